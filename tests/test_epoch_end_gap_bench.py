"""``benchmarks/epoch_end_gap.py``'s garbage-collector clock: the share of an epoch-end gap that Python's collector
took is what the benchmark reports beside the gap, so the clock must count each collection's time, and only that."""

from __future__ import annotations

import gc
import importlib.util
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gc_clock_counts_the_time_of_each_collection_and_nothing_else() -> None:
    spec = importlib.util.spec_from_file_location("epoch_end_gap", ROOT / "benchmarks" / "epoch_end_gap.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench._start_gc_clock()
    try:
        garbage = []
        for _ in range(200_000):  # cycles, so that the collection has work to do
            a: list[object] = []
            a.append(a)
            garbage.append(a)
        del garbage, a
        before = bench._GC_S[0]  # the collections the allocations set off
        t0 = time.perf_counter()
        gc.collect()  # frees the cycles
        gc.collect()  # little to do: a clock that kept only the last collection counts under a third
        elapsed = time.perf_counter() - t0
        counted = bench._GC_S[0] - before
    finally:
        gc.callbacks.remove(bench._time_gc)  # the interpreter's own list: the clock must not outlive the test
    assert 0.0 < counted <= elapsed  # time outside the collections is not counted
    assert counted > 0.8 * elapsed  # freeing 200,000 cycles is most of the two calls

"""What ``fitprof.analyze`` of a big TensorFlow XSpace costs Python's garbage collector, for the ``fitprof`` on
``PYTHONPATH`` (run it once per source tree to compare).

    PYTHONPATH=src python benchmarks/read_gc.py [--steps 6700] [--heap 1000000] [--analyses 10]

The trace: ``tests/gputrace.py``'s ``xspace_trace(steps=..., seed=1)`` (6,700 steps: 87,104 events, 6,788 distinct
(line, metadata, stat values)). Prints, for one analysis from a just-collected heap, the collections of each
generation (``gc.get_stats()``) and the peak of live gc-tracked objects (the collector off, its young count sampled
at every Python call and return); then, in a process holding ``--heap`` tracked objects (a framework's graph), the
collections and the time in the collector (``gc.callbacks``) over ``--analyses`` analyses.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fitprof
import gputrace


def _collections(fn: Any) -> list[int]:
    gc.collect()
    before = [d["collections"] for d in gc.get_stats()]
    fn()
    return [d["collections"] - b for d, b in zip(gc.get_stats(), before, strict=True)]


def _peak(fn: Any) -> int:
    peak = [0]

    def sample(frame: FrameType, event: str, arg: Any) -> None:
        peak[0] = max(peak[0], gc.get_count()[0])

    gc.collect()
    gc.disable()
    start = gc.get_count()[0]
    sys.setprofile(sample)
    try:
        fn()
    finally:
        sys.setprofile(None)
        gc.enable()
    return peak[0] - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6700)
    parser.add_argument("--heap", type=int, default=1_000_000)
    parser.add_argument("--analyses", type=int, default=10)
    args = parser.parse_args()
    print(f"fitprof from {Path(fitprof.__file__).parent}; load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.xplane.pb"
        path.write_bytes(gputrace.xspace_trace(steps=args.steps, seed=1)[0])
        fitprof.analyze(path)  # imports and caches
        print(
            f"one analysis: collections gen0/1/2 {_collections(lambda: fitprof.analyze(path))}, "
            f"peak live tracked objects {_peak(lambda: fitprof.analyze(path))}"
        )
        heap = [[i] for i in range(args.heap)]
        gc.collect()
        spent, began = [0.0], [0.0]

        def timed(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                began[0] = time.perf_counter()
            else:
                spent[0] += time.perf_counter() - began[0]

        gc.callbacks.append(timed)
        got = _collections_no_collect(lambda: [fitprof.analyze(path) for _ in range(args.analyses)])
        gc.callbacks.remove(timed)
        print(
            f"{args.analyses} analyses beside {len(heap):,} objects: collections gen0/1/2 {got}, "
            f"{spent[0] * 1e3:.0f} ms in the collector"
        )


def _collections_no_collect(fn: Any) -> list[int]:
    before = [d["collections"] for d in gc.get_stats()]
    fn()
    return [d["collections"] - b for d, b in zip(gc.get_stats(), before, strict=True)]


if __name__ == "__main__":
    main()

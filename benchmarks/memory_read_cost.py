"""What the memory probe costs: one reset and one read of each memory reader this machine has, and one epoch of the
probe's calls (a reset at the epoch's start, a read and a reset at a window's start and end, a read and a reset at
the epoch's end), interleaved, median of many.

    python benchmarks/memory_read_cost.py [--repeats 2000]

The issue asks for reads once per epoch or window, or per step only below 2 us a read; this prints whether a read
of each reader is below that.
"""

from __future__ import annotations

import argparse
import statistics
import time

from fitprof.fit.memory import MemoryProbe
from fitprof.profilers.memory import KINDS, MemoryReader


def _time_us(fn: object, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()  # type: ignore[operator]
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    print(f"{'kind':<12} {'reset us':>10} {'read us':>10} {'epoch us':>10}  per step under 2 us?")
    for kind in KINDS:
        reader = MemoryReader(kind)
        try:
            reader.reset_peak()
            reader.read()
        except Exception as err:  # no such device here
            print(f"{kind:<12} unavailable ({type(err).__name__})")
            continue
        probe = MemoryProbe(reader, warn=lambda key, message: None)

        def epoch(probe: MemoryProbe = probe) -> None:
            probe.epoch_start(0, now_ns=0)
            probe.window_start(now_ns=0)
            probe.window_end(now_ns=0)
            probe.epoch_end(0, now_ns=0)
            probe.epoch_figures()
            probe.window_figures()

        probe.fit_start(now_ns=0)
        reset, read, whole = (
            _time_us(reader.reset_peak, args.repeats),
            _time_us(reader.read, args.repeats),
            _time_us(epoch, max(1, args.repeats // 10)),
        )
        print(f"{kind:<12} {reset:>10.1f} {read:>10.1f} {whole:>10.1f}  {'yes' if read < 2 else 'no'}")


if __name__ == "__main__":
    main()

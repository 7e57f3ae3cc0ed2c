"""``fitprof.analyze`` against the decode floor: inflating a Kineto trace and decoding its events with msgspec's
typed decoder (the same event struct the reader uses), on each fixture, interleaved in one process.

    python benchmarks/reader_floor.py [--repeats 7] [FIXTURE...]

Default fixtures: every ``*.json.gz`` in /work/shared/fixtures/kineto. Prints, per fixture, the medians (ms) and
``floor / analyze`` (1.0: the analysis costs no more than the decode; the goal is 0.8 or more).
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import time
from pathlib import Path

import msgspec

import fitprof
from fitprof.traces.kineto import _Event

FIXTURES = Path("/work/shared/fixtures/kineto")


class _Doc(msgspec.Struct):
    traceEvents: list[_Event]


_FLOOR = msgspec.json.Decoder(_Doc | list[_Event])


def floor(path: Path) -> int:
    """Inflate and typed-decode the events; their count."""
    with open(path, "rb") as fh:
        raw = fh.read()
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    doc = _FLOOR.decode(data)
    return len(doc if isinstance(doc, list) else doc.traceEvents)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("fixtures", nargs="*", type=Path)
    args = parser.parse_args()
    paths = args.fixtures or sorted(FIXTURES.glob("*.json.gz"))
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    for path in paths:
        times: dict[str, list[float]] = {"floor": [], "analyze": []}
        fitprof.analyze(path)  # warm: imports and caches
        for _ in range(args.repeats):
            for name, fn in (("floor", floor), ("analyze", fitprof.analyze)):
                t0 = time.perf_counter()
                fn(path)
                times[name].append(time.perf_counter() - t0)
        f, a = (statistics.median(times[k]) * 1e3 for k in ("floor", "analyze"))
        print(f"{path.name}: floor {f:.1f} ms, analyze {a:.1f} ms, floor/analyze {f / a:.2f}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

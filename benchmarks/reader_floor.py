"""``fitprof.analyze`` against the decode floor: inflating a Kineto trace and decoding its events with msgspec's
typed decoder (the same event struct the reader uses), on each fixture, interleaved, in the thread's CPU time
(``time.thread_time``, which a loaded machine's waits for a core do not inflate).

    python benchmarks/reader_floor.py [--repeats 7] [--src TREE/src ...] [FIXTURE...]

Default fixtures: every ``*.json.gz`` in /work/shared/fixtures/kineto and in tests/data. Prints, per fixture, the
medians (ms) and ``floor / analyze`` (1.0: the analysis costs no more than the decode). With ``--src`` (two or
more source trees, e.g. a checkout of main and this one), each tree runs in fresh processes, the trees alternated
round by round (``--rounds``), so the ratios of both are measured side by side.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgspec

import fitprof
from fitprof.traces.kineto import _Event

FIXTURES = [Path("/work/shared/fixtures/kineto"), Path(__file__).resolve().parent.parent / "tests" / "data"]


class _Doc(msgspec.Struct):
    traceEvents: list[_Event]


def _timings(paths: list[Path], repeats: int) -> dict[str, dict[str, list[float]]]:
    """Per fixture, the floor's and ``analyze``'s thread CPU times (s), interleaved, after one warm call each."""
    decoder = msgspec.json.Decoder(_Doc | list[_Event])

    def floor(path: Path) -> int:
        with open(path, "rb") as fh:
            raw = fh.read()
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        doc = decoder.decode(data)
        return len(doc if isinstance(doc, list) else doc.traceEvents)

    out: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        times: dict[str, list[float]] = {"floor": [], "analyze": []}
        floor(path)
        fitprof.analyze(path)  # warm: imports and caches
        for _ in range(repeats):
            for name, fn in (("floor", floor), ("analyze", fitprof.analyze)):
                t0 = time.thread_time()
                fn(path)
                times[name].append(time.thread_time() - t0)
        out[path.name] = times
    return out


def _print(label: str, times: dict[str, dict[str, list[float]]]) -> None:
    for name, t in times.items():
        f, a = (statistics.median(t[k]) * 1e3 for k in ("floor", "analyze"))
        print(f"{label}{name}: floor {f:.2f} ms, analyze {a:.2f} ms, floor/analyze {f / a:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--src", nargs="+", default=None, help="source trees to compare, in fresh processes")
    parser.add_argument("--rounds", type=int, default=3, help="with --src: rounds of alternated processes")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("fixtures", nargs="*", type=Path)
    args = parser.parse_args()
    paths = args.fixtures or [p for d in FIXTURES for p in sorted(d.glob("*.json.gz"))]
    if args.child:
        print(json.dumps(_timings(paths, args.repeats)))
        return
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    if not args.src:
        _print("", _timings(paths, args.repeats))
    else:
        merged: dict[str, dict[str, dict[str, list[float]]]] = {src: {} for src in args.src}
        for _ in range(args.rounds):
            for src in args.src:
                env = {**os.environ, "PYTHONPATH": src}
                cmd = [sys.executable, __file__, "--child", "--repeats", str(args.repeats), *map(str, paths)]
                got = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
                for name, t in got.items():
                    slot = merged[src].setdefault(name, {"floor": [], "analyze": []})
                    for k in slot:
                        slot[k].extend(t[k])
        for name in merged[args.src[0]]:
            for src in args.src:
                _print(f"[{src}] ", {name: merged[src][name]})
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""The XSpace reader before and after, side by side in one process: MB/s and the ratio to protobuf's parse.

    python benchmarks/xspace_speed.py --old 7526b3e [--repeats 5] [--steps 2000] [--events 200000]

The reader of commit ``--old`` (``git archive <commit> src``, its package renamed ``fitprof_old`` so both import in
one process) and this checkout's are timed alternately on the same bytes, with protobuf's parse of the whole file
(``XSpace.FromString``, the floor: it builds every message and reads nothing) in the same rounds:

* ``tests/data/keras_tf_cpu.xplane.pb``: the shipped TensorFlow CPU window (0.14 MB, 4,173 events);
* a TensorFlow GPU window of ``--steps`` steps from ``tests/gputrace.py`` (``xspace_trace``: host steps, tf.data
  waits, ``tf_Compute`` ops, device copies and kernels with ``tf_op`` / ``memcpy_details`` stats, a derived line);
* the XSpace fitprof's converter writes from a generated Kineto trace of ``--events`` complete events
  (``analysis_speed.generate_kineto``), read back as that torch window.

Then the converter itself (``kineto_to_xspace``, which the callbacks run at the end of each profiled epoch), old and
new alternately on that generated trace and the real ``../shared/fixtures/kineto`` traces, with whether the two
XSpaces are the same bytes.

Each row: the file's MB, median seconds of the parse alone, ``read_xspace`` and ``fitprof.analyze`` (old and new),
MB/s of ``fitprof.analyze``, its ratio to the parse, new / old, whether the two tables are equal, and the load average
before and after the row.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import io
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def old_package(commit: str, into: Path) -> Any:
    """``fitprof`` of ``commit`` imported as ``fitprof_old``."""
    raw = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        tar.extractall(into, filter="data")
    src, dst = into / "src" / "fitprof", into / "fitprof_old"
    src.rename(dst)
    for path in dst.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\bfitprof(?=[.\s])", "fitprof_old", text)
        path.write_text(text)
    sys.path.insert(0, str(into))
    return importlib.import_module("fitprof_old")


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def alternate(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each function, the functions called in turn ``repeats`` times."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the commit whose reader is the 'before'")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "benchmarks")]
    import analysis_speed

    import fitprof
    import gputrace
    from fitprof.traces._xplane_schema import xplane_classes
    from fitprof.traces.xspace import read_xspace
    from fitprof.traces.xspace_write import kineto_to_xspace

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        old = old_package(args.old, tmp / "old")
        old_read = importlib.import_module("fitprof_old.traces.xspace").read_xspace
        files = [ROOT / "tests" / "data" / "keras_tf_cpu.xplane.pb"]
        data, _ = gputrace.xspace_trace(steps=args.steps, seed=1)
        files.append(tmp / f"tf_gpu_{args.steps}_steps.xplane.pb")
        files[-1].write_bytes(data)
        kineto = tmp / "generated.pt.trace.json"
        analysis_speed.generate_kineto(kineto, args.events)
        files.append(tmp / f"converted_{args.events // 1000}k.xplane.pb")
        files[-1].write_bytes(kineto_to_xspace(kineto, host="bench").SerializeToString())
        parse = xplane_classes()["XSpace"].FromString
        print(f"old: {args.old}; new: this checkout; medians of {args.repeats}, alternated; "
              f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")  # fmt: skip
        print(
            "\n| .xplane.pb | MB | events | protobuf parse s | read_xspace old s | new s | new/old "
            "| analyze old s | new s | new/old | MB/s old | new | ratio to parse old | new | tables equal | load |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for path in files:
            raw = path.read_bytes()
            mb = len(raw) / 1e6
            events = sum(len(line.events) for plane in parse(raw).planes for line in plane.lines)
            before = load()
            t = alternate(
                {
                    "parse": lambda r=raw: parse(r),  # type: ignore[misc]
                    "read_old": lambda p=path: old_read(p, max_events=10**8),  # type: ignore[misc]
                    "read_new": lambda p=path: read_xspace(p, max_events=10**8),  # type: ignore[misc]
                    "analyze_old": lambda p=path: old.analyze(p, max_events=10**8),  # type: ignore[misc]
                    "analyze_new": lambda p=path: fitprof.analyze(p, max_events=10**8),  # type: ignore[misc]
                },
                args.repeats,
            )
            equal = old_read(path, max_events=10**8).equals(read_xspace(path, max_events=10**8))
            print(
                f"| {path.name} | {mb:.2f} | {events:,} | {t['parse']:.4f} | {t['read_old']:.3f} | {t['read_new']:.3f} "
                f"| {t['read_new'] / t['read_old']:.2f} | {t['analyze_old']:.3f} | {t['analyze_new']:.3f} "
                f"| {t['analyze_new'] / t['analyze_old']:.2f} | {mb / t['analyze_old']:.1f} | {mb / t['analyze_new']:.1f} "
                f"| {t['analyze_old'] / t['parse']:.1f} | {t['analyze_new'] / t['parse']:.1f} "
                f"| {'yes' if equal else 'NO'} | {before}-{load()} |",
                flush=True,
            )
        converter(old, [kineto, *sorted(KINETO_FIXTURES.glob("*.json.gz"))], args.repeats)


KINETO_FIXTURES = ROOT.parent / "shared" / "fixtures" / "kineto"


def converter(old: Any, files: list[Path], repeats: int) -> None:
    """The Kineto -> XSpace converter the callbacks run at each profiled epoch's end, old and new alternately:
    median seconds, new / old, and whether the two XSpaces serialise to the same bytes (deterministic maps)."""
    from fitprof.traces.xspace_write import kineto_to_xspace

    old_convert = importlib.import_module("fitprof_old.traces.xspace_write").kineto_to_xspace
    print("\n| Kineto trace | MB | kineto_to_xspace old s | new s | new/old | same bytes | load |")
    print("|---|---:|---:|---:|---:|---|---|")
    for path in files:
        raw = path.read_bytes()
        mb = len(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw) / 1e6
        before = load()
        t = alternate(
            {
                "old": lambda p=path: old_convert(p, host="bench"),  # type: ignore[misc]
                "new": lambda p=path: kineto_to_xspace(p, host="bench"),  # type: ignore[misc]
            },
            repeats,
        )
        same = old_convert(path, host="bench").SerializeToString(deterministic=True) == kineto_to_xspace(
            path, host="bench"
        ).SerializeToString(deterministic=True)
        print(
            f"| {path.name} | {mb:.1f} | {t['old']:.3f} | {t['new']:.3f} | {t['new'] / t['old']:.2f} "
            f"| {'yes' if same else 'NO'} | {before}-{load()} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

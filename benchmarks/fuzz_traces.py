"""A long fuzz run over trace files, and decompression bombs read with and without the size bound.

    python benchmarks/fuzz_traces.py [--inputs 5000] [--seed 1] [--bomb-mb 1024] [--skip-bombs]

* ``--inputs`` mutants of the seed traces (``tests/fuzz_traces.py``: the synthetic Kineto trace and its XSpace,
  the small shared fixtures, ``tests/data``), each analysed with :func:`fitprof.analyze` under the default
  bounds; prints how many gave a report, a ``TraceError`` or anything else (a bug), the slowest input, and the
  peak RSS growth over the run. The same mutator runs 250 inputs in ``make test``.
* bombs: ``.pt.trace.json.gz`` files that inflate to ``--bomb-mb`` MB (whitespace inside ``traceEvents``, as in
  the issue) or less (``{}`` events, numbers, deep nesting), each read by ``fitprof analyze`` in a fresh process
  under the default bound and with ``--max-trace-mb`` raised past the inflated size; prints the outcome, the wall
  time and the process's peak RSS (the child's own ``VmHWM``: ``ru_maxrss`` would carry this parent's peak).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import fuzz_traces  # noqa: E402

_LAUNCH = fuzz_traces.PEAK_RSS_SOURCE + (
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: print('peak_kb', peak_rss_kb(), file=sys.stderr))\n"
    "sys.argv = ['fitprof', *sys.argv[1:]]\nrunpy.run_module('fitprof.cli', run_name='__main__')\n"
)


def run_cli(args: list[str]) -> tuple[int, str, float, float]:
    """``fitprof`` in a fresh process: exit status, its first output line, wall seconds, its peak RSS in MB."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _LAUNCH, *args], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    err = proc.stderr.strip().splitlines()
    peak_kb = int(err[-1].split()[1])
    lines = err[:-1] or proc.stdout.strip().splitlines()[1:]
    return proc.returncode, lines[0] if lines else "", wall, peak_kb / 1024


def _size(n: int) -> str:
    return f"{n / 1e3:,.1f} KB" if n < 1e6 else f"{n / 1e6:,.0f} MB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bomb-mb", type=int, default=1024)
    parser.add_argument("--skip-bombs", action="store_true")
    args = parser.parse_args(argv)
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, Python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.inputs:
            t0 = time.perf_counter()
            result = fuzz_traces.run(args.inputs, args.seed, tmp, ROOT, ROOT.parent / "shared" / "fixtures" / "kineto")
            print(
                f"fuzz: {result['inputs']} inputs (seed {args.seed}) in {time.perf_counter() - t0:.0f} s: "
                f"{result['outcomes']}; other outcomes: {len(result['failures'])}; peak RSS growth "
                f"{(result['peak_kb'] - result['baseline_kb']) / 1024:.1f} MB; slowest input "
                f"{result['slowest_s']:.2f} s ({result['slowest']})"
            )
            for failure in result["failures"]:
                print("  ", failure)
        if args.skip_bombs:
            return
        print("\n| bomb | .gz size | inflates to | --max-trace-mb | exit | wall s | peak RSS MB | message |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        seed = tmp / "seed.pt.trace.json"
        seed.write_text(json.dumps(fuzz_traces.kineto_seed()))
        cases = [("none (seed trace)", None, 0), ("events", "events", 64), ("numbers", "numbers", 64)]
        cases += [("deep", "deep", 64), ("whitespace", "whitespace", args.bomb_mb)]
        for label, kind, mb in cases:
            if kind is None:
                path = seed
            else:
                path = tmp / f"bomb_{kind}.pt.trace.json.gz"
                path.write_bytes(fuzz_traces.bomb(kind, mb))
            bounds = [None] if kind != "whitespace" else [None, str(mb * 2)]
            for bound in bounds:
                extra = ["--max-trace-mb", bound] if bound else []
                status, message, wall, peak = run_cli(["analyze", str(path), "--format", "csv", *extra])
                shown = (
                    message
                    if status
                    else "report, verdict "
                    + next((v for v in ("no-steps", "compute-bound", "input-bound") if v in message), "?")
                )
                print(
                    f"| {label} | {path.stat().st_size / 1e3:,.0f} KB | {_size(mb * 2**20 or seed.stat().st_size)} | "
                    f"{bound or 'default (512)'} | {status} | {wall:.1f} | {peak:,.0f} | {shown.replace(str(path), path.name)} |",
                    flush=True,
                )
    print(f"\nreproduce: python benchmarks/fuzz_traces.py {' '.join(sys.argv[1:] if argv is None else argv)}")


if __name__ == "__main__":
    main()

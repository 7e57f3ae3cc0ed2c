"""How fast fitprof reads and analyses traces, against xprof's conversion and HolisticTraceAnalysis's parser.

    python benchmarks/analysis_speed.py [--repeats 3] [--events 1000000] [--skip-xprof]

* every Kineto fixture in ``../shared/fixtures/kineto/`` (real A100 / MI250 / CPU traces): fitprof's reader
  (:func:`fitprof.traces.read_trace`) and analysis (:func:`fitprof.analysis.analyze_table`), median seconds and
  events per second (complete events in the file over read + analysis time);
* a generated Kineto trace of ``--events`` complete events (plain JSON): 1,000-op steps, each op a
  ``cpu_op`` with a nested ``cpu_op``, a ``cudaLaunchKernel`` and its kernel (same correlation id), plus one
  pinned host-to-device copy and a DataLoader span per step;
* a real ``.xplane.pb`` from the Keras digits example (one epoch, steps 6-10): ``fitprof.analyze`` against
  xprof's ``xspace_to_tool_data(..., "framework_op_stats")`` and ``"input_pipeline_analyzer"`` on a fresh copy
  each time (the conversion caches its result beside the file; the cached second call is shown too);
* HolisticTraceAnalysis's parser (``hta.common.trace.parse_trace_file``) on the same Kineto files, when
  ``import hta`` works (it is not a fitprof dependency; see benchmarks/JOURNAL.md, section 3, for how it was made available).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT.parent / "shared" / "fixtures" / "kineto"


def median_seconds(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time of ``fn()`` over ``repeats`` calls, and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def count_complete_events(path: Path) -> int:
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return sum(1 for e in events if e.get("ph") == "X")


def generate_kineto(path: Path, n_events: int, ops_per_step: int = 1000) -> int:
    """Write a synthetic CPU+GPU Kineto trace with about ``n_events`` complete events; return the count."""
    events: list[dict[str, Any]] = []
    ts, corr, step = 1_000.0, 1, 0
    per_op = 4
    while len(events) + per_op * ops_per_step + 5 <= n_events:
        step_start = ts
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": step_start, "dur": 0.0})  # fmt: skip
        step_index = len(events) - 1
        events.append({"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": ts + 1, "dur": 200.0,
                       "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"})  # fmt: skip
        ts += 210
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": ts,
                       "dur": 8.0, "args": {"correlation": corr}})  # fmt: skip
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7,
                       "ts": ts + 5, "dur": 40.0, "args": {"correlation": corr, "bytes": 1 << 20}})  # fmt: skip
        corr += 1
        ts += 10
        for k in range(ops_per_step):
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": ts,
                           "dur": 20.0})  # fmt: skip
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm" if k % 3 else "aten::mm", "pid": 1,
                           "tid": 1, "ts": ts + 2, "dur": 15.0})  # fmt: skip
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": ts + 4, "dur": 6.0, "args": {"correlation": corr}})  # fmt: skip
            events.append({"ph": "X", "cat": "kernel", "name": f"sgemm_{k % 7}", "pid": 0, "tid": 7, "ts": ts + 12,
                           "dur": 18.0, "args": {"correlation": corr}})  # fmt: skip
            corr += 1
            ts += 22
        events[step_index]["dur"] = ts - step_start
        step += 1
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return len(events)


def generate_kineto_stream(path: Path, target_mb: float, ops_per_step: int = 1000) -> int:
    """Write a Kineto trace of about ``target_mb`` MB plain JSON, the events of :func:`generate_kineto`, one step
    at a time (the whole trace is never held); return the number of events."""
    target = target_mb * 1e6
    n, corr, ts, step = 0, 1, 1_000.0, 0
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{"schemaVersion": 1, "traceEvents": [')
        while fh.tell() < target:
            step_start = ts
            events: list[dict[str, Any]] = [
                {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                 "ts": step_start, "dur": 0.0},
                {"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": ts + 1, "dur": 200.0,
                 "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": ts + 210,
                 "dur": 8.0, "args": {"correlation": corr}},
                {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7,
                 "ts": ts + 215, "dur": 40.0, "args": {"correlation": corr, "bytes": 1 << 20}},
            ]  # fmt: skip
            corr += 1
            ts += 220
            for k in range(ops_per_step):
                events += [
                    {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": ts, "dur": 20.0},
                    {"ph": "X", "cat": "cpu_op", "name": "aten::addmm" if k % 3 else "aten::mm", "pid": 1,
                     "tid": 1, "ts": ts + 2, "dur": 15.0},
                    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                     "ts": ts + 4, "dur": 6.0, "args": {"correlation": corr}},
                    {"ph": "X", "cat": "kernel", "name": f"sgemm_{k % 7}", "pid": 0, "tid": 7, "ts": ts + 12,
                     "dur": 18.0, "args": {"correlation": corr}},
                ]  # fmt: skip
                corr += 1
                ts += 22
            events[0]["dur"] = ts - step_start
            fh.write(("," if n else "") + ",".join(map(json.dumps, events)))
            n += len(events)
            step += 1
        fh.write("]}")
    return n


_CHILD = """
import json, sys, time
def peak_rss_kb():  # VmHWM starts afresh at exec; ru_maxrss would carry the parent's peak
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
if sys.argv[2] == "json.loads":
    base_kb = peak_rss_kb()
    t0 = time.perf_counter()
    with open(sys.argv[1], "rb") as fh:
        doc = json.loads(fh.read())
    took = time.perf_counter() - t0
    print(json.dumps({"s": took, "peak_kb": peak_rss_kb(), "base_kb": base_kb, "steps": None}))
    raise SystemExit
import fitprof
base_kb = peak_rss_kb()
t0 = time.perf_counter()
report = fitprof.analyze(sys.argv[1], max_trace_mb=1e9, max_events=10**9)
took = time.perf_counter() - t0
print(json.dumps({"s": took, "peak_kb": peak_rss_kb(), "base_kb": base_kb,
                  "steps": report.steps_analyzed}))
"""


def analyze_in_child(path: Path, what: str = "fitprof") -> dict[str, Any]:
    """``fitprof.analyze`` (or, with ``what="json.loads"``, ``json.loads`` of the plain file read at once) of one
    file in a fresh process: seconds, peak RSS and the RSS before the call (kB, the process's own ``VmHWM``),
    steps."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), what], capture_output=True, text=True, env=env, check=True
    )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def load_average() -> str:
    """The machine's 1-minute load average now (the runs share the CPUs with whatever else runs)."""
    return f"{os.getloadavg()[0]:.1f}"


def bench_ratio(path: Path, repeats: int) -> dict[str, Any]:
    """``fitprof.analyze`` (from the file: inflating, decoding, table, analysis) against ``json.loads`` of the
    same plain text, in this process, alternated; median seconds, MB/s of plain JSON and the ratio."""
    import fitprof

    raw = path.read_bytes()
    plain = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    loads, ours = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        doc = json.loads(plain)
        loads.append(time.perf_counter() - t0)
        del doc
        t0 = time.perf_counter()
        fitprof.analyze(path, max_trace_mb=1e9, max_events=10**9)
        ours.append(time.perf_counter() - t0)
    loads_s, ours_s = statistics.median(loads), statistics.median(ours)
    return {
        "file": path.name,
        "plain_mb": len(plain) / 1e6,
        "json_loads_s": loads_s,
        "fitprof_s": ours_s,
        "mb_per_s": len(plain) / 1e6 / ours_s,
        "ratio": ours_s / loads_s,
    }


def bench_kineto(path: Path, repeats: int, hta_parse: Callable[[str], Any] | None) -> dict[str, Any]:
    from fitprof.analysis import analyze_table
    from fitprof.traces import read_trace

    n = count_complete_events(path)
    read_s, table = median_seconds(lambda: read_trace(path), repeats)
    analyze_s, _ = median_seconds(lambda: analyze_table(table), repeats)
    row: dict[str, Any] = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "events": n,
        "read_s": read_s,
        "analyze_s": analyze_s,
        "events_per_s": n / (read_s + analyze_s),
    }
    if hta_parse is not None:
        try:
            row["hta_s"], _ = median_seconds(lambda: hta_parse(str(path)), repeats)
        except Exception as err:  # HTA fails on some inputs (pandas 3); say so instead of a number
            row["hta_s"] = f"failed: {type(err).__name__}: {str(err)[:80]}"
    return row


def xspace_rows(tmp: Path, repeats: int) -> None:
    """XSpace reader speed: ``fitprof.analyze`` on the shipped ``.xplane.pb`` and on one converted (by
    :func:`fitprof.traces.xspace_write.kineto_to_xspace`) from a generated Kineto trace of 50,000 events; MB/s of
    the protobuf file, and the protobuf parse alone (``XSpace.ParseFromString``, the floor) side by side."""
    import fitprof
    from fitprof.traces._xplane_schema import xplane_classes
    from fitprof.traces.xspace_write import kineto_to_xspace

    shipped = ROOT / "tests" / "data" / "keras_tf_cpu.xplane.pb"
    kineto = tmp / "xspace_source.pt.trace.json"
    generate_kineto(kineto, 50_000)
    converted = tmp / "generated_50k.xplane.pb"
    converted.write_bytes(kineto_to_xspace(kineto, host="bench").SerializeToString())
    xspace_cls = xplane_classes()["XSpace"]
    print("\n| .xplane.pb | MB | fitprof.analyze s | MB/s | protobuf parse alone s | ratio to the parse | load |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path in (shipped, converted):
        if not path.is_file():
            continue
        raw = path.read_bytes()
        load = load_average()
        parse_s, _ = median_seconds(lambda r=raw: xspace_cls.FromString(r), repeats)  # type: ignore[misc]
        ours_s, _ = median_seconds(lambda p=path: fitprof.analyze(p), repeats)  # type: ignore[misc]
        print(
            f"| {path.name} | {len(raw) / 1e6:,.2f} | {ours_s:.3f} | {len(raw) / 1e6 / ours_s:,.1f} | {parse_s:.3f} | "
            f"{ours_s / parse_s:.1f} | {load}-{load_average()} |",
            flush=True,
        )


def keras_xplane(tmp: Path) -> Path:
    """Run the Keras digits example for one epoch and return its ``.xplane.pb``."""
    logdir = tmp / "keras"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "keras_digits.py"), "--logdir", str(logdir), "--epochs", "1"],
        check=True,
        capture_output=True,
        env={**os.environ, "KERAS_BACKEND": "tensorflow"},
    )
    return next(logdir.glob("plugins/profile/*/*.xplane.pb"))


def bench_xspace(xplane: Path, tmp: Path, repeats: int) -> dict[str, Any]:
    import fitprof

    row: dict[str, Any] = {"file": f"keras_digits {xplane.name}", "bytes": xplane.stat().st_size}
    row["fitprof_s"], report = median_seconds(lambda: fitprof.analyze(xplane), repeats)
    from xprof.convert.raw_to_tool_data import xspace_to_tool_data

    for tool in ("framework_op_stats", "input_pipeline_analyzer"):
        fresh: list[float] = []
        for i in range(repeats):
            d = tmp / f"x_{tool}_{i}"
            d.mkdir()
            copy = d / xplane.name
            shutil.copy(xplane, copy)
            t0 = time.perf_counter()
            xspace_to_tool_data([str(copy)], tool, {})
            fresh.append(time.perf_counter() - t0)
        row[f"xprof_{tool}_s"] = statistics.median(fresh)
        cached, _ = median_seconds(lambda c=copy, t=tool: xspace_to_tool_data([str(c)], t, {}), repeats)  # type: ignore[misc]
        row[f"xprof_{tool}_cached_s"] = cached
    row["steps"] = report.steps_analyzed
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--skip-xprof", action="store_true")
    parser.add_argument("--skip-hta", action="store_true", help="do not time HTA's parser even where it imports")
    parser.add_argument(
        "--big-mb",
        type=float,
        nargs="*",
        default=[],
        metavar="MB",
        help="also generate plain Kineto traces of these sizes (e.g. 1000) and analyse each in a fresh process: "
        "seconds, MB/s and peak RSS",
    )
    parser.add_argument("--skip-big-json", action="store_true", help="no json.loads child on the --big-mb traces")
    parser.add_argument(
        "--ratio-only",
        action="store_true",
        help="only the ratio table (fixtures, generated trace) and --big-mb: no read/analyse split, no HTA",
    )
    args = parser.parse_args(argv)

    import numpy as np
    import pandas as pd

    import fitprof

    hta_parse: Callable[[str], Any] | None = None
    try:
        if args.skip_hta:
            raise ImportError("--skip-hta")
        from hta.common.trace import parse_trace_file

        logging.getLogger("hta").setLevel(logging.ERROR)
        hta_parse = parse_trace_file
        import hta

        hta_version = getattr(hta, "__version__", "installed")
    except Exception as err:
        hta_version = f"not available ({type(err).__name__})"
    print(
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, no GPU; Python {sys.version.split()[0]}, "
        f"fitprof {fitprof.__version__}, numpy {np.__version__}, pandas {pd.__version__}, HTA {hta_version}"
    )
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        files = sorted(FIXTURES.glob("*.json.gz")) if FIXTURES.is_dir() else []
        gen = tmp / "generated_1m.pt.trace.json"
        t0 = time.perf_counter()
        n = generate_kineto(gen, args.events)
        print(f"generated {n} events ({gen.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")
        print(f"load average at the start: {load_average()}")
        if not args.ratio_only:
            print("| trace | size | complete events | read s | analyse s | events/s | HTA parse s |")
            print("|---|---:|---:|---:|---:|---:|---:|")
        for path in [] if args.ratio_only else [*files, gen]:
            row = bench_kineto(path, args.repeats, hta_parse)
            rows.append(row)
            hta_cell = row.get("hta_s", "–")
            hta_cell = f"{hta_cell:.3f}" if isinstance(hta_cell, float) else hta_cell
            print(
                f"| {row['file']} | {row['bytes'] / 1e3:,.0f} KB | {row['events']:,} | {row['read_s']:.3f} | "
                f"{row['analyze_s']:.3f} | {row['events_per_s']:,.0f} | {hta_cell} |",
                flush=True,
            )
        print(
            "\n| trace | plain JSON MB | json.loads s | fitprof.analyze s (from the file) | MB/s | ratio to json.loads "
            "| peak RSS MB, fresh process (before the call) | load |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for path in [*files, gen]:
            load = load_average()
            r = bench_ratio(path, args.repeats)
            child = analyze_in_child(path)
            print(
                f"| {r['file']} | {r['plain_mb']:,.1f} | {r['json_loads_s']:.3f} | {r['fitprof_s']:.3f} | "
                f"{r['mb_per_s']:,.0f} | {r['ratio']:.2f} | {child['peak_kb'] / 1024:,.0f} "
                f"({child['base_kb'] / 1024:,.0f}) | {load}-{load_average()} |",
                flush=True,
            )
        xspace_rows(tmp, args.repeats)
        if args.big_mb:
            print(
                "\n| generated trace | plain JSON MB | events | fitprof.analyze s | MB/s | peak RSS MB (before the "
                "call) | RSS / size | json.loads s | its peak RSS MB | ratio to json.loads | load |"
            )
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for mb in args.big_mb:
            big = tmp / f"generated_{mb:g}mb.pt.trace.json"
            n_big = generate_kineto_stream(big, mb)
            size = big.stat().st_size
            load = load_average()
            r = analyze_in_child(big)  # each in a fresh process: its own peak RSS, one after the other
            j = analyze_in_child(big, "json.loads") if not args.skip_big_json else {"s": math.nan, "peak_kb": 0}
            print(
                f"| {big.name} ({r['steps']} steps) | {size / 1e6:,.0f} | {n_big:,} | {r['s']:.1f} | "
                f"{size / 1e6 / r['s']:,.0f} | {r['peak_kb'] / 1024:,.0f} ({r['base_kb'] / 1024:,.0f}) | "
                f"{r['peak_kb'] * 1024 / size:.2f} | {j['s']:.1f} | {j['peak_kb'] / 1024:,.0f} | "
                f"{r['s'] / j['s']:.2f} | {load}-{load_average()} |",
                flush=True,
            )
            big.unlink()
        if not args.skip_xprof:
            xplane = keras_xplane(tmp)
            row = bench_xspace(xplane, tmp, args.repeats)
            print(
                "\n| .xplane.pb | size | fitprof.analyze s | xprof framework_op_stats s (cached) | "
                "xprof input_pipeline_analyzer s (cached) |\n|---|---:|---:|---:|---:|"
            )
            print(
                f"| {row['file']} ({row['steps']} steps) | {row['bytes'] / 1e3:,.0f} KB | {row['fitprof_s']:.3f} | "
                f"{row['xprof_framework_op_stats_s']:.3f} ({row['xprof_framework_op_stats_cached_s']:.3f}) | "
                f"{row['xprof_input_pipeline_analyzer_s']:.3f} ({row['xprof_input_pipeline_analyzer_cached_s']:.3f}) |"
            )
    print(f"\nreproduce: python benchmarks/analysis_speed.py {' '.join(sys.argv[1:] if argv is None else argv)}")


if __name__ == "__main__":
    main()

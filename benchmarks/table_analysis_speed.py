"""The table build and the analysis of one revision against another, side by side in one process.

    python benchmarks/table_analysis_speed.py --old-rev 7526b3e [--repeats 7] TRACE [TRACE ...]

The old revision's ``src/fitprof`` is taken with ``git archive`` into a temporary folder and imported as the
package ``fitprof_old`` (its ``fitprof`` imports rewritten), beside this checkout's ``fitprof``. For each trace the
reader's columns in file order (``kineto._load`` and ``_kineto_rules.frame_columns`` of this checkout) and its table are
made once; then, alternating old and new (the first of each pair swapped every repeat), medians of ``--repeats``:
``fitprof.analyze`` from the file (everything: inflating, decoding, table, analysis), ``table_from_columns`` on a
fresh copy of the columns, ``_self_times`` of the table and ``analyze_table`` of the table, with ``json.loads`` of
the plain text as the yardstick of issue 17. Before timing it checks that both revisions give the same table
(``DataFrame.equals`` and the self times' bytes) and the same report (every float's bytes). Then one ``cProfile``
run of each for the cumulative time of the functions named in ``PROFILED``. Kineto traces only.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import gzip
import importlib
import io
import json
import pstats
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROFILED = (
    "analyze_table",
    "_exposed_times",
    "host_spans_exposed",
    "_overlap",
    "_intersect",
    "_subtract",
    "_union",
    "exposed_times",
    "overlap",
    "intersect",
    "subtract",
    "union",
    "table_from_columns",
    "_self_times",
)
BOUNDS = {"max_trace_mb": 1 << 16, "max_events": 1 << 31}


def import_old(rev: str, into: Path) -> Any:
    """``src/fitprof`` of ``rev`` as the package ``fitprof_old`` (imported from ``into``)."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src/fitprof"], check=True, capture_output=True)
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        tar.extractall(into, filter="data")
    package = into / "fitprof_old"
    (into / "src" / "fitprof").rename(package)
    pattern = re.compile(r"\b(from|import) fitprof\b")
    for path in package.rglob("*.py"):
        path.write_text(pattern.sub(r"\1 fitprof_old", path.read_text(encoding="utf-8")), encoding="utf-8")
    sys.path.insert(0, str(into))
    return importlib.import_module("fitprof_old")


def seconds(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def side_by_side(label: str, old: Callable[[], object], new: Callable[[], object], repeats: int) -> None:
    t_old: list[float] = []
    t_new: list[float] = []
    for r in range(repeats):
        pair = [(t_old, old), (t_new, new)]
        for times, fn in pair if r % 2 == 0 else pair[::-1]:
            times.append(seconds(fn))
    mo, mn = statistics.median(t_old), statistics.median(t_new)
    print(
        f"  {label:32s} {mo * 1e3:9.1f} {mn * 1e3:9.1f} {mn / mo:7.3f}   "
        f"({min(t_old) * 1e3:.1f}-{max(t_old) * 1e3:.1f} | {min(t_new) * 1e3:.1f}-{max(t_new) * 1e3:.1f})"
    )


def profiled(fn: Callable[[], object]) -> dict[str, tuple[int, float]]:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    stats: dict[Any, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    return {
        name: (calls, cumulative)
        for (file, _, name), (_, calls, _, cumulative, _) in stats.items()
        if name in PROFILED and ("analysis" in file or "_table.py" in file)
    }


def same_report(a: Any, b: Any) -> bool:
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    return da.keys() == db.keys() and all(
        np.asarray(da[k], dtype=float).tobytes() == np.asarray(db[k], dtype=float).tobytes()
        if isinstance(da[k], float)
        else da[k] == db[k]
        for k in da
    )


def one_trace(path: Path, repeats: int, old: Any) -> None:
    """Check, time and profile one trace (module docstring); ``old``: the ``fitprof_old`` package."""
    import fitprof
    from fitprof.traces import _kineto_rules as kineto_rules
    from fitprof.traces import _table, kineto, read_trace
    from fitprof.traces._limits import Limits

    old_table = importlib.import_module("fitprof_old.traces._table")
    old_analysis = importlib.import_module("fitprof_old.analysis")
    table = read_trace(path, **BOUNDS)
    _, events = kineto._load(path, Limits.of(**BOUNDS), [])
    columns = kineto_rules.frame_columns(events, path)
    del events
    raw = path.read_bytes()
    text = gzip.decompress(raw) if path.name.endswith(".gz") else raw
    built_old = old_table.table_from_columns(dict(columns))
    built_new = _table.table_from_columns(dict(columns))
    assert built_old.equals(built_new), "the tables differ"
    assert built_old["self_us"].to_numpy().tobytes() == built_new["self_us"].to_numpy().tobytes()
    assert same_report(old_analysis.analyze_table(table), fitprof.analysis.analyze_table(table)), "reports differ"
    print(f"{path.name}: {len(text) / 1e6:.1f} MB plain, {len(table):,} events; tables and reports equal")
    print(f"  {'median ms':32s} {'old':>9s} {'new':>9s} {'new/old':>7s}   (old range | new range)")
    pairs: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        ("json.loads (old) | analyze (new)", lambda: json.loads(text), lambda: fitprof.analyze(path, **BOUNDS)),
        ("fitprof.analyze", lambda: old.analyze(path, **BOUNDS), lambda: fitprof.analyze(path, **BOUNDS)),
        (
            "table_from_columns",
            lambda: old_table.table_from_columns(dict(columns)),
            lambda: _table.table_from_columns(dict(columns)),
        ),
        ("_self_times", lambda: old_table._self_times(table), lambda: _table._self_times(table)),
        ("analyze_table", lambda: old_analysis.analyze_table(table), lambda: fitprof.analysis.analyze_table(table)),
    ]
    for label, fn_old, fn_new in pairs:
        side_by_side(label, fn_old, fn_new, repeats)
    p_old = profiled(pairs[4][1]) | profiled(pairs[2][1])
    p_new = profiled(pairs[4][2]) | profiled(pairs[2][2])
    print("  cProfile, one run each: calls and cumulative s, old -> new")
    for name in PROFILED:
        (co, so), (cn, sn) = p_old.get(name, (0, 0.0)), p_new.get(name, (0, 0.0))
        print(f"    {name:20s} {co:4d} {so:8.4f} -> {cn:4d} {sn:8.4f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--old-rev", required=True, help="the git revision to compare with (e.g. main)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        old = import_old(args.old_rev, Path(tmp))
        print(f"old = {args.old_rev}, new = this checkout; load average {Path('/proc/loadavg').read_text().strip()}")
        for path in args.traces:
            one_trace(path, args.repeats, old)
        print(f"load average {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()

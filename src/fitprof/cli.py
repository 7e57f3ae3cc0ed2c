"""The ``fitprof`` command: bottleneck tables from fitprof runs (``report``) or from any trace file (``analyze``).

``fitprof report LOGDIR``
    Finds every fitprof run below ``LOGDIR`` (a folder holding ``plugins/fitprof/<session>.rank<r>.json``,
    written by the Keras and the Lightning callbacks for each profiled window) and prints one row per run,
    epoch and rank: exactly the figures the callback logged.

``fitprof analyze TRACE...``
    Analyses trace files directly (``*.xplane.pb``, ``*.pt.trace.json``, ``*.json.gz``, or a
    ``plugins/profile/<session>`` folder, whose ``*.xplane.pb`` files are read), recorded by fitprof or not:
    one row per file, with the same figures as :func:`fitprof.analyze`. With several ranks' traces it adds a
    spread record: max - min of ``step_time_ms`` and ``input_percent`` across the ranks, and the slowest rank.

Output formats (``--format``): ``table`` (default, aligned text, then each row's verdict line and the advice),
``markdown`` (the same as a Markdown table), ``json`` (a list of records; numbers in the units their names
say, NaN as ``null``) and ``csv`` (one flat row per record, the top operator only).

Bad input (a missing path, a truncated, corrupt or foreign file) gives one ``fitprof: error: <path>: <what>``
line on stderr per file and exit status 2; the other files are still reported. Nothing is printed or
written when no file could be reported. This module imports no framework.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from fitprof import analyze
from fitprof._reportfile import REPORTS_DIR, clean_json
from fitprof.analysis import BottleneckReport, OpStat, one_line
from fitprof.traces import TraceError, trace_format

EXIT_OK = 0
EXIT_BAD_INPUT = 2
FORMATS = ("table", "json", "csv", "markdown")

STRAGGLER_INPUT_SPREAD = 10.0
"""Input-share spread (percentage points) above which the most input-bound rank is named the straggler."""
RECORD_TRACE = "trace"
"""``record`` of a row from ``fitprof analyze`` (one trace file)."""
RECORD_WINDOW = "window"
"""``record`` of a row from ``fitprof report`` (one profiled window: run, epoch, rank)."""
RECORD_SPREAD = "spread"
"""``record`` of a rank-spread summary (max - min across the ranks of one group of rows)."""

SEGMENTS = ("input wait", "host-to-device", "other/compute")
"""Names of the stacked segments of ``--plot`` (ms per step): input wait, HtoD copy time, the rest."""

_LEADING_KEYS = ("record", "run", "epoch", "rank", "world_size", "framework")
_RANK_IN_NAME = re.compile(r"_rank(\d+)$")
_NAME_WIDTH = 40
_FLOAT_FIELDS = frozenset(f.name for f in dataclasses.fields(BottleneckReport) if f.type == "float")
_REQUIRED_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(BottleneckReport)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)


class _BadInput(Exception):
    """One input that cannot be reported; the message names it and says what is wrong."""


# --------------------------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    """Run the ``fitprof`` command.

    Args:
        argv: the arguments after the program name (``sys.argv[1:]`` when ``None``).

    Returns:
        The exit status: 0 when every input was reported, 2 for bad arguments, no arguments (help is printed),
        or any input that could not be reported (each named on one stderr line; the good ones are still
        reported).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits for --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_BAD_INPUT)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


def _parser() -> argparse.ArgumentParser:
    from fitprof import __version__

    parser = argparse.ArgumentParser(
        prog="fitprof",
        description="Where does the training step time go? Tables from fitprof runs or from trace files.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
        p.add_argument("--out", metavar="FILE", help="write the output to FILE instead of stdout")

    rep = sub.add_parser(
        "report",
        help="one row per run, epoch and rank of the fitprof runs below LOGDIR",
        description="Print the bottleneck figures the fitprof callbacks logged for every run below LOGDIR "
        "(folders holding plugins/fitprof/<session>.rank<r>.json), one row per run, epoch and rank.",
    )
    rep.add_argument("logdir", metavar="LOGDIR", help="a log folder (searched at any depth)")
    common(rep)
    rep.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also save the step-time breakdown per epoch (stacked: input wait, host-to-device, other/compute)",
    )
    rep.set_defaults(handler=_cmd_report)

    ana = sub.add_parser(
        "analyze",
        help="analyse trace files (.xplane.pb, .pt.trace.json[.gz]) or plugins/profile/<session> folders",
        description="Analyse trace files, recorded by fitprof or not: *.xplane.pb, *.pt.trace.json, "
        "*.json.gz, or a plugins/profile/<session> folder (its *.xplane.pb files). One row per file; "
        "with several ranks' traces, also the spread across ranks and the slowest rank.",
    )
    ana.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or session folders")
    common(ana)
    ana.add_argument("--top-k", type=_positive_int, default=5, metavar="N", help="operators to rank (default: 5)")
    ana.set_defaults(handler=_cmd_analyze)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _error(message: str) -> None:
    """One line on stderr (whitespace in the message, e.g. a reader's newline, is collapsed)."""
    print(f"fitprof: error: {' '.join(message.split())}", file=sys.stderr)


def _describe(path: str | os.PathLike[str], err: BaseException) -> str:
    """``<path>: <what is wrong>``, without repeating the path when the message starts with it already."""
    where = os.fspath(path)
    if isinstance(err, OSError) and err.strerror:
        what = err.strerror.lower()
    else:
        what = str(err) or type(err).__name__
    if where in what:
        return what
    return f"{where}: {what}"


# ------------------------------------------------------------------------------------------------- analyze


def _cmd_analyze(args: argparse.Namespace) -> int:
    records: list[dict[str, Any]] = []
    bad = False
    for arg in args.traces:
        try:
            files = _trace_files(Path(arg))
        except _BadInput as err:
            _error(str(err))
            bad = True
            continue
        for path in files:
            try:
                report = _analyze_file(path, args.top_k)
            except (TraceError, OSError, ValueError, ImportError) as err:
                _error(_describe(path, err))
                bad = True
                continue
            except Exception as err:  # a reader bug on odd input: still one line, never a traceback
                _error(f"{path}: could not analyse ({type(err).__name__}: {err})")
                bad = True
                continue
            records.append(_record(report, record=RECORD_TRACE, run=os.fspath(path), epoch=None, rank=report.rank))
    records += _spreads(records, key=lambda r: (r["world_size"],), label=_analyze_spread_label)
    return _finish(args, records, bad)


def _trace_files(path: Path) -> list[Path]:
    """The trace files one ``analyze`` argument stands for (a file, or a session folder's ``*.xplane.pb``)."""
    if path.is_dir():
        files = sorted(path.glob("*.xplane.pb"))
        if not files:
            raise _BadInput(
                f"{path}: no .xplane.pb file in this folder (analyze takes trace files or a "
                "plugins/profile/<session> folder; for a log folder use 'fitprof report')"
            )
        return files
    if not path.exists():
        raise _BadInput(f"{path}: no such file or folder")
    return [path]


def _analyze_file(path: Path, top_k: int) -> BottleneckReport:
    """:func:`fitprof.analyze` plus the rank: from the trace's ``distributedInfo`` (Kineto) or, for an XSpace,
    from a ``_rank<N>`` suffix of the file name (how fitprof names a multi-rank run's ``.xplane.pb``)."""
    report = analyze(path, top_k=top_k)
    if report.rank is None and trace_format(path) == "xspace":
        m = _RANK_IN_NAME.search(path.name.removesuffix(".xplane.pb"))
        report.rank = int(m.group(1)) if m else None
    return report


def _analyze_spread_label(group: list[dict[str, Any]]) -> str:
    ws = group[0]["world_size"]
    return f"ranks of world size {ws}" if ws is not None else "ranks"


# -------------------------------------------------------------------------------------------------- report


def _cmd_report(args: argparse.Namespace) -> int:
    logdir = Path(args.logdir)
    if not logdir.exists():
        _error(f"{logdir}: no such folder")
        return EXIT_BAD_INPUT
    if not logdir.is_dir():
        _error(f"{logdir}: not a folder (report takes a log folder; for a trace file use 'fitprof analyze')")
        return EXIT_BAD_INPUT
    files = find_report_files(logdir)
    if not files:
        _error(
            f"{logdir}: no fitprof run found (no plugins/fitprof/<session>.rank<r>.json below it; "
            "for other profiles use 'fitprof analyze')"
        )
        return EXIT_BAD_INPUT
    records: list[dict[str, Any]] = []
    bad = False
    for path in files:
        try:
            records.append(_window_record(path, logdir))
        except (_BadInput, OSError, ValueError) as err:
            _error(_describe(path, err))
            bad = True
    _number_fits(records)
    records.sort(key=lambda r: (r["run"], r["fit"], r["epoch"], -1 if r["rank"] is None else r["rank"]))
    records += _spreads(records, key=lambda r: (r["run"], r["fit"], r["epoch"]), label=_fit_labeller(records))
    status = _finish(args, records, bad)
    if args.plot and any(r["record"] == RECORD_WINDOW for r in records):
        try:
            here = logdir.resolve().name or os.fspath(logdir)  # a title better than "." for LOGDIR itself
            windows = [{**r, "run": here} if r["run"] == "." else r for r in records if r["record"] == RECORD_WINDOW]
            plot_breakdown(windows, args.plot)
        except (OSError, ValueError, ImportError) as err:
            _error(_describe(args.plot, err))
            return EXIT_BAD_INPUT
    return status


def find_report_files(logdir: str | os.PathLike[str]) -> list[Path]:
    """Every ``<run>/plugins/fitprof/*.json`` report file below ``logdir`` (any depth), sorted."""
    found = []
    for path in Path(logdir).rglob("*.json"):
        if path.parent.name == REPORTS_DIR[1] and path.parent.parent.name == REPORTS_DIR[0] and path.is_file():
            found.append(path)
    return sorted(found)


def _window_record(path: Path, logdir: Path) -> dict[str, Any]:
    """The row of one ``fitprof_report.json`` (see :mod:`fitprof._reportfile`)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise _BadInput(f"{path}: not a fitprof report (not UTF-8 text)") from None
    except json.JSONDecodeError as err:
        raise _BadInput(f"{path}: not a fitprof report (not valid JSON: {err})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("report"), dict):
        raise _BadInput(f"{path}: not a fitprof report (no 'report' object)")
    report = _report_from_dict(doc["report"], path)
    epoch, rank = doc.get("epoch"), doc.get("rank", report.rank)
    if not isinstance(epoch, int) or not (rank is None or isinstance(rank, int)):
        raise _BadInput(f"{path}: not a fitprof report ('epoch' or 'rank' is not an integer)")
    if doc.get("framework"):
        report.framework = str(doc["framework"])
    run = path.parent.parent.parent
    trace = doc.get("trace")
    source = os.path.normpath(run / trace) if isinstance(trace, str) and trace else report.source
    rec = _record(report, record=RECORD_WINDOW, run=run.relative_to(logdir).as_posix(), epoch=epoch, rank=rank)
    rec["source"] = source
    rec["report_file"] = os.fspath(path)
    session = doc.get("session")
    rec["session"] = session if isinstance(session, str) and session else path.name.partition(".rank")[0]
    return rec


_SESSION_SUFFIX = re.compile(r"^(.*?)(?:_(\d+))?$")


def _session_order(session: str) -> tuple[str, int]:
    """Sort key of a session name ``YYYY_MM_DD_HH_MM_SS[_n]``: its time, then ``n`` as a number (``_10`` after
    ``_9``)."""
    m = _SESSION_SUFFIX.match(session)
    stamp, n = (m.group(1), int(m.group(2))) if m and m.group(2) and len(m.group(1)) >= 19 else (session, 0)
    return stamp, n


def _number_fits(records: list[dict[str, Any]]) -> None:
    """Set ``fit`` (1, 2, ...) on the window records: several ``fit`` calls into one run directory each write
    their windows there, epochs counted from their own start.

    Per run and rank, windows in session (time) order: a window whose epoch is not after the previous window's
    starts the next fit. (A resumed fit that goes on counting epochs reads as the same fit: its rows differ by
    epoch.)
    """
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault((rec["run"], rec["rank"]), []).append(rec)
    for group in groups.values():
        group.sort(key=lambda r: (_session_order(r["session"]), r["epoch"]))
        fit, last = 1, None
        for rec in group:
            if last is not None and rec["epoch"] <= last:
                fit += 1
            rec["fit"], last = fit, rec["epoch"]


def _several_fits(rows: Iterable[dict[str, Any]]) -> bool:
    return any((r.get("fit") or 1) > 1 for r in rows)


def _fit_labeller(records: list[dict[str, Any]]) -> Callable[[list[dict[str, Any]]], str]:
    """The spread label of a group of rows: its run, and its fit when the run holds several."""
    several = {r["run"] for r in records if (r.get("fit") or 1) > 1}

    def label(group: list[dict[str, Any]]) -> str:
        run = group[0]["run"]
        return f"{run} (fit {group[0]['fit']})" if run in several else run

    return label


def _report_from_dict(data: dict[str, Any], path: Path) -> BottleneckReport:
    """Rebuild a :class:`BottleneckReport` from its ``to_dict()`` (``null`` -> NaN; unknown keys ignored)."""
    missing = [name for name in _REQUIRED_FIELDS if name not in data]
    if missing:
        raise _BadInput(f"{path}: not a fitprof report (the report lacks {', '.join(missing)})")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(BottleneckReport):
        if f.name not in data:
            continue
        value = data[f.name]
        if f.name in _FLOAT_FIELDS:
            value = _float(value, f.name, path)
        kwargs[f.name] = value
    ops = kwargs.get("top_ops")
    if not isinstance(ops, list) or not all(isinstance(o, dict) and "name" in o for o in ops):
        raise _BadInput(f"{path}: not a fitprof report ('top_ops' is not a list of operators)")
    kwargs["top_ops"] = [
        OpStat(
            str(o["name"]),
            _float(o.get("self_ms_per_step"), "self_ms_per_step", path),
            _float(o.get("percent"), "percent", path),
        )
        for o in ops
    ]
    if not isinstance(kwargs.get("advice"), list) or not isinstance(kwargs.get("steps_analyzed"), int):
        raise _BadInput(f"{path}: not a fitprof report ('advice' or 'steps_analyzed' has the wrong type)")
    return BottleneckReport(**kwargs)


def _float(value: Any, name: str, path: Path) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _BadInput(f"{path}: not a fitprof report ({name!r} is {value!r}, not a number)")
    return float(value)


# ------------------------------------------------------------------------------------------------- records


def _record(report: BottleneckReport, *, record: str, run: str, epoch: int | None, rank: int | None) -> dict[str, Any]:
    """One output record: where it comes from, then every :class:`BottleneckReport` field and its headline."""
    fields = report.to_dict()
    fields["rank"] = rank
    out: dict[str, Any] = {"record": record, "run": run, "epoch": epoch, "fit": None, "session": None}
    out.update({k: fields[k] for k in _LEADING_KEYS if k in fields})
    out.update(fields)
    out["headline"] = report.headline()
    return out


def _spreads(
    records: list[dict[str, Any]],
    *,
    key: Callable[[dict[str, Any]], tuple[Any, ...]],
    label: Callable[[list[dict[str, Any]]], str],
) -> list[dict[str, Any]]:
    """A spread record for every group (by ``key``) of rows that holds two ranks or more with a step time."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rec in records:
        if rec["record"] != RECORD_SPREAD and rec["rank"] is not None and _finite(rec["step_time_ms"]):
            groups.setdefault(key(rec), []).append(rec)
    out = []
    for group in groups.values():
        if len({r["rank"] for r in group}) < 2:
            continue
        slowest = max(group, key=lambda r: r["step_time_ms"])
        fastest = min(group, key=lambda r: r["step_time_ms"])
        with_input = [r for r in group if _finite(r["input_percent"])]
        inputs = [r["input_percent"] for r in with_input]
        step_spread = slowest["step_time_ms"] - fastest["step_time_ms"]
        input_spread = max(inputs) - min(inputs) if inputs else math.nan
        most_input = max(with_input, key=lambda r: r["input_percent"]) if with_input else slowest
        # Synchronous training (DDP, MultiWorkerMirrored) makes fast ranks wait in the all-reduce, so step times
        # come out alike; a rank that waits for its input much more than the others is then the straggler.
        straggler = most_input if _finite(input_spread) and input_spread >= STRAGGLER_INPUT_SPREAD else slowest
        out.append(
            {
                "record": RECORD_SPREAD,
                "run": label(group),
                "epoch": group[0]["epoch"],
                "rank": None,
                "world_size": group[0]["world_size"],
                "ranks": sorted({r["rank"] for r in group}),
                "step_time_ms_spread": step_spread,
                "input_percent_spread": input_spread,
                "slowest_rank": slowest["rank"],
                "slowest_step_time_ms": slowest["step_time_ms"],
                "slowest_source": slowest["source"],
                "fastest_rank": fastest["rank"],
                "fastest_step_time_ms": fastest["step_time_ms"],
                "most_input_bound_rank": most_input["rank"],
                "input_percent_max": most_input["input_percent"],
                "straggler_rank": straggler["rank"],
                "headline": (
                    f"straggler: rank {straggler['rank']}"
                    + (
                        f" (input {most_input['input_percent']:.1f}% of its step time, {input_spread:.1f} points "
                        "more than the least input-bound rank)"
                        if straggler is most_input and straggler is not slowest
                        else ""
                    )
                    + f"; slowest step: rank {slowest['rank']}, {slowest['step_time_ms']:.2f} ms/step, "
                    f"{step_spread:.2f} ms more than rank {fastest['rank']} ({fastest['step_time_ms']:.2f} ms); "
                    f"input share spread {_fmt(input_spread, '.1f')} points."
                ),
            }
        )
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _public(rec: dict[str, Any]) -> dict[str, Any]:
    """The record as strict JSON (NaN and infinities -> ``None``)."""
    return dict(clean_json(rec))


# -------------------------------------------------------------------------------------------------- output


def _finish(args: argparse.Namespace, records: list[dict[str, Any]], bad: bool) -> int:
    """Render ``records`` and write them to ``--out`` or stdout; nothing at all when there is no record."""
    status = EXIT_BAD_INPUT if bad else EXIT_OK
    if not records:
        return EXIT_BAD_INPUT
    text = render(records, args.format)
    if args.out:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as err:
            _error(_describe(args.out, err))
            return EXIT_BAD_INPUT
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return status


def render(records: Sequence[dict[str, Any]], fmt: str) -> str:
    """The records as text in one of :data:`FORMATS`.

    Args:
        records: rows built by ``report`` / ``analyze`` (trace or window records, then spread records).
        fmt: ``"table"``, ``"markdown"``, ``"json"`` or ``"csv"``.

    Returns:
        The text, ending in a newline.

    Raises:
        ValueError: for an unknown format.
    """
    if fmt == "json":
        return json.dumps([_public(r) for r in records], indent=2, allow_nan=False) + "\n"
    if fmt == "csv":
        return _csv(records)
    if fmt in ("table", "markdown"):
        return _text(records, markdown=fmt == "markdown")
    raise ValueError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")


_CSV_COLUMNS = (
    "record",
    "run",
    "epoch",
    "rank",
    "world_size",
    "framework",
    "steps_analyzed",
    "step_time_ms",
    "input_ms_per_step",
    "input_percent",
    "htod_ms_per_step",
    "htod_percent",
    "htod_gbps",
    "collective_percent",
    "top_op",
    "top_op_ms_per_step",
    "top_op_percent",
    "verdict",
    "headline",
    "advice",
    "source",
    "fit",
    "session",
)
_CSV_SPREAD_COLUMNS = (
    "ranks",
    "step_time_ms_spread",
    "input_percent_spread",
    "slowest_rank",
    "slowest_step_time_ms",
    "fastest_rank",
    "fastest_step_time_ms",
    "slowest_source",
    "most_input_bound_rank",
    "input_percent_max",
    "straggler_rank",
)
_INT_COLUMNS = (
    "epoch",
    "fit",
    "rank",
    "world_size",
    "steps_analyzed",
    "slowest_rank",
    "fastest_rank",
    "most_input_bound_rank",
    "straggler_rank",
)


def _csv(records: Sequence[dict[str, Any]]) -> str:
    import pandas as pd

    rows = []
    for rec in records:
        row = {k: v for k, v in rec.items() if k in _CSV_COLUMNS or k in _CSV_SPREAD_COLUMNS}
        ops = rec.get("top_ops") or []
        if rec["record"] != RECORD_SPREAD:
            row["top_op"] = ops[0]["name"] if ops else ""
            row["top_op_ms_per_step"] = ops[0]["self_ms_per_step"] if ops else math.nan
            row["top_op_percent"] = ops[0]["percent"] if ops else math.nan
            row["advice"] = " ".join(rec.get("advice") or [])
        if "ranks" in row:
            row["ranks"] = " ".join(str(r) for r in row["ranks"])
        rows.append(row)
    columns = list(_CSV_COLUMNS)
    if any(r["record"] == RECORD_SPREAD for r in records):
        columns += _CSV_SPREAD_COLUMNS
    frame = pd.DataFrame(rows, columns=columns)
    for col in _INT_COLUMNS:
        if col in frame:
            frame[col] = frame[col].astype("Int64")
    buf = io.StringIO()
    frame.to_csv(buf, index=False, lineterminator="\n")
    return buf.getvalue()


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _short(name: str, width: int = _NAME_WIDTH) -> str:
    """``name`` on one line (:func:`fitprof.analysis.one_line`), cut in the middle to ``width`` characters (both
    ends of op and kernel names say something)."""
    name = one_line(name)
    if len(name) <= width:
        return name
    head = (width - 1) // 3
    return name[:head] + "…" + name[len(name) - (width - 1 - head) :]


def _text(records: Sequence[dict[str, Any]], *, markdown: bool) -> str:
    """The aligned table (or Markdown table), then per run: each row's headline and the run's advice."""
    rows = [r for r in records if r["record"] != RECORD_SPREAD]
    spreads = [r for r in records if r["record"] == RECORD_SPREAD]
    ranks = {r["rank"] for r in rows if r["rank"] is not None}
    show_rank = len(ranks) > 1 or bool(ranks - {0})
    show_epoch = any(r["epoch"] is not None for r in rows)
    show_fit = _several_fits(rows)  # several fits into one run directory: tell them apart
    header = ["run"]
    header += ["fit", "session"] * show_fit + ["epoch"] * show_epoch + ["rank"] * show_rank
    header += ["framework", "steps", "step ms", "input %", "HtoD ms/step", "HtoD %", "top op", "top %", "verdict"]
    body = []
    for r in rows:
        top = r["top_ops"][0] if r["top_ops"] else None
        cells = [r["run"]]
        cells += [_fmt(r.get("fit"), "d"), r.get("session") or "-"] * show_fit
        cells += [_fmt(r["epoch"], "d")] * show_epoch + [_fmt(r["rank"], "d")] * show_rank
        cells += [
            r["framework"] or "-",
            str(r["steps_analyzed"]),
            _fmt(r["step_time_ms"], ".2f"),
            _fmt(r["input_percent"], ".1f"),
            _fmt(r["htod_ms_per_step"], ".3f"),
            _fmt(r["htod_percent"], ".1f"),
            _short(top["name"]) if top else "-",
            _fmt(top["percent"], ".1f") if top else "-",
            r["verdict"],
        ]
        body.append(cells)
    left = {"run", "session", "framework", "top op", "verdict"}
    lines = _markdown_table(header, body, left) if markdown else _plain_table(header, body, left)
    lines.append("")
    for run, group in _by_run(rows):
        lines += [f"**{_md_escape(run)}**", ""] if markdown else [run]
        bullet = "- " if markdown else "  "
        for r in group:
            where = []
            if show_fit and r.get("fit") is not None:
                where.append(f"fit {r['fit']} ({r['session']})")
            if r["epoch"] is not None:
                where.append(f"epoch {r['epoch']}")
            if show_rank and r["rank"] is not None:
                where.append(f"rank {r['rank']}")
            prefix = f"{', '.join(where)}: " if where else ""
            lines.append(f"{bullet}{prefix}{r['headline']}")
        notes = _unique(w for r in group for w in r.get("warnings") or [])
        lines += [f"{bullet}note: {w}" for w in notes]
        latest = {r["verdict"]: r for r in group}  # per verdict, the advice of its last row (it names that op)
        for verdict, r in latest.items():
            if r.get("advice"):
                lines.append(f"{bullet}advice ({verdict}):")
                lines += [f"  - {a}" if markdown else f"    - {a}" for a in r["advice"]]
        lines.append("")
    if spreads:
        lines += (
            ["**Rank spread** (max - min across ranks)", ""] if markdown else ["Rank spread (max - min across ranks)"]
        )
        for s in spreads:
            epoch = f", epoch {s['epoch']}" if s["epoch"] is not None else ""
            lines.append(
                f"{'- ' if markdown else '  '}{s['run']}{epoch}: step time spread "
                f"{_fmt(s['step_time_ms_spread'], '.2f')} ms, input share spread "
                f"{_fmt(s['input_percent_spread'], '.1f')} points; slowest: rank {s['slowest_rank']} "
                f"({_fmt(s['slowest_step_time_ms'], '.2f')} ms/step, {s['slowest_source']}); "
                f"straggler: rank {s['straggler_rank']}"
            )
        lines.append("")
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def _plain_table(header: list[str], body: list[list[str]], left: set[str]) -> list[str]:
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if h in left else c.rjust(w) for c, w, h in zip(cells, widths, header, strict=True)
        ).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(row) for row in body)]


def _md_escape(text: str) -> str:
    return text.replace("|", r"\|")


def _markdown_table(header: list[str], body: list[list[str]], left: set[str]) -> list[str]:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(_md_escape(c) for c in cells) + " |"

    rule = "|" + "|".join("---" if h in left else "---:" for h in header) + "|"
    return [line(header), rule, *(line(row) for row in body)]


def _by_run(rows: Iterable[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["run"], []).append(r)
    return list(groups.items())


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


# ---------------------------------------------------------------------------------------------------- plot


def plot_breakdown(records: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Save the step-time breakdown of each window as stacked bars, one panel per run.

    Each bar is one epoch (and rank, when a run has several); its segments, in ms per step, are
    ``"input wait"`` (``input_ms_per_step``), ``"host-to-device"`` (``htod_ms_per_step``) and
    ``"other/compute"`` (``step_time_ms`` less the two, at least 0). A window without steps gets an empty bar
    marked "no steps".

    Args:
        records: window records (``fitprof report`` rows).
        path: the image file; the format follows its extension (``.png``).

    Raises:
        ImportError: if matplotlib is not installed.
        OSError: if the file cannot be written.
        ValueError: if there is no record or matplotlib cannot save to that file type.
    """
    if not records:
        raise ValueError("nothing to plot")
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            f"--plot needs matplotlib, which is not installed: pip install 'fitprof[plot]' ({err})"
        ) from None

    runs = _by_run(records)
    fig = Figure(figsize=(max(6.0, 1.2 + 0.9 * max(len(g) for _, g in runs)), 1.2 + 3.0 * len(runs)), dpi=100)
    fig.set_layout_engine("constrained")
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    colors = {"input wait": "tab:orange", "host-to-device": "tab:green", "other/compute": "tab:blue"}
    for ax, (run, group) in zip(axes, runs, strict=True):
        several_ranks = len({r["rank"] for r in group}) > 1
        several_fits = _several_fits(group)
        labels: list[str] = []
        parts: dict[str, list[float]] = {name: [] for name in SEGMENTS}
        totals: list[float] = []
        for r in group:
            label = str(r["epoch"]) if r["epoch"] is not None else "-"
            label = f"{label}\nfit {r['fit']}" if several_fits else label
            labels.append(f"{label}\nrank {r['rank']}" if several_ranks else label)
            step = r["step_time_ms"] if _finite(r["step_time_ms"]) else 0.0
            inp = r["input_ms_per_step"] if _finite(r["input_ms_per_step"]) else 0.0
            htod = r["htod_ms_per_step"] if _finite(r["htod_ms_per_step"]) else 0.0
            parts["input wait"].append(inp)
            parts["host-to-device"].append(htod)
            parts["other/compute"].append(max(step - inp - htod, 0.0))
            totals.append(step)
        x = list(range(len(group)))
        bottom = [0.0] * len(group)
        for name in SEGMENTS:
            ax.bar(x, parts[name], bottom=bottom, color=colors[name], label=name, width=0.6)
            bottom = [b + v for b, v in zip(bottom, parts[name], strict=True)]
        top = max(totals) if any(totals) else 1.0
        for xi, total, r in zip(x, totals, group, strict=True):
            text = f"{total:.2f} ms" if _finite(r["step_time_ms"]) else "no steps"
            ax.text(xi, total + 0.02 * top, text, ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, top * 1.18)
        ax.set_xticks(x, labels)
        half, middle = max(len(x), 3) / 2, (len(x) - 1) / 2  # bars keep their width with one or two epochs
        ax.set_xlim(middle - half, middle + half)
        ax.set_xlabel("epoch / rank" if several_ranks else "epoch")
        ax.set_ylabel("time per step (ms)")
        ax.set_title(f"run: {run}")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside upper center", ncols=len(SEGMENTS), frameon=False)
    fig.savefig(os.fspath(path))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

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
    ``--scheduler ADDRESS`` analyses each file as one task on a Dask distributed cluster (:mod:`fitprof._dask`):
    the workers read the files (absolute paths, or URLs through fsspec) and only the reports come back.

Output formats (``--format``): ``table`` (default, aligned text, then each row's verdict line and the advice),
``markdown`` (the same as a Markdown table), ``json`` (a list of records; numbers in the units their names
say, NaN as ``null``) and ``csv`` (one flat row per record, the top operator only).

Bad input (a missing path, a truncated, corrupt or foreign file, a trace past ``--max-trace-mb`` /
``--max-events``, a report file that leads outside ``LOGDIR``) gives one ``fitprof: error: <path>: <what>``
line on stderr per file and exit status 2; the other files are still reported. Nothing is printed or
written when no file could be reported. This module imports no framework.

``LOGDIR`` and ``TRACE`` may be URLs (``s3://``, ``gs://``, ``hdfs://``, ``memory://``...; ``file://`` is a
local path): the files the command needs (the report files, the named traces) are copied through fsspec into a
temporary folder and read there; every path printed names the URL. A scheme whose package (e.g. ``s3fs``) is
missing is one error line naming the package.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fitprof import _fs, analyze
from fitprof._dask import DEFAULT_CONNECT_TIMEOUT_S, SchedulerError, scheduler_map
from fitprof._parallel import auto_jobs, default_jobs, ordered_map
from fitprof._session import trigger_step
from fitprof.analysis import BottleneckReport
from fitprof.cli.plot import SEGMENTS, plot_breakdown
from fitprof.cli.render import FORMATS, RECORD_EPOCH, RECORD_SPREAD, RECORD_TRACE, RECORD_WINDOW, finite, render
from fitprof.cross_rank import RankFigures, Spread, spread
from fitprof.metrics import EPOCH_PREFIX
from fitprof.report_files import (
    ReportFileError,
    find_epoch_files,
    find_report_files,
    is_epoch_file,
    is_report_file,
    read_epoch_file,
    read_report_file,
)
from fitprof.traces import TraceError
from fitprof.traces._limits import DEFAULT_MAX_EVENTS, DEFAULT_MAX_TRACE_MB

EXIT_OK = 0
EXIT_BAD_INPUT = 2

_LEADING_KEYS = ("record", "run", "epoch", "rank", "world_size", "framework")


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
    urls = [a for a in [getattr(args, "logdir", None), *(getattr(args, "traces", None) or [])] if a is not None]
    with contextlib.ExitStack() as stack:
        # A temporary folder only when there is a URL to copy: local paths are read where they are.
        tmp = (
            stack.enter_context(tempfile.TemporaryDirectory(prefix="fitprof-cli-"))
            if any(map(_fs.is_remote, urls))
            else ""
        )
        bad = _fetch_urls(args, Path(tmp))
        if bad and getattr(args, "logdir", None) is not None:
            return EXIT_BAD_INPUT
        try:
            status = handler(args)
        finally:
            _SHOWN.clear()
    return EXIT_BAD_INPUT if bad else status


_SHOWN: dict[str, str] = {}
"""Local copy -> the URL it came from, while a command reads URLs (:func:`_fetch_urls`)."""


def _shown(text: str) -> str:
    """``text`` with each local copy's path replaced by its URL."""
    for local in sorted(_SHOWN, key=len, reverse=True):
        text = text.replace(local, _SHOWN[local])
    return text


def _fetch_urls(args: argparse.Namespace, tmp: Path) -> bool:
    """Copy what the URL arguments name into ``tmp`` (through fsspec) and point ``args`` at the copies; a
    ``file://`` URL becomes its path. Returns whether an argument could not be fetched (its error printed)."""
    bad = False
    if getattr(args, "logdir", None) is not None:
        if _fs.is_remote(args.logdir):
            url = args.logdir.rstrip("/")
            local = tmp / (url.rpartition("/")[2] or "logdir")  # its name: the --plot title of LOGDIR itself
            local.mkdir()
            try:  # only the report and per-epoch files: a few KB per window, about 1 KB per epoch
                _fs.fetch(url, local, lambda rel: is_report_file(rel) or is_epoch_file(rel))
            except (OSError, ValueError) as err:
                _error(_describe(url, err))
                bad = True
            _SHOWN[os.fspath(local)] = url
            args.logdir = os.fspath(local)
        else:
            args.logdir = _fs.local_path(args.logdir)
    traces = []
    for n, arg in enumerate(getattr(args, "traces", None) or []):
        if not _fs.is_remote(arg) or getattr(args, "scheduler", None):  # a cluster's workers read URLs themselves
            traces.append(_fs.local_path(arg))
            continue
        local = tmp / str(n)
        local.mkdir()
        try:  # a trace file, or a session folder's *.xplane.pb
            files = _fs.fetch(arg, local, lambda rel: "/" not in rel and rel.endswith(".xplane.pb"))
        except (OSError, ValueError) as err:
            _error(_describe(arg, err))
            bad = True
            continue
        if len(files) == 1 and files[0][0] == arg:  # one file
            _SHOWN[os.fspath(files[0][1])] = arg
            traces.append(os.fspath(files[0][1]))
        else:
            _SHOWN[os.fspath(local)] = arg.rstrip("/")
            traces.append(os.fspath(local))
    if hasattr(args, "traces"):
        args.traces = traces
    return bad


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
        p.add_argument(
            "--jobs",
            type=_positive_int,
            default=None,
            metavar="N",
            help="read the files in N parallel processes; the output is the same for any N (default: the cores, "
            f"{default_jobs()} here, when the files hold 32 MB or more, else 1)",
        )

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
    ana.add_argument(
        "--max-trace-mb",
        type=_positive_float,
        default=DEFAULT_MAX_TRACE_MB,
        metavar="MB",
        help=f"refuse a trace bigger than MB, inflated for a .gz (default: {DEFAULT_MAX_TRACE_MB:g})",
    )
    ana.add_argument(
        "--max-events",
        type=_positive_int,
        default=DEFAULT_MAX_EVENTS,
        metavar="N",
        help=f"refuse a trace with more than N events (default: {DEFAULT_MAX_EVENTS:,})",
    )
    ana.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="analyse each file on the Dask cluster whose scheduler is ADDRESS (tcp://host:8786); its workers read "
        "the files (a shared filesystem or URLs) and send back only the per-file reports; needs "
        "pip install 'fitprof[dask]'; not with --jobs",
    )
    ana.add_argument(
        "--scheduler-timeout",
        type=_positive_float,
        default=DEFAULT_CONNECT_TIMEOUT_S,
        metavar="S",
        help=f"give up reaching the scheduler after S seconds (default: {DEFAULT_CONNECT_TIMEOUT_S:g})",
    )
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


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def _error(message: str) -> None:
    """One line on stderr (whitespace in the message, e.g. a reader's newline, is collapsed)."""
    print(f"fitprof: error: {' '.join(_shown(message).split())}", file=sys.stderr)


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
    if args.scheduler is not None and args.jobs is not None:
        _error(
            f"--scheduler {args.scheduler} and --jobs {args.jobs} exclude each other: --scheduler runs the files "
            "on the Dask cluster's workers, --jobs in local processes; give one of them"
        )
        return EXIT_BAD_INPUT
    work: list[Path | str | _BadInput] = []  # the files (paths, or URLs for --scheduler) and bad arguments
    for arg in args.traces:
        try:
            work += _remote_trace_files(arg) if _fs.is_remote(arg) else _trace_files(Path(arg))
        except _BadInput as err:
            work.append(err)
    tasks = [(p, args.top_k, args.max_trace_mb, args.max_events) for p in work if not isinstance(p, _BadInput)]
    if args.scheduler is not None:
        try:
            done = _analyze_on_cluster(tasks, args.scheduler, args.scheduler_timeout)
        except (SchedulerError, ImportError) as err:
            _error(str(err))
            return EXIT_BAD_INPUT
    else:
        done = ordered_map(_analyze_task, tasks, args.jobs or auto_jobs([t[0] for t in tasks]))
    results = iter(done)
    records: list[dict[str, Any]] = []
    bad = False
    for item in work:
        report, error = (None, str(item)) if isinstance(item, _BadInput) else next(results)
        if report is None:
            _error(error or "")
            bad = True
            continue
        records.append(_record(report, record=RECORD_TRACE, run=str(item), epoch=None, rank=report.rank))
    records += _spreads(records, key=lambda r: (r["world_size"],), label=_analyze_spread_label)
    return _finish(args, records, bad)


def _analyze_task(task: tuple[Path | str, int, float, int]) -> tuple[BottleneckReport | None, str | None]:
    """The report of one file, or the error line that says why there is none (run in a ``--jobs`` worker or on
    a ``--scheduler`` cluster's worker: a URL is copied into a temporary folder there and read from it)."""
    path, top_k, max_trace_mb, max_events = task
    if isinstance(path, str):
        return _analyze_url(path, top_k, max_trace_mb, max_events)
    try:
        return analyze(path, top_k=top_k, max_trace_mb=max_trace_mb, max_events=max_events), None
    except (TraceError, OSError, ValueError, ImportError) as err:
        return None, _describe(path, err)
    except Exception as err:  # a reader bug on odd input: still one line, never a traceback
        return None, f"{path}: could not analyse ({type(err).__name__}: {err})"


def _analyze_on_cluster(
    tasks: list[tuple[Path | str, int, float, int]], address: str, connect_timeout_s: float
) -> list[tuple[BottleneckReport | None, str | None]]:
    """:func:`_analyze_task` of every task on the Dask cluster at ``address``, in order. The workers get absolute
    paths (their working folder is not ours); the reports and error lines name each path as it was given.

    Raises:
        SchedulerError, ModuleNotFoundError: see :func:`fitprof._dask.scheduler_map`.
    """
    sent = [(p.absolute() if isinstance(p, Path) else p, k, mb, n) for p, k, mb, n in tasks]
    done = scheduler_map(_analyze_task, sent, address, connect_timeout_s=connect_timeout_s)
    out: list[tuple[BottleneckReport | None, str | None]] = []
    for given, there, (report, error) in zip((t[0] for t in tasks), (t[0] for t in sent), done, strict=True):
        if there != given:
            if report is not None:
                report = dataclasses.replace(report, source=os.fspath(given))
            if error is not None:
                error = error.replace(os.fspath(there), os.fspath(given))
        out.append((report, error))
    return out


def _analyze_url(
    url: str, top_k: int, max_trace_mb: float, max_events: int
) -> tuple[BottleneckReport | None, str | None]:
    """:func:`_analyze_task` for one trace file at a URL, on the worker that runs it: the file is copied through
    fsspec into a temporary folder, analysed, and deleted; the report and the error line name the URL."""
    with tempfile.TemporaryDirectory(prefix="fitprof-worker-") as tmp:
        try:
            fetched = _fs.fetch(url, Path(tmp), lambda rel: "/" not in rel)
        except (OSError, ValueError) as err:
            return None, _describe(url, err)
        if len(fetched) != 1 or fetched[0][0] != url:  # a folder (the client lists a folder's files)
            return None, f"{url}: not a trace file"
        local = fetched[0][1]
        report, error = _analyze_task((local, top_k, max_trace_mb, max_events))
    if report is not None:
        report = dataclasses.replace(report, source=url)
    return report, None if error is None else error.replace(os.fspath(local), url)


def _remote_trace_files(url: str) -> list[str | _BadInput]:
    """The trace files one ``analyze`` URL argument stands for, as URLs (``--scheduler`` only; without it, URLs
    are copied here before the command runs): the file, or a session folder's ``*.xplane.pb`` (listed here,
    read by the workers)."""
    try:
        fs, root = _fs.open_fsspec(url)
        if fs.isfile(root):
            return [url]
        if not fs.isdir(root):
            return [_BadInput(f"{url}: no such file or folder")]
        names = sorted(n.rstrip("/").rpartition("/")[2] for n in fs.ls(root, detail=False))
    except (OSError, ValueError) as err:
        return [_BadInput(_describe(url, err))]
    files: list[str | _BadInput] = [_fs.join(url, n) for n in names if n.endswith(".xplane.pb")]
    return files or [
        _BadInput(
            f"{url}: no .xplane.pb file in this folder (analyze takes trace files or a plugins/profile/<session> "
            "folder; for a log folder use 'fitprof report')"
        )
    ]


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
    epoch_files = find_epoch_files(logdir)
    if not files and not epoch_files:
        _error(
            f"{logdir}: no fitprof run found (no plugins/fitprof/<session>.rank<r>.json nor epochs.rank<r>.jsonl "
            "below it; for other profiles use 'fitprof analyze')"
        )
        return EXIT_BAD_INPUT
    records: list[dict[str, Any]] = []
    bad = False
    jobs = args.jobs or (auto_jobs(files) if files else 1)
    for record, error in ordered_map(_report_task, [(path, logdir) for path in files], jobs):
        if record is None:
            _error(error or "")
            bad = True
        else:
            records.append(record)
    _number_fits(records)
    records.sort(
        key=lambda r: (
            r["run"],
            r["fit"],
            r["epoch"],
            -1 if r["trigger_step"] is None else r["trigger_step"],  # the scheduled window, then triggered ones
            -1 if r["rank"] is None else r["rank"],
        )
    )
    # Cross-rank spreads of the scheduled windows only: each rank triggers on its own signal, at its own step.
    scheduled = [r for r in records if r["trigger_step"] is None]
    records += _spreads(scheduled, key=lambda r: (r["run"], r["fit"], r["epoch"]), label=_fit_labeller(records))
    for path in epoch_files:
        try:
            records += _epoch_records(path, logdir)
        except (ReportFileError, OSError) as err:
            _error(_describe(path, err) if isinstance(err, OSError) else str(err))
            bad = True
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


def _report_task(task: tuple[Path, Path]) -> tuple[dict[str, Any] | None, str | None]:
    """The row of one report file, or the error line that says why there is none (run in a ``--jobs`` worker)."""
    path, logdir = task
    try:
        return _window_record(path, logdir), None
    except (ReportFileError, OSError, ValueError) as err:
        return None, _describe(path, err)


def _window_record(path: Path, logdir: Path) -> dict[str, Any]:
    """The row of one report file (see :mod:`fitprof.report_files`), read with its bounds: the file stays inside
    ``logdir``, and so does the trace path it names (else the row's source is the report's own)."""
    doc = read_report_file(path, logdir=logdir)
    run = doc.run.relative_to(logdir).as_posix()
    rec = _record(doc.report, record=RECORD_WINDOW, run=run, epoch=doc.epoch, rank=doc.rank)
    rec["source"] = doc.trace
    rec["report_file"] = os.fspath(path)
    rec["session"] = doc.session or path.name.partition(".rank")[0]
    rec["trigger_step"] = trigger_step(rec["session"])  # a window the slowdown trigger opened; None: scheduled
    rec["_written"] = doc.written
    return rec


def _epoch_records(path: Path, logdir: Path) -> list[dict[str, Any]]:
    """The rows of one per-epoch file (:func:`fitprof.report_files.read_epoch_file`): where each epoch's wall
    time went, its CPU use and verdicts, the ``fitprof/epoch/`` prefix dropped from the figures' keys."""
    out = []
    for rec in read_epoch_file(path, logdir=logdir):
        row: dict[str, Any] = {
            "record": RECORD_EPOCH,
            "run": rec.run.relative_to(logdir).as_posix(),
            "fit": rec.fit,
            "epoch": rec.epoch,
            "rank": rec.rank,
            "framework": rec.framework,
        }
        row.update({k.removeprefix(EPOCH_PREFIX): v for k, v in rec.figures.items()})
        row["verdicts"] = rec.verdicts
        out.append(row)
    out.sort(key=lambda r: (r["run"], r["fit"], r["epoch"], r["rank"]))
    return out


_SESSION_SUFFIX = re.compile(r"^(.*?)(?:_(\d+))?$")


def _session_order(session: str) -> tuple[str, int]:
    """Sort key of a session name ``YYYY_MM_DD_HH_MM_SS[_n]``: its time, then ``n`` as a number (``_10`` after
    ``_9``)."""
    m = _SESSION_SUFFIX.match(session)
    if m and m.group(2) and len(m.group(1)) >= 19:
        return m.group(1), int(m.group(2))
    return session, 0


def _number_fits(records: list[dict[str, Any]]) -> None:
    """Set ``fit`` (1, 2, ...) on the window records: several ``fit`` calls into one run directory each write
    their windows there, epochs counted from their own start.

    Per run and rank, windows in the order they were written (the report file's ``written`` time; for files
    without it, session-name order): a window whose epoch is before the previous window's starts the next fit,
    and so does a scheduled window in the epoch of the previous one when this fit has a scheduled window in that
    epoch already. A window the slowdown trigger opened (``trigger_step`` set, session ``*_trigger_step<S>``) is
    written in the same epoch as its fit's scheduled window (after it: both are analysed at the epoch's end), so
    it starts a new fit only when its epoch is before the previous window's. (Session names carry the second and
    the epoch, so two fits within one second cannot be told apart by their names alone; two fits whose only
    windows were triggered in the same epoch read as one.) (A resumed fit that goes on counting epochs reads as
    the same fit: its rows differ by epoch.)
    """
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault((rec["run"], rec["rank"]), []).append(rec)
    for group in groups.values():
        if all(math.isfinite(r.get("_written", math.nan)) for r in group):
            group.sort(key=lambda r: r["_written"])
        else:
            group.sort(key=lambda r: (_session_order(r["session"]), r["epoch"]))
        fit, last, scheduled = 1, None, False  # scheduled: this fit has a scheduled window in epoch ``last``
        for rec in group:
            triggered = rec.get("trigger_step") is not None
            if last is not None and (rec["epoch"] < last or (rec["epoch"] == last and not triggered and scheduled)):
                fit += 1
                scheduled = False
            elif rec["epoch"] != last:
                scheduled = False
            scheduled = scheduled or not triggered
            rec["fit"], last = fit, rec["epoch"]
    for rec in records:
        rec.pop("_written", None)  # an ordering key only, not a figure


def _fit_labeller(records: list[dict[str, Any]]) -> Callable[[list[dict[str, Any]]], str]:
    """The spread label of a group of rows: its run, and its fit when the run holds several."""
    several = {r["run"] for r in records if (r.get("fit") or 1) > 1}

    def label(group: list[dict[str, Any]]) -> str:
        run = group[0]["run"]
        return f"{run} (fit {group[0]['fit']})" if run in several else run

    return label


# ------------------------------------------------------------------------------------------------- records


def _record(report: BottleneckReport, *, record: str, run: str, epoch: int | None, rank: int | None) -> dict[str, Any]:
    """One output record: where it comes from, then every :class:`BottleneckReport` field and its headline."""
    fields = report.to_dict()
    fields["rank"] = rank
    out: dict[str, Any] = {
        "record": record,
        "run": run,
        "epoch": epoch,
        "fit": None,
        "session": None,
        "trigger_step": None,
    }
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
    """A spread record (:func:`fitprof.cross_rank.spread`) for every group (by ``key``) of rows that holds two
    ranks or more with a step time."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rec in records:
        if rec["record"] != RECORD_SPREAD and rec["rank"] is not None and finite(rec["step_time_ms"]):
            groups.setdefault(key(rec), []).append(rec)
    out = []
    for group in groups.values():
        s = spread([RankFigures(r["rank"], r["step_time_ms"], r["input_percent"]) for r in group])
        if s is None:
            continue
        source = next(r["source"] for r in group if r["rank"] == s.slowest.rank)
        out.append(
            {
                "record": RECORD_SPREAD,
                "run": label(group),
                "epoch": group[0]["epoch"],
                "rank": None,
                "world_size": group[0]["world_size"],
                "ranks": list(s.ranks),
                "step_time_ms_spread": s.step_time_ms_spread,
                "input_percent_spread": s.input_percent_spread,
                "slowest_rank": s.slowest.rank,
                "slowest_step_time_ms": s.slowest.step_time_ms,
                "slowest_source": source,
                "fastest_rank": s.fastest.rank,
                "fastest_step_time_ms": s.fastest.step_time_ms,
                "most_input_bound_rank": s.most_input_bound.rank,
                "input_percent_max": s.most_input_bound.input_percent,
                "straggler_rank": s.straggler.rank,
                "headline": _spread_headline(s),
            }
        )
    return out


def _spread_headline(s: Spread) -> str:
    """One line: the straggler, why, the slowest and fastest rank and the input-share spread."""
    why = (
        f" (input {s.most_input_bound.input_percent:.1f}% of its step time, {s.input_percent_spread:.1f} points "
        "more than the least input-bound rank)"
        if s.straggler_by_input
        else ""
    )
    input_spread = format(s.input_percent_spread, ".1f") if finite(s.input_percent_spread) else "-"
    return (
        f"straggler: rank {s.straggler.rank}{why}; slowest step: rank {s.slowest.rank}, "
        f"{s.slowest.step_time_ms:.2f} ms/step, {s.step_time_ms_spread:.2f} ms more than rank {s.fastest.rank} "
        f"({s.fastest.step_time_ms:.2f} ms); input share spread {input_spread} points."
    )


# -------------------------------------------------------------------------------------------------- output


def _finish(args: argparse.Namespace, records: list[dict[str, Any]], bad: bool) -> int:
    """Render ``records`` and write them to ``--out`` or stdout; nothing at all when there is no record."""
    status = EXIT_BAD_INPUT if bad else EXIT_OK
    if not records:
        return EXIT_BAD_INPUT
    if _SHOWN:  # name the URLs, not the local copies
        records = [{k: _shown(v) if isinstance(v, str) else v for k, v in r.items()} for r in records]
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


__all__ = ["EXIT_BAD_INPUT", "EXIT_OK", "FORMATS", "SEGMENTS", "main", "render"]

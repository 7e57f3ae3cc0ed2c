"""``fitprof analyze TRACE...``: one record per trace file (``*.xplane.pb``, ``*.pt.trace.json[.gz]``, a
``plugins/profile/<session>`` folder's ``*.xplane.pb``, or a ``torch.profiler.tensorboard_trace_handler`` folder's
``*.pt.trace.json[.gz]``), recorded by fitprof or not, with the same figures as :func:`fitprof.analyze`; with
several ranks' traces, a spread record across them. The files are read here, in ``--jobs`` processes, or as tasks
on a Dask cluster (``--scheduler``).

``tensorboard_trace_handler`` names each window's file ``<worker>.<time_ns>.pt.trace.json[.gz]`` (the worker
``<host>_<pid>`` unless named): in such a folder each file is a record, ``window`` numbers a worker's files in time
order (0, 1, ...), and a trace without a rank of its own (no ``distributedInfo``) takes its worker's place among
the folder's workers as its rank, so that the spread compares the workers window by window.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from fitprof import _fs, analyze
from fitprof.analysis import BottleneckReport
from fitprof.cli._dask import DEFAULT_CONNECT_TIMEOUT_S, SchedulerError, scheduler_map
from fitprof.cli._parallel import auto_jobs, ordered_map
from fitprof.cli.arguments import NumberOption, add_number_options, add_output_options, positive_float, positive_int
from fitprof.cli.output import EXIT_BAD_INPUT, BadInput, Output, describe
from fitprof.cli.records import make_record, spreads
from fitprof.cli.render import RECORD_TRACE
from fitprof.traces import TraceError
from fitprof.traces._limits import DEFAULT_MAX_EVENTS, DEFAULT_MAX_TRACE_MB

HELP = "analyse trace files (.xplane.pb, .pt.trace.json[.gz]) or plugins/profile/<session> folders"
"""The line ``fitprof --help`` gives ``analyze``."""

DESCRIPTION = (
    "Analyse trace files, recorded by fitprof or not: *.xplane.pb, *.pt.trace.json, "
    "*.json.gz, or a plugins/profile/<session> folder (its *.xplane.pb files). One row per file; "
    "with several ranks' traces, also the spread across ranks and the slowest rank."
)
"""What ``fitprof analyze --help`` says it does."""

LIMITS = (
    NumberOption("--top-k N", positive_int, 5, "operators to rank"),
    NumberOption(
        "--max-trace-mb MB", positive_float, DEFAULT_MAX_TRACE_MB, "refuse a trace bigger than MB, inflated for a .gz"
    ),
    NumberOption("--max-events N", positive_int, DEFAULT_MAX_EVENTS, "refuse a trace with more than N events", ","),
)
"""What ``analyze`` ranks and the bounds it reads a trace within (:mod:`fitprof.traces._limits`)."""

SCHEDULER_TIMEOUT = NumberOption(
    "--scheduler-timeout S", positive_float, DEFAULT_CONNECT_TIMEOUT_S, "give up reaching the scheduler after S seconds"
)
"""How long ``--scheduler`` waits to reach the cluster; listed after it."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``analyze`` arguments: the traces, the output options, the limits and the Dask cluster."""
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or session folders")
    add_output_options(p)
    add_number_options(p, LIMITS)
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="analyse each file on the Dask cluster whose scheduler is ADDRESS (tcp://host:8786); its workers read "
        "the files (a shared filesystem or URLs) and send back only the per-file reports; needs "
        "pip install 'fitprof[dask]'; not with --jobs",
    )
    add_number_options(p, [SCHEDULER_TIMEOUT])


def run(args: argparse.Namespace, out: Output) -> int:
    """Analyse the traces ``args`` names and print their records; the exit status."""
    if args.scheduler is not None and args.jobs is not None:
        out.error(
            f"--scheduler {args.scheduler} and --jobs {args.jobs} exclude each other: --scheduler runs the files "
            "on the Dask cluster's workers, --jobs in local processes; give one of them"
        )
        return EXIT_BAD_INPUT
    work: list[Path | str | BadInput] = []  # the files (paths, or URLs for --scheduler) and bad arguments
    for arg in args.traces:
        try:
            work += _remote_trace_files(arg) if _fs.is_remote(arg) else _trace_files(Path(arg))
        except BadInput as err:
            work.append(err)
    tasks = [(p, args.top_k, args.max_trace_mb, args.max_events) for p in work if not isinstance(p, BadInput)]
    if args.scheduler is not None:
        try:
            done = _analyze_on_cluster(tasks, args.scheduler, args.scheduler_timeout)
        except (SchedulerError, ImportError) as err:
            out.error(str(err))
            return EXIT_BAD_INPUT
    else:
        done = ordered_map(_analyze_task, tasks, args.jobs or auto_jobs([t[0] for t in tasks]))
    results = iter(done)
    records: list[dict[str, Any]] = []
    for item in work:
        report, error = (None, str(item)) if isinstance(item, BadInput) else next(results)
        if report is None:
            out.skip(error or "")
            continue
        records.append(make_record(report, record=RECORD_TRACE, run=str(item), epoch=None, rank=report.rank))
    _workers_as_ranks(records)
    records += spreads(
        records, key=lambda r: (r["world_size"], r.get("_folder"), r.get("window")), label=_analyze_spread_label
    )
    for rec in records:
        rec.pop("_folder", None)  # a grouping key only
    return out.finish(args, records)


HANDLER_NAME = re.compile(r"^(?P<worker>.+)\.(?P<ns>\d{6,})\.pt\.trace\.json(?:\.gz)?$")
"""A file ``torch.profiler.tensorboard_trace_handler`` wrote: ``<worker>.<time.time_ns()>.pt.trace.json[.gz]``."""


def _workers_as_ranks(records: list[dict[str, Any]]) -> None:
    """Number the windows of each ``tensorboard_trace_handler`` worker (``window``: 0, 1, ... in time order) and,
    in a folder of several workers, give a trace without a rank its worker's place as its rank (world size: the
    workers), so the spread compares the workers' same windows. Other records are left as they are."""
    folders: dict[str, dict[str, list[tuple[int, dict[str, Any]]]]] = {}
    for rec in records:
        path = Path(rec["run"])
        m = HANDLER_NAME.match(path.name)
        if m:
            workers = folders.setdefault(os.fspath(path.parent), {})
            workers.setdefault(m.group("worker"), []).append((int(m.group("ns")), rec))
    for folder, workers in folders.items():
        names = sorted(workers)
        for place, name in enumerate(names):
            for window, (_, rec) in enumerate(sorted(workers[name], key=lambda t: t[0])):
                rec["window"] = window
                rec["worker"] = name
                rec["_folder"] = folder
                if rec["rank"] is None and len(names) > 1:
                    rec["rank"], rec["world_size"] = place, len(names)


def _analyze_task(task: tuple[Path | str, int, float, int]) -> tuple[BottleneckReport | None, str | None]:
    """The report of one file, or the error line that says why there is none (run in a ``--jobs`` worker or on
    a ``--scheduler`` cluster's worker: a URL is copied into a temporary folder there and read from it)."""
    path, top_k, max_trace_mb, max_events = task
    if isinstance(path, str):
        return _analyze_url(path, top_k, max_trace_mb, max_events)
    try:
        return analyze(path, top_k=top_k, max_trace_mb=max_trace_mb, max_events=max_events), None
    except (TraceError, OSError, ValueError, ImportError) as err:
        return None, describe(path, err)
    except Exception as err:  # a reader bug on odd input: still one line, never a traceback
        return None, f"{path}: could not analyse ({type(err).__name__}: {err})"


def _analyze_on_cluster(
    tasks: list[tuple[Path | str, int, float, int]], address: str, connect_timeout_s: float
) -> list[tuple[BottleneckReport | None, str | None]]:
    """:func:`_analyze_task` of every task on the Dask cluster at ``address``, in order. The workers get absolute
    paths (their working folder is not ours); the reports and error lines name each path as it was given.

    Raises:
        SchedulerError, ModuleNotFoundError: see :func:`fitprof.cli._dask.scheduler_map`.
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
            return None, describe(url, err)
        if len(fetched) != 1 or fetched[0][0] != url:  # a folder (the client lists a folder's files)
            return None, f"{url}: not a trace file"
        local = fetched[0][1]
        report, error = _analyze_task((local, top_k, max_trace_mb, max_events))
    if report is not None:
        report = dataclasses.replace(report, source=url)
    return report, None if error is None else error.replace(os.fspath(local), url)


def _remote_trace_files(url: str) -> list[str | BadInput]:
    """The trace files one ``analyze`` URL argument stands for, as URLs (``--scheduler`` only; without it, URLs
    are copied here before the command runs): the file, or a session folder's ``*.xplane.pb`` (listed here,
    read by the workers)."""
    try:
        fs, root = _fs.open_fsspec(url)
        if fs.isfile(root):
            return [url]
        if not fs.isdir(root):
            return [BadInput(f"{url}: no such file or folder")]
        names = sorted(n.rstrip("/").rpartition("/")[2] for n in fs.ls(root, detail=False))
    except (OSError, ValueError) as err:
        return [BadInput(describe(url, err))]
    files: list[str | BadInput] = [_fs.join(url, n) for n in folder_traces(names)]
    return files or [BadInput(f"{url}: {NO_TRACE_IN_FOLDER}")]


def folder_traces(names: list[str]) -> list[str]:
    """The trace files of a folder, by name: its ``*.xplane.pb`` (a ``plugins/profile/<session>`` folder), else
    its ``*.pt.trace.json[.gz]`` (a ``tensorboard_trace_handler`` folder, or Kineto traces side by side)."""
    xplanes = sorted(n for n in names if n.endswith(".xplane.pb"))
    return xplanes or sorted(n for n in names if n.endswith((".pt.trace.json", ".pt.trace.json.gz")))


NO_TRACE_IN_FOLDER = (
    "no trace file in this folder (analyze takes trace files, a plugins/profile/<session> folder of .xplane.pb, or "
    "a folder of .pt.trace.json[.gz] such as torch.profiler.tensorboard_trace_handler writes; for a log folder "
    "of fitprof runs use 'fitprof report')"
)


def _trace_files(path: Path) -> list[Path]:
    """The trace files one ``analyze`` argument stands for (a file, or a folder's traces: :func:`folder_traces`)."""
    if path.is_dir():
        files = [path / n for n in folder_traces([p.name for p in path.iterdir() if p.is_file()])]
        if not files:
            raise BadInput(f"{path}: {NO_TRACE_IN_FOLDER}")
        return files
    if not path.exists():
        raise BadInput(f"{path}: no such file or folder")
    return [path]


def _analyze_spread_label(group: list[dict[str, Any]]) -> str:
    ws = group[0]["world_size"]
    label = f"ranks of world size {ws}" if ws is not None else "ranks"
    folder, window = group[0].get("_folder"), group[0].get("window")
    return label if folder is None else f"{folder} (workers), window {window}: {label}"

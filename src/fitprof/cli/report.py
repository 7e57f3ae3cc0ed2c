"""``fitprof report LOGDIR``: one record per run, fit, epoch, window and rank of the fitprof runs below ``LOGDIR``
(the report files the callbacks wrote, ``plugins/fitprof/<session>.rank<r>.json``): exactly the figures the
callback logged; a spread record per group of ranks, and with ``--plot`` the step-time breakdown per epoch. Then
one ``epoch`` record per epoch and rank from the per-epoch files (``plugins/fitprof/epochs.rank<r>.jsonl``): where
each epoch's wall time went, and its verdicts.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fitprof._profile_jobs import finish_here, leftover_line
from fitprof._session import trigger_step
from fitprof.cli._parallel import auto_jobs, ordered_map
from fitprof.cli.arguments import add_output_options
from fitprof.cli.output import EXIT_BAD_INPUT, Output, describe
from fitprof.cli.plot import plot_breakdown
from fitprof.cli.records import make_record, spreads
from fitprof.cli.render import RECORD_EPOCH, RECORD_FIT, RECORD_WINDOW
from fitprof.metrics import EPOCH_PREFIX, FIT_PREFIX
from fitprof.report_files import (
    ReportFileError,
    find_epoch_files,
    find_report_files,
    read_epoch_file,
    read_report_file,
)

HELP = "one row per run, epoch and rank of the fitprof runs below LOGDIR"
"""The line ``fitprof --help`` gives ``report``."""

DESCRIPTION = (
    "Print the bottleneck figures the fitprof callbacks logged for every run below LOGDIR "
    "(folders holding plugins/fitprof/<session>.rank<r>.json), one row per run, epoch and rank."
)
"""What ``fitprof report --help`` says it does."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``report`` arguments: the log folder, the output options and ``--plot``."""
    p.add_argument("logdir", metavar="LOGDIR", help="a log folder (searched at any depth)")
    add_output_options(p)
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also save the step-time breakdown per epoch (stacked: input wait, host-to-device, other/compute)",
    )


def run(args: argparse.Namespace, out: Output) -> int:
    """Print the records of the runs below ``args.logdir``; the exit status."""
    logdir = Path(args.logdir)
    if not logdir.exists():
        out.error(f"{logdir}: no such folder")
        return EXIT_BAD_INPUT
    if not logdir.is_dir():
        out.error(f"{logdir}: not a folder (report takes a log folder; for a trace file use 'fitprof analyze')")
        return EXIT_BAD_INPUT
    # the .xplane.pb conversions a killed converter (or a restart) left below LOGDIR: done now, and said
    line = leftover_line(*finish_here(logdir), by="report")
    if line:
        print(line, file=sys.stderr)  # stderr, as the other notes: stdout stays the records
    files = find_report_files(logdir)
    epoch_files = find_epoch_files(logdir)
    if not files and not epoch_files:
        folders = _trace_folders(logdir)
        where = " ".join(shlex.quote(os.fspath(f)) for f in folders[:3]) + (" ..." if len(folders) > 3 else "")
        out.error(
            f"{logdir}: no fitprof run found (no plugins/fitprof/<session>.rank<r>.json nor epochs.rank<r>.jsonl "
            "below it); "
            + (
                f"its traces are read by: fitprof analyze {where}"
                if folders
                else "for other profiles use 'fitprof analyze'"
            )
        )
        return EXIT_BAD_INPUT
    records: list[dict[str, Any]] = []
    jobs = args.jobs or (auto_jobs(files) if files else 1)
    for record, error in ordered_map(_report_task, [(path, logdir) for path in files], jobs):
        if record is None:
            out.skip(error or "")
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
    records += spreads(scheduled, key=lambda r: (r["run"], r["fit"], r["epoch"]), label=_fit_labeller(records))
    notes: list[str] = []  # lines left out of files otherwise read
    for path in epoch_files:
        try:
            records += _epoch_records(path, logdir, notes.append)
        except ReportFileError as err:
            out.skip(str(err))
        except OSError as err:
            out.skip(describe(path, err))
    if not records and not out.skipped:  # else each file left out is named, and why
        out.error(_nothing_readable(logdir, epoch_files))
        return EXIT_BAD_INPUT
    for note in notes:
        out.warning(note)
    status = out.finish(args, records)
    if args.plot and any(r["record"] == RECORD_WINDOW for r in records):
        try:
            here = logdir.resolve().name or os.fspath(logdir)  # a title better than "." for LOGDIR itself
            windows = [{**r, "run": here} if r["run"] == "." else r for r in records if r["record"] == RECORD_WINDOW]
            epochs = [{**r, "run": here} if r["run"] == "." else r for r in records if r["record"] == RECORD_EPOCH]
            plot_breakdown(windows, args.plot, epochs)
        except (OSError, ValueError, ImportError) as err:
            out.error(describe(args.plot, err))
            return EXIT_BAD_INPUT
        # on stderr, as the other notes: stdout stays the records (csv, json) a script parses
        print(f"fitprof: plot saved to {os.path.abspath(args.plot)}", file=sys.stderr)
    return status


_TRACE_SUFFIXES = (".xplane.pb", ".pt.trace.json", ".pt.trace.json.gz")


def _trace_folders(logdir: Path) -> list[Path]:
    """The folders below ``logdir`` (any depth) that hold trace files ``fitprof analyze`` reads: a
    ``tensorboard_trace_handler`` folder, a ``plugins/profile/<session>`` folder; sorted."""
    found = set()
    for folder, _, names in os.walk(logdir):
        if any(n.endswith(_TRACE_SUFFIXES) for n in names):
            found.add(Path(folder))
    return sorted(found)


def _report_task(task: tuple[Path, Path]) -> tuple[dict[str, Any] | None, str | None]:
    """The row of one report file, or the error line that says why there is none (run in a ``--jobs`` worker)."""
    path, logdir = task
    try:
        return _window_record(path, logdir), None
    except (ReportFileError, OSError, ValueError) as err:
        return None, describe(path, err)


def _window_record(path: Path, logdir: Path) -> dict[str, Any]:
    """The row of one report file (see :mod:`fitprof.report_files`), read with its bounds: the file stays inside
    ``logdir``, and so does the trace path it names (else the row's source is the report's own)."""
    doc = read_report_file(path, logdir=logdir)
    run = doc.run.relative_to(logdir).as_posix()
    rec = make_record(doc.report, record=RECORD_WINDOW, run=run, epoch=doc.epoch, rank=doc.rank)
    rec["source"] = doc.trace
    rec["report_file"] = os.fspath(path)
    rec["session"] = doc.session or path.name.partition(".rank")[0]
    rec["trigger_step"] = trigger_step(rec["session"])  # a window the slowdown trigger opened; None: scheduled
    rec["_written"] = doc.written
    return rec


def _nothing_readable(logdir: Path, epoch_files: list[Path]) -> str:
    """The one line of a log folder whose fitprof files were all read and hold no record: per-epoch files with no
    line (a run creates its file at its first epoch's end: one with no line stopped first, or could not write it)."""
    return (
        f"{logdir}: nothing readable: {len(epoch_files)} per-epoch file(s) found, with no epoch record in them (a run "
        "that stopped before its first epoch ended, or could not write its log folder, e.g. a full disk)"
    )


def _epoch_records(path: Path, logdir: Path, warn: Callable[[str], None]) -> list[dict[str, Any]]:
    """The rows of one per-epoch file (:func:`fitprof.report_files.read_epoch_file`; ``warn`` is told of the lines
    left out): where each epoch's wall time went, its CPU use and verdicts, the ``fitprof/epoch/`` prefix dropped
    from the figures' keys."""
    out = []
    fits: list[Any] = []
    for rec in read_epoch_file(path, logdir=logdir, warn=warn, fits=fits):
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
    for rec in fits:  # each fit's own line, after its epochs
        fit_row: dict[str, Any] = {
            "record": RECORD_FIT,
            "run": rec.run.relative_to(logdir).as_posix(),
            "fit": rec.fit,
            "epoch": rec.epoch,
            "rank": rec.rank,
            "framework": rec.framework,
        }
        fit_row.update({k.removeprefix(FIT_PREFIX): v for k, v in rec.figures.items()})
        out.append(fit_row)
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

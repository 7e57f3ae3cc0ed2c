"""The ``fitprof`` command's entry point: the parser, its subcommands, and the URL arguments copied to local files
before a subcommand runs.

Each subcommand is a module of this package (a :class:`Command`): its help line and description, the arguments it
adds to its parser, and the function that runs it; :data:`COMMANDS` names them, and :func:`build_parser` makes
each one's parser.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Protocol

from fitprof import _fs
from fitprof.cli import analyze, baseline, compare, mcp, report
from fitprof.cli.output import EXIT_BAD_INPUT, Output, describe
from fitprof.report_files import is_epoch_file, is_report_file

TRACE_SUFFIXES = (".xplane.pb", ".pt.trace.json", ".pt.trace.json.gz")
"""The trace files a folder URL given to ``analyze`` is searched for (:func:`fitprof.cli.analyze.folder_traces`)."""


class Command(Protocol):
    """What a subcommand's module holds."""

    HELP: str
    """Its line in ``fitprof --help``."""
    DESCRIPTION: str
    """What its own ``--help`` says it does."""

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        """Add its arguments to its parser."""

    def run(self, args: argparse.Namespace, out: Output) -> int:
        """Run it on the parsed ``args``, printing through ``out``; the exit status."""


COMMANDS: dict[str, Command] = {
    "report": report,
    "analyze": analyze,
    "compare": compare,
    "baseline": baseline,
    "mcp": mcp,
}
"""The subcommands by name, in the order ``fitprof --help`` lists them. A new subcommand is a module holding what
:class:`Command` names, and one entry here."""


def main(argv: list[str] | None = None) -> int:
    """Run the ``fitprof`` command.

    Args:
        argv: the arguments after the program name (``sys.argv[1:]`` when ``None``).

    Returns:
        The exit status: 0 when something was reported (each input that could not be is named on one
        ``fitprof: warning:`` line), 2 for bad arguments, no arguments (help is printed), nothing that could be
        reported, or, under ``--strict``, any input that could not be.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits for --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_BAD_INPUT)
    urls = [a for a in [getattr(args, "logdir", None), *(getattr(args, "traces", None) or [])] if a is not None]
    with contextlib.ExitStack() as stack:
        # A temporary folder only when there is a URL to copy: local paths are read where they are.
        tmp = (
            stack.enter_context(tempfile.TemporaryDirectory(prefix="fitprof-cli-"))
            if any(map(_fs.is_remote, urls))
            else ""
        )
        out = Output()
        if fetch_urls(args, Path(tmp), out):  # the log folder could not be fetched: nothing to report
            return EXIT_BAD_INPUT
        status: int = args.run(args, out)
    return status


def fetch_urls(args: argparse.Namespace, tmp: Path, out: Output) -> bool:
    """Copy what the URL arguments name into ``tmp`` (through fsspec) and point ``args`` at the copies; a
    ``file://`` URL becomes its path; ``out`` learns which URL each copy stands for, and which trace URLs could
    not be fetched (:meth:`~fitprof.cli.output.Output.skip`). Returns whether the log folder could not be fetched
    (its error printed)."""
    bad = False
    if getattr(args, "logdir", None) is not None:
        if _fs.is_remote(args.logdir):
            url = args.logdir.rstrip("/")
            local = tmp / (url.rpartition("/")[2] or "logdir")  # its name: the --plot title of LOGDIR itself
            local.mkdir()
            try:  # only the report files: a few KB per window
                _fs.fetch(url, local, lambda rel: is_report_file(rel) or is_epoch_file(rel))
            except (OSError, ValueError) as err:
                out.error(describe(url, err))
                bad = True
            out.urls[os.fspath(local)] = url
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
        try:  # a trace file, or a folder's traces (a session's *.xplane.pb, a trace handler's *.pt.trace.json[.gz])
            files = _fs.fetch(arg, local, lambda rel: "/" not in rel and rel.endswith(TRACE_SUFFIXES))
        except (OSError, ValueError) as err:
            out.skip(describe(arg, err))  # one input among others: the subcommand reports it with the rest
            continue
        if len(files) == 1 and files[0][0] == arg:  # one file
            out.urls[os.fspath(files[0][1])] = arg
            traces.append(os.fspath(files[0][1]))
        else:
            out.urls[os.fspath(local)] = arg.rstrip("/")
            traces.append(os.fspath(local))
    if hasattr(args, "traces"):
        args.traces = traces
    return bad


def build_parser() -> argparse.ArgumentParser:
    """The ``fitprof`` parser with every subcommand of :data:`COMMANDS`."""
    from fitprof import __version__

    parser = argparse.ArgumentParser(
        prog="fitprof",
        description="Where does the training step time go? Tables from fitprof runs or from trace files.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.HELP, description=command.DESCRIPTION)
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser

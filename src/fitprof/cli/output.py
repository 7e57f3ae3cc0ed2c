"""What the ``fitprof`` command prints: one line per bad input, the records in the chosen format, and every path as
the user named it (a URL, not the local copy read in its place).

A file that cannot be read among others that can (a run killed mid-write leaves one) is skipped with one
``fitprof: warning:`` line naming it, and the command exits 0: the good files are the answer. It is an error (exit
status 2) when nothing could be reported, or for every such file under ``--strict``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from fitprof._atomic import write_text
from fitprof.cli.render import render

EXIT_OK = 0
EXIT_BAD_INPUT = 2


class BadInput(Exception):
    """One input that cannot be reported; the message names it and says what is wrong."""


def describe(path: str | os.PathLike[str], err: BaseException) -> str:
    """``<path>: <what is wrong>``, without repeating the path when the message starts with it already."""
    where = os.fspath(path)
    if isinstance(err, OSError) and err.strerror:
        what = err.strerror.lower()
    else:
        what = str(err) or type(err).__name__
    if where in what:
        return what
    return f"{where}: {what}"


class Output:
    """The output of one run of the command.

    A command that reads URLs reads local copies of them (:func:`fitprof.cli.command.fetch_urls`); ``urls`` maps
    each copy's path to the URL it came from, so that every line printed names the URL. One instance per run:
    nothing of one run is left for the next (``main`` may be called many times in one process).
    """

    def __init__(self) -> None:
        self.urls: dict[str, str] = {}
        self.skipped: list[str] = []

    def shown(self, text: str) -> str:
        """``text`` with each local copy's path replaced by its URL."""
        for local in sorted(self.urls, key=len, reverse=True):
            text = text.replace(local, self.urls[local])
        return text

    def error(self, message: str) -> None:
        """One line on stderr (whitespace in the message, e.g. a reader's newline, is collapsed)."""
        print(f"fitprof: error: {' '.join(self.shown(message).split())}", file=sys.stderr)

    def warning(self, message: str) -> None:
        """One ``fitprof: warning:`` line on stderr (whitespace collapsed as in :meth:`error`)."""
        print(f"fitprof: warning: {' '.join(self.shown(message).split())}", file=sys.stderr)

    def skip(self, message: str) -> None:
        """One input file that cannot be reported (``message`` names it and says why); :meth:`finish` prints it,
        as a warning when other records were reported, else (or under ``--strict``) as an error."""
        self.skipped.append(message)

    def finish(self, args: argparse.Namespace, records: list[dict[str, Any]], bad: bool = False) -> int:
        """Print the skipped files (:meth:`skip`), then render ``records`` and write them to ``--out`` or stdout;
        nothing at all when there is no record.

        Returns:
            The exit status: :data:`EXIT_BAD_INPUT` when ``bad``, there is no record, a file was skipped under
            ``--strict``, or ``--out`` cannot be written, else :data:`EXIT_OK`.
        """
        strict = bool(getattr(args, "strict", False))
        for message in self.skipped:
            if records and not strict:
                self.warning(f"{message} (skipped)")
            else:
                self.error(message)
        status = EXIT_BAD_INPUT if bad or (strict and self.skipped) else EXIT_OK
        if not records:
            return EXIT_BAD_INPUT
        if self.urls:  # name the URLs, not the local copies
            records = [{k: self.shown(v) if isinstance(v, str) else v for k, v in r.items()} for r in records]
        text = render(records, args.format)
        if args.out:
            try:
                write_text(args.out, text)  # whole or not at all, as every file fitprof leaves
            except OSError as err:
                self.error(describe(args.out, err))
                return EXIT_BAD_INPUT
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
        return status

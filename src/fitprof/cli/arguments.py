"""The argument types, the options every ``fitprof`` subcommand shares (``--format``, ``--out``, ``--jobs``,
``--strict``) and the one way a numeric option is declared (:func:`add_number_option`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from fitprof.cli._parallel import default_jobs
from fitprof.cli.render import FORMATS


def positive_int(text: str) -> int:
    """``text`` as an integer >= 1, else :class:`argparse.ArgumentTypeError` naming it."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _number(text: str, allowed: str, ok: Callable[[float], bool]) -> float:
    """``text`` as a finite number for which ``ok`` holds, else :class:`argparse.ArgumentTypeError` saying
    ``allowed`` and naming it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None
    if not math.isfinite(value) or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {allowed}, got {text}")
    return value


def positive_float(text: str) -> float:
    """``text`` as a finite number > 0, else :class:`argparse.ArgumentTypeError` naming it."""
    return _number(text, "a number > 0", lambda value: value > 0)


def non_negative_float(text: str) -> float:
    """``text`` as a finite number >= 0, else :class:`argparse.ArgumentTypeError` naming it."""
    return _number(text, "a number >= 0", lambda value: value >= 0)


def add_number_option(
    p: argparse.ArgumentParser,
    usage: str,
    kind: Callable[[str], float] | Callable[[str], int],
    default: float,
    help: str,
    shown: str = "g",
) -> None:
    """A numeric option on a subcommand's parser, ``usage`` as its help shows it (``"--top-k N"``: the flag and its
    metavar): ``kind`` checks the text (:func:`positive_int`, ...), and the help ends with ``(default: ...)``, the
    default formatted by ``shown`` (``"g"``, ``","``), so that what the help says is the default the parser uses."""
    flag, metavar = usage.split()
    p.add_argument(flag, type=kind, default=default, metavar=metavar, help=f"{help} (default: {default:{shown}})")


def add_format_options(p: argparse.ArgumentParser, formats: tuple[str, ...] = FORMATS) -> None:
    """``--format`` (one of ``formats``, default ``table``) and ``--out`` on a subcommand's parser."""
    p.add_argument("--format", choices=formats, default="table", help="output format (default: table)")
    p.add_argument("--out", metavar="FILE", help="write the output to FILE instead of stdout")


def add_output_options(p: argparse.ArgumentParser) -> None:
    """``--format``, ``--out``, ``--jobs`` and ``--strict`` on a subcommand's parser."""
    add_format_options(p)
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        metavar="N",
        help="read the files in N parallel processes; the output is the same for any N (default: the cores, "
        f"{default_jobs()} here, when the files hold 32 MB or more, else 1)",
    )
    add_strict_option(p)


def add_strict_option(p: argparse.ArgumentParser) -> None:
    """``--strict`` on a subcommand's parser: an unreadable file among readable ones is an error, not a skip
    (:meth:`fitprof.cli.output.Output.finish`)."""
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit with status 2 when any file cannot be read (default: such a file is skipped with a warning "
        "naming it, and the status is 2 only when nothing could be reported)",
    )

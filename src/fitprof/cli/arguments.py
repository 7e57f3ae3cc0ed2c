"""The argument types, the options every ``fitprof`` subcommand shares (``--format``, ``--out``, ``--jobs``,
``--strict``) and the one way a numeric option is declared: a :class:`NumberOption` row in its subcommand's table,
put on the parser by :func:`add_number_options`."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterable

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


@dataclasses.dataclass(frozen=True)
class NumberOption:
    """One numeric option of a subcommand: a row of its table, so that its flag, check, default and help are
    declared once and the help states the default the parser uses.

    Attributes:
        usage: the flag and its metavar as the help shows them (``"--top-k N"``).
        kind: checks the text (:func:`positive_int`, :func:`positive_float`, :func:`non_negative_float`).
        default: the value when the option is not given.
        help: what the option does; the help line adds ``(default: ...)``.
        shown: the format spec of the default in the help (``"g"``; ``","`` groups thousands).
    """

    usage: str
    kind: Callable[[str], float] | Callable[[str], int]
    default: float
    help: str
    shown: str = "g"


def add_number_options(p: argparse.ArgumentParser, options: Iterable[NumberOption]) -> None:
    """Each of ``options`` on a subcommand's parser, in order (the order ``--help`` lists them in); the help of
    each ends with ``(default: ...)``, its default formatted by its ``shown``."""
    for option in options:
        flag, metavar = option.usage.split()
        p.add_argument(
            flag,
            type=option.kind,
            default=option.default,
            metavar=metavar,
            help=f"{option.help} (default: {option.default:{option.shown}})",
        )


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

"""``fitprof compare BASELINE CANDIDATE``: a regression gate for CI, on :mod:`fitprof.compare`.

Each side is a run directory (its report files, as ``fitprof report`` reads them), one report file, or one trace
file (analysed as ``fitprof analyze`` does). The output (``--format table``, ``markdown`` for a pull-request
comment, ``json``) gives each figure and each ranked operator on both sides with its spread across windows, the
change, and whether it is a regression; the first line (the first record in json) names the largest one.

A side may be a URL (``s3://``, ``gs://``, ``memory://``...; fsspec and the scheme's package): its report files and
TensorBoard event files, or the one file it names, are copied into a temporary folder and read there; every line
printed names the URL.

A report file of a run directory that cannot be read (a run killed mid-write leaves one) is skipped as
``fitprof report`` skips it (:meth:`fitprof.cli.output.Output.skip`): one ``fitprof: warning:`` line naming it,
and the side is the files that could be read; under ``--strict`` it is an error.

Exit status: 0 nothing regressed, 1 a regression (see :mod:`fitprof.compare` for the rule), 2 bad input: a
missing side or one with no readable report, an unreadable file under ``--strict``, bad arguments, or two sides
that are not comparable (another framework, world size, device, batch size, or mostly different operators), which
are named on stderr instead of being compared.
Framework-free.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

from fitprof import _fs
from fitprof.cli.arguments import (
    NumberOption,
    add_format_options,
    add_number_options,
    add_strict_option,
    non_negative_float,
)
from fitprof.cli.output import EXIT_OK, Output, describe
from fitprof.cli.render import RECORD_COMPARE, RECORD_FIGURE, RECORD_OPERATOR
from fitprof.compare import (
    DEFAULT_FAIL_OVER_PERCENT,
    DEFAULT_MIN_MS,
    NOISE_FACTOR,
    Change,
    CompareInputError,
    Comparison,
    NotComparableError,
    compare,
    load_side,
)
from fitprof.report_files import is_report_file
from fitprof.traces._limits import DEFAULT_MAX_EVENTS, DEFAULT_MAX_TRACE_MB

EXIT_REGRESSION = 1
FORMATS = ("table", "markdown", "json")


HELP = "compare a candidate run with a baseline; exit 1 on a regression (a CI gate)"
"""The line ``fitprof --help`` gives ``compare``."""

DESCRIPTION = (
    "Compare the figures and operators of CANDIDATE with BASELINE, each a run directory (its "
    "report files), a report file or a trace file. A change counts when it passes --fail-over and the run-to-run "
    "spread the runs' windows show. Exit status: 0 no regression, 1 regression, 2 bad input or sides that "
    "are not comparable."
)
"""What ``fitprof compare --help`` says it does."""

THRESHOLDS = (
    NumberOption(
        "--fail-over PCT",
        non_negative_float,
        DEFAULT_FAIL_OVER_PERCENT,
        "fail when the step time, or an operator's self time per step, grew by more than PCT percent beyond the noise",
    ),
    NumberOption(
        "--min-ms MS",
        non_negative_float,
        DEFAULT_MIN_MS,
        "an operator must also grow by more than MS ms per step to fail",
    ),
)
"""When a change is a regression (:func:`fitprof.compare.compare`)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``compare`` arguments: the two sides, the output options and the thresholds."""
    p.add_argument("baseline", metavar="BASELINE", help="run directory, report file or trace file")
    p.add_argument("candidate", metavar="CANDIDATE", help="run directory, report file or trace file")
    add_format_options(p, FORMATS)
    add_strict_option(p)
    add_number_options(p, THRESHOLDS)


def run(args: argparse.Namespace, out: Output) -> int:
    """Load both sides, compare, print; the exit status (0 no regression, 1 regression, 2 bad input)."""
    with tempfile.TemporaryDirectory(prefix="fitprof-compare-") as tmp:
        sides = []
        for n, path in enumerate((args.baseline, args.candidate)):
            try:
                local = _fetch(path, Path(tmp) / str(n), out) if _fs.is_remote(path) else _fs.local_path(path)
                side = load_side(local, max_trace_mb=DEFAULT_MAX_TRACE_MB, max_events=DEFAULT_MAX_EVENTS, skip=out.skip)
                sides.append(dataclasses.replace(side, path=path))
            except CompareInputError as err:  # it names the file (a local copy: out names its URL)
                out.error(str(err))
            except (OSError, ValueError) as err:  # a URL that cannot be read
                out.error(describe(path, err))
        if len(sides) < 2:
            return out.finish(args, [])  # the skipped files too, as errors: nothing is compared
        try:
            result = compare(sides[0], sides[1], fail_over_percent=args.fail_over, min_ms=args.min_ms)
        except NotComparableError as err:
            out.error(str(err))
            return out.finish(args, [])
        status = out.finish(args, records(result), bad=False)
    return EXIT_REGRESSION if status == EXIT_OK and result.regressed else status


def _fetch(url: str, dest: Path, out: Output) -> str:
    """Copy what one URL side needs into ``dest`` through fsspec: the file, or a run directory's report files and
    TensorBoard event files (not its traces); returns the local path to load. Error lines name the URL.

    Raises:
        OSError, ValueError: the URL cannot be read (:func:`fitprof._fs.fetch`).
    """
    dest.mkdir()
    files = _fs.fetch(url, dest, lambda rel: is_report_file(rel) or rel.rpartition("/")[2].startswith(_EVENTS))
    local = files[0][1] if len(files) == 1 and files[0][0] == url else dest
    out.urls[os.fspath(local)] = url.rstrip("/")
    return os.fspath(local)


_EVENTS = "events.out.tfevents."


def records(result: Comparison) -> list[dict[str, Any]]:
    """The comparison as output records: one ``compare`` summary, then one ``figure`` record per figure and one
    ``operator`` record per operator (values in the units their ``unit`` says; spreads are sample standard
    deviations across a side's windows)."""
    head: dict[str, Any] = {
        "record": RECORD_COMPARE,
        "status": result.status,
        "headline": result.headline(),
        "fail_over_percent": result.fail_over_percent,
        "min_ms": result.min_ms,
        "noise_factor": NOISE_FACTOR,
        "notes": list(result.notes),
    }
    for which, side in (("baseline", result.baseline), ("candidate", result.candidate)):
        head[which] = os.fspath(side.path)
        head[f"{which}_kind"] = side.kind
        head[f"{which}_windows"] = len(side.windows)
    return [
        head,
        *(_change_record(RECORD_FIGURE, c) for c in result.figures),
        *(_change_record(RECORD_OPERATOR, c) for c in result.operators),
    ]


def _change_record(kind: str, c: Change) -> dict[str, Any]:
    return {
        "record": kind,
        "name": c.name,
        "label": c.label,
        "unit": c.unit,
        "status": c.status,
        "baseline": c.baseline.mean,
        "baseline_spread": c.baseline.spread,
        "baseline_windows": c.baseline.n,
        "candidate": c.candidate.mean,
        "candidate_spread": c.candidate.spread,
        "candidate_windows": c.candidate.n,
        "change": c.change,
        "change_percent": c.change_percent,
        "noise": c.noise,
        "significant": c.significant,
        "worse": c.worse,
        "regression": c.regression,
        **(
            {
                "baseline_percent": c.baseline_share.mean,
                "candidate_percent": c.candidate_share.mean,
                "share_held": c.share_held,
                "sporadic": c.sporadic,
            }
            if c.baseline_share is not None and c.candidate_share is not None
            else {}
        ),
    }

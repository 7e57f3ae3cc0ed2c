"""``fitprof compare BASELINE CANDIDATE`` (or ``--against NAME CANDIDATE``): a regression gate for CI, on
:mod:`fitprof.compare`.

Each side is a run directory or a folder of runs (their report files and always-on timing), one report file, or one
trace file (analysed as ``fitprof analyze`` does); ``--against NAME`` takes the baseline saved under NAME in the
baseline store (:mod:`fitprof.baselines`, ``fitprof baseline save``). The output (``--format table``, ``markdown``
for a pull-request comment, ``json``) gives each figure and each ranked operator on both sides: the median over
the side's samples, the change, the ratio of the medians with its bootstrap interval, and whether it is a
regression; the first line (the first record in json) is the headline.

A side may be a URL (``s3://``, ``gs://``, ``memory://``...; fsspec and the scheme's package): its report files and
TensorBoard event files, or the one file it names, are copied into a temporary folder and read there; every line
printed names the URL.

A report file of a run directory that cannot be read (a run killed mid-write leaves one) is skipped as
``fitprof report`` skips it: one ``fitprof: warning:`` line naming it; under ``--strict`` it is an error.

Exit status: 0 nothing regressed, 1 a regression, 2 bad input (a missing side, bad arguments, or two sides that are
not comparable: another framework, world size, device, precision, batch size, backend, parameter count or model
structure, named on stderr), 3 inconclusive
(either side was CPU-contended: ``--inconclusive fail`` makes it 1, ``--inconclusive pass`` 0). ``--accept
--reason`` (with ``--against``) records the decision in the store, makes the candidate the baseline, and exits 0.
Framework-free.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from fitprof import _fs, baselines
from fitprof.cli.arguments import (
    NumberOption,
    add_format_options,
    add_number_options,
    add_strict_option,
    non_negative_float,
)
from fitprof.cli.output import EXIT_BAD_INPUT, EXIT_OK, Output, describe
from fitprof.cli.render import RECORD_COMPARE, RECORD_FIGURE, RECORD_OPERATOR
from fitprof.compare import (
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE,
    DEFAULT_FAIL_OVER_PERCENT,
    DEFAULT_MIN_MS,
    DEFAULT_STEP_FAIL_OVER_PERCENT,
    GATES,
    PART_OF_STEP,
    Change,
    CompareInputError,
    Comparison,
    NotComparableError,
    compare,
    load_side,
)
from fitprof.traces._limits import DEFAULT_MAX_EVENTS, DEFAULT_MAX_TRACE_MB

EXIT_REGRESSION = 1
EXIT_INCONCLUSIVE = 3
"""Either side was CPU-contended: the figures measure the wait for a core; neither ok nor a regression."""
FORMATS = ("table", "markdown", "json")
INCONCLUSIVE = ("status", "fail", "pass")
"""``--inconclusive``: exit :data:`EXIT_INCONCLUSIVE` (default), 1, or 0 when a side was CPU-contended."""


HELP = "compare a candidate run with a baseline; exit 1 on a regression, 3 when inconclusive (a CI gate)"
"""The line ``fitprof --help`` gives ``compare``."""

DESCRIPTION = (
    "Compare the figures and operators of CANDIDATE with BASELINE (or the saved baseline --against NAME), each a "
    "run directory or folder of runs, a report file or a trace file. A figure regresses when it went the worse "
    "way by more than its --fail-over threshold and its bootstrap interval excludes no change; the step's parts "
    "and the operators also need the step time to have grown. Exit status: 0 no regression, 1 regression, 2 bad "
    "input or sides that are not comparable, 3 inconclusive (a side was CPU-contended; see --inconclusive)."
)
"""What ``fitprof compare --help`` says it does."""

THRESHOLDS = (
    NumberOption(
        "--min-ms MS",
        non_negative_float,
        DEFAULT_MIN_MS,
        "a ms figure or an operator must also grow by more than MS ms per step to fail",
    ),
)
"""When a change is a regression (:func:`fitprof.compare.compare`), besides ``--fail-over``."""


def fail_over(text: str) -> tuple[str, float]:
    """``PCT`` (every gate) or ``GATE=PCT`` -> (gate or ``*``, PCT).

    Raises:
        argparse.ArgumentTypeError: an unknown gate or a bad number.
    """
    gate, _, pct = text.rpartition("=")
    gate = gate.strip() or "*"
    if gate != "*" and gate not in GATES:
        raise argparse.ArgumentTypeError(f"unknown figure {gate!r} in {text!r}; allowed: {', '.join(GATES)}")
    return gate, non_negative_float(pct)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``compare`` arguments: the sides, the baseline store, the output options and the thresholds."""
    p.add_argument(
        "sides",
        metavar="SIDE",
        nargs="+",
        help="BASELINE CANDIDATE (or CANDIDATE with --against): run directory, folder of runs, report or trace file",
    )
    p.add_argument("--against", metavar="NAME", help="compare with the baseline saved as NAME (fitprof baseline save)")
    p.add_argument(
        "--store",
        metavar="STORE",
        help=f"the baseline store, a folder or URL (default: ${baselines.STORE_ENV} or {baselines.DEFAULT_STORE})",
    )
    add_format_options(p, FORMATS)
    add_strict_option(p)
    p.add_argument(
        "--fail-over",
        metavar="[FIGURE=]PCT",
        type=fail_over,
        action="append",
        default=[],
        help=(
            f"fail when FIGURE grew by more than PCT percent, significantly; FIGURE one of {', '.join(GATES)}; "
            f"without FIGURE=, every figure (default: {DEFAULT_FAIL_OVER_PERCENT:g} for each, "
            f"{DEFAULT_STEP_FAIL_OVER_PERCENT:g} for step where both sides keep every step time); repeatable"
        ),
    )
    add_number_options(p, THRESHOLDS)
    p.add_argument(
        "--inconclusive",
        choices=INCONCLUSIVE,
        default="status",
        help=f"when a side was CPU-contended: exit {EXIT_INCONCLUSIVE} (status, the default), 1 (fail) or 0 (pass)",
    )
    p.add_argument(
        "--accept",
        action="store_true",
        help="accept the candidate (with --against and --reason): record the decision and make it the baseline",
    )
    p.add_argument("--reason", metavar="TEXT", help="why the candidate is accepted (recorded with --accept)")


def run(args: argparse.Namespace, out: Output) -> int:
    """Load both sides, compare, print; the exit status (see the module docstring)."""
    problem = _check(args)
    if problem:
        out.error(problem)
        return EXIT_BAD_INPUT
    with tempfile.TemporaryDirectory(prefix="fitprof-compare-") as tmp:
        sides, shown_decisions = [], []
        paths = list(args.sides)
        if args.against:
            try:
                folder = baselines.fetch(args.against, args.store, Path(tmp) / "store")
            except (OSError, ValueError) as err:
                out.error(describe(baselines.store_location(args.store), err) if isinstance(err, OSError) else str(err))
                return EXIT_BAD_INPUT
            shown_decisions = baselines.decisions(folder)
            paths.insert(0, os.fspath(folder))
        for n, path in enumerate(paths):
            try:
                local = _fetch(path, Path(tmp) / str(n), out) if _fs.is_remote(path) else _fs.local_path(path)
                side = load_side(local, max_trace_mb=DEFAULT_MAX_TRACE_MB, max_events=DEFAULT_MAX_EVENTS, skip=out.skip)
                shown = f"baseline {args.against!r}" if args.against and n == 0 else path
                sides.append(dataclasses.replace(side, path=shown))
            except CompareInputError as err:  # it names the file (a local copy: out names its URL)
                out.error(str(err))
            except (OSError, ValueError) as err:  # a URL that cannot be read
                out.error(describe(path, err))
        if len(sides) < 2:
            return out.finish(args, [])  # the skipped files too, as errors: nothing is compared
        try:
            result = compare(sides[0], sides[1], fail_over_percent=dict(args.fail_over), min_ms=args.min_ms)
        except NotComparableError as err:
            out.error(str(err))
            return out.finish(args, [])
        if shown_decisions:
            result = dataclasses.replace(
                result,
                notes=[
                    f"baseline {args.against!r}: last decision: {baselines.decision_text(shown_decisions[-1])}",
                    *result.notes,
                ],
            )
        if args.accept:
            accepted = _accept(args, result, paths[-1], shown_decisions, out)
            if accepted is None:
                return EXIT_BAD_INPUT
            result = dataclasses.replace(result, notes=[*result.notes, accepted])
        status = out.finish(args, records(result), bad=False)
    if status != EXIT_OK or args.accept:
        return status
    if result.inconclusive:
        return {"status": EXIT_INCONCLUSIVE, "fail": EXIT_REGRESSION, "pass": EXIT_OK}[args.inconclusive]
    return EXIT_REGRESSION if result.regressed else EXIT_OK


def _check(args: argparse.Namespace) -> str:
    """What is wrong with the arguments' combination ("" when nothing)."""
    want = 1 if args.against else 2
    if len(args.sides) != want:
        return (
            f"compare takes {'CANDIDATE with --against NAME' if args.against else 'BASELINE CANDIDATE'}, "
            f"got {len(args.sides)} path(s): {' '.join(args.sides)}"
        )
    if args.accept and not (args.against and args.reason and args.reason.strip()):
        return "--accept needs --against NAME (the baseline it replaces) and --reason TEXT (why)"
    if args.reason and not args.accept:
        return "--reason goes with --accept"
    return ""


def _accept(
    args: argparse.Namespace, result: Comparison, candidate: str, history: list[dict[str, Any]], out: Output
) -> str | None:
    """Record the decision and save the candidate as the baseline; the note saying so (None: it failed, said)."""
    decision = {
        "decision": "accepted",
        "time": time.time(),
        "baseline": args.against,
        "candidate": candidate,
        "reason": args.reason.strip(),
        "status": result.status,
        "headline": result.headline(),
        "regressions": [c.name for c in result.regressions],
    }
    if _fs.is_remote(candidate):
        out.error(f"{candidate}: --accept takes a local candidate run directory")
        return None
    try:
        where, _ = baselines.save(
            args.against, _fs.local_path(candidate), args.store, decisions=[*history, decision], source=candidate
        )
    except (OSError, ValueError) as err:
        out.error(describe(baselines.store_location(args.store), err) if isinstance(err, OSError) else str(err))
        return None
    return f"accepted as the baseline {args.against!r} ({where}): {baselines.decision_text(decision)}"


def _fetch(url: str, dest: Path, out: Output) -> str:
    """Copy what one URL side needs into ``dest`` through fsspec: the file, or a run directory's report files, per-epoch files
    and TensorBoard event files (not its traces); returns the local path to load. Error lines name the URL.

    Raises:
        OSError, ValueError: the URL cannot be read (:func:`fitprof._fs.fetch`).
    """
    dest.mkdir()
    files = _fs.fetch(url, dest, baselines.wanted)
    local = files[0][1] if len(files) == 1 and files[0][0] == url else dest
    out.urls[os.fspath(local)] = url.rstrip("/")
    return os.fspath(local)


def records(result: Comparison) -> list[dict[str, Any]]:
    """The comparison as output records: one ``compare`` summary, then one ``figure`` record per figure and one
    ``operator`` record per operator (values in the units their ``unit`` says: each side's median over its
    samples, their mean and sample standard deviation; the ratio of the medians and its bootstrap interval)."""
    head: dict[str, Any] = {
        "record": RECORD_COMPARE,
        "status": result.status,
        "headline": result.headline(),
        "fail_over_percent": result.fail_over_percent,
        "thresholds": dict(result.thresholds),
        "min_ms": result.min_ms,
        "confidence": CONFIDENCE,
        "resamples": BOOTSTRAP_RESAMPLES,
        "part_of_step": PART_OF_STEP,
        "inconclusive": result.inconclusive,
        "contention": [c.text() for c in result.contention],
        "steps_per_epoch": result.steps_per_epoch,
        "notes": list(result.notes),
    }
    for which, side in (("baseline", result.baseline), ("candidate", result.candidate)):
        head[which] = os.fspath(side.path)
        head[f"{which}_kind"] = side.kind
        head[f"{which}_windows"] = len(side.windows)
        head[f"{which}_runs"] = side.runs
        head[f"{which}_epochs"] = len(side.rows)
    return [
        head,
        *(_change_record(RECORD_FIGURE, c) for c in result.figures),
        *(_change_record(RECORD_OPERATOR, c) for c in result.operators),
    ]


def _change_record(kind: str, c: Change) -> dict[str, Any]:
    return {
        "record": kind,
        "name": c.name,
        "test": c.test,
        "label": c.label,
        "unit": c.unit,
        "gate": c.gate,
        "threshold": c.threshold,
        "status": c.status,
        "baseline": c.baseline.median,
        "baseline_mean": c.baseline.mean,
        "baseline_spread": c.baseline.spread,
        "baseline_windows": c.baseline.n,
        "candidate": c.candidate.median,
        "candidate_mean": c.candidate.mean,
        "candidate_spread": c.candidate.spread,
        "candidate_windows": c.candidate.n,
        "change": c.change,
        "change_percent": c.change_percent,
        "ratio": c.ratio,
        "ratio_low": c.ratio_lo,
        "ratio_high": c.ratio_hi,
        "noise": c.noise,
        "significant": c.significant,
        "worse": c.worse,
        "regression": c.regression,
        "step_held": c.step_held,
        "small_for_step": c.small_for_step,
        "cost_ms_per_epoch": c.cost_ms_per_epoch,
        **(
            {
                "baseline_percent": c.baseline_share.median,
                "candidate_percent": c.candidate_share.median,
                "share_held": c.share_held,
                "sporadic": c.sporadic,
            }
            if c.baseline_share is not None and c.candidate_share is not None
            else {}
        ),
    }

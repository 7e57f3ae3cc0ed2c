"""Compare two runs' bottleneck figures, aware of their noise: the regression gate behind ``fitprof compare``.

Framework-free. Each side is what one run left behind:

* a run directory: every report file below it (``<run>/plugins/fitprof/<session>.rank<r>.json``, found and read
  with :func:`fitprof.report_files.find_report_files` / :func:`~fitprof.report_files.read_report_file`, as
  ``fitprof report`` reads them), one per profiled window and rank; windows the slowdown trigger opened are left
  out (they were taken because steps were slow);
* one report file (anywhere: a baseline kept in the repository is one);
* one trace file (``.xplane.pb``, ``.pt.trace.json[.gz]``), analysed with :func:`fitprof.analyze`, as
  ``fitprof analyze`` does.

A side's value of a figure is the mean over its windows, and its spread the sample standard deviation over them
(NaN with a single window). A change counts as significant when it is larger than :data:`NOISE_FACTOR` times the
larger of the two sides' spreads: the run-to-run noise the runs themselves show. With no spread on either side
(one window each) significance is unknown, and only the threshold decides.

What fails the gate (:attr:`Comparison.regressed`), with ``fail_over_percent`` (``fitprof compare --fail-over``)
and ``min_ms`` (``--min-ms``):

* the step time grew by more than ``fail_over_percent`` and the change is not within the noise;
* an operator's self time per step grew by more than ``fail_over_percent`` and by more than ``min_ms``, and the
  change is not within the noise. An operator ranked on the candidate side only ("new") is compared with the
  smallest time ranked on the baseline side, the most it can have had there.

The other figures (input wait, host-to-device copies, collectives, throughput) are reported with their
significance but do not fail the gate: a step-time regression is what they would explain.

Two sides are comparable only when both are known to hold the same framework, world size, device, samples per
step and operator-time source, and at least half of the smaller side's ranked operators appear on the other side;
:func:`compare` raises :class:`NotComparableError` naming every difference otherwise.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fitprof._session import trigger_step
from fitprof.analysis import BottleneckReport
from fitprof.report_files import (
    MAX_REPORT_BYTES,
    ReportFileError,
    find_report_files,
    is_report_file,
    read_report_file,
)

NOISE_FACTOR = 2.0
"""A change is significant when it exceeds this many times the larger side's spread (sample standard deviation of
the figure over the side's windows)."""
DEFAULT_FAIL_OVER_PERCENT = 10.0
"""``fitprof compare --fail-over``'s default: step time or an operator's time per step grown by more than this (%)."""
DEFAULT_MIN_MS = 0.1
"""``--min-ms``'s default: an operator must also grow by more than this many ms per step to fail the gate."""
MIN_SHARED_OPERATORS = 0.5
"""Two sides are comparable only when this share of the smaller side's ranked operators is on the other side."""
SAMPLES_TOLERANCE = 0.01
"""Samples per step that differ by more than this fraction mean another batch size."""

KIND_RUN = "run directory"
KIND_REPORT = "report file"
KIND_TRACE = "trace file"

STATUS_REGRESSION = "regression"
STATUS_OK = "ok"


class CompareInputError(ValueError):
    """A side that cannot be loaded; the message names the path and says what is wrong."""


class NotComparableError(ValueError):
    """The two sides were measured on different setups; :attr:`reasons` says how, one item each."""

    def __init__(self, baseline: str, candidate: str, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__(
            f"{baseline} and {candidate} are not comparable: {'; '.join(reasons)} "
            "(compare runs of one setup; a change of setup is a new baseline)"
        )


@dataclass(frozen=True)
class Window:
    """One profiled window of a side: its report, and where it comes from (epoch and rank None for a trace)."""

    report: BottleneckReport
    epoch: int | None = None
    rank: int | None = None


@dataclass(frozen=True)
class Side:
    """What one run left behind, as :func:`load_side` found it.

    Attributes:
        path: the path as given.
        kind: :data:`KIND_RUN`, :data:`KIND_REPORT` or :data:`KIND_TRACE`.
        windows: the profiled windows compared (scheduled windows only), at least one.
        triggered_left_out: windows the slowdown trigger opened, not compared.
    """

    path: str
    kind: str
    windows: list[Window]
    triggered_left_out: int = 0


@dataclass(frozen=True)
class Figure:
    """A figure compared: the :class:`~fitprof.BottleneckReport` field it is read from, how it is shown, and
    which way is worse."""

    field: str
    label: str
    unit: str
    higher_is_worse: bool = True
    gates: bool = False
    """Whether a regression of this figure fails the gate (step time only)."""


FIGURES: tuple[Figure, ...] = (
    Figure("step_time_ms", "step time", "ms", gates=True),
    Figure("input_ms_per_step", "input wait", "ms/step"),
    Figure("htod_ms_per_step", "host-to-device copies", "ms/step"),
    Figure("dtoh_ms_per_step", "device-to-host copies", "ms/step"),
    Figure("collective_ms_per_step", "collectives", "ms/step"),
    Figure("samples_per_s", "throughput", "samples/s", higher_is_worse=False),
    Figure("items_per_s", "items throughput", "items/s", higher_is_worse=False),
    Figure("flops_per_s", "FLOP rate", "FLOP/s", higher_is_worse=False),
)
"""The figures compared, in this order; a figure with no finite value on either side is left out. A report
field added later (memory, ...) is one row here."""


@dataclass(frozen=True)
class Stat:
    """One side's value of a figure: ``mean`` over ``n`` windows and ``spread``, their sample standard deviation
    (NaN when ``n`` < 2)."""

    mean: float
    spread: float
    n: int

    @staticmethod
    def of(values: Sequence[float]) -> Stat:
        finite = [v for v in values if math.isfinite(v)]
        if not finite:
            return Stat(math.nan, math.nan, 0)
        spread = statistics.stdev(finite) if len(finite) >= 2 else math.nan
        return Stat(statistics.fmean(finite), spread, len(finite))


@dataclass(frozen=True)
class Change:
    """One compared figure or operator.

    Attributes:
        name: the figure's field (``step_time_ms``) or the operator's name.
        label: how it is shown (``step time``; the operator's name).
        unit: ``ms``, ``ms/step``, ``samples/s``, ...
        baseline, candidate: each side's :class:`Stat`; an operator not ranked on a side has ``n`` 0 there.
        change: ``candidate.mean - baseline.mean`` (NaN when either is unknown); for a new operator, at least
            this much (the baseline mean stands for the most it can have had).
        change_percent: ``change`` over the baseline mean, times 100 (NaN when the baseline is 0 or unknown).
        noise: :data:`NOISE_FACTOR` times the larger side spread (NaN when neither side has one).
        significant: ``abs(change) > noise``; None when the noise is unknown.
        regression: whether this change fails the gate.
        worse: whether the change goes the bad way (slower, less throughput).
        status: ``both``, ``new`` (ranked on the candidate side only) or ``gone`` (baseline only); figures:
            ``both``.
    """

    name: str
    label: str
    unit: str
    baseline: Stat
    candidate: Stat
    change: float
    change_percent: float
    noise: float
    significant: bool | None
    regression: bool
    worse: bool
    status: str = "both"


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare`.

    Attributes:
        baseline, candidate: the two sides.
        figures: one :class:`Change` per figure of :data:`FIGURES` with a value on both sides.
        operators: one :class:`Change` per operator ranked on either side, the largest growth first.
        fail_over_percent, min_ms: the thresholds used.
    """

    baseline: Side
    candidate: Side
    figures: list[Change]
    operators: list[Change]
    fail_over_percent: float
    min_ms: float
    notes: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        """Every change that fails the gate, the largest growth (ms) first."""
        found = [c for c in (*self.figures, *self.operators) if c.regression]
        return sorted(found, key=lambda c: -c.change)

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)

    @property
    def status(self) -> str:
        """:data:`STATUS_REGRESSION` or :data:`STATUS_OK`."""
        return STATUS_REGRESSION if self.regressed else STATUS_OK

    def step_time(self) -> Change | None:
        return next((c for c in self.figures if c.name == "step_time_ms"), None)

    def grew_most(self) -> Change | None:
        """The operator whose self time per step grew most (ms), when one grew beyond its noise."""
        grown = [c for c in self.operators if c.change > 0 and c.significant is not False and math.isfinite(c.change)]
        return max(grown, key=lambda c: c.change, default=None)

    def headline(self) -> str:
        """One line: regression or not, the step time's change and why it counts or not, and the largest
        regression (or the operator that grew most)."""
        step = self.step_time()
        parts = []
        if step is not None:
            parts.append(f"step time {_change_text(step)}{_why(step, self.fail_over_percent)}")
        regs = [c for c in self.regressions if c is not step]
        if regs:
            top = regs[0]
            more = f" (and {len(regs) - 1} more)" if len(regs) > 1 else ""
            parts.append(f"largest operator regression: {top.label} {_change_text(top)}{more}")
        elif (op := self.grew_most()) is not None:
            parts.append(f"the operator that grew most: {op.label} {_change_text(op)}")
        return f"{self.status}: {'; '.join(parts) or 'no figure on both sides'}."


def _change_text(c: Change) -> str:
    """``+23.4% (12.10 -> 14.93 ms)``; a new operator: ``new, 2.31 ms/step (at most 0.12 before)``."""
    if c.status == "new":
        return f"new in the ranked operators, {c.candidate.mean:.3g} {c.unit} (at most {c.baseline.mean:.3g} before)"
    if c.status == "gone":
        return f"no longer ranked (was {c.baseline.mean:.3g} {c.unit})"
    pct = f"{c.change_percent:+.1f}% " if math.isfinite(c.change_percent) else ""
    return f"{pct}({c.baseline.mean:.4g} -> {c.candidate.mean:.4g} {c.unit})"


def _why(c: Change, fail_over: float) -> str:
    if c.regression:
        return f", past the {fail_over:g}% threshold" + (
            f" and the run-to-run noise (+-{c.noise:.3g} {c.unit})" if c.significant else " (no spread known)"
        )
    if c.significant is False:
        return f", within the run-to-run noise (+-{c.noise:.3g} {c.unit})"
    if c.worse and math.isfinite(c.change_percent) and abs(c.change_percent) <= fail_over:
        return f", under the {fail_over:g}% threshold"
    return ""


# ---------------------------------------------------------------------------------------------------- loading


def load_side(
    path: str | os.PathLike[str], *, max_trace_mb: float | None = None, max_events: int | None = None
) -> Side:
    """Load one side: a run directory, a report file or a trace file (see the module docstring).

    A ``.json`` file is a report file when it lies in a ``plugins/fitprof`` folder or is a JSON object with a
    ``"report"`` key; any other file is read as a trace.

    Args:
        path: the run directory or file.
        max_trace_mb, max_events: bounds on a trace file (:func:`fitprof.analyze`'s).

    Raises:
        CompareInputError: the path is missing, holds no report file, or a file in it cannot be read (the
            message names the file and says why).
    """
    from fitprof import analyze
    from fitprof.traces import TraceError

    p = Path(path)
    shown = os.fspath(path)
    if p.is_dir():
        files = find_report_files(p)
        if not files:
            raise CompareInputError(
                f"{shown}: no fitprof report file below this folder (a run directory holds "
                "plugins/fitprof/<session>.rank<r>.json); give a run directory, a report file or a trace file"
            )
        windows, triggered = [], 0
        for f in files:
            doc = _read_report(f, logdir=p)
            if trigger_step(doc.session or f.name.partition(".rank")[0]) is not None:
                triggered += 1
                continue
            windows.append(Window(doc.report, doc.epoch, doc.rank))
        if not windows:
            raise CompareInputError(f"{shown}: only windows the slowdown trigger opened; no scheduled window")
        return Side(shown, KIND_RUN, windows, triggered)
    if not p.exists():
        raise CompareInputError(f"{shown}: no such file or folder")
    if _looks_like_report(p):
        doc = _read_report(p, logdir=None)
        return Side(shown, KIND_REPORT, [Window(doc.report, doc.epoch, doc.rank)])
    try:
        report = analyze(p, max_trace_mb=max_trace_mb, max_events=max_events)
    except (TraceError, OSError, ValueError) as err:
        raise CompareInputError(_describe(shown, err)) from None
    return Side(shown, KIND_TRACE, [Window(report, None, report.rank)])


def load_baseline(path: str | os.PathLike[str]) -> Side:
    """A baseline for the callbacks: a run directory or a report file (no trace: a trace would be analysed at
    every comparison).

    Raises:
        CompareInputError: as :func:`load_side`, and for a trace file.
    """
    side = load_side(path)
    if side.kind == KIND_TRACE:
        raise CompareInputError(f"{side.path}: a baseline is a run directory or a report file, not a trace file")
    return side


def _read_report(path: Path, logdir: Path | None) -> Any:
    try:
        return read_report_file(path, logdir=logdir)
    except (ReportFileError, OSError) as err:
        raise CompareInputError(_describe(os.fspath(path), err)) from None


def _looks_like_report(path: Path) -> bool:
    if is_report_file(path.absolute().as_posix()):
        return True
    if not path.name.endswith(".json") or path.name.endswith(".pt.trace.json"):
        return False
    try:
        if path.stat().st_size > MAX_REPORT_BYTES:
            return False
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and "report" in doc and "traceEvents" not in doc


def _describe(where: str, err: BaseException) -> str:
    what = err.strerror.lower() if isinstance(err, OSError) and err.strerror else (str(err) or type(err).__name__)
    return what if where in what else f"{where}: {what}"


# ------------------------------------------------------------------------------------------------ comparing


def comparable(baseline: Side, candidate: Side) -> list[str]:
    """Why the two sides cannot be compared, one reason each (empty: comparable). A property unknown on a side
    (a bare trace knows no batch size) is not held against it."""
    reasons = []
    for what, get in (
        ("framework", lambda r: r.framework or None),
        ("world size", lambda r: r.world_size),
        ("device", lambda r: r.device_name or None),
        ("operator times", lambda r: r.op_time_source or None),
    ):
        b, c = _values(baseline, get), _values(candidate, get)
        if b and c and b != c:
            reasons.append(f"{what} {_set_text(b)} vs {_set_text(c)}")
    b_samples = Stat.of([w.report.samples_per_step for w in baseline.windows]).mean
    c_samples = Stat.of([w.report.samples_per_step for w in candidate.windows]).mean
    if (
        math.isfinite(b_samples)
        and math.isfinite(c_samples)
        and abs(c_samples - b_samples) > SAMPLES_TOLERANCE * max(b_samples, c_samples)
    ):
        reasons.append(f"samples per step (batch size) {b_samples:g} vs {c_samples:g}")
    b_ops, c_ops = _op_names(baseline), _op_names(candidate)
    if b_ops and c_ops:
        shared = len(b_ops & c_ops)
        smaller = min(len(b_ops), len(c_ops))
        if shared < MIN_SHARED_OPERATORS * smaller:
            reasons.append(
                f"mostly different operators ({shared} of the {smaller} ranked on the smaller side are on both)"
            )
    return reasons


def _values(side: Side, get: Any) -> set[Any]:
    return {v for w in side.windows if (v := get(w.report)) is not None}


def _set_text(values: set[Any]) -> str:
    return "/".join(sorted(map(str, values)))


def _op_names(side: Side) -> set[str]:
    return {op.name for w in side.windows for op in w.report.top_ops}


def compare(
    baseline: Side,
    candidate: Side,
    *,
    fail_over_percent: float = DEFAULT_FAIL_OVER_PERCENT,
    min_ms: float = DEFAULT_MIN_MS,
    check_comparable: bool = True,
) -> Comparison:
    """Compare ``candidate`` with ``baseline`` (see the module docstring for the rules).

    Args:
        baseline, candidate: the sides (:func:`load_side`).
        fail_over_percent: the step time or an operator grown by more than this (%) fails the gate; >= 0.
        min_ms: an operator must also grow by more than this (ms per step); >= 0.
        check_comparable: raise when the sides are not comparable (:func:`comparable`).

    Raises:
        NotComparableError: the sides differ in setup (``check_comparable``).
        ValueError: a threshold is negative or not finite.
    """
    for name, value in (("fail_over_percent", fail_over_percent), ("min_ms", min_ms)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    if check_comparable and (reasons := comparable(baseline, candidate)):
        raise NotComparableError(baseline.path, candidate.path, reasons)
    figures = []
    for fig in FIGURES:
        b = Stat.of([float(getattr(w.report, fig.field, math.nan)) for w in baseline.windows])
        c = Stat.of([float(getattr(w.report, fig.field, math.nan)) for w in candidate.windows])
        if b.n == 0 or c.n == 0 or b.mean == c.mean == 0:  # absent, or nothing on either side (HtoD on a CPU)
            continue
        figures.append(_change(fig.field, fig.label, fig.unit, b, c, fig.higher_is_worse, fail_over_percent, None))
        if not fig.gates:
            figures[-1] = _no_gate(figures[-1])
    operators = _operators(baseline, candidate, fail_over_percent, min_ms)
    notes = []
    for side, label in ((baseline, "baseline"), (candidate, "candidate")):
        if side.triggered_left_out:
            notes.append(
                f"{label}: {side.triggered_left_out} window(s) the slowdown trigger opened are left out "
                "(they were taken because steps were slow)"
            )
    if all(w.report.steps_analyzed == 0 for s in (baseline, candidate) for w in s.windows):
        notes.append("no training step was analysed on either side")
    return Comparison(baseline, candidate, figures, operators, fail_over_percent, min_ms, notes)


def _no_gate(c: Change) -> Change:
    return replace(c, regression=False)


def _change(
    name: str,
    label: str,
    unit: str,
    b: Stat,
    c: Stat,
    higher_is_worse: bool,
    fail_over: float,
    min_ms: float | None,
    status: str = "both",
) -> Change:
    change = c.mean - b.mean
    pct = 100.0 * change / b.mean if b.mean > 0 else math.nan
    spreads = [s for s in (b.spread, c.spread) if math.isfinite(s)]
    noise = NOISE_FACTOR * max(spreads) if spreads else math.nan
    significant = None if not math.isfinite(noise) else abs(change) > noise
    worse = change > 0 if higher_is_worse else change < 0
    grown = abs(pct) > fail_over if math.isfinite(pct) else (b.mean == 0 and c.mean > 0)
    regression = worse and grown and significant is not False and (min_ms is None or abs(change) > min_ms)
    return Change(name, label, unit, b, c, change, pct, noise, significant, regression, worse, status)


def _operators(baseline: Side, candidate: Side, fail_over: float, min_ms: float) -> list[Change]:
    """Per operator ranked on either side: its self time per step on each (mean over the windows that rank it)."""
    b_ops, c_ops = _op_values(baseline), _op_values(candidate)
    b_floor, c_floor = _smallest_ranked(baseline), _smallest_ranked(candidate)
    out = []
    for name in dict.fromkeys([*b_ops, *c_ops]):
        if name in b_ops and name in c_ops:
            status, b, c = "both", Stat.of(b_ops[name]), Stat.of(c_ops[name])
        elif name in c_ops:
            status, b, c = "new", Stat(b_floor, math.nan, 0), Stat.of(c_ops[name])
        else:
            status, b, c = "gone", Stat.of(b_ops[name]), Stat(c_floor, math.nan, 0)
        change = _change(name, name, "ms/step", b, c, True, fail_over, min_ms, status)
        if status == "gone":  # the candidate's value is a bound only: no change can be claimed
            change = replace(change, regression=False, significant=None, worse=False)
        out.append(change)
    return sorted(out, key=lambda c: -c.change if math.isfinite(c.change) else math.inf)


def _op_values(side: Side) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for w in side.windows:
        for op in w.report.top_ops:
            out.setdefault(op.name, []).append(op.self_ms_per_step)
    return out


def _smallest_ranked(side: Side) -> float:
    """The mean over windows of each window's smallest ranked operator time: the most an operator the side does
    not rank can take there (0 where a window ranks none)."""
    per_window = [min((op.self_ms_per_step for op in w.report.top_ops), default=0.0) for w in side.windows]
    return statistics.fmean(per_window) if per_window else 0.0

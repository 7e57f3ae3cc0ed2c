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
larger of the two sides' spreads (the run-to-run noise the runs themselves show) and the two sides' ranges do not
overlap (every window of the candidate past every window of the baseline). With no spread on either side
(one window each) significance is unknown, and only the threshold decides.

What fails the gate (:attr:`Comparison.regressed`), with ``fail_over_percent`` (``fitprof compare --fail-over``)
and ``min_ms`` (``--min-ms``):

* the step time grew by more than ``fail_over_percent`` and the change is not within the noise;
* an operator's self time per step grew by more than ``fail_over_percent`` and by more than ``min_ms``, the
  change is not within the noise, and its share of step time grew beyond the shares' noise too (a run on a busier
  machine slows every operator alike; a slower operator takes a larger share). An operator ranked on the
  candidate side only ("new") is compared with the smallest time ranked on the baseline side, the most it can
  have had there. It must be ranked in more than half of the candidate's windows: one window's stall (a thread
  preempted inside one operator) is not a slower operator.

The other figures (input wait, host-to-device copies, collectives, throughput) are reported with their
significance but do not fail the gate: a step-time regression is what they would explain.

Two sides are comparable only when both are known to hold the same framework, world size, device, samples per
step and operator-time source, and at least half of the operators ranked in most windows of the smaller side are
ranked in most windows of the other;
:func:`compare` raises :class:`NotComparableError` naming every difference otherwise.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fitprof._session import trigger_step
from fitprof.analysis import BottleneckReport
from fitprof.metrics import (
    EPOCH_INPUT_PERCENT,
    EPOCH_MEMORY_PEAK_MB,
    EPOCH_PREFIX,
    EPOCH_SAMPLES_PER_S,
    EPOCH_STEP_TIME_MS_P50,
)
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
"""Two sides are comparable only when this share of the smaller side's steadily ranked operators (ranked in most
of its windows) are steadily ranked on the other side too."""
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
        epochs: a run directory's always-on step timing, ``fitprof/epoch/<name>`` -> one value per epoch (in step
            order), read from the TensorBoard event files below it (:func:`epoch_values`); empty without them.
    """

    path: str
    kind: str
    windows: list[Window]
    triggered_left_out: int = 0
    epochs: dict[str, list[float]] = field(default_factory=dict)


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
    every_step: bool = False
    """Read from the always-on step timing (:attr:`Side.epochs`, one value per epoch), not from the windows."""


FIGURES: tuple[Figure, ...] = (
    Figure("step_time_ms", "step time", "ms", gates=True),
    Figure(EPOCH_STEP_TIME_MS_P50.key, "step time, every step (median)", "ms", every_step=True),
    Figure(EPOCH_INPUT_PERCENT.key, "input wait, every step", "%", every_step=True),
    Figure(EPOCH_SAMPLES_PER_S.key, "throughput, every step", "samples/s", higher_is_worse=False, every_step=True),
    Figure("input_ms_per_step", "input wait", "ms/step"),
    Figure("htod_ms_per_step", "host-to-device copies", "ms/step"),
    Figure("dtoh_ms_per_step", "device-to-host copies", "ms/step"),
    Figure("collective_ms_per_step", "collectives", "ms/step"),
    Figure("samples_per_s", "throughput", "samples/s", higher_is_worse=False),
    Figure("items_per_s", "items throughput", "items/s", higher_is_worse=False),
    Figure("flops_per_s", "FLOP rate", "FLOP/s", higher_is_worse=False),
    Figure("allocs_per_step", "allocations", "per step"),
    Figure("alloc_mb_per_step", "memory allocated", "MB/step"),
    Figure("allocated_peak_mb", "memory held at once by the steps' allocations", "MB"),
    Figure(EPOCH_MEMORY_PEAK_MB.key, "memory peak, every epoch", "MB", every_step=True),
)
"""The figures compared, in this order; a figure with no finite value on either side is left out. A report
field added later (memory, ...) is one row here. Where both sides have the always-on step timing, a step-time
regression of the windows counts only when the every-step median confirms it (grew past the same threshold, not
within its own noise across epochs): the windows hold a few steps, the always-on timing every clean step."""


@dataclass(frozen=True)
class Stat:
    """One side's value of a figure: ``mean`` over ``n`` windows, ``spread``, their sample standard deviation
    (NaN when ``n`` < 2), and their smallest and largest value ``lo`` / ``hi``. ``n`` 0 with a finite mean is a
    bound, not a measurement (an operator a side does not rank)."""

    mean: float
    spread: float
    n: int
    lo: float = math.nan
    hi: float = math.nan

    @staticmethod
    def of(values: Sequence[float]) -> Stat:
        finite = [v for v in values if math.isfinite(v)]
        if not finite:
            return Stat(math.nan, math.nan, 0)
        spread = statistics.stdev(finite) if len(finite) >= 2 else math.nan
        return Stat(statistics.fmean(finite), spread, len(finite), min(finite), max(finite))

    @staticmethod
    def bound(value: float) -> Stat:
        return Stat(value, math.nan, 0, value, value)


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
        baseline_share, candidate_share: operators only: the share of step time (%) on each side.
        share_held: operators only: the time grew past the thresholds, but its share of step time did not grow
            beyond its noise (the whole step slowed alike), so it is not a regression.
        sporadic: operators only: it grew past the thresholds but is ranked in at most half of the candidate's
            windows (a stall in one window, not a slower operator), so it is not a regression.
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
    baseline_share: Stat | None = None
    candidate_share: Stat | None = None
    share_held: bool = False
    sporadic: bool = False


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare`.

    Attributes:
        baseline, candidate: the two sides.
        figures: one :class:`Change` per figure of :data:`FIGURES` with a value on both sides.
        operators: one :class:`Change` per operator ranked on either side, the largest growth first.
        fail_over_percent, min_ms: the thresholds used.
        notes: what the reader should know beside the figures (windows left out, a step-time regression the
            always-on timing did not confirm).
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
        """The operator whose self time per step grew most in ms per step (its percentage aside: a 0.01 ms operator
        doubling is no news), among the changes that count: by more than :attr:`min_ms`, not within the noise (with
        no spread known on either side, the threshold alone decides, as for the gate), ranked in most of the
        candidate's windows. None when no operator's growth counts."""
        grown = [
            c
            for c in self.operators
            if c.change > self.min_ms
            and math.isfinite(c.change)
            and c.significant is not False
            and 2 * c.candidate.n > len(self.candidate.windows)
        ]
        return max(grown, key=lambda c: c.change, default=None)

    def headline(self) -> str:
        """One line: regression or not, the step time's change and why it counts or not, and the largest
        regression (or the operator that grew most)."""
        step = self.step_time()
        parts = []
        if step is not None:
            parts.append(f"step time {_change_text(step)}{_why(step, self.fail_over_percent)}")
        every = next((c for c in self.figures if c.name == EPOCH_STEP_TIME_MS_P50.key), None)
        if every is not None:
            parts.append(f"every step's median {_change_text(every)}{_why(every, self.fail_over_percent)}")
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
    path: str | os.PathLike[str],
    *,
    max_trace_mb: float | None = None,
    max_events: int | None = None,
    skip: Callable[[str], None] | None = None,
    accepts: str = "give a run directory, a report file or a trace file",
) -> Side:
    """Load one side: a run directory, a report file or a trace file (see the module docstring).

    A ``.json`` file is a report file when it lies in a ``plugins/fitprof`` folder or is a JSON object with a
    ``"report"`` key; any other file is read as a trace.

    Args:
        path: the run directory or file.
        max_trace_mb, max_events: bounds on a trace file (:func:`fitprof.analyze`'s).
        skip: called with one line (``<file>: <what is wrong>``) for each report file of a run directory that
            cannot be read, which is then left out (a run killed mid-write leaves one beside good ones); None:
            such a file raises.
        accepts: what the caller takes, said in the error for a folder holding no report file.

    Raises:
        CompareInputError: the path is missing, holds no report file, no readable one, or (``skip`` None) a file
            in it cannot be read (the message names the file and says why).
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
                f"plugins/fitprof/<session>.rank<r>.json); {accepts}"
            )
        windows, triggered, unreadable = [], 0, []
        for f in files:
            try:
                doc = _read_report(f, logdir=p)
            except CompareInputError as err:
                if skip is None:
                    raise
                unreadable.append(str(err))
                continue
            if trigger_step(doc.session or f.name.partition(".rank")[0]) is not None:
                triggered += 1
                continue
            windows.append(Window(doc.report, doc.epoch, doc.rank))
        if len(unreadable) == len(files):
            raise CompareInputError(f"{shown}: no readable report file ({'; '.join(unreadable)})")
        if skip is not None:
            for line in unreadable:
                skip(line)
        if not windows:
            raise CompareInputError(f"{shown}: only windows the slowdown trigger opened; no scheduled window")
        return Side(shown, KIND_RUN, windows, triggered, epoch_values(p))
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


def load_baseline(path: str | os.PathLike[str], skip: Callable[[str], None] | None = None) -> Side:
    """A baseline for the callbacks: a run directory or a report file (no trace: a trace would be analysed at
    every comparison). ``skip`` as :func:`load_side`'s: each unreadable report file of a run directory beside
    readable ones.

    Raises:
        CompareInputError: as :func:`load_side`, and for a trace file.
    """
    side = load_side(path, skip=skip, accepts="a baseline is a run directory or a report file")
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


MAX_EVENT_FILE_BYTES = 256_000_000
"""Event files bigger than this are not read for the always-on step timing (a run's scalars take a few MB)."""


def epoch_values(run: Path) -> dict[str, list[float]]:
    """The always-on step timing logged below ``run``: every ``fitprof/epoch/*`` scalar in its TensorBoard event
    files (``events.out.tfevents.*``: the Keras callback's own file, Lightning's ``TensorBoardLogger``), one value
    per step it was logged at (the last one when a step repeats), in step order. Empty when there is none, when
    tensorboard is not installed, or for a file that cannot be read (the windows are compared all the same).

    The files are TFRecord framed (length, its CRC, the record, its CRC); each record is a TensorBoard ``Event``
    parsed with tensorboard's protobuf classes, without TensorFlow.
    """
    try:
        from tensorboard.compat.proto import event_pb2
    except ImportError:
        return {}
    found: dict[str, dict[int, float]] = {}
    for path in sorted(run.rglob("events.out.tfevents.*")):
        try:
            if path.stat().st_size > MAX_EVENT_FILE_BYTES:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        at = 0
        while at + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, at)
            record = data[at + 12 : at + 12 + length]
            at += 12 + length + 4
            if len(record) != length:
                break  # a file cut short while it was written
            try:
                event = event_pb2.Event.FromString(record)
            except Exception:  # protobuf's DecodeError: a damaged record, skipped
                continue
            for value in event.summary.value:
                if value.tag.startswith(EPOCH_PREFIX):
                    number = _scalar(value)
                    if number is not None:
                        found.setdefault(value.tag, {})[int(event.step)] = number
    return {tag: [v for _, v in sorted(steps.items())] for tag, steps in found.items()}


def _scalar(value: Any) -> float | None:
    """A summary value's scalar: ``simple_value`` (torch's ``SummaryWriter``) or a one-element float tensor
    (tensorboard's ``scalar_pb``)."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    tensor = value.tensor
    if tensor.float_val:
        return float(tensor.float_val[0])
    if tensor.double_val:
        return float(tensor.double_val[0])
    if tensor.tensor_content and tensor.dtype in (1, 2):  # DT_FLOAT, DT_DOUBLE
        fmt = "<f" if tensor.dtype == 1 else "<d"
        if len(tensor.tensor_content) == struct.calcsize(fmt):
            return float(struct.unpack(fmt, tensor.tensor_content)[0])
    return None


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
    b_ops, c_ops = _steady_ops(baseline), _steady_ops(candidate)
    if b_ops and c_ops:
        shared, smaller = len(b_ops & c_ops), min(len(b_ops), len(c_ops))
        if shared < MIN_SHARED_OPERATORS * smaller:
            reasons.append(
                f"mostly different operators ({shared} of the {smaller} operators ranked in most windows of the "
                "smaller side are ranked on the other)"
            )
    return reasons


def _values(side: Side, get: Any) -> set[Any]:
    return {v for w in side.windows if (v := get(w.report)) is not None}


def _set_text(values: set[Any]) -> str:
    return "/".join(sorted(map(str, values)))


def _steady_ops(side: Side) -> set[str]:
    """The operators ranked in more than half of the side's windows: on a busy machine a thread preempted inside
    an operator lifts it into one window's top list, never into most of them."""
    counts: dict[str, int] = {}
    for w in side.windows:
        for name in {op.name for op in w.report.top_ops}:
            counts[name] = counts.get(name, 0) + 1
    return {name for name, n in counts.items() if 2 * n > len(side.windows)}


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
        b, c = Stat.of(_figure_values(baseline, fig)), Stat.of(_figure_values(candidate, fig))
        if b.n == 0 or c.n == 0 or b.mean == c.mean == 0:  # absent, or nothing on either side (HtoD on a CPU)
            continue
        figures.append(_change(fig.field, fig.label, fig.unit, b, c, fig.higher_is_worse, fail_over_percent, None))
    notes = []
    by_name = {c.name: c for c in figures}
    step, every = by_name.get("step_time_ms"), by_name.get(EPOCH_STEP_TIME_MS_P50.key)
    if step is not None and step.regression and every is not None and not every.regression:
        notes.append(
            "the windows' step time grew, but the always-on step timing of every step does not confirm it "
            f"({_change_text(every)}{_why(every, fail_over_percent)}): not counted"
        )
    gating = {f.field for f in FIGURES if f.gates}
    figures = [
        c if c.name in gating and (c is not step or every is None or every.regression) else _no_gate(c) for c in figures
    ]
    operators = _operators(baseline, candidate, fail_over_percent, min_ms)
    for side, label in ((baseline, "baseline"), (candidate, "candidate")):
        if side.triggered_left_out:
            notes.append(
                f"{label}: {side.triggered_left_out} window(s) the slowdown trigger opened are left out "
                "(they were taken because steps were slow)"
            )
    if all(w.report.steps_analyzed == 0 for s in (baseline, candidate) for w in s.windows):
        notes.append("no training step was analysed on either side")
    return Comparison(baseline, candidate, figures, operators, fail_over_percent, min_ms, notes)


def _figure_values(side: Side, fig: Figure) -> list[float]:
    if fig.every_step:
        return side.epochs.get(fig.field, [])
    return [float(getattr(w.report, fig.field, math.nan)) for w in side.windows]


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
    if math.isfinite(noise):
        # Beyond the noise, and every window of one side past every window of the other: a spike in one window
        # of a run moves the mean and the spread, not the whole range.
        apart = c.lo > b.hi if change > 0 else c.hi < b.lo
        significant: bool | None = abs(change) > noise and apart
    else:
        significant = None
    worse = change > 0 if higher_is_worse else change < 0
    grown = abs(pct) > fail_over if math.isfinite(pct) else (b.mean == 0 and c.mean > 0)
    regression = worse and grown and significant is not False and (min_ms is None or abs(change) > min_ms)
    return Change(name, label, unit, b, c, change, pct, noise, significant, regression, worse, status)


def _operators(baseline: Side, candidate: Side, fail_over: float, min_ms: float) -> list[Change]:
    """Per operator ranked on either side: its self time per step on each (mean over the windows that rank it),
    and its share of step time. An operator regresses only when its share of step time grew too (beyond the
    shares' noise): a machine busier during one run slows every operator alike and leaves the shares as they
    were, while an operator that itself got slower takes a larger share."""
    b_ops, c_ops = _op_values(baseline), _op_values(candidate)
    b_floor, c_floor = _smallest_ranked(baseline), _smallest_ranked(candidate)
    out = []
    for name in dict.fromkeys([*b_ops, *c_ops]):
        if name in b_ops and name in c_ops:
            status = "both"
            (b, b_share), (c, c_share) = _op_stats(b_ops[name]), _op_stats(c_ops[name])
        elif name in c_ops:
            status, (b, b_share), (c, c_share) = "new", b_floor, _op_stats(c_ops[name])
        else:
            status, (b, b_share), (c, c_share) = "gone", _op_stats(b_ops[name]), c_floor
        change = _change(name, name, "ms/step", b, c, True, fail_over, min_ms, status)
        share = _change(name, name, "%", b_share, c_share, True, 0.0, None, status)
        change = replace(change, baseline_share=b_share, candidate_share=c_share)
        if status == "gone":  # the candidate's value is a bound only: no change can be claimed
            change = replace(change, regression=False, significant=None, worse=False)
        elif change.regression and not share.regression:
            change = replace(change, regression=False, share_held=True)
        if change.regression and 2 * c.n <= len(candidate.windows):
            change = replace(change, regression=False, sporadic=True)
        out.append(change)
    return sorted(out, key=lambda c: -c.change if math.isfinite(c.change) else math.inf)


def _op_values(side: Side) -> dict[str, list[tuple[float, float]]]:
    """Operator name -> (self ms per step, percent of step time) of each window that ranks it."""
    out: dict[str, list[tuple[float, float]]] = {}
    for w in side.windows:
        for op in w.report.top_ops:
            out.setdefault(op.name, []).append((op.self_ms_per_step, op.percent))
    return out


def _op_stats(values: list[tuple[float, float]]) -> tuple[Stat, Stat]:
    return Stat.of([v[0] for v in values]), Stat.of([v[1] for v in values])


def _smallest_ranked(side: Side) -> tuple[Stat, Stat]:
    """The mean over windows of each window's smallest ranked operator time and share: the most an operator the
    side does not rank can take there (0 where a window ranks none); ``n`` 0 (a bound, not a measurement)."""
    ms, pct = [], []
    for w in side.windows:
        smallest = min(w.report.top_ops, key=lambda op: op.self_ms_per_step, default=None)
        ms.append(smallest.self_ms_per_step if smallest else 0.0)
        pct.append(smallest.percent if smallest else 0.0)
    return Stat.bound(statistics.fmean(ms)), Stat.bound(statistics.fmean(pct))


# ------------------------------------------------------------------------------------ against a baseline (callbacks)


@dataclass(frozen=True)
class VsBaseline:
    """One profiled window compared with a baseline (:func:`against_baseline`), for the callbacks' ``baseline=``.

    Attributes:
        step_time_percent: the window's step time over the baseline's mean, less 1, times 100 (+23.4: 23.4% slower;
            NaN when either is unknown): logged as ``fitprof/vs_baseline/step_time_percent``.
        comparison: the full comparison (None when the sides are not comparable).
        reasons: why the sides are not comparable (empty when they are).
    """

    baseline: str
    step_time_percent: float
    comparison: Comparison | None
    reasons: list[str]

    @property
    def regressed(self) -> bool:
        return self.comparison is not None and self.comparison.regressed

    def line(self) -> str:
        """One line for the text summary: the step time against the baseline and the operator that grew most."""
        if self.comparison is None:
            return f"Not compared with the baseline {self.baseline}: {'; '.join(self.reasons)}."
        step = self.comparison.step_time()
        parts = [f"step time {_change_text(step)}{_why(step, self.comparison.fail_over_percent)}"] if step else []
        op = self.comparison.grew_most()
        if op is not None:
            parts.append(f"the operator that grew most: {op.label} {_change_text(op)}")
        status = "regression" if self.regressed else "no regression"
        return f"Against the baseline {self.baseline} ({status}): {'; '.join(parts) or 'no figure to compare'}."


def against_baseline(
    baseline: Side,
    report: BottleneckReport,
    *,
    epoch: int | None = None,
    fail_over_percent: float = DEFAULT_FAIL_OVER_PERCENT,
    min_ms: float = DEFAULT_MIN_MS,
) -> VsBaseline:
    """Compare one window's report with a baseline (:func:`load_baseline`) by :func:`compare`'s rules: the
    window is a candidate side of one window, so the noise is the baseline's spread across its windows.

    Raises:
        ValueError: a threshold is negative or not finite.
    """
    window = Side("this run", KIND_TRACE, [Window(report, epoch, report.rank)])
    base = Stat.of([w.report.step_time_ms for w in baseline.windows]).mean
    pct = 100.0 * (report.step_time_ms / base - 1) if base > 0 and math.isfinite(report.step_time_ms) else math.nan
    try:
        result = compare(baseline, window, fail_over_percent=fail_over_percent, min_ms=min_ms)
    except NotComparableError as err:
        return VsBaseline(baseline.path, math.nan, None, err.reasons)
    return VsBaseline(baseline.path, pct, result, [])

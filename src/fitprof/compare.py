"""Compare two runs' bottleneck figures, aware of their noise: the regression gate behind ``fitprof compare``.

Framework-free. Each side is what one run (or a folder of runs) left behind:

* a run directory, or a folder of several: every report file below it (``<run>/plugins/fitprof/<session>.rank<r>.json``,
  read with :func:`fitprof.report_files.read_report_file`, as ``fitprof report`` reads them), one per profiled
  window and rank; windows the slowdown trigger opened are left out (they were taken because steps were slow);
  and every epoch of every run's always-on timing (:func:`epoch_rows`: the per-epoch files
  ``plugins/fitprof/epochs.rank<r>.jsonl``, or else the ``fitprof/epoch/*`` scalars of the TensorBoard event files);
* one report file (anywhere: a baseline kept in the repository is one);
* one trace file (``.xplane.pb``, ``.pt.trace.json[.gz]``), analysed with :func:`fitprof.analyze`.

**The statistic.** A figure's samples on a side are its values over every window (window figures) or over every
epoch of every run (every-step figures, the epoch parts): a folder of N runs gives N runs' samples to every figure.
A side's value is the median of its samples. The effect is the ratio of the candidate's median to the baseline's,
with its :data:`CONFIDENCE` percentile-bootstrap interval (:data:`BOOTSTRAP_RESAMPLES` resamples of each side, a
fixed seed, so the same inputs give the same interval). A change is *significant* when the interval of the
difference of the medians excludes 0; with a single sample on both sides significance is unknown and the threshold
alone decides.

**The step time over every step.** Where both sides' per-epoch files keep their clean step times (``step_ms``,
written since the callbacks keep them), the step gate is decided by the median of every clean step of every run on
each side, tested with :func:`step_bootstrap`: a hierarchical bootstrap that resamples the runs, then the steps
within them, so that a folder of N runs counts N runs and a shift between runs of the same code widens the
interval. Its default threshold is :data:`DEFAULT_STEP_FAIL_OVER_PERCENT`. A side without step times (older files,
report files, a trace) is compared on the per-epoch medians as before.

**What fails the gate** (:attr:`Comparison.regressed`): each gate of :data:`GATES` has its own threshold
(``fitprof compare --fail-over [GATE=]PCT``). A gate's figure regresses when it went the worse way by more than
its threshold (%), by more than its floor (:data:`FLOORS`: ``min_ms`` for ms figures), and significantly. The
figure that decides a gate is the every-step one where both sides have it (every clean step of every epoch), else
the windows' one.

* The step's own parts (input wait, host-to-device copies, collectives) and the operators are judged in ms per step
  against the step's own change: they regress only when the step time grew by at least :data:`PART_OF_STEP` times
  their own growth. A faster step therefore never fails on its parts: when the step shrinks, what did not shrink
  gains share, which is no regression.
* An operator also needs its share of step time to have grown (a machine busier during one run slows every operator
  alike), and to be ranked in more than half of the candidate's windows (one window's stall is not a slower
  operator). An operator ranked on the candidate side only ("new") is compared with the smallest time ranked on
  the baseline side, the most it can have had there: a new dominant operator is a named regression.
* Operator names are matched across Keras's auto-numbering (:func:`operator_key`: ``dense_1/MatMul`` and
  ``dense_2/MatMul`` are one operator).

**Which regression is named first** (:attr:`Comparison.regressions`, the headline): the step time, then the one
that costs the most time, by :attr:`Change.cost_ms_per_epoch`: what it adds to an epoch in ms, a figure of ms per
step (a part of the step, an operator) times the steps of an epoch (:func:`steps_per_epoch`), an epoch part (s per
epoch: start-up, validation, checkpoint saves) as it is. Not by percent: the first batch's fetch falls into the
epoch's start-up, so 20 ms more in ``collate_fn`` is start-up +1000% (20 ms once an epoch) beside input wait +400%
(20 ms on every step). A figure that is no time (memory) comes after every time, the largest percent first.

**Inconclusive.** When more than a quarter of either side's epochs were CPU-contended (the training thread waited
for a core :data:`CONTENDED_WAIT_PERCENT` % of the wall time or more; a side of report files alone: any of its
windows' epochs), the step times measure the wait, not the code: the status is :data:`STATUS_INCONCLUSIVE` whatever the figures say, and
:attr:`Comparison.contention` names the side and by how much.

**Comparable.** Two sides are comparable when they agree on the setup the reports record: framework, world size,
device, precision (compute dtype), samples per step (the batch size) and the operator-time source; and, from the
per-epoch files' ``setup``, the backend, the model's parameter count and structure (a fingerprint of its layer
classes in order), the precision and the device. A property unknown on a side (files written before it was
recorded) is not held against it. :func:`compare` raises :class:`NotComparableError` naming every difference.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fitprof._session import trigger_step
from fitprof.analysis import BottleneckReport
from fitprof.metrics import (
    COMPARED_METRICS,
    EPOCH_CPU_PERCENT,
    EPOCH_INPUT_MS_PER_STEP,
    EPOCH_INPUT_PERCENT,
    EPOCH_INVOLUNTARY_SWITCHES_PER_S,
    EPOCH_OWN_THREADS_CPU_PERCENT,
    EPOCH_PREFIX,
    EPOCH_RUN_WAIT_PERCENT,
    EPOCH_STEP_TIME_MS_P50,
    EPOCH_STEPS_TIMED,
    EPOCH_TRAIN_STEPS_S,
    Metric,
)
from fitprof.report_files import (
    MAX_REPORT_BYTES,
    ReportFileError,
    find_epoch_files,
    find_report_files,
    is_report_file,
    read_epoch_file,
    read_report_file,
)

NOISE_FACTOR = 2.0
"""Kept for the records: the old rule's factor on the spread. Significance is now the bootstrap interval's."""
CONFIDENCE = 0.99
"""The bootstrap interval's coverage: a change is significant when this interval of the difference of the
medians excludes 0 (a strict level, as asv's p < 0.002 is strict: with 3 samples a side it takes every candidate
sample past every baseline sample)."""
BOOTSTRAP_RESAMPLES = 2000
"""Resamples of each side for the interval."""
BOOTSTRAP_SEED = 20260101
"""The generator's seed: the same inputs give the same interval and the same verdict."""
DEFAULT_FAIL_OVER_PERCENT = 10.0
"""``fitprof compare --fail-over``'s default for every gate but the step time (%)."""
DEFAULT_STEP_FAIL_OVER_PERCENT = 6.0
"""The step gate's default threshold (%) where both sides keep every clean step time: lower than the others because
the step time is then judged over every clean step of every run (:func:`step_bootstrap`), whose interval is narrow
enough to tell a +10% step from the noise, while this minimum effect stands between the gate and the shift between
runs of the same code (their medians spread over 6-9% in 8 runs on a quiet machine). Measured on 2 quiet cores
(``benchmarks/compare_gate.py``: a sleep-modelled 12.5-13.8 ms Lightning step, 8 same-code runs and 6 runs 12-14%
slower a set, 4 sets), in folders of 3 runs a side: at 5%, 0-2 false alarms in 56 pairs; at 6%, 0 in each set, with
55-56 of 56 slower pairs caught; at 7%, 0, with 53-56 caught. One run a side cannot tell a 6% shift between runs from
a regression: at 6%, 0-4 false alarms in 56 pairs. Set ``--fail-over step=PCT`` (or a threshold for every figure)
to override."""
STEP_RESAMPLE_CAP = 600
"""Step times of one run that one resample of :func:`step_bootstrap` draws at most: a run that kept more is
represented by this many of its step times, evenly spaced in sorted order (its quantiles kept), so that the
resampling stays a fraction of a second for long runs."""
STEP_RESAMPLE_TOTAL = 4000
"""Step times of one side that one resample draws at most: with many runs, each run's cap is this over the runs
(at least 50), bounding the time and memory of :func:`step_bootstrap` for a folder of many long runs."""
_CHUNK = 250
"""Resamples computed at once (bounds the memory of a side's resampled steps)."""
DEFAULT_MIN_MS = 0.1
"""``--min-ms``'s default: a ms figure or an operator must also grow by more than this many ms per step."""
PART_OF_STEP = 0.5
"""A part of the step (input wait, copies, collectives, an operator) regresses only when the step time grew by at
least this fraction of the part's own growth (ms per step): what the step did not feel is not a regression."""
PART_MIN_STEP_PERCENT = 3.0
"""A part of the step (input wait, copies, collectives) regresses only when its growth (ms per step) is at least this
share of the baseline's step time (%): less is within what runs of the same code differ by. Over the 56 ordered
pairs of 8 same-code runs (a 12.5-13.4 ms step, 2 cores, quiet) the input wait grew by up to 1.42% of the step
(+0.15 ms), past its 10% threshold and ``--min-ms``. Operators keep ``--min-ms`` alone: their own share of the step
must grow too (:func:`_operators`), and the largest same-code growth seen was 0.63% of the step."""
CONTENDED_WAIT_PERCENT = 20.0
"""An epoch whose training thread waited for a core this share of its wall time (or more) is CPU-contended (the
figure ``fitprof/epoch/run_wait_percent`` documents the same line)."""
CONTENDED_RUNNABLE_PERCENT = 25.0
"""An epoch whose training thread waited for a core this share (or more) of the time it was ready to run (its wait
over its wait plus its own CPU time, the CPU time being ``cpu_percent`` less ``own_threads_cpu_percent``) is
CPU-contended too. The share of wall time misses a training thread that mostly sleeps or blocks (on a GPU
kernel, on a ``time.sleep``-modelled step, on I/O): it cannot wait for a core 20% of the wall time while it wants
one for only a third of it. Measured on 2 cores (steps of a 10 ms sleep and ~3 ms of CPU, 3 sets of 33-39 epochs
each): beside 2 busy processes the training thread waited 13-27% of the wall time (half of the epochs under the
20% line) but 42-51% of its runnable time; on the quiet machine 0-8.4%."""
CONTENDED_SWITCHES_PER_CPU_S = 1000.0
"""Without the run-queue wait (no schedstat): this many involuntary context switches per CPU second make an epoch
CPU-contended."""
CONTENDED_SHARE = 0.25
"""A side is CPU-contended when more than this share of its epochs were, or any of its windows was."""
SAMPLES_TOLERANCE = 0.01
"""Samples per step that differ by more than this fraction mean another batch size."""
EVERY_STEP_INPUT_MS = EPOCH_INPUT_MS_PER_STEP.key
"""Derived per epoch, not logged (:data:`fitprof.metrics.EPOCH_INPUT_MS_PER_STEP`): ``input_percent`` / 100 x ``step_time_ms_p50``, the input wait in ms per step."""

GATES = ("step", "operator", "input", "htod", "collectives", "validation", "checkpoint", "startup", "memory")
"""The figures that can fail the gate, each with its own threshold (``--fail-over GATE=PCT``)."""
FLOORS = {"validation": 0.01, "checkpoint": 0.01, "startup": 0.01, "memory": 1.0}
"""A gate's figure must also grow by more than this (in its unit: s for the epoch parts, MB for memory); the ms
figures use ``min_ms``."""

KIND_RUN = "run directory"
KIND_REPORT = "report file"
KIND_TRACE = "trace file"

STATUS_REGRESSION = "regression"
STATUS_OK = "ok"
STATUS_INCONCLUSIVE = "inconclusive"


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
    """What one run (or a folder of runs) left behind, as :func:`load_side` found it.

    Attributes:
        path: the path as given.
        kind: :data:`KIND_RUN`, :data:`KIND_REPORT` or :data:`KIND_TRACE`.
        windows: the profiled windows compared (scheduled windows only), at least one.
        triggered_left_out: windows the slowdown trigger opened, not compared.
        epochs: the always-on timing, ``fitprof/epoch/<name>`` -> one value per epoch of every run (runs one after
            the other, epochs in order; :func:`epoch_rows`), plus the derived :data:`EVERY_STEP_INPUT_MS`; empty
            without it.
        runs: how many runs the epochs come from (0 without any).
        rows: the same epochs as one dict of figures each (what the contention check reads).
        steps: every clean step time (ms) of each run, one list a run (the per-epoch files' ``step_ms``, its epochs
            one after the other); a run whose file keeps none (written before they were kept) is left out, and
            the step gate falls back to the per-epoch medians when a side has none.
        setup: each setup field (:data:`fitprof.report_files.SETUP_FIELDS`) -> the values its epochs recorded
            (empty for files written before the setup was recorded).
    """

    path: str
    kind: str
    windows: list[Window]
    triggered_left_out: int = 0
    epochs: dict[str, list[float]] = field(default_factory=dict)
    runs: int = 0
    rows: list[dict[str, float]] = field(default_factory=list)
    steps: list[list[float]] = field(default_factory=list)
    setup: dict[str, set[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Figure:
    """A figure compared: the :class:`~fitprof.BottleneckReport` field (or ``fitprof/epoch/*`` tag) it is read
    from, how it is shown, which way is worse, and the gate it can fail ("" for none)."""

    field: str
    label: str
    unit: str
    higher_is_worse: bool = True
    gate: str = ""
    every_step: bool = False
    """Read from the always-on timing (:attr:`Side.epochs`, one value per epoch of every run), not the windows."""

    @property
    def gates(self) -> bool:
        return bool(self.gate)


_PARTS = ("input", "htod", "collectives")


def figures_of(compared: Sequence[Metric]) -> tuple[Figure, ...]:
    """The :class:`Figure` of each metric with a ``compared`` (:class:`fitprof.metrics.Compared`), in the order
    given: an every-step figure is read by its ``fitprof/epoch/*`` key, a window figure by its report ``field``."""
    return tuple(
        Figure(m.key if c.every_step else m.field, c.label, c.unit, c.higher_is_worse, c.gate, c.every_step)
        for m in compared
        if (c := m.compared) is not None
    )


FIGURES: tuple[Figure, ...] = figures_of(COMPARED_METRICS)
"""The figures compared, one per registry row with a comparison (:data:`fitprof.metrics.COMPARED_METRICS`), in
its order; a figure with no finite value on either side is left out. Where a gate has two figures (the windows'
and the every-step one) and both sides have the every-step one, it decides: the windows hold a few steps, the
always-on timing every clean step of every epoch of every run."""


@dataclass(frozen=True)
class Stat:
    """One side's samples of a figure: their ``median``, ``mean``, sample standard deviation ``spread`` (NaN when
    ``n`` < 2), smallest ``lo`` and largest ``hi``, and the samples themselves. ``n`` 0 with a finite median is a
    bound, not a measurement (an operator a side does not rank)."""

    mean: float
    spread: float
    n: int
    lo: float = math.nan
    hi: float = math.nan
    median: float = math.nan
    values: tuple[float, ...] = ()

    @staticmethod
    def of(values: Sequence[float]) -> Stat:
        finite = tuple(float(v) for v in values if math.isfinite(v))
        if not finite:
            return Stat(math.nan, math.nan, 0)
        spread = statistics.stdev(finite) if len(finite) >= 2 else math.nan
        return Stat(
            statistics.fmean(finite), spread, len(finite), min(finite), max(finite), statistics.median(finite), finite
        )

    @staticmethod
    def bound(value: float) -> Stat:
        return Stat(value, math.nan, 0, value, value, value)


def bootstrap(baseline: Sequence[float], candidate: Sequence[float]) -> tuple[float, float, float, float]:
    """The :data:`CONFIDENCE` percentile-bootstrap intervals of the difference of the medians (candidate less
    baseline, in the figure's unit) and of their ratio (candidate over baseline; NaN bounds when a baseline
    resample's median is 0): ``(diff_lo, diff_hi, ratio_lo, ratio_hi)``. Each side is resampled with replacement
    :data:`BOOTSTRAP_RESAMPLES` times by a generator seeded with :data:`BOOTSTRAP_SEED`.

    Raises:
        ValueError: a side is empty.
    """
    if not baseline or not candidate:
        raise ValueError("bootstrap needs at least one sample a side")
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    b, c = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    mb = np.median(b[rng.integers(0, len(b), (BOOTSTRAP_RESAMPLES, len(b)))], axis=1)
    mc = np.median(c[rng.integers(0, len(c), (BOOTSTRAP_RESAMPLES, len(c)))], axis=1)
    return _intervals(mb, mc)


def _intervals(mb: np.ndarray, mc: np.ndarray) -> tuple[float, float, float, float]:
    """The ``CONFIDENCE`` percentile intervals of the resampled medians' difference (candidate less baseline) and
    ratio (NaN where a baseline median is not positive), from paired resamples ``mb``, ``mc``."""
    tail = 100 * (1 - CONFIDENCE) / 2
    d_lo, d_hi = np.percentile(mc - mb, [tail, 100 - tail])
    if np.all(mb > 0):
        r_lo, r_hi = np.percentile(mc / mb, [tail, 100 - tail])
    else:
        r_lo = r_hi = math.nan
    return float(d_lo), float(d_hi), float(r_lo), float(r_hi)


def _pooled_medians(runs: Sequence[Sequence[float]], rng: np.random.Generator) -> np.ndarray:
    """:data:`BOOTSTRAP_RESAMPLES` medians of a side's steps resampled in two stages: its runs drawn with
    replacement (as many as it has), then each run's steps drawn with replacement; a run drawn k times weighs k
    times in the pooled median (one resample of its steps serves all k draws)."""
    cap = min(STEP_RESAMPLE_CAP, max(50, STEP_RESAMPLE_TOTAL // len(runs)))
    arrays = []
    for run in runs:
        a = np.sort(np.asarray(run, dtype=float))
        if len(a) > cap:
            a = a[np.linspace(0, len(a) - 1, cap).round().astype(int)]
        arrays.append(a)
    n_runs = len(arrays)
    out = []
    for start in range(0, BOOTSTRAP_RESAMPLES, _CHUNK):
        b = min(_CHUNK, BOOTSTRAP_RESAMPLES - start)
        drawn = rng.integers(0, n_runs, (b, n_runs))
        counts = np.stack([(drawn == r).sum(axis=1) for r in range(n_runs)], axis=1)  # (b, runs): times drawn
        values = np.concatenate([a[rng.integers(0, len(a), (b, len(a)))] for a in arrays], axis=1)
        weights = np.concatenate([np.repeat(counts[:, [r]], len(a), axis=1) for r, a in enumerate(arrays)], axis=1)
        order = np.argsort(values, axis=1)
        values = np.take_along_axis(values, order, axis=1)
        cum = np.cumsum(np.take_along_axis(weights, order, axis=1), axis=1)
        at = np.argmax(cum >= cum[:, -1:] / 2.0, axis=1)  # the weighted median: the first value holding half
        out.append(values[np.arange(b), at])
    return np.concatenate(out)


def step_bootstrap(
    baseline: Sequence[Sequence[float]], candidate: Sequence[Sequence[float]]
) -> tuple[float, float, float, float]:
    """The :data:`CONFIDENCE` intervals of the difference (ms) and of the ratio of the median step times of two
    sides given as every clean step time (ms) of each run, one list a run: ``(diff_lo, diff_hi, ratio_lo,
    ratio_hi)``, NaN ratio bounds when a resampled baseline median is 0.

    The test is a hierarchical percentile bootstrap (:data:`BOOTSTRAP_RESAMPLES` resamples, seeded with
    :data:`BOOTSTRAP_SEED`): each side's runs are drawn with replacement, then each drawn run's steps, and the
    resample's statistic is the median of the pooled steps. Resampling the runs first makes a folder of N runs count
    as N runs: a shift between runs of the same code widens the interval, where resampling the pooled steps alone
    would take thousands of steps of a few runs for thousands of independent samples. With one run a side only the
    steps are resampled, and the interval holds the step-to-step spread alone (the threshold guards against a
    shift between runs there).

    Raises:
        ValueError: a side has no run with a step time.
    """
    b_runs = [list(r) for r in baseline if len(r)]
    c_runs = [list(r) for r in candidate if len(r)]
    if not b_runs or not c_runs:
        raise ValueError("step_bootstrap needs at least one step time a side")
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    mb, mc = _pooled_medians(b_runs, rng), _pooled_medians(c_runs, rng)
    return _intervals(mb, mc)


@dataclass(frozen=True)
class Change:
    """One compared figure or operator.

    Attributes:
        name: the figure's field (``step_time_ms``) or the operator's name (auto-numbering taken out).
        label: how it is shown (``step time``; the operator's name).
        unit: ``ms``, ``ms/step``, ``samples/s``, ...
        baseline, candidate: each side's :class:`Stat`; an operator not ranked on a side has ``n`` 0 there.
        change: ``candidate.median - baseline.median`` (NaN when either is unknown); for a new operator, at least
            this much (the baseline value stands for the most it can have had).
        change_percent: ``change`` over the baseline median, times 100 (NaN when the baseline is 0 or unknown).
        noise: half the width of the interval of the difference (NaN when unknown), for the tables.
        significant: the interval of the difference excludes 0; None when unknown (one sample a side).
        regression: whether this change fails the gate.
        worse: whether the change goes the bad way (slower, less throughput).
        status: ``both``, ``new`` (ranked on the candidate side only) or ``gone`` (baseline only); figures:
            ``both``.
        baseline_share, candidate_share: operators only: the share of step time (%) on each side.
        share_held: operators only: grew past the thresholds, but its share of step time did not grow
            significantly (the whole step slowed alike).
        sporadic: operators only: grew past the thresholds but is ranked in at most half of the candidate's
            windows.
        gate: the gate this change can fail ("" for none); threshold: that gate's threshold (%).
        ratio, ratio_lo, ratio_hi: the ratio of the medians and its interval (NaN when unknown).
        step_held: a part of the step (or an operator) that grew past its thresholds while the step time did not
            grow by :data:`PART_OF_STEP` of that: not a regression.
        small_for_step: a part of the step (input wait, copies, collectives) that grew past its thresholds by less than
            :data:`PART_MIN_STEP_PERCENT` of the baseline's step time: not a regression.
        test: how the samples were taken and tested, in words, where it is not the default (the medians of the
            windows' or the epochs' values, :func:`bootstrap`): the step time over every step says so.
        cost_ms_per_epoch: the time the change adds to one epoch (ms; negative when it saves time): ``change`` times
            the candidate's steps per epoch (:func:`steps_per_epoch`) for a figure in ms per step (``ms``,
            ``ms/step``: the step time, its parts, an operator), ``change`` times 1000 for an epoch part (``s``);
            NaN for a figure that is no time (memory, throughput). What orders :attr:`Comparison.regressions`.
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
    gate: str = ""
    threshold: float = math.nan
    ratio: float = math.nan
    ratio_lo: float = math.nan
    ratio_hi: float = math.nan
    step_held: bool = False
    small_for_step: bool = False
    test: str = ""
    cost_ms_per_epoch: float = math.nan


@dataclass(frozen=True)
class Contention:
    """How CPU-contended a side was: ``epochs`` of its ``of`` epochs (and ``windows`` of its windows) contended, the
    largest run-queue wait seen (% of wall time, NaN without schedstat) and the largest share of the training
    thread's runnable time it waited (:func:`runnable_wait_percent`, NaN where unknown)."""

    side: str
    epochs: int
    of: int
    windows: int
    worst_wait_percent: float
    worst_runnable_percent: float = math.nan

    def text(self) -> str:
        parts = []
        if self.epochs:
            parts.append(f"{self.epochs} of {self.of} epochs CPU-contended")
        if self.windows:
            parts.append(f"{self.windows} window(s) of a CPU-contended epoch")
        runnable = (
            f", {self.worst_runnable_percent:.0f}% of the time it was ready to run"
            if math.isfinite(self.worst_runnable_percent)
            else ""
        )
        wait = (
            f" (the training thread waited for a core up to {self.worst_wait_percent:.0f}% of the wall time{runnable})"
            if math.isfinite(self.worst_wait_percent)
            else ""
        )
        return f"{self.side}: {', '.join(parts)}{wait}"


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare`.

    Attributes:
        baseline, candidate: the two sides.
        figures: one :class:`Change` per figure of :data:`FIGURES` with a value on both sides.
        operators: one :class:`Change` per operator ranked on either side, the largest growth first.
        fail_over_percent: the step gate's threshold (%); thresholds: every gate's.
        min_ms: the floor of the ms figures and operators.
        notes: what the reader should know beside the figures.
        contention: each CPU-contended side (empty when neither was): the comparison is inconclusive.
        steps_per_epoch: the steps of an epoch that turn a figure's ms per step into its time per epoch
            (:attr:`Change.cost_ms_per_epoch`): the candidate's :func:`steps_per_epoch`, else the baseline's, else 1
            (no epoch on either side, so no epoch part either).
    """

    baseline: Side
    candidate: Side
    figures: list[Change]
    operators: list[Change]
    fail_over_percent: float
    min_ms: float
    notes: list[str] = field(default_factory=list)
    contention: list[Contention] = field(default_factory=list)
    thresholds: dict[str, float] = field(default_factory=dict)
    steps_per_epoch: float = math.nan

    @property
    def regressions(self) -> list[Change]:
        """Every change that fails the gate: the step time first, then the one that costs the most time
        (:attr:`Change.cost_ms_per_epoch`), then those that are no time (memory), the largest growth (% of the
        baseline) first. By time, not percent: a few ms once an epoch can be +1000% where 20 ms on every step
        is +400%, and the reader should fix the 20 ms first."""
        found = [c for c in (*self.figures, *self.operators) if c.regression]
        return sorted(found, key=_rank)

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)

    @property
    def inconclusive(self) -> bool:
        return bool(self.contention)

    @property
    def status(self) -> str:
        """:data:`STATUS_INCONCLUSIVE` when a side was CPU-contended, else :data:`STATUS_REGRESSION` or
        :data:`STATUS_OK`."""
        if self.inconclusive:
            return STATUS_INCONCLUSIVE
        return STATUS_REGRESSION if self.regressed else STATUS_OK

    def step_time(self) -> Change | None:
        """The step time that decides the step gate: every step's where both sides have it, else the windows'."""
        return _decider(self.figures, "step")

    def grew_most(self) -> Change | None:
        """The operator whose self time per step grew most in ms per step (its percentage aside: a 0.01 ms operator
        doubling is no news), among the changes that count: by more than :attr:`min_ms`, not within the noise,
        ranked in most of the candidate's windows. None when no operator's growth counts."""
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
        """One line: the status, the CPU-contended side (if any), the largest regression other than the step time
        (named: an operator, the input wait), the step time's change with its interval, else the operator that
        grew most."""
        step = self.step_time()
        parts = []
        if self.contention:
            parts.append(
                "CPU-contended, so step times measure the wait for a core ("
                + "; ".join(c.text() for c in self.contention)
                + ")"
            )
        others = [c for c in self.regressions if c.gate != "step"]
        if others:
            top = others[0]
            more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
            parts.append(f"{top.label} {_change_text(top)}{_why(top)}{more}")
        if step is not None:
            parts.append(f"{step.label} {_change_text(step)}{_why(step)}")
        if not others and (op := self.grew_most()) is not None:
            parts.append(f"the operator that grew most: {op.label} {_change_text(op)}")
        return f"{self.status}: {'; '.join(parts) or 'no figure on both sides'}."


def _rank(c: Change) -> tuple[bool, bool, float]:
    """The order of :attr:`Comparison.regressions`: the step time, then time costs largest first, then the rest
    by percent."""
    cost = c.cost_ms_per_epoch
    if math.isfinite(cost):
        return (c.gate != "step", False, -cost)
    return (c.gate != "step", True, -_size(c))


def _size(c: Change) -> float:
    if math.isfinite(c.change_percent):
        return c.change_percent
    return math.inf if c.change > 0 else 0.0


def _decider(changes: Sequence[Change], gate: str) -> Change | None:
    """The change that decides ``gate``: its every-step figure where present, else its windows' figure."""
    mine = [c for c in changes if c.gate == gate]
    every = {f.field for f in FIGURES if f.every_step}
    return next((c for c in mine if c.name in every), None) or next(iter(mine), None)


def _change_text(c: Change) -> str:
    """``+23.4% (12.10 -> 14.93 ms, ratio 1.23 [1.18, 1.29])``; a new operator: ``new, 2.31 ms/step (at most 0.12
    before)``."""
    if c.status == "new":
        return (
            f"new in the ranked operators, {c.candidate.median:.3g} {c.unit} (at most {c.baseline.median:.3g} before)"
        )
    if c.status == "gone":
        return f"no longer ranked (was {c.baseline.median:.3g} {c.unit})"
    pct = f"{c.change_percent:+.1f}% " if math.isfinite(c.change_percent) else ""
    interval = (
        f", ratio {c.ratio:.3f} [{c.ratio_lo:.3f}, {c.ratio_hi:.3f}] at {CONFIDENCE:.0%}"
        if math.isfinite(c.ratio_lo) and c.baseline.n + c.candidate.n > 2
        else ""
    )
    return f"{pct}({c.baseline.median:.4g} -> {c.candidate.median:.4g} {c.unit}{interval})"


def _why(c: Change) -> str:
    if c.regression:
        if c.status == "new":
            return f", past the {c.threshold:g}% threshold over the most it can have had"
        return f", past the {c.threshold:g}% threshold" + (
            " and significant" if c.significant else " (one sample a side: significance unknown)"
        )
    if c.step_held:
        return ", but the step time did not grow by as much"
    if c.small_for_step:
        return f", but by less than {PART_MIN_STEP_PERCENT:g}% of the step time"
    if c.significant is False and c.worse:
        return ", not significant (the interval holds no change)"
    if c.worse and math.isfinite(c.change_percent) and abs(c.change_percent) <= c.threshold:
        return f", under the {c.threshold:g}% threshold"
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
        rows, runs, steps, setup = _epoch_data(p)
        return Side(shown, KIND_RUN, windows, triggered, _columns(rows), runs, rows, steps, setup)
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


def epoch_rows(run: Path) -> tuple[list[dict[str, float]], int]:
    """Every epoch of every run below ``run`` (a run directory, or a folder of several): one dict of its
    ``fitprof/epoch/*`` figures each, and how many runs they come from.

    Read from the per-epoch files (``plugins/fitprof/epochs.rank<r>.jsonl``, every rank, every fit: each fit of
    each file is one run) where there are any; else from the TensorBoard event files' ``fitprof/epoch/*``
    scalars, each folder of event files one run (:func:`epoch_values`). Each row also holds the derived
    :data:`EVERY_STEP_INPUT_MS`. A file that cannot be read is left out (the windows are compared all the same).
    """
    rows, runs, _, _ = _epoch_data(run)
    return rows, runs


def _epoch_data(run: Path) -> tuple[list[dict[str, float]], int, list[list[float]], dict[str, set[str]]]:
    """:func:`epoch_rows`, and from the per-epoch files also every run's clean step times (one list a run with
    any: each fit of each file, its epochs' ``step_ms`` one after the other) and the setup values recorded."""
    rows: list[dict[str, float]] = []
    runs: dict[tuple[str, int], list[float]] = {}
    setup: dict[str, set[str]] = {}
    for path in find_epoch_files(run):
        try:
            records = read_epoch_file(path, logdir=run)
        except (ReportFileError, OSError):
            continue
        for record in records:
            rows.append(_with_input_ms(dict(record.figures)))
            runs.setdefault((os.fspath(path), record.fit), []).extend(record.step_ms)
            for key, value in record.setup.items():
                setup.setdefault(key, set()).add(value)
    if rows:
        return rows, len(runs), [steps for steps in runs.values() if steps], setup
    by_run = _event_values(run)
    for steps in by_run.values():
        rows.extend(_with_input_ms(figures) for _, figures in sorted(steps.items()))
    return rows, len(by_run), [], {}


def _with_input_ms(figures: dict[str, float]) -> dict[str, float]:
    pct, p50 = figures.get(EPOCH_INPUT_PERCENT.key, math.nan), figures.get(EPOCH_STEP_TIME_MS_P50.key, math.nan)
    if math.isfinite(pct) and math.isfinite(p50):
        figures[EVERY_STEP_INPUT_MS] = pct / 100.0 * p50
    return figures


def _columns(rows: Sequence[Mapping[str, float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for row in rows:
        for tag, value in row.items():
            out.setdefault(tag, []).append(value)
    return out


def epoch_values(run: Path) -> dict[str, list[float]]:
    """The always-on step timing logged in the TensorBoard event files below ``run``: every ``fitprof/epoch/*``
    scalar, one value per step it was logged at (the last one when a step repeats within one run), runs one after
    the other (each folder of event files is one run: a folder of N runs gives N runs' values, none overwriting
    another's). Empty when there is none, when tensorboard is not installed, or for a file that cannot be read.

    The files are TFRecord framed (length, its CRC, the record, its CRC); each record is a TensorBoard ``Event``
    parsed with tensorboard's protobuf classes, without TensorFlow.
    """
    rows = [figures for steps in _event_values(run).values() for _, figures in sorted(steps.items())]
    return _columns(rows)


def _event_values(run: Path) -> dict[str, dict[int, dict[str, float]]]:
    """Folder of event files -> step -> ``fitprof/epoch/*`` tag -> value."""
    try:
        from tensorboard.compat.proto import event_pb2
    except ImportError:
        return {}
    found: dict[str, dict[int, dict[str, float]]] = {}
    for path in sorted(run.rglob("events.out.tfevents.*")):
        try:
            if path.stat().st_size > MAX_EVENT_FILE_BYTES:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        steps = found.setdefault(os.fspath(path.parent), {})
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
                        steps.setdefault(int(event.step), {})[value.tag] = number
    return {k: v for k, v in found.items() if v}


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
    """Why the two sides cannot be compared, one reason each (empty: comparable), from the setup the report files
    record: framework, world size, device, precision, samples per step, operator-time source; and from the setup the
    per-epoch files record (:attr:`Side.setup`): backend, parameter count, model structure, precision, device. A
    property unknown on a side (a bare trace knows no batch size, a file written before the setup was recorded
    knows no parameter count) is not held against it. The operators ranked are no part of it: an operator that
    appears is a finding (:func:`compare`), not another setup."""
    reasons = []
    for what, get in (
        ("framework", lambda r: r.framework or None),
        ("world size", lambda r: r.world_size),
        ("device", lambda r: r.device_name or None),
        ("precision", lambda r: r.compute_dtype or None),
        ("operator times", lambda r: r.op_time_source or None),
    ):
        b, c = _values(baseline, get), _values(candidate, get)
        if b and c and b != c:
            reasons.append(f"{what} {_set_text(b)} vs {_set_text(c)}")
    b_samples = Stat.of([w.report.samples_per_step for w in baseline.windows]).median
    c_samples = Stat.of([w.report.samples_per_step for w in candidate.windows]).median
    if (
        math.isfinite(b_samples)
        and math.isfinite(c_samples)
        and abs(c_samples - b_samples) > SAMPLES_TOLERANCE * max(b_samples, c_samples)
    ):
        reasons.append(f"samples per step (batch size) {b_samples:g} vs {c_samples:g}")
    named = {r.split(" ")[0] for r in reasons}
    for key, what in _SETUP_WORDS.items():
        b, c = baseline.setup.get(key, set()), candidate.setup.get(key, set())
        if b and c and b != c and what.split(" ")[0] not in named:
            reasons.append(f"{what} {_set_text(b)} vs {_set_text(c)}")
    return reasons


_SETUP_WORDS = {
    "backend": "backend",
    "parameters": "parameter count",
    "structure": "model structure (layer classes, fingerprint)",
    "precision": "precision",
    "device": "device",
}
"""How :func:`comparable` names each setup field of the per-epoch files (:data:`fitprof.report_files.SETUP_FIELDS`)."""


def _values(side: Side, get: Any) -> set[Any]:
    return {v for w in side.windows if (v := get(w.report)) is not None}


def _set_text(values: set[Any]) -> str:
    return "/".join(sorted(map(str, values)))


_AUTO_NUMBER = re.compile(r"(?<=[A-Za-z])_\d+(?=$|[/:.])")


def operator_key(name: str) -> str:
    """An operator's name with Keras's auto-numbering taken out of each scope (``sequential_3/dense_2/MatMul`` ->
    ``sequential/dense/MatMul``): a model built twice in one process numbers its layers anew. Two layers of one
    model that differ only by that number become one operator (their times added)."""
    return _AUTO_NUMBER.sub("", name)


def contention(side: Side, label: str) -> Contention | None:
    """How CPU-contended ``side`` was (None when it was not, by :data:`CONTENDED_SHARE`): from each epoch's
    run-queue wait (``fitprof/epoch/run_wait_percent`` at :data:`CONTENDED_WAIT_PERCENT` or more; without it,
    involuntary switches per CPU second at :data:`CONTENDED_SWITCHES_PER_CPU_S` or more); a side without the
    always-on figures (report files alone), from each window's ``contention`` (the callback found its epoch
    contended)."""
    epochs, waits, shares = 0, [], []
    for row in side.rows:
        wait = row.get(EPOCH_RUN_WAIT_PERCENT.key, math.nan)
        if math.isfinite(wait):
            waits.append(wait)
            share = runnable_wait_percent(row)
            if math.isfinite(share):
                shares.append(share)
            epochs += wait >= CONTENDED_WAIT_PERCENT or share >= CONTENDED_RUNNABLE_PERCENT
            continue
        cpu, switches = (
            row.get(EPOCH_CPU_PERCENT.key, math.nan),
            row.get(EPOCH_INVOLUNTARY_SWITCHES_PER_S.key, math.nan),
        )
        if cpu > 0 and switches / (cpu / 100.0) >= CONTENDED_SWITCHES_PER_CPU_S:
            epochs += 1
    # The windows' flag is their epoch's verdict: it decides only where the side has no epoch rows (report files
    # alone), else one contended epoch of many would count twice.
    windows = 0 if side.rows else sum(1 for w in side.windows if w.report.contention)
    if not windows and not (side.rows and epochs > CONTENDED_SHARE * len(side.rows)):
        return None
    return Contention(
        label, epochs, len(side.rows), windows, max(waits, default=math.nan), max(shares, default=math.nan)
    )


def runnable_wait_percent(row: Mapping[str, float]) -> float:
    """The training thread's wait for a core over the time it was ready to run (its wait plus its own CPU time),
    times 100, from one epoch's figures: ``run_wait_percent`` over itself plus ``cpu_percent`` less
    ``own_threads_cpu_percent`` (all % of the epoch's wall time). NaN where a figure is missing (no schedstat) or
    the sum is not positive."""
    wait = row.get(EPOCH_RUN_WAIT_PERCENT.key, math.nan)
    own = row.get(EPOCH_CPU_PERCENT.key, math.nan) - row.get(EPOCH_OWN_THREADS_CPU_PERCENT.key, math.nan)
    ready = wait + max(own, 0.0) if math.isfinite(own) else math.nan
    return 100.0 * wait / ready if math.isfinite(ready) and ready > 0 else math.nan


def parse_thresholds(fail_over: float | Mapping[str, float] | None = None) -> dict[str, float]:
    """Every gate's threshold (%): ``fail_over`` for all, or a mapping of some gates (the rest keep their default:
    :data:`DEFAULT_FAIL_OVER_PERCENT`; ``"*"`` sets the rest), or None for every default.

    Raises:
        ValueError: an unknown gate, or a threshold negative or not finite.
    """
    if fail_over is None:
        fail_over = {}
    if isinstance(fail_over, Mapping):
        unknown = [g for g in fail_over if g != "*" and g not in GATES]
        if unknown:
            raise ValueError(f"unknown figure {unknown[0]!r} for a threshold; allowed: {', '.join(GATES)}")
        rest = float(fail_over.get("*", DEFAULT_FAIL_OVER_PERCENT))
        out = {g: float(fail_over.get(g, rest)) for g in GATES}
    else:
        out = {g: float(fail_over) for g in GATES}
    for gate, value in out.items():
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"the {gate} threshold must be a finite number >= 0, got {value}")
    return out


def compare(
    baseline: Side,
    candidate: Side,
    *,
    fail_over_percent: float | Mapping[str, float] | None = None,
    min_ms: float = DEFAULT_MIN_MS,
    check_comparable: bool = True,
) -> Comparison:
    """Compare ``candidate`` with ``baseline`` (see the module docstring for the rules).

    Args:
        baseline, candidate: the sides (:func:`load_side`).
        fail_over_percent: every gate's threshold (%), or a mapping gate -> threshold, or None for the defaults
            (:func:`parse_thresholds`); where the step gate's is not given and both sides keep every step time,
            it is :data:`DEFAULT_STEP_FAIL_OVER_PERCENT`.
        min_ms: a ms figure or an operator must also grow by more than this (ms per step); >= 0.
        check_comparable: raise when the sides are not comparable (:func:`comparable`).

    Raises:
        NotComparableError: the sides differ in setup (``check_comparable``).
        ValueError: a threshold is negative or not finite, or names an unknown gate.
    """
    thresholds = parse_thresholds(fail_over_percent)
    if isinstance(fail_over_percent, Mapping):
        step_given = bool({"step", "*"} & set(fail_over_percent))
    else:
        step_given = fail_over_percent is not None
    if baseline.steps and candidate.steps and not step_given:
        thresholds["step"] = DEFAULT_STEP_FAIL_OVER_PERCENT
    if not math.isfinite(min_ms) or min_ms < 0:
        raise ValueError(f"min_ms must be a finite number >= 0, got {min_ms}")
    if check_comparable and (reasons := comparable(baseline, candidate)):
        raise NotComparableError(baseline.path, candidate.path, reasons)
    figures: list[Change] = []
    for fig in FIGURES:
        b, c = Stat.of(_figure_values(baseline, fig)), Stat.of(_figure_values(candidate, fig))
        if b.n == 0 or c.n == 0 or b.median == c.median == 0:  # absent, or nothing on either side (HtoD on a CPU)
            continue
        floor = FLOORS.get(fig.gate, min_ms if fig.unit.startswith("ms") else 0.0)
        threshold = thresholds.get(fig.gate, thresholds["step"])
        if fig.every_step and fig.gate == "step" and baseline.steps and candidate.steps:
            change = _every_step_change(fig, baseline, candidate, threshold, floor)
        else:
            change = _change(fig.field, fig.label, fig.unit, b, c, fig.higher_is_worse, threshold, floor)
        figures.append(replace(change, gate=fig.gate, regression=change.regression and fig.gates))
    notes = []
    deciders = {gate: _decider(figures, gate) for gate in GATES}
    kept = []
    for ch in figures:
        decider = deciders.get(ch.gate)
        if ch.gate and ch is not decider and ch.regression:
            if decider is not None and not decider.regression:
                notes.append(
                    f"the windows' {ch.label} grew ({_change_text(ch)}), but the always-on timing of every step "
                    f"does not confirm it ({_change_text(decider)}{_why(decider)}): not counted"
                )
            ch = replace(ch, regression=False)
        kept.append(ch)
    figures = kept
    step = _decider(figures, "step")
    step_change = step.change if step is not None else math.nan
    step_base = step.baseline.median if step is not None else math.nan
    if step is not None and step.test:
        notes.append(f"{step.label}: {step.test}")
    figures = [_held_by_step(c, step_change, step_base) if c.gate in _PARTS else c for c in figures]
    operators = [_held_by_step(c, step_change) for c in _operators(baseline, candidate, thresholds["operator"], min_ms)]
    for side, label in ((baseline, "baseline"), (candidate, "candidate")):
        if side.triggered_left_out:
            notes.append(
                f"{label}: {side.triggered_left_out} window(s) the slowdown trigger opened are left out "
                "(they were taken because steps were slow)"
            )
    if all(w.report.steps_analyzed == 0 for s in (baseline, candidate) for w in s.windows):
        notes.append("no training step was analysed on either side")
    steps = steps_per_epoch(candidate)
    if not math.isfinite(steps):
        steps = steps_per_epoch(baseline)
    if not math.isfinite(steps):
        steps = 1.0  # no epoch on either side, so no epoch part to weigh a step's ms against
    figures = [_with_cost(c, steps) for c in figures]
    operators = [_with_cost(c, steps) for c in operators]
    contended = [x for x in (contention(baseline, "baseline"), contention(candidate, "candidate")) if x is not None]
    return Comparison(
        baseline, candidate, figures, operators, thresholds["step"], min_ms, notes, contended, thresholds, steps
    )


def steps_per_epoch(side: Side) -> float:
    """The training steps of one of ``side``'s epochs, the median over its epochs: each epoch's time in training
    steps (``fitprof/epoch/train_steps_s``) over its median step time (``fitprof/epoch/step_time_ms_p50``), so
    every step counts, the first and a window's too; an epoch without those counts its clean steps
    (``fitprof/epoch/steps_timed``, fewer than it ran). NaN without any epoch (report files, a trace)."""
    counts = []
    for row in side.rows:
        train_s, p50 = row.get(EPOCH_TRAIN_STEPS_S.key, math.nan), row.get(EPOCH_STEP_TIME_MS_P50.key, math.nan)
        if math.isfinite(train_s) and train_s > 0 and math.isfinite(p50) and p50 > 0:
            counts.append(1000.0 * train_s / p50)
        elif math.isfinite(timed := row.get(EPOCH_STEPS_TIMED.key, math.nan)) and timed > 0:
            counts.append(timed)
    return statistics.median(counts) if counts else math.nan


def _with_cost(c: Change, steps: float) -> Change:
    """:attr:`Change.cost_ms_per_epoch` of ``c`` for epochs of ``steps`` steps."""
    if c.unit in ("ms", "ms/step"):
        return replace(c, cost_ms_per_epoch=c.change * steps)
    if c.unit == "s":
        return replace(c, cost_ms_per_epoch=c.change * 1000.0)
    return c


def _every_step_change(fig: Figure, baseline: Side, candidate: Side, threshold: float, floor: float) -> Change:
    """The step time over every clean step of every run on each side: the medians of the pooled steps, their
    change and :func:`step_bootstrap`'s interval (runs, then steps resampled)."""
    b = Stat.of([v for run in baseline.steps for v in run])
    c = Stat.of([v for run in candidate.steps for v in run])
    interval = step_bootstrap(baseline.steps, candidate.steps)
    change = _change(fig.field, fig.label, fig.unit, b, c, fig.higher_is_worse, threshold, floor, interval=interval)
    one = (
        " (one run a side: the interval holds the step-to-step spread only)"
        if min(len(baseline.steps), len(candidate.steps)) == 1
        else ""
    )
    test = (
        f"median of every clean step, {b.n} step(s) of {len(baseline.steps)} run(s) against {c.n} of "
        f"{len(candidate.steps)}; {CONFIDENCE:.0%} interval of the ratio by resampling the runs, then the steps "
        f"within them ({BOOTSTRAP_RESAMPLES} resamples){one}"
    )
    return replace(change, test=test)


def _held_by_step(c: Change, step_change: float, step_base: float = math.nan) -> Change:
    """A part of the step (or an operator) that regressed only counts when the step itself grew by
    :data:`PART_OF_STEP` of the part's growth (ms): a faster step never fails on what did not shrink with it; and,
    given the baseline's step time ``step_base`` (ms; the parts, not the operators), when that growth is at least
    :data:`PART_MIN_STEP_PERCENT` of it."""
    if not c.regression:
        return c
    if math.isfinite(step_change) and not step_change >= PART_OF_STEP * c.change:
        return replace(c, regression=False, step_held=True)
    if math.isfinite(step_base) and c.change < PART_MIN_STEP_PERCENT / 100.0 * step_base:
        return replace(c, regression=False, small_for_step=True)
    return c


def _figure_values(side: Side, fig: Figure) -> list[float]:
    if fig.every_step:
        return side.epochs.get(fig.field, [])
    return [float(getattr(w.report, fig.field, math.nan)) for w in side.windows]


def _change(
    name: str,
    label: str,
    unit: str,
    b: Stat,
    c: Stat,
    higher_is_worse: bool,
    threshold: float,
    floor: float | None,
    status: str = "both",
    interval: tuple[float, float, float, float] | None = None,
) -> Change:
    """``interval``: the bootstrap intervals (:func:`bootstrap`'s tuple) when they come from elsewhere
    (:func:`step_bootstrap`); None: :func:`bootstrap` of the two :class:`Stat`'s samples."""
    change = c.median - b.median
    pct = 100.0 * change / b.median if b.median > 0 else math.nan
    ratio = c.median / b.median if b.median > 0 else math.nan
    significant: bool | None = None
    noise = r_lo = r_hi = math.nan
    if b.n >= 1 and c.n >= 1 and b.n + c.n > 2:
        d_lo, d_hi, r_lo, r_hi = interval if interval is not None else bootstrap(b.values, c.values)
        significant = d_lo > 0 or d_hi < 0
        noise = (d_hi - d_lo) / 2
    worse = change > 0 if higher_is_worse else change < 0
    grown = abs(pct) > threshold if math.isfinite(pct) else (b.median == 0 and c.median > 0)
    regression = worse and grown and significant is not False and (floor is None or abs(change) > floor)
    return Change(
        name,
        label,
        unit,
        b,
        c,
        change,
        pct,
        noise,
        significant,
        regression,
        worse,
        status,
        threshold=threshold,
        ratio=ratio,
        ratio_lo=r_lo,
        ratio_hi=r_hi,
    )


def _operators(baseline: Side, candidate: Side, threshold: float, min_ms: float) -> list[Change]:
    """Per operator ranked on either side (names matched by :func:`operator_key`): its self time per step on each
    (over the windows that rank it), and its share of step time. An operator regresses only when its share of
    step time grew too: a machine busier during one run slows every operator alike and leaves the shares as they
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
        change = _change(name, name, "ms/step", b, c, True, threshold, min_ms, status)
        share = _change(name, name, "%", b_share, c_share, True, 0.0, None, status)
        change = replace(change, baseline_share=b_share, candidate_share=c_share, gate="operator")
        if status == "gone":  # the candidate's value is a bound only: no change can be claimed
            change = replace(change, regression=False, significant=None, worse=False)
        elif change.regression and not share.regression:
            change = replace(change, regression=False, share_held=True)
        if change.regression and 2 * c.n <= len(candidate.windows):
            change = replace(change, regression=False, sporadic=True)
        out.append(change)
    return sorted(out, key=lambda c: -c.change if math.isfinite(c.change) else math.inf)


def _op_values(side: Side) -> dict[str, list[tuple[float, float]]]:
    """Operator key (:func:`operator_key`) -> (self ms per step, percent of step time) of each window that ranks
    it; operators of one window with one key are added."""
    out: dict[str, list[tuple[float, float]]] = {}
    for w in side.windows:
        mine: dict[str, tuple[float, float]] = {}
        for op in w.report.top_ops:
            key = operator_key(op.name)
            ms, pct = mine.get(key, (0.0, 0.0))
            mine[key] = (ms + op.self_ms_per_step, pct + op.percent)
        for key, value in mine.items():
            out.setdefault(key, []).append(value)
    return out


def _op_stats(values: list[tuple[float, float]]) -> tuple[Stat, Stat]:
    return Stat.of([v[0] for v in values]), Stat.of([v[1] for v in values])


def _smallest_ranked(side: Side) -> tuple[Stat, Stat]:
    """The median over windows of each window's smallest ranked operator time and share: the most an operator the
    side does not rank can take there (0 where a window ranks none); ``n`` 0 (a bound, not a measurement)."""
    ms, pct = [], []
    for w in side.windows:
        smallest = min(w.report.top_ops, key=lambda op: op.self_ms_per_step, default=None)
        ms.append(smallest.self_ms_per_step if smallest else 0.0)
        pct.append(smallest.percent if smallest else 0.0)
    return Stat.bound(statistics.median(ms)), Stat.bound(statistics.median(pct))


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
        parts = [f"step time {_change_text(step)}{_why(step)}"] if step else []
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

"""Always-on step timing and the slowdown trigger (framework-free: stdlib and numpy only).

Three pieces, used by both adapters:

* :class:`StepRecorder`: one epoch's wall-clock step times, from a ``time.perf_counter_ns()`` stamp taken at each
  step boundary (and, where the adapter can see it, the time the loop waited for its batch and the batch's
  sample count). Steps that would mislead are *excluded*: the first steps of an epoch (warm-up, compilation,
  iterator start-up), the steps that hold validation (and the ones right after), and the steps inside a
  profiling window (the profiler's own cost). A checkpoint save is *taken out* of the step it ran in
  (:meth:`StepRecorder.take_out`) instead: saving every few steps would otherwise exclude every step.
  :meth:`StepRecorder.too_few` says why an epoch timed too few steps. At epoch end :meth:`StepRecorder.summary` gives an
  :class:`EpochSteps`: steps timed, step time p50/p90/max, input share and samples per second over the clean
  steps. O(1) per step (three list appends), no device synchronisation.
* :class:`SlowdownTrigger`: a robust rolling baseline (median and MAD of the last ``baseline_steps`` clean step
  times) and a rule that fires when ``consecutive`` clean steps in a row are slower than
  ``median + max(mad_k * 1.4826 * MAD, rel * median)``; at most ``max_windows`` firings per run, at least
  ``min_spacing`` steps apart. Excluded steps never enter the baseline nor count towards a firing. After it
  fires, the adapter opens a profiling window at the next step boundary.
* :func:`not_representative`: whether a profiled window's step time or input share is off its epoch's by more
  than the run-to-run spread, and the words that say so.

The default thresholds and why they are what they are: docs/lightning.md, "Always-on step timing".
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DEFAULT_WARMUP_STEPS",
    "EpochSteps",
    "SlowdownTrigger",
    "StepRecorder",
    "TriggerEvent",
    "not_representative",
]

DEFAULT_WARMUP_STEPS = 3
"""Steps excluded at the start of every epoch: the first step holds the DataLoader iterator's start-up (worker
processes, a first prefetch), the first steps of the first epoch compilation and allocator warm-up."""

AFTER_PAUSE_STEPS = 1
"""Steps excluded after a pause (validation, checkpoint save, a profiling window): the step that holds the pause
itself, plus this many more while caches and prefetch queues refill."""

WARMUP = "warmup"
"""Why a step is excluded (:meth:`StepRecorder.exclude_next`): the first steps of the epoch."""
VALIDATION = "validation"
"""Why: validation ran in it or just before it."""
WINDOW = "window"
"""Why: a profiling window held it (or had just closed)."""
FLOPS = "flops"
"""Why: fitprof counted the step's FLOPs."""
OTHER_PAUSE = "pause"
"""Why: another pause (the default)."""
_REASON_WORDS = {
    WARMUP: ("warm-up step (the first of the epoch)", "warm-up steps (the first of the epoch)"),
    VALIDATION: ("step during or after validation", "steps during or after validation"),
    WINDOW: ("step in or after a profiling window", "steps in or after a profiling window"),
    FLOPS: ("step whose FLOPs were counted", "steps whose FLOPs were counted"),
    OTHER_PAUSE: ("step after a pause", "steps after a pause"),
}

_MAD_TO_SIGMA = 1.4826
"""MAD x 1.4826 estimates the standard deviation of normally distributed noise."""

_NO_INPUT = -1
_NO_SAMPLES = -1


@dataclass(frozen=True)
class EpochSteps:
    """The step-time figures of one epoch, over its clean (not excluded) steps.

    Attributes:
        steps_timed: clean steps the figures come from.
        steps_excluded: steps seen but left out (warm-up, validation, checkpoint, profiling window).
        step_time_ms_p50: median wall time of a clean step (ms), NaN without clean steps.
        step_time_ms_p90: 90th percentile (ms, numpy's linear interpolation), NaN without clean steps.
        step_time_ms_max: the slowest clean step (ms), NaN without clean steps.
        step_time_ms_mean: mean clean step time (ms).
        input_percent: time waiting for the batch over step time, summed over the clean steps whose wait was
            measured, times 100 (0-100); NaN when no wait was measured (an adapter that cannot see the fetch).
        samples_per_s: samples over seconds, summed over the clean steps whose batch size is known; NaN when
            none is known.
    """

    steps_timed: int
    steps_excluded: int
    step_time_ms_p50: float
    step_time_ms_p90: float
    step_time_ms_max: float
    step_time_ms_mean: float
    input_percent: float
    samples_per_s: float


class StepRecorder:
    """Wall-clock time of every training step of one epoch (see the module docstring).

    Use: :meth:`begin_epoch` with the stamp of the epoch start (it also excludes the next ``warmup_steps``
    steps), then :meth:`step` once per step boundary with a fresh ``time.perf_counter_ns()`` stamp; the step's
    time is the stamp less the previous boundary's. :meth:`exclude_next` flags coming steps (call it when a
    pause starts: validation, a checkpoint, a profiling window); :meth:`summary` at epoch end.

    Args:
        warmup_steps: steps excluded at the start of every epoch (>= 0).

    Attributes:
        step_ns: the clean steps' wall times of the current epoch (ns), in order.
        step_index: their 1-based step numbers in the epoch (as the adapter numbered them).
    """

    def __init__(self, warmup_steps: int = DEFAULT_WARMUP_STEPS) -> None:
        self.warmup_steps = int(warmup_steps)
        self.step_ns: list[int] = []
        self.step_index: list[int] = []
        self._input_ns: list[int] = []
        self._samples: list[int] = []
        self._last_ns: int | None = None
        self._skip = 0
        self._excluded = 0
        self._taken = 0  # ns taken out of the step in progress (a save inside it)
        self._reason = WARMUP
        self._reasons: dict[str, int] = {}  # steps excluded this epoch, by why

    def begin_epoch(self, now_ns: int | None) -> None:
        """Forget the previous epoch; ``now_ns`` (``perf_counter_ns``) is the start of the epoch's first step
        (None: the first :meth:`step` call only sets the origin and is not timed)."""
        self.step_ns = []
        self.step_index = []
        self._input_ns = []
        self._samples = []
        self._last_ns = now_ns
        self._skip = self.warmup_steps
        self._excluded = 0
        self._taken = 0
        self._reason = WARMUP
        self._reasons = {}

    def exclude_next(self, n: int = 1 + AFTER_PAUSE_STEPS, reason: str = "") -> None:
        """Exclude the next ``n`` steps (counted from the step in progress), or more where more are excluded
        already. ``reason`` (e.g. :data:`VALIDATION`, :data:`WINDOW`) is what :meth:`too_few` names for them."""
        if n > self._skip:
            self._skip = n
            self._reason = reason or OTHER_PAUSE

    def take_out(self, ns: int) -> None:
        """Take ``ns`` (a pause inside the step in progress that is not training: a checkpoint save) out of that
        step's time instead of excluding the step: the step and the ones after it stay timed."""
        if ns > 0:
            self._taken += int(ns)

    def step(self, now_ns: int, index: int, *, input_ns: int | None = None, samples: int | None = None) -> int | None:
        """Record the step that ends at ``now_ns`` (``time.perf_counter_ns()``).

        Args:
            now_ns: the stamp of this step boundary.
            index: the step's 1-based number in the epoch.
            input_ns: the part of the step spent waiting for its batch (ns), None when not measured.
            samples: the step's batch size (:func:`fitprof._batch.batch_size`), None when unknown.

        Returns:
            The step's wall time in ns when it is clean (recorded), None when it is excluded or is the first
            boundary seen (no previous stamp).
        """
        # Every training step runs this: plain comparisons, no helper calls.
        last, self._last_ns = self._last_ns, now_ns
        taken = self._taken
        if taken:
            self._taken = 0
        if self._skip > 0 or last is None:
            why = self._reason if self._skip > 0 else WARMUP
            self._reasons[why] = self._reasons.get(why, 0) + 1
            self._skip = max(self._skip - 1, 0)
            self._excluded += 1
            return None
        dt = now_ns - last - taken
        if dt < 0:
            dt = 0
        self.step_ns.append(dt)
        self.step_index.append(index)
        if input_ns is None:
            self._input_ns.append(_NO_INPUT)
        else:
            wait = int(input_ns)
            self._input_ns.append(wait if wait > 0 else 0)
        self._samples.append(_NO_SAMPLES if samples is None else int(samples))
        return dt

    def too_few(self, epoch: int, min_steps: int | None = None, min_seen: int | None = None) -> str | None:
        """Why the epoch timed fewer than ``min_steps`` (None: :data:`MIN_STEPS_COMPARED`, the fewest that stand
        for an epoch) of the ``min_seen`` or more steps it saw outside its warm-up steps and profiling windows
        (None: twice ``min_steps``), e.g. ``"epoch 3 timed
        2 of 24 steps (fewer than 10): 19 steps during or after validation, 3 warm-up steps (the first of the
        epoch)"``; None otherwise. A shorter epoch times few steps by its nature (warm-up, a window), one that saw
        many and timed few lost them to a pause that repeats. Say it once per fit: the cause repeats every epoch."""
        if min_steps is None:
            min_steps = MIN_STEPS_COMPARED
        if min_seen is None:
            min_seen = 2 * min_steps
        timed = len(self.step_ns)
        seen = timed + self._excluded
        by_design = self._reasons.get(WARMUP, 0) + self._reasons.get(WINDOW, 0)
        if timed >= min_steps or seen - by_design < max(min_seen, 1):
            return None
        why = ", ".join(
            f"{n} {_REASON_WORDS.get(reason, (reason, reason))[n != 1]}"
            for reason, n in sorted(self._reasons.items(), key=lambda item: -item[1])
        )
        return f"epoch {epoch} timed {timed} of {seen} steps (fewer than {min_steps}): {why}"

    def summary(self, device_ms: list[float] | None = None) -> EpochSteps:
        """The figures of the epoch so far (:class:`EpochSteps`); never raises.

        Args:
            device_ms: where steps run on a device, each clean step's device-side time (ms, one per entry of
                :attr:`step_ns`, e.g. between CUDA events recorded at the step boundaries): the step-time p50, p90,
                max and mean then come from it; input share and samples/s stay on the host clock. Ignored when
                its length differs.
        """
        n = len(self.step_ns)
        if n == 0:
            nan = math.nan
            return EpochSteps(0, self._excluded, nan, nan, nan, nan, nan, nan)
        ms = np.asarray(self.step_ns, dtype=np.float64) / 1e6
        times = ms if device_ms is None or len(device_ms) != n else np.asarray(device_ms, dtype=np.float64)
        p50, p90 = (float(v) for v in np.percentile(times, [50, 90]))
        wait = np.asarray(self._input_ns, dtype=np.float64)
        measured = wait >= 0
        input_pct = math.nan
        if measured.any():
            total = float(ms[measured].sum())
            input_pct = 100.0 * float(wait[measured].sum()) / 1e6 / total if total > 0 else math.nan
        samples = np.asarray(self._samples, dtype=np.float64)
        known = samples >= 0
        per_s = math.nan
        if known.any():
            seconds = float(ms[known].sum()) / 1e3
            per_s = float(samples[known].sum()) / seconds if seconds > 0 else math.nan
        return EpochSteps(
            steps_timed=n,
            steps_excluded=self._excluded,
            step_time_ms_p50=p50,
            step_time_ms_p90=p90,
            step_time_ms_max=float(times.max()),
            step_time_ms_mean=float(times.mean()),
            input_percent=input_pct,
            samples_per_s=per_s,
        )


@dataclass(frozen=True)
class TriggerEvent:
    """One firing of the :class:`SlowdownTrigger`.

    Attributes:
        step: the number (as passed to :meth:`SlowdownTrigger.observe`) of the step that completed the run of
            slow steps; the window opens at the next step boundary.
        step_time_ms: the median wall time of the slow run of steps that fired it (ms).
        baseline_ms: the baseline median step time at that moment (ms).
        threshold_ms: the step time the slow steps exceeded (ms).
    """

    step: int
    step_time_ms: float
    baseline_ms: float
    threshold_ms: float


class SlowdownTrigger:
    """Fires when training steps stay slower than their recent baseline (see the module docstring).

    Feed it every clean step with :meth:`observe` (never an excluded one: the adapter passes only what
    :meth:`StepRecorder.step` recorded). A step is *slow* when its time exceeds
    ``threshold = median + max(mad_k * 1.4826 * MAD, rel * median)`` of the last ``baseline_steps`` clean steps
    (``MAD`` = median absolute deviation: a run of outliers moves neither figure much). ``consecutive`` slow steps
    in a row fire it, once the baseline holds at least ``min_baseline`` steps, at most ``max_windows`` times per
    run and at least ``min_spacing`` steps after the previous firing. After a firing the baseline starts afresh, so
    a slowdown that persists becomes the new normal rather than firing again and again.

    The defaults were measured on a 2-core machine shared by six busy processes (steady Lightning fits, step
    wall times' MAD 19-28% of their median, single steps up to 12x the median): replaying 7,988 measured steps of
    three fits (2-3 ms and 140 ms steps) gave 3 false firings with these defaults (1 in about 2,700 steps;
    ``consecutive=3`` gave 10-16 with ``mad_k`` 8-10, ``mad_k=6`` gave 6). On a quiet machine (MAD a few % of the
    median) the ``rel`` floor rules: a slowdown of 25% or more fires it; on a noisy one only a slowdown larger than
    the noise can.

    The threshold is recomputed every ``refresh`` steps (two sorts of ``baseline_steps`` ints), so a step costs one
    comparison and a deque append most of the time: 5.6-6.3 us a step on average, measured over 50,000 synthetic
    steps on that busy machine (load average about 11).

    Args:
        baseline_steps: K, the clean steps the baseline is computed from (>= 4).
        min_baseline: clean steps needed before it may fire (4 <= min_baseline <= baseline_steps).
        consecutive: M, slow steps in a row that fire it (>= 1).
        mad_k: the margin in robust standard deviations (>= 0).
        rel: the smallest margin, as a fraction of the median (>= 0): noise-free step times would otherwise fire
            on a 1% wobble.
        max_windows: the most firings per run (>= 0; 0 never fires).
        min_spacing: steps (as numbered in :meth:`observe`) between two firings (>= 0).
        refresh: recompute the threshold every this many clean steps (>= 1).

    Raises:
        ValueError: for an argument outside the ranges above.

    Attributes:
        events: every :class:`TriggerEvent` of the run so far.
        threshold_ns: the current threshold (ns; ``inf`` until the baseline holds ``min_baseline`` steps), read-only
            (:attr:`threshold_ms` in ms).
    """

    def __init__(
        self,
        *,
        baseline_steps: int = 64,
        min_baseline: int = 16,
        consecutive: int = 5,
        mad_k: float = 8.0,
        rel: float = 0.25,
        max_windows: int = 3,
        min_spacing: int = 200,
        refresh: int = 16,
    ) -> None:
        checks = (
            ("baseline_steps", baseline_steps, 4),
            ("min_baseline", min_baseline, 4),
            ("consecutive", consecutive, 1),
            ("max_windows", max_windows, 0),
            ("min_spacing", min_spacing, 0),
            ("refresh", refresh, 1),
        )
        for name, value, low in checks:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if min_baseline > baseline_steps:
            raise ValueError(f"min_baseline must be <= baseline_steps ({baseline_steps}), got {min_baseline!r}")
        for name, fvalue in (("mad_k", mad_k), ("rel", rel)):
            if isinstance(fvalue, bool) or not isinstance(fvalue, (int, float)) or not fvalue >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {fvalue!r}")
        self.baseline_steps = baseline_steps
        self.min_baseline = min_baseline
        self.consecutive = consecutive
        self.mad_k = float(mad_k)
        self.rel = float(rel)
        self.max_windows = max_windows
        self.min_spacing = min_spacing
        self.refresh = refresh
        self.events: list[TriggerEvent] = []
        self._base: deque[int] = deque(maxlen=baseline_steps)
        self._run: list[int] = []
        self._since_refresh = 0
        self.threshold_ns = math.inf
        self._median_ns = math.nan
        self._last_fire: int | None = None
        self._before_fire: list[int] = []  # the baseline the last firing forgot, back if it is withdrawn

    def reset_run(self) -> None:
        """Forget the baseline and the current run of slow steps, keep the firings (a new ``fit``: call
        :meth:`reset` to forget those too)."""
        self._base.clear()
        self._run = []
        self._since_refresh = 0
        self.threshold_ns = math.inf
        self._median_ns = math.nan

    def reset(self) -> None:
        """Forget everything (a new run)."""
        self.reset_run()
        self.events = []
        self._last_fire = None

    @property
    def baseline_ms(self) -> float:
        """The current baseline median (ms); NaN before the first refresh."""
        return self._median_ns / 1e6

    @property
    def threshold_ms(self) -> float:
        """The current threshold (ms); ``inf`` until the baseline holds ``min_baseline`` steps."""
        return self.threshold_ns / 1e6

    def _recompute(self) -> None:
        self._since_refresh = 0
        if len(self._base) < self.min_baseline:
            self.threshold_ns = math.inf
            return
        values = sorted(self._base)
        median = _median_sorted(values)
        mad = _median_sorted(sorted(abs(v - median) for v in values))
        self._median_ns = median
        self.threshold_ns = median + max(self.mad_k * _MAD_TO_SIGMA * mad, self.rel * median)

    def observe(self, step_ns: int, step: int, *, allowed: bool = True) -> TriggerEvent | None:
        """Feed one clean step's wall time (ns) and its number; the :class:`TriggerEvent` when it fires now.

        ``allowed=False`` (the adapter cannot open a window now: one is open or due, the epoch ends) keeps
        counting the run of slow steps but holds the firing back to the first allowed step.

        A slow step is judged against the threshold in force before it (it enters the baseline afterwards, so a
        slowdown that lasts moves the baseline slowly: the median of ``baseline_steps`` needs half of them slow).
        """
        if len(self.events) >= self.max_windows:
            return None  # spent: no more work per step
        fired = None
        if step_ns > self.threshold_ns:
            self._run.append(step_ns)
            if len(self._run) >= self.consecutive and allowed and self._may_fire(step):
                run = sorted(self._run)
                fired = TriggerEvent(
                    step=step,
                    step_time_ms=_median_sorted(run) / 1e6,
                    baseline_ms=self._median_ns / 1e6,
                    threshold_ms=self.threshold_ns / 1e6,
                )
                self.events.append(fired)
                self._last_fire = step
                before = list(self._base)
                self.reset_run()
                self._before_fire = before
                return fired
        elif self._run:  # the run of slow steps is broken (most steps: no run, nothing to allocate)
            self._run = []
        self._base.append(step_ns)
        self._since_refresh += 1
        if self._since_refresh >= self.refresh or self.threshold_ns == math.inf:
            self._recompute()
        return fired

    def withdraw(self, event: TriggerEvent) -> None:
        """Take back a firing that proved a false alarm (its window's steps were no slower than the baseline's
        threshold): it no longer counts against ``max_windows`` nor starts the ``min_spacing`` gap, and (for the
        latest firing) the baseline it forgot comes back, so a real slowdown soon after can still fire. No-op for
        an event this trigger did not fire."""
        if event in self.events:
            last = event is self.events[-1]
            self.events.remove(event)
            self._last_fire = self.events[-1].step if self.events else None
            if last:
                # The steps before the firing were the real baseline: without them a slowdown that begins
                # while a fresh baseline fills would enter it and never fire.
                since = list(self._base)
                self._base.clear()
                self._base.extend(self._before_fire + since)
                self._run = []
                self._recompute()
            self._before_fire = []

    def _may_fire(self, step: int) -> bool:
        if len(self.events) >= self.max_windows:
            return False
        return self._last_fire is None or step - self._last_fire >= self.min_spacing


def _median_sorted(values: list[int] | list[float]) -> float:
    n = len(values)
    mid = n // 2
    return float(values[mid]) if n % 2 else (values[mid - 1] + values[mid]) / 2.0


STEP_TIME_REL_THRESHOLD = 0.5
"""A window's mean step time more than 50% off its epoch's mean clean step time is "not representative".

Measured spread (same steady fits as the trigger defaults): the mean of 5 consecutive steps was off the epoch mean
by more than 25% in 46-66% of windows and by more than 50% in 10-28%, so 50% is the smallest margin that is not
mostly noise there; a profiled window also adds the profiler's own cost to each step."""
INPUT_PP_THRESHOLD = 10.0
"""A window's input share more than 10 percentage points off its epoch's is "not representative".

Measured spread (the same fits): a 5-step window's wall-clock input share was off the epoch's by more than 5 pp in
14-21% of windows and by more than 10 pp in 3-13%."""
MIN_STEPS_COMPARED = 10
"""An epoch with fewer clean steps than this is not compared with its window (too few to stand for the epoch)."""


def not_representative(
    window_step_ms: float,
    window_input_percent: float,
    epoch: EpochSteps,
    *,
    step_rel: float = STEP_TIME_REL_THRESHOLD,
    input_pp: float = INPUT_PP_THRESHOLD,
    min_steps: int = MIN_STEPS_COMPARED,
) -> str | None:
    """Why a profiled window does not represent its epoch, or None when it does (or cannot be compared).

    Compares the window's mean step time (ms, from its trace) with the epoch's median clean step time (the figure
    the progress bar and ``fitprof/epoch/step_time_ms_p50`` show; a few slow steps, a checkpoint's or a stall's,
    move the mean but not the median, so a window as fast as the epoch's typical step is not called off), and the
    window's input share (%) with the epoch's; a figure that is NaN on either side is not compared.

    Args:
        window_step_ms: the window's mean step time (ms), e.g. ``BottleneckReport.step_time_ms``.
        window_input_percent: the window's input share (0-100).
        epoch: the epoch's :class:`EpochSteps`.
        step_rel: the relative step-time difference above which it says so (0.5 = 50%).
        input_pp: the input-share difference in percentage points above which it says so.
        min_steps: the fewest clean steps the epoch needs to be compared at all.

    Returns:
        E.g. ``"the window is not representative of its epoch (step time 12.1 ms vs a median of 6.0 ms over the
        epoch's 480 timed steps; input 45.0% vs 12.0% for the epoch)"``, or None.
    """
    if epoch.steps_timed < min_steps:
        return None
    reasons = []
    epoch_ms = epoch.step_time_ms_p50
    step_known = math.isfinite(window_step_ms) and math.isfinite(epoch_ms) and epoch_ms > 0
    if step_known and abs(window_step_ms - epoch_ms) > step_rel * epoch_ms:
        reasons.append(
            f"step time {window_step_ms:.1f} ms vs a median of {epoch_ms:.1f} ms over the epoch's "
            f"{epoch.steps_timed} timed steps"
        )
    input_known = math.isfinite(window_input_percent) and math.isfinite(epoch.input_percent)
    if input_known and abs(window_input_percent - epoch.input_percent) > input_pp:
        reasons.append(f"input {window_input_percent:.1f}% vs {epoch.input_percent:.1f}% for the epoch")
    if not reasons:
        return None
    return "the window is not representative of its epoch (" + "; ".join(reasons) + ")"

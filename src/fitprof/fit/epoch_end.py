"""The one path of an epoch's end, framework-free: what :meth:`FitEngine.epoch_end
<fitprof.fit.engine.FitEngine.epoch_end>` asks of its windows and probes, built into one
:class:`~fitprof.fit.result.EpochResult` that the engine hands to one publisher
(:class:`fitprof.fit.publishing.EpochPublisher`).

In order, for an epoch that ended:

1. the epoch-parts probe's verdicts and its CPU-contention evidence (:func:`fitprof.fit.epoch_parts.contention`),
   which revises the verdict of each window of the epoch;
2. the scheduled window (kept by :meth:`EpochEnd.keep`; none on a rank that profiled none, which still takes part
   in the gather): analysed (:meth:`fitprof.fit.pipeline.WindowPipeline.analyze`) with the throughput counts, the
   probes' window figures and the baseline comparison beside its figures, gathered across ranks
   (:meth:`~fitprof.fit.pipeline.WindowPipeline.gather`) into the result's ``window`` scalars and ``log``;
3. the ``fitprof/epoch/*`` figures and the probes' epoch figures;
4. the triggered windows the engine stopped in this epoch (:class:`fitprof.fit.triggered.TriggeredWindows`),
   through the same analysis, each compared with the last scheduled window (:func:`compare_windows`) in one line
   (:func:`trigger_line`), and the ``fitprof/trigger/*`` scalars of the last of them;
5. the lines the adapter prints: the verdicts and the probes' advice.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from fitprof import metrics
from fitprof._warn import WarnOnce
from fitprof.analysis import BottleneckReport, cpu_contended
from fitprof.compare import Side, against_baseline, load_baseline
from fitprof.fit import steps
from fitprof.fit.epoch_parts import EpochParts, contention
from fitprof.fit.pipeline import WindowPipeline
from fitprof.fit.probes import Probes
from fitprof.fit.result import EpochResult, Gather, Triggered, Work
from fitprof.fit.steps import EpochSteps, TriggerEvent
from fitprof.profilers.base import ProfileWindow
from fitprof.throughput import StepWork

Pending = list[tuple[ProfileWindow, Path, TriggerEvent]]
"""The triggered windows stopped in an epoch, each with its trace and its firing."""


OP_GROWTH_FLOOR = 0.05
"""An operator is named as the one that grew only when its self time per step grew by at least 5% of the triggered
window's step time (a 0.06 ms wobble in ``aten::copy_`` is not the cause of a 400 ms step)."""


def compare_windows(triggered: BottleneckReport, normal: BottleneckReport | None, normal_epoch: int | None) -> str:
    """What changed from the last normal window to a triggered one, in one sentence: step time, input share,
    host-to-device copy time per step, and the operator whose self time per step grew most, when that growth is at
    least :data:`OP_GROWTH_FLOOR` of the triggered step time (an operator absent from the normal window's top list
    counts as 0 there, so its growth is an upper bound).

    Returns:
        E.g. ``"vs the normal window of epoch 0: step 3.1 -> 41.0 ms, input 4.0% -> 88.2%, HtoD 0.00 -> 0.00
        ms/step, grew most: aten::bmm 0.00 -> 12.30 ms/step"``; ``"no normal window to compare with"`` without one.
    """
    if normal is None:
        return "no normal window to compare with"
    where = f"epoch {normal_epoch}" if normal_epoch is not None else "this run"
    parts = [
        f"step {normal.step_time_ms:.1f} -> {triggered.step_time_ms:.1f} ms",
        f"input {normal.input_percent:.1f}% -> {triggered.input_percent:.1f}%",
        f"HtoD {normal.htod_ms_per_step:.2f} -> {triggered.htod_ms_per_step:.2f} ms/step",
    ]
    before = {op.name: op.self_ms_per_step for op in normal.top_ops}
    growth = [(op.self_ms_per_step - before.get(op.name, 0.0), op) for op in triggered.top_ops]
    floor = OP_GROWTH_FLOOR * triggered.step_time_ms
    growth = [(g, op) for g, op in growth if math.isfinite(g) and g >= floor]
    if growth:
        _, op = max(growth, key=lambda item: item[0])
        parts.append(f"grew most: {op.name} {before.get(op.name, 0.0):.2f} -> {op.self_ms_per_step:.2f} ms/step")
    else:
        parts.append(f"no operator grew by {100 * OP_GROWTH_FLOOR:.0f}% of the step or more")
    return f"vs the normal window of {where}: " + ", ".join(parts)


def epoch_scalars(figures: steps.EpochSteps) -> dict[str, float]:
    """The ``fitprof/epoch/*`` scalars of one epoch's always-on step timing (NaN where there is no figure), the
    same keys in both callbacks."""
    return {
        metrics.EPOCH_STEP_TIME_MS_P50.key: figures.step_time_ms_p50,
        metrics.EPOCH_STEP_TIME_MS_P90.key: figures.step_time_ms_p90,
        metrics.EPOCH_STEP_TIME_MS_MAX.key: figures.step_time_ms_max,
        metrics.EPOCH_INPUT_PERCENT.key: figures.input_percent,
        metrics.EPOCH_SAMPLES_PER_S.key: figures.samples_per_s,
        metrics.EPOCH_STEPS_TIMED.key: float(figures.steps_timed),
    }


def trigger_scalars(event: steps.TriggerEvent) -> dict[str, float]:
    """The ``fitprof/trigger/*`` scalars of one triggered window: the step after which it fired, that step's time
    and the baseline (ms)."""
    return {
        metrics.TRIGGER_STEP.key: float(event.step),
        metrics.TRIGGER_STEP_TIME_MS.key: event.step_time_ms,
        metrics.TRIGGER_BASELINE_MS.key: event.baseline_ms,
    }


def trigger_line(
    epoch: int,
    event: steps.TriggerEvent,
    report: BottleneckReport | None,
    compared: str,
    *,
    false_alarm_ms: float | None = None,
) -> str:
    """One line for a triggered window, the same in both callbacks: ``fitprof epoch 0: slowdown after step 41
    (40.1 ms/step vs baseline 3.2 ms), triggered window: ...`` followed by ``compared``
    (:func:`compare_windows`). ``false_alarm_ms``: the window's median step wall time when its steps were no
    slower than the threshold (a false alarm, which the trigger took back); the line then says so."""
    head = (
        f"fitprof epoch {epoch}: slowdown after step {event.step} ({event.step_time_ms:.1f} ms/step vs baseline "
        f"{event.baseline_ms:.1f} ms)"
    )
    if false_alarm_ms is not None:
        head += (
            f" was a false alarm: the window's steps took {false_alarm_ms:.1f} ms (median), within the baseline's "
            f"noise (threshold {event.threshold_ms:.1f} ms), so the slowdown had passed; it does not count against "
            "trigger_max_windows or trigger_min_spacing"
        )
    if report is None:
        return f"{head}, the triggered window could not be analysed"
    return (
        f"{head}, triggered window: {report.step_time_ms:.2f} ms/step, input {report.input_percent:.1f}%, "
        f"HtoD {report.htod_percent:.1f}% -> {report.verdict}; {compared}"
    )


class EpochEnd:
    """Builds each epoch's :class:`~fitprof.fit.result.EpochResult` for one engine (see the module docstring).

    Args:
        pipeline, trigger_pipeline: the scheduled and the triggered windows' :class:`~fitprof.fit.pipeline.WindowPipeline`,
            each with its own results and trace retention.
        warn: the adapter's warn-once channel.
        probes: the engine's probes, whose window and epoch figures and advice join the result.
        parts: the engine's epoch-parts probe (the epoch's verdicts and CPU contention).
        baseline: a run directory or report file of an earlier run (:func:`fitprof.compare.load_baseline`).

    Raises:
        TypeError: ``baseline`` is not a path.
        ValueError: ``baseline`` is missing or holds no readable report file (the message names it and says why).

    Attributes:
        pipeline, trigger_pipeline: the scheduled and the triggered windows' results, forgotten at each ``begin_fit``.
        baseline: the loaded baseline (None: none given).
        contention: this epoch's CPU-contention evidence and fix, which each of its windows' verdicts names.
    """

    def __init__(
        self,
        pipeline: WindowPipeline,
        trigger_pipeline: WindowPipeline,
        *,
        warn: WarnOnce,
        probes: Probes,
        parts: EpochParts,
        baseline: str | os.PathLike[str] | None,
    ) -> None:
        self.pipeline, self.trigger_pipeline = pipeline, trigger_pipeline
        if baseline is not None and not isinstance(baseline, (str, os.PathLike)):
            raise TypeError(f"baseline must be a path (a run directory or a report file), got {baseline!r}")
        self.baseline: Side | None = None
        if baseline is not None:
            self.baseline = load_baseline(
                baseline,
                skip=lambda line: warn(f"baseline-unreadable {line}", f"fitprof: baseline report file skipped: {line}"),
            )
        self.warn = warn
        self.probes = probes
        self.parts = parts
        self.contention: tuple[str, str] | None = None
        self.log_dir: str | None = None
        self.rank, self.world = 0, 1
        self._closed: tuple[ProfileWindow, Path] | None = None  # this epoch's stopped scheduled window

    def begin_fit(self, log_dir: str | None, rank: int, world: int) -> None:
        """A ``fit`` begins: where its windows write, this rank and the number of ranks; the last fit's results
        are forgotten."""
        self.log_dir, self.rank, self.world = log_dir, rank, world
        self._closed = None
        self.pipeline.clear()
        self.trigger_pipeline.clear()

    def keep(self, window: ProfileWindow, trace: Path) -> None:
        """The scheduled window stopped with its trace: kept for its epoch's end."""
        self._closed = (window, trace)

    def stopped(self, epoch: int, window: ProfileWindow, trace: Path, *, triggered: bool) -> None:
        """A window of epoch ``epoch`` (``triggered`` or the scheduled one) stopped with its trace: its ``.xplane.pb``
        is handed to the converter now (:meth:`fitprof.fit.pipeline.WindowPipeline.hand_over`)."""
        pipeline = self.trigger_pipeline if triggered else self.pipeline
        pipeline.hand_over(
            epoch,
            trace,
            log_dir=self.log_dir or ".",
            session=window.session_dir.name if window.session_dir is not None else None,
            rank=self.rank,
            world_size=self.world,
        )

    def result(
        self,
        epoch: int,
        figures: EpochSteps,
        *,
        profiled: bool,
        pending: Pending,
        false_alarms: dict[tuple[int, int], float],
        work: Work | None,
        gather: Gather | None,
    ) -> EpochResult:
        """The one result of epoch ``epoch`` (see the module docstring).

        Args:
            figures: the epoch's always-on step timing.
            profiled: the epoch had a scheduled window (this rank's or another's: this rank gathers).
            pending: the triggered windows stopped in this epoch.
            false_alarms: ``(epoch, step)`` of each firing taken back -> its window's median step time (ms).
            work: the adapter's throughput counts of the scheduled window.
            gather: the cross-rank all-gather (None: this rank's own figures).
        """
        wall = self.parts.results.get(epoch)
        self.contention = None if wall is None else contention(wall, self.parts.framework)
        result = EpochResult(figures=figures, profiled=profiled)
        if profiled and epoch not in self.pipeline.reports:  # not flushed already after an exception
            self._scheduled(epoch, result, work=work, gather=gather)
        result.epoch = {**epoch_scalars(figures), **self.probes.figures("epoch")}
        result.triggered = self._triggered(epoch, pending, false_alarms)
        result.trigger = {m.key: math.nan for m in metrics.TRIGGER_METRICS}
        if result.triggered:
            result.trigger.update(trigger_scalars(result.triggered[-1].event))
        result.verdicts = self.parts.verdicts(epoch) if wall is not None else []
        result.advice = self.probes.advice()
        result.contended = self.contention is not None
        return result

    def _scheduled(self, epoch: int, result: EpochResult, *, work: Work | None, gather: Gather | None) -> None:
        """The scheduled window of a profiled epoch (:meth:`keep`; none on a rank that profiled none, which still
        takes part in ``gather``), with the throughput counts of ``work``, the probes' window figures and the
        baseline comparison, gathered into ``result``'s ``window``, ``log`` and ``session_dir``."""
        closed, self._closed = self._closed, None
        report = None
        if closed is not None:
            result.session_dir = closed[0].session_dir
            counts: StepWork | None = None if work is None else work.work()
            report = self._analyze(self.pipeline, epoch, *closed, counts)
        extra = self.probes.figures("window") if closed is not None else {}
        baseline_line = ""
        if self.baseline is not None and report is not None:
            extra[metrics.VS_BASELINE_STEP_TIME_PERCENT.key], baseline_line = self._against_baseline(epoch, report)
        result.window, result.log = self.pipeline.gather(
            epoch,
            report,
            rank=self.rank,
            world_size=self.world,
            gather=gather,
            epoch_steps=result.figures,
            extra=extra,
            baseline_line=baseline_line,
        )

    def _against_baseline(self, epoch: int, report: BottleneckReport) -> tuple[float, str]:
        """The window against ``baseline``: its step time in percent of the baseline's and the summary's line; one
        warning a fit for a regression, one for a baseline that is not comparable."""
        assert self.baseline is not None
        vs = against_baseline(self.baseline, report, epoch=epoch)
        if vs.comparison is None:
            self.warn("baseline-not-comparable", f"fitprof: {vs.line()}")
        elif vs.regressed:
            self.warn("baseline-regression", f"fitprof: epoch {epoch} regressed. {vs.line()}")
        return vs.step_time_percent, vs.line()

    def _analyze(
        self, pipeline: WindowPipeline, epoch: int, window: ProfileWindow, trace: Path, work: StepWork | None = None
    ) -> BottleneckReport | None:
        """Analyse one stopped window's trace and write what goes beside it (a temporary copy, ``session_dir``
        None: only analysed, then deleted)."""
        return pipeline.analyze(
            epoch,
            trace,
            log_dir=self.log_dir or ".",
            session=window.session_dir.name if window.session_dir is not None else None,
            rank=self.rank,
            world_size=self.world,
            discard=window.cleanup,
            work=work,
            revise=self._revise,
        )

    def _revise(self, report: BottleneckReport) -> BottleneckReport:
        """A window of a CPU-contended epoch: its verdict says so (:func:`fitprof.analysis.cpu_contended`)."""
        return report if self.contention is None else cpu_contended(report, *self.contention)

    def _triggered(self, epoch: int, pending: Pending, false_alarms: dict[tuple[int, int], float]) -> list[Triggered]:
        """Analyse this epoch's triggered windows (this rank's own, no collective: each rank triggers on its own
        signal) and compare each with the last scheduled window; ``false_alarms``: the firings taken back."""
        reports = self.pipeline.reports
        normal_epoch = max(reports) if reports else None
        normal = None if normal_epoch is None else reports[normal_epoch]
        out = []
        for window, trace, event in pending:
            report = self._analyze(self.trigger_pipeline, epoch, window, trace)
            line = trigger_line(
                epoch,
                event,
                report,
                compare_windows(report, normal, normal_epoch) if report else "",
                false_alarm_ms=false_alarms.get((epoch, event.step)),
            )
            text = line if report is None else f"{line}\n\n{report.summary_markdown()}"
            out.append(Triggered(epoch, event, report, line, text))
        return out

    def __getstate__(self) -> dict[str, object]:
        """Copied and pickled with the engine: this epoch's stopped window is not copied."""
        return {**self.__dict__, "_closed": None}

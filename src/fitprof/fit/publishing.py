"""What the engine publishes at an epoch's end, framework-free: each stopped window analysed through its
:class:`~fitprof.fit.pipeline.WindowPipeline` (the scheduled windows' and the triggered windows'), the scheduled
window's figures with the probes' and the baseline comparison, each triggered window's line against the last
scheduled window, and the epoch's line in this rank's per-epoch file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from fitprof import metrics
from fitprof._warn import WarnOnce
from fitprof.analysis import BottleneckReport, cpu_contended
from fitprof.compare import Side, against_baseline, load_baseline
from fitprof.fit.epoch_parts import EpochParts
from fitprof.fit.events import EpochResult, Triggered, Work
from fitprof.fit.pipeline import EpochLog, Gather, WindowPipeline, compare_windows, trigger_line
from fitprof.fit.probes import Probes
from fitprof.profilers.base import ProfileWindow
from fitprof.report_files import append_epoch_record
from fitprof.steps import EpochSteps, StepRecorder, TriggerEvent
from fitprof.throughput import StepWork


class EpochPublisher:
    """The epoch-end publishing of one :class:`~fitprof.fit.engine.FitEngine`.

    Args:
        pipeline, trigger_pipeline: the scheduled and the triggered windows' :class:`~fitprof.fit.pipeline.WindowPipeline`,
            each with its own results and trace retention.
        warn: the adapter's warn-once channel.
        probes: the engine's probes, whose window figures join the scheduled window's.
        parts: the engine's epoch-parts probe (the framework's name, the epoch's verdicts).
        baseline: a run directory or report file of an earlier run (:func:`fitprof.compare.load_baseline`).

    Raises:
        TypeError: ``baseline`` is not a path.
        ValueError: ``baseline`` is missing or holds no readable report file (the message names it and says why).

    Attributes:
        pipeline, trigger_pipeline: the scheduled and the triggered windows' results, forgotten at each ``begin_fit``.
        baseline: the loaded baseline (None: none given).
        contention: this epoch's CPU-contention evidence and fix (:func:`fitprof.fit.epoch_parts.contention`), which
            each of its windows' verdicts names.
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
        """The scheduled window stopped with its trace: kept for its epoch's end (:meth:`scheduled`)."""
        self._closed = (window, trace)

    def scheduled(
        self,
        epoch: int,
        result: EpochResult,
        *,
        work: Work | None,
        gather: Gather | None,
        log: Callable[[EpochLog], None],
    ) -> None:
        """A profiled epoch ended: the scheduled window it kept (:meth:`keep`; none on a rank that profiled none,
        which still takes part in ``gather``), with the throughput counts of ``work``, published (:meth:`window`)
        into ``result``'s ``window`` and ``session_dir``."""
        closed, self._closed = self._closed, None
        if closed is not None:
            result.session_dir = closed[0].session_dir
        counts = None if closed is None or work is None else work.work()
        result.window = self.window(epoch, closed, work=counts, gather=gather, log=log, epoch_steps=result.figures)

    def window(
        self,
        epoch: int,
        closed: tuple[ProfileWindow, Path] | None,
        *,
        work: StepWork | None,
        gather: Gather | None,
        log: Callable[[EpochLog], None],
        epoch_steps: EpochSteps | None,
    ) -> dict[str, float]:
        """The scheduled window of a profiled epoch (``closed``: its stopped window and trace; None on a rank that
        profiled none, which still takes part in ``gather``): analysed, with the probes' window figures and the
        baseline comparison, and published (:meth:`fitprof.fit.pipeline.WindowPipeline.publish`)."""
        report = None
        if closed is not None:
            report = self.analyze(self.pipeline, epoch, *closed, work)
        extra = self.probes.figures("window") if closed is not None else {}
        baseline_line = ""
        if self.baseline is not None and report is not None:
            extra[metrics.VS_BASELINE_STEP_TIME_PERCENT.key], baseline_line = self._against_baseline(epoch, report)
        return self.pipeline.publish(
            epoch,
            report,
            rank=self.rank,
            world_size=self.world,
            gather=gather,
            log=log,
            epoch_steps=epoch_steps,
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

    def analyze(
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

    def triggered(
        self,
        epoch: int,
        pending: list[tuple[ProfileWindow, Path, TriggerEvent]],
        false_alarms: dict[tuple[int, int], float],
    ) -> list[Triggered]:
        """Analyse this epoch's triggered windows (this rank's own, no collective: each rank triggers on its own
        signal) and compare each with the last scheduled window; ``false_alarms``: the firings taken back."""
        reports = self.pipeline.reports
        normal_epoch = max(reports) if reports else None
        normal = None if normal_epoch is None else reports[normal_epoch]
        out = []
        for window, trace, event in pending:
            report = self.analyze(self.trigger_pipeline, epoch, window, trace)
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

    def record(self, epoch: int, result: EpochResult, steps: StepRecorder) -> None:
        """The epoch's verdicts (:meth:`fitprof.fit.epoch_parts.EpochParts.verdicts`) into ``result``, its line in
        this rank's per-epoch file, and once per fit why an epoch timed too few steps."""
        result.verdicts = self.parts.verdicts(epoch) if epoch in self.parts.results else []
        few = steps.too_few(epoch)
        if few:
            self.warn("too-few", f"fitprof: {few}; the fitprof/epoch/* step figures stand on those steps only.")
        if self.log_dir is None:
            return
        try:
            append_epoch_record(
                self.log_dir,
                epoch=epoch,
                rank=self.rank,
                framework=self.parts.framework,
                figures=result.epoch,
                verdicts=result.verdicts,
            )
        except OSError as err:
            # the key the adapters' other writes warn under: one "could not write" per fit, whatever failed first
            self.warn("write", f"fitprof: could not write the per-epoch file in {self.log_dir} ({err!r}).")

    def __getstate__(self) -> dict[str, object]:
        """Copied and pickled with the engine: this epoch's stopped window is not copied."""
        return {**self.__dict__, "_closed": None}

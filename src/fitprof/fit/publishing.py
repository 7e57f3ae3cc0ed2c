"""The one publisher of an epoch's end, framework-free: it takes the epoch's finished
:class:`~fitprof.fit.result.EpochResult` (built by :class:`fitprof.fit.epoch_end.EpochEnd`) and sends it out:
rank 0's window log to the adapter's ``log`` and once a fit the warning that an epoch timed too few steps at the
epoch's end hook (:meth:`EpochPublisher.publish`), the epoch's line to this rank's per-epoch file at its close
(:meth:`EpochPublisher.record`, its parts final: :mod:`fitprof.fit.epoch_close`). It reads nothing back and calls
nothing upstream."""

from __future__ import annotations

from fitprof._warn import WarnOnce
from fitprof.fit.fit_wall import FitWall
from fitprof.fit.result import EpochResult, Log
from fitprof.fit.steps import StepRecorder
from fitprof.report_files import append_epoch_record


class EpochPublisher:
    """Publishes each epoch's result of one :class:`~fitprof.fit.engine.FitEngine`.

    Args:
        warn: the adapter's warn-once channel.
        framework: the framework's name, as the per-epoch file records it (:mod:`fitprof.fit.boundary`).

    Attributes:
        log_dir: where this fit writes (None: profiling is off for it), set by :meth:`begin_fit`.
        rank: this process's global rank.
        setup: what the fit is measured on (:func:`fitprof.fit.setup.describe_setup`), written in every epoch's
            line; the adapter sets it after :meth:`begin_fit`, which empties it.
    """

    def __init__(self, *, warn: WarnOnce, framework: str) -> None:
        self.warn = warn
        self.framework = framework
        self.log_dir: str | None = None
        self.rank = 0
        self.setup: dict[str, str] = {}
        # each epoch's clean step times (ms), taken at its end hook: by its close the next epoch's start has reset
        # the step recorder
        self._step_ms: dict[int, list[float]] = {}

    def begin_fit(self, log_dir: str | None, rank: int) -> None:
        """A ``fit`` begins: where it writes and this rank."""
        self.log_dir, self.rank = log_dir, rank
        self.setup = {}
        self._step_ms = {}

    def publish(self, epoch: int, result: EpochResult, *, log: Log, steps: StepRecorder) -> None:
        """Publish epoch ``epoch``'s ``result`` at its end hook: its window's :class:`~fitprof.fit.result.EpochLog`
        to ``log`` (rank 0, when the epoch has one), and once per fit why an epoch timed too few steps (``steps``:
        the epoch's always-on recorder). Its line in the per-epoch file waits for its close (:meth:`record`)."""
        if result.log is not None:
            log(result.log)
        self._step_ms[epoch] = [ns / 1e6 for ns in steps.step_ns]
        few = steps.too_few(epoch)
        if few:
            self.warn("too-few", f"fitprof: {few}; the fitprof/epoch/* step figures stand on those steps only.")

    def record(self, epoch: int, result: EpochResult) -> None:
        """Epoch ``epoch``'s line in this rank's per-epoch file, at its close (its figures, verdicts and advice);
        nothing when profiling is off. One warning a fit when it cannot be written."""
        step_ms = self._step_ms.pop(epoch, [])
        if self.log_dir is None:
            return
        try:
            append_epoch_record(
                self.log_dir,
                epoch=epoch,
                rank=self.rank,
                framework=self.framework,
                figures=result.epoch,
                verdicts=[*result.verdicts, *result.advice],  # the advice kept for `fitprof report`
                # every clean step, so that `fitprof compare` tests over steps, not over a few epoch medians
                step_ms=step_ms,
                setup=self.setup,
            )
        except OSError as err:
            # the key the adapters' other writes warn under: one "could not write" per fit, whatever failed first
            self.warn("write", f"fitprof: could not write the per-epoch file in {self.log_dir} ({err!r}).")

    def publish_fit(self, fit: FitWall | None, epochs: int) -> FitWall | None:
        """The fit's own line in this rank's per-epoch file (``fitprof/fit/*``, :class:`FitWall`), once at its end
        (``epochs``: how many ended); nothing when no fit was counted (it raised) or profiling is off. Returns
        ``fit``."""
        if fit is None or self.log_dir is None:
            return fit
        try:
            append_epoch_record(
                self.log_dir,
                epoch=max(epochs - 1, 0),
                rank=self.rank,
                framework=self.framework,
                figures=fit.scalars(),
                verdicts=[],
                kind="fit",
            )
        except OSError as err:
            self.warn("write", f"fitprof: could not write the per-epoch file in {self.log_dir} ({err!r}).")
        return fit

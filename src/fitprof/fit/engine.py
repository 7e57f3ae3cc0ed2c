"""The window engine both callbacks drive: framework-free, driven by plain events, tested with a fake window and a
fake clock (``tests/test_engine*.py``).

An adapter translates its framework's hooks into the events of :class:`FitEngine` (``fit_start``,
``epoch_start``, ``step_start``, ``step_end``, ``validation_start`` / ``_end``, ``checkpoint_start`` / ``_end``,
``epoch_end``, ``fit_end``, ``exception``) and hands over what only it can do: a new window of its profiler
(:class:`~fitprof.profilers.base.ProfileWindow`), whether a step is the epoch's last, the FLOP count, the
cross-rank gather and the logging. The engine owns the rest:

- the window schedule (:mod:`fitprof.fit.schedule`): the ``profile_batch`` window of every ``every_n_epochs``-th
  epoch, its warm-up step (the step before its first, recorded but not marked, which takes the profiler's
  start-up), its FLOP-count step (outside the window: counting slows the step it counts), yielding to another
  profiler that holds some of its steps, and the slowdown-triggered windows;
- marking steps, the ``fitprof/overhead`` span around its own work inside a window, validation annotations,
  closing and dropping windows, and the warnings each of these may give;
- always-on step timing (:class:`fitprof.fit.steps.StepRecorder`) and the slowdown trigger
  (:class:`fitprof.fit.steps.SlowdownTrigger`);
- coverage (:class:`fitprof.fit.coverage.FitCoverage`) and the "nothing was profiled" warning;
- the epoch's end, one way: its windows and the registered probes (:mod:`fitprof.fit.probes`) built into one
  :class:`~fitprof.fit.result.EpochResult` (:mod:`fitprof.fit.epoch_end`), handed to one publisher
  (:mod:`fitprof.fit.publishing`) and returned to the adapter, which logs and prints what it carries.

Steps are 1-based within the epoch, as the adapter numbers them. Where a step begins and ends depends on the
framework's hooks, named once by the adapter's :class:`~fitprof.fit.boundary.StepBoundary` (``KERAS``: a step ends
at the next ``step_start``; ``LIGHTNING``: at its ``step_end``, holding its batch fetch).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fitprof._batch import batch_size
from fitprof._session import trigger_suffix
from fitprof._warn import WarnOnce
from fitprof.analysis import BottleneckReport
from fitprof.compare import Side
from fitprof.fit import own_cpu, schedule
from fitprof.fit import steps as _steps
from fitprof.fit.boundary import StepBoundary
from fitprof.fit.config import ProfileConfig, profiles_rank
from fitprof.fit.coverage import FitCoverage, short_window
from fitprof.fit.epoch_close import EpochClose
from fitprof.fit.epoch_end import EpochEnd
from fitprof.fit.epoch_parts import EpochParts, FitWall
from fitprof.fit.hooks import Spans
from fitprof.fit.memory import MemoryProbe
from fitprof.fit.pipeline import WindowPipeline
from fitprof.fit.probes import Probe, Probes
from fitprof.fit.publishing import EpochPublisher
from fitprof.fit.result import Busy, EpochResult, Gather, Log, Work
from fitprof.fit.steps import EpochSteps, SlowdownTrigger, StepRecorder, TriggerEvent
from fitprof.fit.triggered import TriggeredWindows
from fitprof.fit.xplane_worker import FINISH_TIMEOUT_S, XplaneWorker
from fitprof.profilers.base import ProfileWindow, WindowBusy
from fitprof.traces._table import CHECKPOINT_ANNOTATION, VALIDATION_ANNOTATION

_log = logging.getLogger(__name__)

WindowFactory = Callable[[int, str], ProfileWindow]
"""``(epoch, session suffix) -> a new, unstarted window`` (suffix ``""`` for the scheduled window, a triggered
window's :func:`fitprof._session.trigger_suffix`)."""


class FitEngine:
    """The window state machine, step timing, coverage and epoch-end publishing of one callback.

    Args:
        config: the checked ``profile_batch`` / ``every_n_epochs`` / ``top_k``.
        new_window: makes a window (:data:`WindowFactory`).
        warn: the adapter's warn-once channel.
        boundary: where the framework's steps begin and end, and its name (:mod:`fitprof.fit.boundary`).
        max_trace_mb, keep_last_windows: the pipeline's limits (:class:`~fitprof.fit.pipeline.WindowPipeline`).
        ranks: the global ranks that profile (None: all).
        trigger: the slowdown trigger (None: no triggered windows).
        work: the throughput counts of the scheduled window (None: none).
        probes: extra per-epoch and per-window figures (:mod:`fitprof.fit.probes`); one line adds one.
        baseline: a run directory or report file of an earlier run (:func:`fitprof.compare.load_baseline`): each
            scheduled window is compared with it (:func:`fitprof.compare.against_baseline`, ``fitprof compare``'s
            rules), ``fitprof/vs_baseline/step_time_percent`` is logged beside the window's figures, the Markdown
            summary gets a line naming the operator that grew most, and a regression gives one warning a fit.
        clock: the engine's clock in ns (``time.perf_counter_ns``; tests pass a fake).
        xplane_timeout_s: how long the end of a ``fit`` waits for the background ``.xplane.pb`` conversions when
            ``FITPROF_WAIT_FOR_PROFILES`` is set (s; :mod:`fitprof.fit.xplane_worker`: by default it waits for none).

    Raises:
        TypeError: ``baseline`` is not a path.
        ValueError: ``baseline`` is missing or holds no readable report file (the message names it and says why).

    Attributes:
        pipeline: the scheduled windows' results (``reports``, ``trace_paths``, ...), forgotten at each
            ``fit_start``; ``trigger_pipeline`` the triggered windows'.
        steps: the always-on step recorder of the current or last epoch.
        epoch_steps: each epoch's always-on figures (0-based epoch -> figures).
        triggers: the triggered windows' bookkeeping (:class:`~fitprof.fit.triggered.TriggeredWindows`);
            ``triggered`` and ``false_alarms`` are its records of this fit.
        coverage: what this fit covered.
        window: the open window, None between windows.
        spans: where the adapter's hook timers report (:class:`fitprof.fit.hooks.Spans`); nothing else of the
            epoch-parts probe is the adapter's.
    """

    def __init__(
        self,
        config: ProfileConfig,
        *,
        new_window: WindowFactory,
        warn: WarnOnce,
        boundary: StepBoundary,
        max_trace_mb: float | None = None,
        keep_last_windows: int | None = None,
        ranks: frozenset[int] | None = None,
        trigger: SlowdownTrigger | None = None,
        work: Work | None = None,
        probes: Iterable[Probe] = (),
        baseline: str | os.PathLike[str] | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
        xplane_timeout_s: float = FINISH_TIMEOUT_S,
    ) -> None:
        self.given_config = config  # as the user gave it; ``config`` is it for this fit (``in_calls``)
        self.config = config
        self.new_window = new_window
        self.warn = warn
        self.boundary = boundary
        self.ranks = ranks
        self.trigger = trigger
        # The triggered windows' bookkeeping (firings, their steps, false alarms, publishing); a triggered window
        # is as long as the profile_batch window, 5 steps when that is off.
        self.triggers = TriggeredWindows(trigger, length=config.num_steps if config.enabled else 5)
        self.work = work
        self.clock = clock
        self.xplane_timeout_s = xplane_timeout_s
        self._xplane: XplaneWorker | None = None  # the background .xplane.pb writer, from warm_up to fit_end
        # The figures written once for both callbacks: one line per built-in probe, then the user's.
        # Where each epoch's wall time went; the adapters also hand it their hook timers' spans (fitprof.fit.hooks).
        self.parts = EpochParts(boundary.framework, clock=clock, worker_cpu=own_cpu.workers_in(probes := tuple(probes)))
        self.spans: Spans = self.parts  # where the adapter's hook timers report (fitprof.fit.hooks), no more
        self.memory = MemoryProbe(warn=warn)  # the host's memory until fit_start names the training device
        builtin: tuple[Probe, ...] = (self.parts, self.memory)
        self.probes = Probes((*builtin, *probes), warn)
        # The per-step events go straight to the probes that take them (no lookup by name every step).
        self._on_step_start = self.probes.methods("step_start")
        self._on_step_end = self.probes.methods("step_end")
        self._at_start = boundary.at_step_start
        self._at_end = boundary.at_step_end
        # The scheduled and the triggered windows each keep their own results and trace retention.
        scheduled, triggered = (
            WindowPipeline(
                top_k=config.top_k,
                max_trace_mb=max_trace_mb,
                keep_last_windows=keep_last_windows,
                warn=warn,
                converter=self._converter,
            )
            for _ in range(2)
        )
        # The epoch's end, one way: the probes and the windows into one result, handed to one publisher.
        self.ends = EpochEnd(scheduled, triggered, warn=warn, probes=self.probes, parts=self.parts, baseline=baseline)
        self.publisher = EpochPublisher(warn=warn, framework=boundary.framework)
        self.closing = EpochClose(self.parts, self.publisher)  # each epoch's result from its end hook to its close
        self.pipeline, self.trigger_pipeline = scheduled, triggered
        self.baseline: Side | None = self.ends.baseline
        self.coverage = FitCoverage(config)
        self.steps = StepRecorder()
        self.epoch_steps: dict[int, EpochSteps] = {}
        self.window: ProfileWindow | None = None
        self.log_dir: str | None = None
        self.rank, self.world = 0, 1
        self.spe = 1
        self.ends_after: Callable[[int], bool] = _never
        self.epoch = -1
        self._reset_epoch()
        self._now = 0
        self._save_annotated = False  # a save's fitprof/checkpoint annotation is open in the window

    def _reset_epoch(self) -> None:
        self.profiled = False  # this epoch has a window somewhere (every rank takes part in its gather)
        self.armed = False  # this rank's scheduled window is still to come or open
        self.plan = schedule.Plan.off()
        self.busy: list[Busy] = []
        self._marked = 0  # the last step marked in the open window (0: none yet, its warm-up step runs)
        self._event: TriggerEvent | None = None  # the firing whose window is open
        self._count_pending = False
        self._seen = 0  # the last step seen in this epoch
        self._validating = False

    # ------------------------------------------------------------------------------------------------ fit
    def fit_start(
        self,
        *,
        log_dir: str | None,
        rank: int = 0,
        world: int = 1,
        steps_per_execution: int = 1,
        ends_after: Callable[[int], bool] | None = None,
        memory_device: tuple[str, int] = ("host", 0),
    ) -> None:
        """A ``fit`` begins: forget the last fit's results, warnings and firings.

        Args:
            log_dir: where windows write (None: profiling is off for this fit, e.g. another profiler owns it).
            rank, world: this process's global rank and the number of ranks.
            steps_per_execution: batches per call (``KERAS`` boundary).
            ends_after: ``ends_after(step)``, whether step ``step`` (the one ending now, or the next) is the
                epoch's last, where the framework can tell; default: never known.
            memory_device: the training device whose memory the memory probe reads, ``(kind, index)``
                (:data:`fitprof.profilers.memory.KINDS`; default the host's, a CPU-only run).
        """
        if self.window is not None:  # a previous fit ended inside a window (an exception): flush it now
            self._close(drop_open_step=False)
        self.warn.reset()
        self.warn.rank = self.rank = rank
        try:
            self.memory.use(*memory_device)
        except ValueError as err:
            self.warn("memory-device", f"fitprof: {err}; memory figures are read from the host.")
            self.memory.use("host")
        self.world = world
        self.log_dir = log_dir
        self.spe = max(int(steps_per_execution), 1)
        self.config = self.given_config.in_calls(self.spe)
        self.ends_after = ends_after or _never
        self.ends.begin_fit(log_dir, rank, world)
        self.publisher.begin_fit(log_dir, rank)
        self.coverage.begin_fit()
        self.coverage.left_out = not self.profiles_rank
        self.epoch_steps = {}
        self.triggers.begin_fit()
        self.steps = StepRecorder()
        self.probes.call("fit_start", now_ns=self.clock())

    @property
    def profiles_rank(self) -> bool:
        return profiles_rank(self.ranks, self.rank)

    @property
    def triggered(self) -> list[tuple[int, TriggerEvent, BottleneckReport | None]]:
        """One ``(epoch, event, report or None)`` per triggered window of this fit, in order."""
        return self.triggers.published

    @property
    def false_alarms(self) -> dict[tuple[int, int], float]:
        """``(epoch, step)`` of each triggered window that proved a false alarm -> its steps' median wall time (ms)."""
        return self.triggers.false_alarms

    @property
    def started_here(self) -> bool:
        """A window of this engine is open now."""
        return self.window is not None

    def fit_end(self) -> None:
        """The ``fit`` ended normally: the last epoch closes (:meth:`close_epoch`, when the adapter has not), stop
        what is still open (nothing is kept of it) and give the "nothing was profiled" warning when that is so."""
        self.close_epoch()
        if self.window is not None:
            self._close(drop_open_step=self.boundary.drops_open_step)
        self.finish_conversions()
        if never := self.coverage.message("fitprof: "):
            self.warn("never", never)
        self.probes.call("fit_end", now_ns=self.clock())

    def fit_teardown(self) -> FitWall | None:
        """After :meth:`fit_end`, the framework's own end of the fit: ``fitprof/fit/*`` written and returned."""
        return self.publisher.publish_fit(self.parts.fit_teardown(self.clock()), len(self.parts.results))

    def warm_up(self, *, kineto: bool) -> None:
        """Load before the fit's first step what its first profiled epoch would otherwise load: the trace reader of
        the windows' format (``kineto``: Kineto traces, else XSpace) and, for Kineto traces, the ``.xplane.pb``
        converter (:meth:`XplaneWorker.start`). After :meth:`fit_start`; not when this rank profiles nothing."""
        if self.log_dir is None or not self.profiles_rank or not (self.config.enabled or self.trigger is not None):
            return
        try:
            importlib.import_module("fitprof.traces.kineto" if kineto else "fitprof.traces.xspace")
            if kineto:
                self._converter().start()
                self._converter().adopt(self.log_dir)  # what an earlier fit left unconverted here
        except Exception as err:  # the first epoch end loads them instead
            _log.debug("fitprof: could not prepare the window analysis at the fit's start (%r)", err)

    def _converter(self) -> XplaneWorker:
        """The background ``.xplane.pb`` writer of this fit, made at :meth:`warm_up` or at the first window that
        needs it."""
        if self._xplane is None:
            self._xplane = XplaneWorker(self.warn, timeout_s=self.xplane_timeout_s)
        return self._xplane

    def finish_conversions(self) -> list[int]:
        """Hand the pending ``.xplane.pb`` conversions to the converter, which finishes them after the ``fit``
        (:meth:`XplaneWorker.end_of_fit`; under its ``WAIT_ENV``, wait up to ``xplane_timeout_s``); the epochs left
        unwritten by that wait (named in one warning). Called at the end of a ``fit`` (normal or not)."""
        worker, self._xplane = self._xplane, None
        if worker is None:
            return []
        try:
            return worker.end_of_fit()  # hands the conversions over; waits only under WAIT_ENV
        except Exception as err:  # never fails the fit
            _log.warning("fitprof: could not stop the .xplane.pb converter: %s", err)
            return []

    # ---------------------------------------------------------------------------------------------- epoch
    def epoch_start(self, epoch: int, *, next_step: int = 1, busy: Sequence[Busy] = ()) -> None:
        """Epoch ``epoch`` (0-based) begins, its next step ``next_step`` (1 unless resumed mid-epoch); ``busy``:
        the steps of this epoch another profiler holds."""
        now = self.clock()
        self.close_epoch(now)  # the last epoch, when the adapter has not closed it: before anything of this one
        self.epoch = epoch
        self._reset_epoch()
        cfg = self.config
        if self.boundary.origin_at_epoch_start(next_step):
            self.steps.begin_epoch(now)
        else:  # the first boundary only sets the origin
            self.steps.begin_epoch(None)
        self.triggers.begin_epoch()
        if self.work is not None:
            self.work.epoch_start()
        if self.log_dir is not None:
            self.coverage.epoch(epoch)
        self.profiled = self.log_dir is not None and cfg.enabled and cfg.profiles_epoch(epoch)
        self.armed = self.profiled and self.profiles_rank
        self.busy = list(busy)
        self.probes.call("epoch_start", epoch, now_ns=now)
        if not self.armed:
            return
        if next_step > cfg.first_step:
            self.armed = False  # the window's first step ran before the resume
            self.warn(
                "resumed-past",
                f"fitprof: epoch {epoch} was resumed at step {next_step}, after the window's first step "
                f"(profile_batch={cfg.first_step},{cfg.last_step}); that epoch is not profiled.",
            )
            return
        self.plan = schedule.plan(cfg, next_step=next_step, spe=self.spe)
        blocked = self._yield_to_others()
        if blocked:
            return
        self._count_pending = True
        if self.boundary.opens_at_epoch_start(next_step, self.plan.warm_up):
            self._open_scheduled(next_step)

    def _yield_to_others(self) -> bool:
        """Leave this epoch's window to another profiler that holds any of its steps (:func:`schedule.yield_to`; one
        warning). True when the window is given up."""
        cfg = self.config
        self.plan, taker = schedule.yield_to(self.plan, cfg, [(b.first, b.last) for b in self.busy])
        if taker is None:
            return False
        other = self.busy[taker]
        self.armed = False
        if self.coverage.blocked is None:
            self.coverage.blocked = f"{other.who} profiles the same steps"
        self.warn(
            "busy",
            f"fitprof: {other.who} profiles the same steps as the window of epoch {self.epoch} "
            f"(profile_batch={cfg.first_step},{cfg.last_step}); two profilers cannot run at once, so fitprof "
            f"leaves those steps to {other.name} and profiles no window in that epoch. Give the two callbacks "
            "different steps to get both profiles.",
        )
        return True

    def epoch_end(
        self,
        epoch: int,
        *,
        steps: int = 0,
        device_ms: list[float] | None = None,
        gather: Gather | None = None,
        log: Log = lambda entry: None,
    ) -> EpochResult:
        """Epoch ``epoch``'s end hook: close what is open, analyse its windows, publish; held until :meth:`close_epoch`.

        Args:
            steps: the training steps the framework says the epoch ran (0: unknown; the engine counts them).
            device_ms: each clean step's device time (:meth:`fitprof.fit.steps.StepRecorder.summary`).
            gather: the cross-rank all-gather (None: this rank's own figures); called on every rank of a profiled
                epoch, with or without a report, so the collective always completes.
            log: rank 0's logger of the window's :class:`~fitprof.fit.result.EpochLog`, which the publisher hands
                the result's ``log``.
        """
        now = self.clock()
        figures = self.epoch_steps[epoch] = self.steps.summary(device_ms)
        drop = self.boundary.drops_open_step  # a step marked there for a next step that never ran
        if self.window is not None and self._event is not None:
            self._close(drop_open_step=drop)
        ran = steps or (self._seen + self.spe - 1 if self._seen else 0)
        if self.profiled:
            self.coverage.steps(ran)
        if self.window is not None:
            if self._marked and drop:
                self._warn_short(self._marked - 1)
            elif self._marked and self._marked + self.spe - 1 < self.config.last_step:
                self._warn_short(min(ran, self._seen + self.spe - 1) if ran else self._seen + self.spe - 1)
            self._close(drop_open_step=drop)
        self.armed = False
        self.probes.call("epoch_end", epoch, now_ns=now)
        result = self.ends.result(
            epoch,
            figures,
            profiled=self.profiled,
            pending=self.triggers.take(),
            false_alarms=self.triggers.false_alarms,
            work=self.work,
            gather=gather,
        )
        self.triggers.published_in(result.triggered)
        self.profiled = False
        self.publisher.publish(epoch, result, log=log, steps=self.steps)
        self.closing.hold(epoch, result)
        return result

    def close_epoch(self, now_ns: int | None = None) -> EpochResult | None:
        """The epoch whose end hook ran closes (:mod:`fitprof.fit.epoch_close`, where the adapter says): its result
        with the final parts, its line written; None when no epoch waits."""
        return self.closing.close(self.clock() if now_ns is None else now_ns)

    def exception(self, exc: BaseException | None, *, log: Log, drop_open_step: bool = True) -> EpochResult | None:
        """Training raised: stop the window (``drop_open_step``: the failing step never finished, left out),
        analyse and log what it holds (this rank's own: the other ranks may be anywhere), and stop every profiler.
        Never raises. An epoch whose end hook ran is whole: it closes, and is not flushed again."""
        closed = self.close_epoch()
        self.probes.call("exception", exc, now_ns=self.clock())
        try:
            if self.window is not None:
                self._close(drop_open_step=drop_open_step)
            self.armed = False
            if closed is not None or self.epoch < 0:
                return closed
            self.epoch_end(self.epoch, log=log)
            return self.close_epoch()
        except Exception as err:  # the user's exception matters more
            _log.warning("fitprof: could not flush the window after an exception: %s", err)
            return None
        finally:
            self.abort()
            self.finish_conversions()

    def __getstate__(self) -> dict[str, Any]:
        """Copy and pickle between fits: an open window, this fit's pending traces and its converter process are
        not copied."""
        return {**self.__dict__, "window": None, "ends_after": _never, "_xplane": None}

    def abort(self) -> None:
        """Stop an open window without keeping it (teardown, a callback being deleted); never raises."""
        window, self.window = self.window, None
        self._event = None
        if window is not None:
            with contextlib.suppress(Exception):
                window.abort()

    # ----------------------------------------------------------------------------------------------- steps
    def step_start(
        self,
        step: int,
        batch: Any = None,
        *,
        input_ns: int | None = None,
        samples: int | None = None,
        now_ns: int | None = None,
    ) -> None:
        """Step ``step`` begins (its batch, when the hook has it). At a ``KERAS`` boundary the previous step
        ended here: ``input_ns`` / ``samples`` are that step's input wait and batch size. ``now_ns``: the adapter's
        reading of the engine's clock for this event, when it has one (None: read here)."""
        # Every training step runs this and step_end: the common path (no window open) calls as little as it can.
        now = self.clock() if now_ns is None else now_ns
        self._send(self._on_step_start, step, batch, now)
        if input_ns is not None:  # the one hand-over of the wait: the step timing and the epoch's parts
            self.parts.input_wait(input_ns)
        if self._at_start:
            self._boundary(step, now, input_ns, samples, batch)
        elif self.window is None:
            if step > self._seen:
                self._seen = step
            if self._count_pending:
                self._maybe_count(step, batch)

    def step_end(
        self,
        step: int,
        batch: Any = None,
        *,
        input_ns: int | None = None,
        samples: int | None = None,
        now_ns: int | None = None,
    ) -> None:
        """Step ``step`` ended (``LIGHTNING`` boundary: its input wait and batch size, by default
        :func:`fitprof._batch.batch_size` of ``batch``); ``now_ns`` as in :meth:`step_start`."""
        now = self.clock() if now_ns is None else now_ns
        if input_ns is not None:  # inside the step that ends here
            self.parts.input_wait(input_ns)
        self._send(self._on_step_end, step, batch, now)
        if self._at_end:
            window = self.window
            if window is None:  # the usual step: _boundary_body(step + 1, ...) with no window open, written out
                if step > self._seen:
                    self._seen = step
                if samples is None:
                    samples = batch_size(batch)
                dt = self.steps.step(now, step, input_ns=input_ns, samples=samples)
                self._now = now
                fired = self.triggers.feed(dt, step, self._may_trigger) if self.trigger is not None else None
                if fired is not None:
                    self._open_triggered(step + 1, fired)
                elif self.armed and self.plan.warm_up <= step + 1 <= self.config.last_step:
                    self._open_scheduled(step + 1)
                return
            window.begin_overhead()  # the hook's own time is fitprof's, never the step's
            try:
                if samples is None:
                    samples = batch_size(batch)
                if self._event is None and self._marked and self.work is not None:
                    self.work.window_step(batch)
                self._boundary(step + 1, now, input_ns, samples, batch)
            finally:
                window.end_overhead()  # a no-op once the window stopped

    def _send(self, methods: tuple[Any, ...], step: int, batch: Any, now: int) -> None:
        """Each probe's step event (``methods``: :meth:`~fitprof.fit.probes.Probes.methods`, built once); a probe that
        raises is reported once and the others still run."""
        for method in methods:
            try:
                method(step, batch, now_ns=now)
            except Exception as err:
                self.probes.failed(method, err)

    def _boundary(self, k: int, now: int, input_ns: int | None, samples: int | None, batch: Any) -> None:
        """Step ``k - 1`` ended at ``now`` and step ``k`` is next: time it, feed the trigger, mark, close or open."""
        window = self.window
        if window is not None and self._at_start:
            window.begin_overhead()  # all of this hook's work is fitprof's own
            try:
                self._boundary_body(k, now, input_ns, samples, batch)
            finally:
                window.end_overhead()
        else:
            self._boundary_body(k, now, input_ns, samples, batch)

    def _boundary_body(self, k: int, now: int, input_ns: int | None, samples: int | None, batch: Any) -> None:
        n = k - 1
        at_start = self._at_start
        seen = k if at_start else n
        if seen > self._seen:
            self._seen = seen
        dt = self.steps.step(now, n, input_ns=input_ns, samples=samples)
        self._now = now
        window = self.window
        fired = self.triggers.feed(dt, n, self._may_trigger) if window is None and self.trigger is not None else None
        if window is not None and at_start:
            self._end_marker(k)  # the step that ended here: its marker closes before anything else happens
            window = self.window  # None when the marker failed and the window was dropped
        if window is not None:
            if self._event is not None:
                self._advance_triggered(k)
            else:
                self._advance_scheduled(k)
            self.steps.exclude_next(reason=_steps.WINDOW)  # a window's steps and the one after: the profiler's cost
        elif fired is not None:
            self._open_triggered(k, fired)
        elif self.armed and self.plan.warm_up <= k <= self.config.last_step:
            self._open_scheduled(k)
        if at_start and self.window is None:
            self._maybe_count(k, batch)

    def _maybe_count(self, step: int, batch: Any) -> None:
        """Count the FLOPs of step ``step`` when it is this epoch's count step (>=: steps_per_execution skips
        numbers); the counted step is left out of the step timing (counting slows it)."""
        if self._count_pending and step >= self.plan.count_step and self.window is None:
            self._count_pending = False
            self.steps.exclude_next(1, reason=_steps.FLOPS)
            if self.work is not None:
                self.work.count_flops(step, batch)

    # ----------------------------------------------------------------------------------------- scheduled
    def _open_scheduled(self, k: int) -> None:
        """Start the scheduled window before step ``k``: its warm-up step, or its first step when it takes none
        (then marking it is fitprof's own time)."""
        if self.boundary.sees_epoch_end and k < self.config.first_step and self.ends_after(k):
            self.armed = False  # the warm-up step is the epoch's last: the window would analyse nothing
            return
        if not self._start(""):
            self.armed = self._count_pending = False
            return
        self.steps.exclude_next(reason=_steps.WINDOW)
        if k >= self.config.first_step:
            window = self.window
            assert window is not None
            window.begin_overhead()
            try:
                self._mark_first(k)
            finally:
                window.end_overhead()

    def _advance_scheduled(self, k: int) -> None:
        window = self.window
        assert window is not None
        n, last = k - 1, self.config.last_step
        if not self._marked:  # the warm-up step ended
            if self.boundary.sees_epoch_end and self.ends_after(n):
                self._close(drop_open_step=False)  # nothing analysed: dropped
                self.armed = False
            else:
                self._mark_first(k)
        elif k > last:
            self._close(drop_open_step=False)
            self.armed = False
        elif self.boundary.sees_epoch_end and self.ends_after(n):
            self._warn_short(n)
            self._close(drop_open_step=False)
            self.armed = False
        else:
            self._mark(k)

    def _mark_first(self, k: int) -> None:
        """The window's first analysed step begins: from here on something is profiled."""
        self._mark(k)
        if self.window is None:
            return
        self.coverage.windows += 1
        if self._event is None:
            if self.work is not None:
                self.work.window_opened()
            self.probes.call("window_start", now_ns=self.clock())

    def _end_marker(self, k: int) -> None:
        window = self.window
        assert window is not None
        try:
            window.end_step()
        except Exception as err:  # a step marker failed: drop the window, training goes on
            self._drop(f"could not mark step {k} ({err!r})")

    def _mark(self, k: int) -> None:
        window = self.window
        assert window is not None
        try:
            window.begin_step(k)
        except Exception as err:  # a step marker failed: drop the window, training goes on
            self._drop(f"could not mark step {k} ({err!r})")
            return
        self._marked = k

    def _warn_short(self, steps_done: int) -> None:
        """The epoch ended after step ``steps_done``, inside the window: one warning (:func:`short_window`)."""
        self.warn("short", short_window(self.epoch, steps_done, self.config, self.given_config.num_steps))

    # ------------------------------------------------------------------------------------------- triggered
    def _may_trigger(self, n: int) -> bool:
        """Whether a triggered window may open after step ``n`` (:func:`fitprof.fit.schedule.may_trigger`)."""
        if self.window is not None or self.log_dir is None or not self.profiles_rank:
            return False
        if self.ends_after(n) or self.ends_after(n + 1):
            return False  # the epoch ends before the window's warm-up step, or on it
        return schedule.may_trigger(
            n,
            length=self.triggers.length,
            spe=self.spe,
            scheduled=self.plan.start(self._count_pending) if self.armed else None,
            busy=[(b.first, b.last) for b in self.busy],
        )

    def _open_triggered(self, k: int, event: TriggerEvent) -> None:
        """Open the window the trigger asked for before step ``k``: ``k`` is its warm-up step, the next
        ``triggers.length`` steps (calls) are analysed, in a session ``<time>_epoch<N>_trigger_step<S>``."""
        if self._start(trigger_suffix(event.step)):
            self._event = event
            self.triggers.opened(k, self.spe)
            self.steps.exclude_next(reason=_steps.WINDOW)

    def _advance_triggered(self, k: int) -> None:
        """Mark or close the open triggered window at step boundary ``k``; the boundaries' times from its first
        analysed step on give its steps' wall times (:meth:`TriggeredWindows.closed` judges them)."""
        ends = self.boundary.sees_epoch_end and self.ends_after(k - 1)
        if not self._marked and ends:
            self._close(drop_open_step=False)  # only its warm-up step ran: dropped
            return
        done = self.triggers.boundary(k, self._now)
        if not self._marked:
            self._mark_first(k)
        elif done or ends:
            self._close(drop_open_step=False)
        else:
            self._mark(k)

    # ------------------------------------------------------------------------------------------- windows
    def _start(self, suffix: str) -> bool:
        """Make and start a window (``suffix`` "" for the scheduled one); one warning when it cannot start."""
        try:
            window = self.new_window(self.epoch, suffix)
            window.start()
        except Exception as err:
            self.warn("start", f"fitprof: profiling skipped for epoch {self.epoch}: {err}")
            if not suffix and self.coverage.blocked is None:  # the scheduled window's (a triggered one is extra)
                self.coverage.blocked = err.reason if isinstance(err, WindowBusy) else str(err)
            return False
        self.window = window
        self._marked = 0
        return True

    def _close(self, *, drop_open_step: bool) -> None:
        """Stop the open window and keep its trace for this epoch's analysis (only the warm-up step ran: dropped;
        a failure: one warning, dropped)."""
        window, self.window = self.window, None
        event, self._event = self._event, None
        if window is None:
            return
        self.steps.exclude_next(reason=_steps.WINDOW)  # the stop and export land in the next step
        if not self._marked:  # only the warm-up step ran (the epoch ended before the first analysed step)
            window.abort()
            return
        if event is None:
            if self.work is not None:
                self.work.window_closed()
            self.probes.call("window_end", now_ns=self.clock())
        try:
            trace = window.stop(drop_open_step=drop_open_step)
        except Exception as err:
            self.warn("stop", f"fitprof: the window of epoch {self.epoch} was dropped: {err}")
            window.abort()
            return
        self.ends.stopped(self.epoch, window, trace, triggered=event is not None)  # its .xplane.pb, from now
        if event is None:
            self.ends.keep(window, trace)
        else:
            self.triggers.closed(self.epoch, window, trace, event)

    def _drop(self, reason: str) -> None:
        """Stop the open window without keeping it (one warning naming ``reason``)."""
        if self._event is None:
            self.armed = False  # the scheduled window: this epoch opens no other
        window = self.window
        self.warn("mark", f"fitprof: {reason}; the window of epoch {self.epoch} was dropped.")
        self.abort()
        if window is not None and window.session_dir is not None:
            with contextlib.suppress(OSError):
                window.session_dir.rmdir()  # no empty session in the Profile tab

    # ------------------------------------------------------------------------------------ validation etc.
    def validation_start(self) -> None:
        """Validation begins. Keras (``KERAS`` boundary) validates after the epoch's last training step:
        the window closes. Inside a Lightning window it is wrapped in ``fitprof/validation`` and left out of step
        time. Either way the steps around it are left out of the step timing."""
        self.probes.call("validation_start", now_ns=self.clock())
        self._validating = True
        if self.boundary.validation_closes_window:
            if self.window is not None:
                self._close(drop_open_step=False)
                self.armed = False
            return
        self.steps.exclude_next(reason=_steps.VALIDATION)  # validation runs inside the next step's interval
        if self.window is not None:
            self.window.begin_annotation(VALIDATION_ANNOTATION)

    def validation_end(self) -> None:
        self.probes.call("validation_end", now_ns=self.clock())
        if self._validating and self.window is not None and not self.boundary.validation_closes_window:
            self.window.end_annotation()
        self._validating = False

    def checkpoint_start(self) -> None:
        """A checkpoint save was seen (Lightning's ``on_save_checkpoint``): its time is measured by the adapter's
        hook timers (:meth:`save_begin`, :meth:`save_end`), which take it out of the step it ran in."""
        self.probes.call("checkpoint_start", now_ns=self.clock())

    def checkpoint_end(self) -> None:
        self.probes.call("checkpoint_end", now_ns=self.clock())

    def cpu_share(self, *, threads: int | None = None, workers: int | None = None, feed: str | None = None) -> None:
        """What the framework says of the training's cores and input: its intra-op ``threads`` and the loader's
        ``workers`` (the CPU-contention verdict weighs them), what the fit is ``feed`` (start-up advice that fits it,
        :data:`fitprof.fit.epoch_parts.FEEDS`)."""
        self.parts.threads = self.parts.threads if threads is None else threads
        self.parts.workers = self.parts.workers if workers is None else workers
        self.parts.feed = self.parts.feed if feed is None else feed

    def save_begin(self) -> None:
        """A checkpoint save starts (the adapter's :class:`fitprof.fit.hooks.Saves`): inside a window it is
        annotated ``fitprof/checkpoint``, out of the window's step time. Never raises."""
        self._save_annotated = False
        if self.window is not None:
            try:
                self.window.begin_annotation(CHECKPOINT_ANNOTATION)
                self._save_annotated = True
            except Exception as err:  # the save goes on; the window keeps it in its step time
                _log.debug("fitprof: could not annotate a save (%r)", err)

    def save_end(self, ns: int) -> None:
        """The save that :meth:`save_begin` announced took ``ns``: out of the step it ran in (the step stays timed,
        :meth:`fitprof.fit.steps.StepRecorder.take_out`); its annotation closes. Never raises."""
        if self._save_annotated and self.window is not None:
            with contextlib.suppress(Exception):
                self.window.end_annotation()
        self._save_annotated = False
        self.steps.take_out(ns)


def _never(step: int) -> bool:
    return False

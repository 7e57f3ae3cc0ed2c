"""``FitProfiler`` for Keras 3: profile chosen training steps, log bottleneck scalars at every epoch end."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import keras

from fitprof import _fs, metrics
from fitprof._retention import DEFAULT_MAX_TRACE_MB
from fitprof._warn import WarnOnce
from fitprof.analysis import BottleneckReport
from fitprof.fit import FitEngine, Probe
from fitprof.fit.boundary import KERAS
from fitprof.fit.config import (
    DEFAULT_PROFILE_BATCH,
    SharedAttributes,
    check_arguments,
    normalize_log_dir,
    shared,
    unknown_ranks_message,
)
from fitprof.fit.epoch_close import part_figures
from fitprof.fit.hooks import CallbackHooks
from fitprof.fit.loader import LoaderProbe, process_cpu_ns
from fitprof.fit.pipeline import every_key
from fitprof.fit.probes import finite
from fitprof.fit.result import EpochLog
from fitprof.fit.setup import keras_model_setup
from fitprof.fit.steps import EpochSteps, StepRecorder, TriggerEvent
from fitprof.fit.voice import Voice, profile_place
from fitprof.keras import _callbacks, _distributed, _logs
from fitprof.keras._backends import BACKENDS
from fitprof.keras._guards import Guards, fit_frame_locals
from fitprof.keras._tbevents import TBEventFile
from fitprof.keras._throughput import KerasWork
from fitprof.profilers.base import ProfileWindow
from fitprof.profilers.memory import keras_device

log = logging.getLogger(__name__)

SUPPORTED_BACKENDS = tuple(BACKENDS)


class FitProfiler(keras.callbacks.Callback, SharedAttributes):
    """Profile a few training steps of every epoch and log where the step time goes.

    Add it to ``model.fit(..., callbacks=[FitProfiler(log_dir="logs")])``. In each profiled epoch it profiles
    steps ``profile_batch`` (1-based, inclusive) with the backend's profiler, each step wrapped in a marker
    xprof recognises, writes the profile to ``<log_dir>/plugins/profile/<session>/`` (a new session folder
    per window, shown by TensorBoard's Profile tab), and at the epoch's end analyses it and logs:

    * ``fitprof/step_time_ms``, ``fitprof/input_percent``, ``fitprof/htod_ms_per_step``,
      ``fitprof/htod_percent``, ``fitprof/collective_percent``, their exposed parts
      ``fitprof/htod_exposed_percent`` and ``fitprof/collective_exposed_percent`` (what the verdict rests on),
      ``fitprof/steps_analyzed``,
      ``fitprof/self_ms_per_step`` and
      ``fitprof/top_op_1_ms`` ... ``fitprof/top_op_<top_k>_ms`` (ms per step, operators by rank) as TensorBoard
      scalars in ``log_dir`` (step = epoch) and in the epoch ``logs`` dict of every epoch (NaN where nothing
      was profiled), so ``History`` and callbacks placed after this one (``CSVLogger``) see the same keys every
      epoch; TensorBoard also gets ``fitprof/top_ops/<op name>``;
    * where the epoch's time went, ``fitprof/epoch/wall_s`` and its parts (:mod:`fitprof.fit.epoch_parts`): the
      epoch closes just before ``History`` records its ``logs`` (Keras lists ``History`` after the callbacks given
      to ``fit``), so that a ``ModelCheckpoint`` or another callback listed after this one is counted in its epoch;
      the final parts are put into ``logs`` then (``History``, ``ProgbarLogger``), a callback listed between this
      one and ``History`` sees the parts so far (:mod:`fitprof.fit.epoch_close`);
    * the verdict, advice and top-operator table as Markdown in TensorBoard's Text tab (``fitprof/summary``);
    * under ``MultiWorkerMirroredStrategy`` (one rank per worker): the cross-rank means of the figures above,
      plus ``fitprof/step_time_ms_max``, ``fitprof/input_percent_max``, the rank each belongs to
      (``..._max_rank``) and ``fitprof/ranks_reported``; every rank's ``logs`` get them, only rank 0 writes
      event files. Each rank writes its own ``<host>_rank<r>.xplane.pb`` and report file.

    Each window's report is also written to ``<log_dir>/plugins/fitprof/<session>.rank<r>.json`` for
    ``fitprof report``. Definitions of every figure: :mod:`fitprof.metrics`. The report of each epoch of the last ``fit`` stays in ``self.reports``.

    The window opens one step early: step ``first - 1`` is its warm-up step, recorded but not marked, so the
    profiler's start-up is never in an analysed step (with ``first == 1`` step 1 opens with the window). Inside
    the window the batch hook's own work is wrapped in ``fitprof/overhead``, left out of step time and logged as
    ``fitprof/self_ms_per_step``.

    Outside the windows the batch hook only times the step (one clock read, :class:`fitprof.fit.steps.StepRecorder`)
    and compares a few values, and the callback does not override
    ``on_train_batch_end``, so Keras keeps dispatching other callbacks' batch-end hooks asynchronously.
    Profiling never stops training: a profiler that cannot start (another one running) or stop, or a step marker
    that fails, is reported with one warning and the window is dropped. Warnings are
    :class:`fitprof.FitProfilerWarning` (``"fitprof: ..."``), once per problem per ``fit``, pointing at the
    ``fit`` call; under ``-W error`` they go to ``logging``. A ``keras.callbacks.TensorBoard(profile_batch=...)``
    in the same fit, listed before or after, keeps the steps it profiles: fitprof profiles no window in the epoch
    it overlaps and says so once. The callback can be copied and pickled before and after a fit.

    Args:
        log_dir: the TensorBoard run directory for the profile and the scalars (Windows-style separators are
            read as separators on every system). A URL (``gs://``, ``s3://``, ``memory://``...; see docs/files.md,
            "Remote log directories") is written as Keras's ``TensorBoard`` callback writes it: through
            ``tf.io.gfile`` on TensorFlow, fsspec on torch. The fit records into a local staging folder, copied
            to the URL at the end of each profiled epoch and deleted at the end of the fit (``trace_paths``
            then name the staging copies). A filesystem that cannot be opened or written gives one warning; the
            figures still reach the epoch ``logs``.
        profile_batch: steps of each profiled epoch to profile: an int ``n`` (step ``n`` only), a
            ``(first, last)`` pair, or a ``"first,last"`` string; 1-based, inclusive. The default, steps 6-10,
            leaves tracing, compilation and warm-up out. ``0`` turns profiling off (as in Keras's
            ``TensorBoard``). A fit that profiles nothing ends with one warning naming why (docs/guarantees.md).
        every_n_epochs: profile epochs 0, N, 2N, ... (0-based).
        top_k: how many operators to log by self time.
        max_trace_mb: warn (once, naming the file) when a window's trace is larger than this many MB;
            None never warns.
        keep_last_windows: keep the trace files of only the last N windows of a fit (older ones are deleted
            after their analysis); the scalars and report files of every window stay. None keeps all.
        ranks: the global ranks (worker indices under ``MultiWorkerMirroredStrategy``) that profile: an int or a
            list, tuple, set or range of ints; None (default) profiles every rank. Rank 0 warns when none of
            them exists in the run. A rank left out opens no window but still takes
            part in the epoch-end gather, so the other ranks' cross-rank figures complete
            (``fitprof/ranks_reported`` counts the ranks that profiled). ``ranks=[0]`` avoids a TensorFlow 2.21
            profiler bug that can abort a non-chief worker when its window stops (docs/distributed.md, "Keras
            (`tf.distribute`)"); a warning names it on such a worker.
        verbose: print one line per profiled epoch on rank 0 (step time, input and HtoD share, top operator,
            verdict; :func:`fitprof.fit.pipeline.summary_line`). Also quiet under ``fit(verbose=0)``.
        record_shapes: torch backend only (ignored, with one warning, on TensorFlow): record operator input
            shapes (``torch.profiler.profile(record_shapes=...)``).
        profile_memory: torch only: record allocations and frees.
        with_stack: torch only: record Python and C++ stacks (the largest traces).
        with_flops: torch only: estimate FLOPs (torch 2.13 writes none to the exported trace; shapes are
            recorded). The four are off by default; their measured cost is in docs/arguments.md.
        count_items: a function of one batch returning its items (e.g. tokens), for ``fitprof/items_per_s``:
            torch backend only, called on the batch of the step whose FLOPs are counted (the only batch a callback
            sees) and scaled to the window's samples; None (default), or another backend, logs NaN there.
        trigger: ``"slowdown"`` opens an extra window when steps stay slower than their baseline
            (:class:`fitprof.fit.steps.SlowdownTrigger`): fired after step ``S``, step ``S + 1`` is its warm-up step and
            the next ``L`` steps (as many as ``profile_batch``, 5 when that is off) are analysed, in the session
            ``<time>_epoch<N>_trigger_step<S>``, at the epoch's end, with no collective. It never overlaps the
            ``profile_batch`` window, its warm-up step or its FLOP-count step, and counts no samples or FLOPs.
            None (default): no triggered windows; step timing runs either way.
        trigger_max_windows: the most triggered windows per ``fit`` (>= 1).
        trigger_min_spacing: the fewest clean steps between two triggered windows (>= 0).
        probes: extra figures per epoch and per window (:class:`fitprof.fit.Probe`), logged with the others.
        baseline: a run directory or a report file of an earlier run (``plugins/fitprof/<session>.rank<r>.json``),
            compared with each profiled window by ``fitprof compare``'s rules
            (:func:`fitprof.compare.against_baseline`). ``fitprof/vs_baseline/step_time_percent`` (the window's
            step time over the baseline's, less 1, in %) is logged with the window's figures, the text summary
            starts with a line naming the operator that grew most, and a regression (past 10% and the baseline's
            spread) gives one warning a fit. A baseline that cannot be read raises ``ValueError`` here; one that
            is not comparable (another batch size, device...) gives one warning and logs nothing for it.

    Throughput (:mod:`fitprof.throughput`, :mod:`fitprof.keras._throughput`): ``fitprof/samples_per_s`` is the
    growth of Keras's own sample count (``model._loss_tracker.count``) over the window, per second of the
    analysed steps; ``fitprof/flops_per_step`` is counted on the step before the window's warm-up step (on the step
    after the window when there is no such step, or no warm-up step): on TensorFlow from the shapes of the traced ``train_step`` graph, on torch with
    ``FlopCounterMode``, not on JAX; ``fitprof/flops_per_s`` divides it by the step time and, on a GPU of
    :data:`fitprof.throughput.PEAK_FLOPS`, ``fitprof/mfu`` by the dense peak of the model's compute dtype.

    Raises:
        ValueError: for a bad ``profile_batch``, ``every_n_epochs`` < 1, ``top_k`` < 1, an empty ``log_dir``,
            an empty ``ranks`` or a rank < 0, or a Keras backend other than TensorFlow, torch or JAX.
        TypeError: for arguments of the wrong type.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] = "logs",
        profile_batch: int | tuple[int, int] | str = DEFAULT_PROFILE_BATCH,
        every_n_epochs: int = 1,
        top_k: int = 5,
        max_trace_mb: float | None = DEFAULT_MAX_TRACE_MB,
        keep_last_windows: int | None = None,
        ranks: int | Collection[int] | None = None,
        verbose: bool = True,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        count_items: Callable[[Any], float] | None = None,
        trigger: str | None = None,
        trigger_max_windows: int = 3,
        trigger_min_spacing: int = 200,
        probes: Iterable[Probe] = (),
        baseline: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        log_dir = normalize_log_dir(log_dir)
        args = check_arguments(**shared(locals()))  # the names, types and defaults of fitprof.fit.config
        args.bind(self)
        self.backend = keras.backend.backend()
        fns = BACKENDS.get(self.backend)
        if fns is None:
            raise ValueError(
                f"FitProfiler supports the Keras backends {SUPPORTED_BACKENDS}; the active backend is "
                f"{self.backend!r}. Set KERAS_BACKEND=tensorflow, KERAS_BACKEND=torch or KERAS_BACKEND=jax."
            )
        self._fns = fns
        self.log_dir = log_dir
        self._warn_once = WarnOnce()
        if not fns.torch_options and any(self.torch_options.values()):
            on = ", ".join(f"{k}=True" for k, v in self.torch_options.items() if v)
            self._warn_once("torch-options", f"fitprof: {on} apply to the torch backend only; ignored on {fns.label}.")
        # Throughput: the window's samples, and the FLOPs of one step outside it (fitprof.fit.schedule).
        self._work = KerasWork(fns, self.count_items, self._warn_count_items, self, self._warn_samples)
        # torch backend fed a DataLoader: its workers (fitprof/epoch/loader_*); the wait is the fetch timer's
        self._loader = LoaderProbe(fetch_wait=self._fetch_wait, process_clock=process_cpu_ns)
        self._loader_timing: Any = None
        self._batch_wait: Any = None  # TensorFlow and JAX fed a PyDataset: the step's wait for its batch
        self._engine = FitEngine(
            args.config,
            new_window=self._new_window,
            warn=self._warn_once,
            boundary=KERAS,
            work=self._work,
            probes=(self._loader, *args.probes),
            **args.engine_settings(),
        )
        self._mirror: _fs.Mirror | None = None  # a URL log_dir: the local staging folder copied to it
        self._run_dir = self.log_dir  # where the windows and the event file write (the staging folder for a URL)
        self._events = TBEventFile(self._run_dir)
        # Where the last fit's wall time went (s): ``wall`` and its parts ``setup``, ``epochs``, ``teardown``, with
        # ``profiling``, ``sanity_check`` and ``checkpoint`` inside them (``fitprof/fit/*``); empty until one ends.
        self.fit_seconds: dict[str, float] = {}
        self._guards = Guards()  # what is wrapped while a window is open
        self._voice = Voice()  # what the fit prints: each sentence once
        self._in_flush = False
        self._last_step = 0  # the last step begun in this epoch
        self._spe = 1
        self._csv_loggers: list[Any] = []  # the fit's CSVLoggers, whose columns are fixed at their first epoch
        self._progbars: list[Any] = []  # the fit's ProgbarLoggers, showing a handful of fitprof's keys
        self._tb_profilers: list[Any] = []  # keras.callbacks.TensorBoard callbacks of this fit that profile
        self._checkpoints: list[Any] = []  # the fit's ModelCheckpoints that save every N batches
        self._hooks: CallbackHooks | None = None  # the fit's callbacks' hooks, timed for the epoch's parts
        self._unclose: Callable[[], None] | None = None  # undoes the close before History's on_epoch_end
        self._closes_later = False  # the epoch closes after fitprof's on_epoch_end (History's, or the next epoch's)
        self._fetch_timer: Any = None  # torch backend: times each batch fetch (fitprof.keras._torch_backend)
        self._adapter_samples: int | None = None  # TensorFlow / JAX: samples per step, from Keras's data adapter
        self._prev_samples: int | None = None  # torch: the samples of the batch the step in progress runs

    def __getstate__(self) -> dict[str, Any]:
        """Copy and pickle (``copy.deepcopy``, ``pickle.dumps``) before, after and between fits: a window being
        profiled and the other callbacks of the running fit are not copied (the copy has no window open)."""
        state = self.__dict__.copy()
        state.update(
            _guards=Guards(),
            _tb_profilers=[],
            _csv_loggers=[],
            _mirror=None,
            _fetch_timer=None,
            _checkpoints=[],
            _hooks=None,
            _unclose=None,
            _progbars=[],
            _loader_timing=None,
            _batch_wait=None,
        )
        return state

    # The engine's results, under the names this callback documents.
    reports: dict[int, BottleneckReport] = property(lambda self: self._engine.pipeline.reports)  # type: ignore[assignment]
    """The report of each profiled epoch of the last ``fit`` (0-based epoch -> report)."""
    trace_paths: dict[int, Path] = property(lambda self: self._engine.pipeline.trace_paths)  # type: ignore[assignment]
    """The trace of each profiled epoch of the last ``fit``."""
    steps: StepRecorder = property(lambda self: self._engine.steps)  # type: ignore[assignment]
    epoch_steps: dict[int, EpochSteps] = property(lambda self: self._engine.epoch_steps)  # type: ignore[assignment]
    triggered: list[tuple[int, TriggerEvent, BottleneckReport | None]] = property(  # type: ignore[assignment]
        lambda self: self._engine.triggered
    )

    def _warn_count_items(self, message: str) -> None:
        self._warn_once("count-items", message)

    def _warn_samples(self, message: str) -> None:  # a method, not a lambda: the callback is copied and pickled
        self._warn_once("samples", message)

    def _new_window(self, epoch: int, suffix: str) -> ProfileWindow:
        engine = self._engine
        return self._fns.window(
            self._run_dir,
            epoch=epoch,
            rank=engine.rank,
            world=engine.world,
            suffix=suffix,
            warn=self._warn_once,
            options=self.torch_options,
        )

    def _sync_guards(self) -> None:
        """Wrap what ``fit`` calls while a window is open (:mod:`fitprof.keras._guards`), and unwrap it after."""
        window = self._engine.window
        if window is not None and not self._guards:
            self._guards.install(
                getattr(self, "model", None), window, python_fetch=self._fns.python_fetch, on_error=self._flush
            )
        elif window is None and self._guards:
            self._guards.remove()

    def _flush(self, drop_open_step: bool) -> None:
        """An exception is on its way out of ``fit`` (no ``on_train_end`` follows): analyse and publish the
        partial window, stop the profiler, copy to a URL log dir, unpatch the fetch timer."""
        try:
            self._guards.remove()
            self._in_flush = True
            result = self._engine.exception(None, log=self._log, drop_open_step=drop_open_step)
            if result is not None:
                self._publish_epoch(self._engine.epoch, result)
            if self._mirror is not None:
                self._events.close()
                self._close_mirror()
        except Exception as err:
            log.warning("fitprof: could not flush the window after an exception: %s", err)
        finally:
            self._stop_step_timing()

    # -- Keras hooks ---------------------------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._guards.remove()
        self.fit_seconds = {}
        self._csv_loggers = _logs.csv_loggers(sys._getframe(1))
        self._progbars = _logs.quiet_progbars(sys._getframe(1))
        self._voice.begin_fit()
        for said in _logs.unwatchable_monitors(sys._getframe(1), self.config.every_n_epochs):
            self._warn_once(f"monitor {said}", said)
        self._in_flush = False  # a new fit: its epochs join the cross-rank gather again
        self._open_run_dir()
        rank, world = _distributed.rank_and_world(self.model, self.backend)
        spe = max(int(getattr(self.model, "steps_per_execution", 1) or 1), 1)
        self._spe = spe
        engine = self._engine
        engine.fit_start(
            log_dir=self._run_dir,
            rank=rank,
            world=world,
            steps_per_execution=spe,
            ends_after=self._ends_after,
            memory_device=self._memory_device(),
        )
        engine.warm_up(kineto=self._fns.kineto_trace)  # not at the first window's end, which training waits for
        if rank == 0:
            self._events.warm_up()  # likewise: its first write is at the first epoch's end
        self._work.begin_fit(self.model, world)
        engine.publisher.setup = keras_model_setup(
            self.model, backend=self.backend, device=self._work.log.device_name or "cpu"
        )
        if self._fns.non_chief_abort and rank > 0 and engine.profiles_rank:
            self._warn_once(
                "tf-non-chief",
                f"fitprof: rank {rank} is a non-chief TensorFlow worker. TensorFlow's profiler (2.21) can "
                "abort such a worker when a window stops (heap corruption in TraceMeRecorder, from all-reduces "
                "that end on another thread). Pass ranks=[0] to profile the chief only.",
            )
        unknown = unknown_ranks_message(self.ranks, world)
        if unknown and rank == 0:
            self._warn_once("ranks", f"fitprof: {unknown}")
        found = _callbacks.fit_callbacks(self)
        if self._unclose is not None:  # a fit that raised left it in place, around the hook timers
            self._unclose()
        if self._hooks is not None:  # likewise
            self._hooks.uninstall()
        self._hooks = _callbacks.time_hooks(engine, self, found, self._warn_once, threads=self._fns.threads)
        self._close_later(found)
        self._tb_profilers = [cb for cb in found if _callbacks.tensorboard_profiles(cb)]
        self._checkpoints = [cb for cb in found if _callbacks.saves_every_n_batches(cb)]
        self._start_step_timing()
        self._time_loader()
        if spe > 1:
            calls = engine.config
            window = (
                f" The default window analyses calls 6-10 (batches {calls.first_step}-{calls.last_step}) of each "
                "profiled epoch."
                if self.config.default and calls.enabled
                else ""
            )
            self._warn_once(
                "spe",
                f"fitprof: steps_per_execution={spe}: Keras runs {spe} batches per call, so each "
                f"profiled step holds that many batches and step_time_ms is per execution, not per batch.{window}",
            )

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._close_epoch(None)  # where History did not close the last epoch
        self._last_step = 0
        self._prev_samples = None
        self._engine.epoch_start(epoch, busy=_callbacks.tensorboard_steps(self._tb_profilers, self._spe))

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """The step that ends here (``batch``, 0-based) is timed from the previous batch begin: on TensorFlow its
        traced function (its ``IteratorGetNext`` included) and every batch-end hook; on torch and JAX also the next
        batch's fetch, which Keras runs in Python before this hook (``FetchTimer`` gives its wait on torch). A save
        of a checkpointing callback inside the step is taken out of its time (its hooks are timed: :func:`fitprof.keras._callbacks.time_hooks`)."""
        engine = self._engine
        if self._checkpoints and any(_callbacks.saved_in_last_step(cb) for cb in self._checkpoints):
            engine.checkpoint_start()
            engine.checkpoint_end()
        timer = self._fetch_timer
        if timer is not None:
            wait, samples = timer.wait_ns, self._prev_samples
            self._prev_samples = timer.samples
        else:
            wait, samples = None, self._adapter_samples
        self._last_step = batch + 1
        window = engine.window
        if window is not None:  # the step that ended ran in the window: its samples, as the data gives them
            self._work.step_ended(samples)
        engine.step_start(batch + 1, input_ns=wait, samples=samples)
        if engine.window is not window:
            self._sync_guards()

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        # Validation at the end of an epoch is not training: the window ends before it.
        self._engine.validation_start()
        self._sync_guards()

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self._engine.validation_end()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._engine.window is not None:  # the epoch's last step ran in the window
            self._work.step_ended(self._prev_samples if self._fetch_timer is not None else self._adapter_samples)
        gather = self._gather if self._engine.world > 1 and not self._in_flush else None
        result = self._engine.epoch_end(epoch, steps=self._steps_this_epoch(), gather=gather, log=self._log)
        self._sync_guards()
        if logs is not None:  # every epoch gets every key (NaN where nothing was profiled): History, CSVLogger
            logs.update(every_key(result.window, self.config.top_k, self._engine.world, self._window_keys()))
            logs.update(result.epoch)
            logs.update(result.trigger)
            _logs.no_val_columns(self._csv_loggers, logs)
        if not self._closes_later:  # no callback after this one: nothing more runs in the epoch
            self._close_epoch(logs)

    def _close_later(self, callbacks: list[Any]) -> None:
        """Close each epoch just before ``History`` records its logs (:func:`fitprof.keras._callbacks.close_point`),
        so that what runs after this callback's ``on_epoch_end`` (a ``ModelCheckpoint`` listed after it, other
        callbacks) is counted in the epoch, and ``History`` records the final parts."""
        history, later = _callbacks.close_point(self, callbacks)
        self._unclose = None if history is None else _callbacks.close_before(history, self._close_epoch)
        self._closes_later = later  # without a History after this one: at the next epoch's start or the fit's end

    def _close_epoch(self, logs: dict[str, Any] | None) -> None:
        """The epoch whose ``on_epoch_end`` ran closes (:mod:`fitprof.fit.epoch_close`): its final parts into
        ``logs`` (History's, when given), then published (:meth:`_publish_epoch`)."""
        result = self._engine.close_epoch()
        if result is None:
            return
        if logs is not None:
            logs.update(part_figures(result.epoch))
        self._publish_epoch(self._engine.epoch, result)

    def _publish_epoch(self, epoch: int, result: Any) -> None:
        """Rank 0: the epoch's always-on figures, triggered windows and newly said advice to the event file
        (step = epoch), its lines printed when ``verbose`` (:class:`~fitprof.fit.voice.Voice`, the profile's place
        named once a URL log dir holds it)."""
        synced = result.profiled and result.session_dir is not None and (self._mirror is None or self._mirror.sync())
        if self._engine.rank == 0:
            where = profile_place(self.log_dir, result.session_dir) if synced else None
            lines = self._voice.lines(epoch, result, where)
            if self._verbose():
                _logs.say(self._progbars, lines)
            texts = [t.text for t in result.triggered]
            self._write_events(finite({**result.epoch, **result.trigger}), epoch, texts, self._voice.new)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._work.restore()
        self._close_epoch(None)  # where History did not close the last epoch
        self._engine.fit_end()
        fit = self._engine.fit_teardown()
        self.fit_seconds = fit.seconds() if fit is not None else {}
        if fit is not None and self._engine.rank == 0:  # once a fit, at the step of its last epoch
            self._write_events(fit.scalars(), max(self._engine.epoch, 0), [], [])
        if self._unclose is not None:  # before the hook timers: it wraps theirs
            self._unclose()
            self._unclose = None
        if self._hooks is not None:
            self._hooks.uninstall()
            self._hooks = None
        self._guards.remove()
        self._stop_step_timing()
        self._tb_profilers = []
        self._events.close()
        self._close_mirror()
        self._csv_loggers = []  # hold no other callback (or its open file) past the fit: deepcopy / pickle
        _logs.restore_progbars(self._progbars)  # the fit is over: the class's own hook again
        self._progbars = []

    def __del__(self) -> None:
        # A fit that raised where nothing was wrapped leaves the window open: never leave the profiler running.
        with contextlib.suppress(Exception):
            self._engine.abort()
        with contextlib.suppress(Exception):  # nor the fetch timer patched into Keras's torch epoch iterator
            self._stop_step_timing()

    # -- internal ------------------------------------------------------------------------------------------

    def _verbose(self) -> bool:
        return self.verbose and (self.params or {}).get("verbose", 1) != 0

    def _ends_after(self, step: int) -> bool:
        """Whether the call at step ``step`` is the epoch's last (Keras knows when the data has a length)."""
        known = int((self.params or {}).get("steps") or 0)
        return bool(known) and step + self._spe - 1 >= known

    def _steps_this_epoch(self) -> int:
        """The training batches this epoch really ran: Keras's count when it has one, else the batch hooks seen.

        With data of unknown length (a generator, ``.filter``) on the TensorFlow backend, Keras calls
        ``on_train_batch_begin`` once more, for the call that finds the data exhausted (the optimizer's counter
        moves on that call too, so it cannot tell either): that call is not counted.
        """
        known = int((self.params or {}).get("steps") or 0)
        if known or not self._last_step:
            return known
        counted = self._last_step + self._spe - 1  # the last call runs up to steps_per_execution batches
        if self._fns.extra_last_call and not getattr(self.model, "stop_training", False):
            counted -= self._spe
        return counted

    def _start_step_timing(self) -> None:
        """The sources of the input wait and the samples per step (see :meth:`on_train_batch_begin`)."""
        self._stop_step_timing()
        self._adapter_samples = None
        self._work.data_batch = None
        if self._fns.fetch_timer is not None:
            self._fetch_timer = self._fns.fetch_timer()
            self._fetch_timer.install()
            return
        # TensorFlow and JAX: the fetch is not visible (TF: inside the traced step); the batch size is the data
        # adapter's when Keras knows it (arrays, a tf.data pipeline with a static batch dimension).
        adapter = getattr(fit_frame_locals(self.model).get("epoch_iterator"), "data_adapter", None)
        try:
            n = getattr(adapter, "batch_size", None)
            n = None if n is None else int(n)
        except Exception:  # an adapter whose batch size is unknown raises or gives a symbolic dimension
            n = None
        self._adapter_samples = n * self._spe if n else None
        self._work.data_batch = n or None

    def _stop_step_timing(self) -> None:
        timer, self._fetch_timer = self._fetch_timer, None
        if timer is not None:
            timer.uninstall()
        timing, self._loader_timing = self._loader_timing, None
        if timing is not None:
            timing.detach()
        wait, self._batch_wait = self._batch_wait, None
        if wait is not None:
            wait.uninstall()
        self._loader.attach(None)

    def _fetch_wait(self) -> int | None:
        timer = self._fetch_timer
        if timer is not None:
            return timer.wait_ns
        wait = self._batch_wait
        return None if wait is None else wait.take()

    def _time_loader(self) -> None:
        """On torch, fed a ``DataLoader``: time its workers (:mod:`fitprof.profilers.loader`); fed a ``PyDataset``:
        time its worker threads or processes (:mod:`fitprof.profilers.pydataset`). Keras starts either at each
        epoch's first batch (after ``on_epoch_begin``), so every epoch's workers are timed. On TensorFlow and JAX the
        step pulls its ``PyDataset`` batch inside ``train_function``: the wait is timed around the adapter's generator
        (:class:`fitprof.profilers.pydataset.BatchWait`), except on TensorFlow with no workers, where ``tf.data``
        prefetches the batches in the background and the figures stay NaN."""
        adapter = getattr(fit_frame_locals(self.model).get("epoch_iterator"), "data_adapter", None)
        self._engine.cpu_share(feed=_feed(adapter))
        if _is_py_dataset_adapter(adapter):
            try:
                from fitprof.profilers.pydataset import BatchWait, PyDatasetTiming

                timing = PyDatasetTiming.attach(adapter)
                self._loader_timing = timing
                if self._fns.fetch_timer is None:
                    plain = not self._fns.prefetches_plain_batches
                    if timing.enqueuer is not None or plain:
                        wait = BatchWait(adapter, plain=plain)
                        if wait.install():
                            self._batch_wait = wait
                    if self._batch_wait is None:  # no wait to split the steps with: no figures
                        return
                self._loader.attach(timing)
            except Exception as err:  # never in the way of training: the loader figures stay NaN
                self._warn_once("loader", f"fitprof: the PyDataset's workers are not timed ({err!r}).")
            return
        if self._fns.fetch_timer is None:
            return
        get = getattr(adapter, "get_torch_dataloader", None)
        if get is None:
            return
        try:
            from fitprof.profilers.loader import DataLoaderTiming, loaders_in

            found = loaders_in(get())
            self._loader.user_loader = type(adapter).__name__ == "TorchDataLoaderAdapter"  # not one made from arrays
            if found:
                self._loader_timing = DataLoaderTiming.attach(found[0])
                self._loader.attach(self._loader_timing)
        except Exception as err:  # never in the way of training: the loader figures stay NaN
            self._warn_once("loader", f"fitprof: the DataLoader's workers are not timed ({err!r}).")

    def _gather(self, vector: list[float]) -> list[list[float]]:
        return _distributed.all_gather_vectors(self.model, self.backend, vector, self._engine.world)

    def _write_events(self, scalars: dict[str, float], epoch: int, trigger_texts: list[str], said: list[str]) -> None:
        try:
            self._events.scalars(scalars, step=epoch)
            for text in trigger_texts:
                self._events.text(metrics.TRIGGER_SUMMARY_TAG, text, step=epoch)
            if said:
                self._events.text(metrics.ADVICE_TAG, "\n\n".join(said), step=epoch)
            self._events.flush()
        except ModuleNotFoundError:  # no tensorboard: warned once by _log; the figures still reach the logs
            pass
        except OSError as err:
            self._warn_once("write", f"fitprof: could not write summaries to {self.log_dir}: {err}")

    def _log(self, entry: EpochLog) -> None:
        """Rank 0: write the scalars (by rank and, for TensorBoard, the operators by name) and the summary to
        fitprof's event file in ``log_dir`` (step = epoch); its line is printed with the epoch's result."""
        try:
            self._events.scalars({**entry.scalars, **entry.op_scalars}, step=entry.epoch)
            self._events.text(metrics.SUMMARY_TAG, entry.text, step=entry.epoch)
            self._events.flush()
        except ModuleNotFoundError as err:  # the event-file writer is optional (Keras on torch needs no TensorFlow)
            self._warn_once(
                "tensorboard",
                f"fitprof: `{(err.name or 'tensorboard').split('.')[0]}` is not installed, so the figures are not "
                f"written to an event file in {self.log_dir} (they still reach the epoch logs and History): "
                "pip install tensorboard",
            )
        except OSError as err:
            self._warn_once("write", f"fitprof: could not write summaries to {self.log_dir}: {err}")

    def _open_run_dir(self) -> None:
        """A URL ``log_dir``: a fresh local staging folder for this fit, copied there through the backend's store
        (``tf.io.gfile`` on TensorFlow, as Keras's ``TensorBoard`` callback) or fsspec."""
        self._close_mirror()
        if _fs.is_remote(self.log_dir):
            store = self._fns.store
            self._mirror = _fs.Mirror(self.log_dir, self._warn_once, *((store,) if store else ()))
            self._run_dir = str(self._mirror.local)
            self._events = TBEventFile(self._run_dir)

    def _close_mirror(self) -> None:
        mirror, self._mirror = self._mirror, None
        if mirror is not None:
            mirror.close()

    def _window_keys(self) -> tuple[str, ...]:
        """The window keys beyond the report's base keys, logged every epoch: the probes' (NaN where no window
        closed), and the allocation churn when torch records memory events."""
        keys = tuple(self._engine.probes.figures("window"))
        if self._fns.torch_options and self.torch_options.get("profile_memory"):
            keys += tuple(m.key for m in metrics.CHURN_METRICS)
        return keys

    def _memory_device(self) -> tuple[str, int]:
        """The device the memory figures come from: the backend's first accelerator, else the host."""
        try:
            return keras_device(self.backend)
        except Exception as err:  # the backend could not say: the host's memory, with one warning
            self._warn_once(
                "memory-device",
                f"fitprof: could not find the training device ({err!r}); memory figures are read from the host.",
            )
            return "host", 0


def _is_py_dataset_adapter(adapter: Any) -> bool:
    """Whether ``adapter`` is Keras's adapter of a ``PyDataset`` (whose torch ``DataLoader`` has no workers: the
    ``PyDataset``'s own threads or processes produce the batches)."""
    try:
        from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter
    except ImportError:  # another Keras layout: its PyDataset workers go untimed
        return False
    return isinstance(adapter, PyDatasetAdapter)


_FEED_OF_ADAPTER = {
    "TorchDataLoaderAdapter": "DataLoader",
    "TFDatasetAdapter": "tf.data",
    "PyDatasetAdapter": "PyDataset",
    "ArrayDataAdapter": "arrays",
}
"""Keras 3's data adapter classes (``keras/src/trainers/data_adapters``) -> what the fit is fed
(:data:`fitprof.fit.epoch_parts.FEEDS`); NumPy arrays, tensors and lists all come through ``ArrayDataAdapter``."""


def _feed(adapter: Any) -> str:
    """What ``adapter`` (the fit's Keras data adapter, None when not found) feeds: one of
    :data:`fitprof.fit.epoch_parts.FEEDS`, "" when unknown (a generator, a Grain dataset, another Keras layout)."""
    return _FEED_OF_ADAPTER.get(type(adapter).__name__, "") if adapter is not None else ""

"""``FitProfiler`` for Keras 3: profile chosen training steps, log bottleneck scalars at every epoch end."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import keras

from fitprof import _config, _fs, metrics
from fitprof._coverage import FitCoverage
from fitprof._retention import DEFAULT_MAX_TRACE_MB
from fitprof._session import trigger_suffix
from fitprof._warn import WarnOnce
from fitprof.analysis import BottleneckReport
from fitprof.keras._tbevents import TBEventFile
from fitprof.steps import EpochSteps, SlowdownTrigger, StepRecorder, TriggerEvent
from fitprof.window import (
    EpochLog,
    WindowPipeline,
    compare_windows,
    epoch_scalars,
    every_key,
    trigger_line,
    trigger_scalars,
)

log = logging.getLogger(__name__)

SUPPORTED_BACKENDS = ("tensorflow", "torch", "jax")


class FitProfiler(keras.callbacks.Callback):
    """Profile a few training steps of every epoch and log where the step time goes.

    Add it to ``model.fit(..., callbacks=[FitProfiler(log_dir="logs")])``. In each profiled epoch it profiles
    steps ``profile_batch`` (1-based, inclusive) with the backend's profiler, each step wrapped in a marker
    xprof recognises, writes the profile to ``<log_dir>/plugins/profile/<session>/`` (a new session folder
    per window, shown by TensorBoard's Profile tab), and at the epoch's end analyses it and logs:

    * ``fitprof/step_time_ms``, ``fitprof/input_percent``, ``fitprof/htod_ms_per_step``,
      ``fitprof/htod_percent``, ``fitprof/collective_percent``, ``fitprof/steps_analyzed``,
      ``fitprof/self_ms_per_step`` and
      ``fitprof/top_op_1_ms`` ... ``fitprof/top_op_<top_k>_ms`` (ms per step, operators by rank) as TensorBoard
      scalars in ``log_dir`` (step = epoch) and in the epoch ``logs`` dict of every epoch (NaN where nothing
      was profiled), so ``History`` and callbacks placed after this one (``CSVLogger``) see the same keys every
      epoch; TensorBoard also gets ``fitprof/top_ops/<op name>``;
    * the verdict, advice and top-operator table as Markdown in TensorBoard's Text tab (``fitprof/summary``);
    * under ``MultiWorkerMirroredStrategy`` (one rank per worker): the cross-rank means of the figures above,
      plus ``fitprof/step_time_ms_max``, ``fitprof/input_percent_max``, the rank each belongs to
      (``..._max_rank``) and ``fitprof/ranks_reported``; every rank's ``logs`` get them, only rank 0 writes
      event files. Each rank writes its own ``<host>_rank<r>.xplane.pb`` and report file.

    Each window's report is also written to ``<log_dir>/plugins/fitprof/<session>.rank<r>.json`` for
    ``fitprof report``. Definitions of every figure: :mod:`fitprof.metrics`. The report of each epoch stays in ``self.reports``.

    The window opens one step early: step ``first - 1`` is its warm-up step, recorded but not marked, so the
    profiler's start-up is never in an analysed step (with ``first == 1`` step 1 opens with the window). Inside
    the window the batch hook's own work is wrapped in ``fitprof/overhead``, left out of step time and logged as
    ``fitprof/self_ms_per_step``.

    Outside the windows the batch hook only times the step (one clock read, :class:`fitprof.steps.StepRecorder`)
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
            read as separators on every system). A URL (``gs://``, ``s3://``, ``memory://``...; see the README,
            "Remote log directories") is written as Keras's ``TensorBoard`` callback writes it: through
            ``tf.io.gfile`` on TensorFlow, fsspec on torch. The fit records into a local staging folder, copied
            to the URL at the end of each profiled epoch and deleted at the end of the fit (``trace_paths``
            then name the staging copies). A filesystem that cannot be opened or written gives one warning; the
            figures still reach the epoch ``logs``.
        profile_batch: steps of each profiled epoch to profile: an int ``n`` (step ``n`` only), a
            ``(first, last)`` pair, or a ``"first,last"`` string; 1-based, inclusive. The default, steps 6-10,
            leaves tracing, compilation and warm-up out. ``0`` turns profiling off (as in Keras's
            ``TensorBoard``). A fit that profiles nothing ends with one warning naming why (see the README).
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
            profiler bug that can abort a non-chief worker when its window stops (see the README, "Distributed
            training"); a warning names it on such a worker.
        verbose: print one line per profiled epoch on rank 0 (step time, input and HtoD share, top operator,
            verdict; :func:`fitprof.window.summary_line`). Also quiet under ``fit(verbose=0)``.
        record_shapes: torch backend only (ignored, with one warning, on TensorFlow): record operator input
            shapes (``torch.profiler.profile(record_shapes=...)``).
        profile_memory: torch only: record allocations and frees.
        with_stack: torch only: record Python and C++ stacks (the largest traces).
        with_flops: torch only: estimate FLOPs (torch 2.13 writes none to the exported trace; shapes are
            recorded). The four are off by default; their measured cost is in the README.
        count_items: a function of one batch returning its items (e.g. tokens), for ``fitprof/items_per_s``:
            torch backend only, called on the batch of the step whose FLOPs are counted (the only batch a callback
            sees) and scaled to the window's samples; None (default), or another backend, logs NaN there.
        trigger: ``"slowdown"`` opens an extra window when steps stay slower than their baseline
            (:class:`fitprof.steps.SlowdownTrigger`): fired after step ``S``, step ``S + 1`` is its warm-up step and
            the next ``L`` steps (as many as ``profile_batch``, 5 when that is off) are analysed, in the session
            ``<time>_epoch<N>_trigger_step<S>``, at the epoch's end, with no collective. It never overlaps the
            ``profile_batch`` window, its warm-up step or its FLOP-count step, and counts no samples or FLOPs.
            None (default): no triggered windows; step timing runs either way.
        trigger_max_windows: the most triggered windows per ``fit`` (>= 1).
        trigger_min_spacing: the fewest clean steps between two triggered windows (>= 0).

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
        profile_batch: int | tuple[int, int] | str = _config.DEFAULT_PROFILE_BATCH,
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
    ) -> None:
        super().__init__()
        self.count_items = _config.check_count_items(count_items)
        self.trigger = _config.check_trigger(trigger, trigger_max_windows, trigger_min_spacing)
        log_dir = _config.normalize_log_dir(log_dir)
        self.verbose = _config.check_flag("verbose", verbose)
        self.torch_options = _config.torch_options(
            record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops
        )
        self.ranks = _config.check_ranks(ranks)
        self.config = _config.make_config(profile_batch, every_n_epochs, top_k)
        self.max_trace_mb = _config.check_optional_limit("max_trace_mb", max_trace_mb, integer=False)
        self.keep_last_windows = _config.check_optional_limit("keep_last_windows", keep_last_windows, integer=True)
        backend = keras.backend.backend()
        if backend not in SUPPORTED_BACKENDS:
            raise ValueError(
                f"FitProfiler supports the Keras backends {SUPPORTED_BACKENDS}; the active backend is {backend!r}. "
                "Set KERAS_BACKEND=tensorflow, KERAS_BACKEND=torch or KERAS_BACKEND=jax."
            )
        self.backend = backend
        self.log_dir = log_dir
        self._warn_once = WarnOnce()
        if backend == "tensorflow" and any(self.torch_options.values()):
            on = ", ".join(f"{k}=True" for k, v in self.torch_options.items() if v)
            self._warn_once("torch-options", f"fitprof: {on} apply to the torch backend only; ignored on TensorFlow.")
        self._pipeline = WindowPipeline(
            top_k=self.config.top_k,
            max_trace_mb=self.max_trace_mb,
            keep_last_windows=self.keep_last_windows,
            warn=self._warn_once,
        )
        self._closed: dict[int, tuple[Any, Path]] = {}  # epoch -> (stopped window, its trace), until analysed
        self._mirror: _fs.Mirror | None = None  # a URL log_dir: the local staging folder copied to it
        self._run_dir = self.log_dir  # where the windows and the event file write (the staging folder for a URL)
        self._events = TBEventFile(self._run_dir)
        self._window: Any = None  # the backend window while profiling
        self._guards: list[tuple[Any, str, Any, Any, bool]] = []  # what is wrapped while the window is open
        self._armed = False  # this epoch still has a window to open
        self._step_open = False
        self._epoch = 0
        self._steps_seen = 0
        self._epoch_profiled = False
        self._in_flush = False
        self._rank, self._world = 0, 1
        self._logged: dict[int, dict[str, float]] = {}  # epoch -> the scalars it published
        self._csv_loggers: list[Any] = []  # the fit's CSVLoggers, whose columns are fixed at their first epoch
        self._coverage = FitCoverage(self.config)
        self._last_begun = 0  # the last step marked in the open window
        self._step_seen = 0  # the last step seen in this profiled epoch (steps counted when Keras gives none)
        self._spe = 1
        self._warm_up = 1  # the step that opens this epoch's window: the warm-up step, or first when none is taken
        self._tb_profilers: list[Any] = []  # keras.callbacks.TensorBoard callbacks of this fit that profile
        self._tb_done: list[int] = []  # each one's global train batch count when this epoch began
        from fitprof.keras._throughput import KerasWork

        # Throughput: the window's samples, and the FLOPs of one step outside it (the call before the window's
        # warm-up call, or the one after the window when there is no such call or no warm-up step): counting slows
        # the step it counts, so it is neither an analysed step nor the warm-up step the profiler records.
        self._work = KerasWork(backend, self.count_items, self._warn_count_items)
        self._count_step = self.config.last_step + 1  # set each epoch (on_epoch_begin)
        self._count_pending = False
        # Always-on step timing (every training step, outside and inside the windows) and the slowdown trigger.
        self.steps = StepRecorder()
        self._slowdown: SlowdownTrigger | None = None
        if self.trigger is not None:
            self._slowdown = SlowdownTrigger(max_windows=trigger_max_windows, min_spacing=trigger_min_spacing)
        self._fetch_timer: Any = None  # torch backend: times each batch fetch (fitprof.keras._torch_backend)
        self._adapter_samples: int | None = None  # TensorFlow / JAX: samples per step, from Keras's data adapter
        self._prev_samples: int | None = None  # torch: the samples of the batch the step in progress runs
        self._checkpoints: list[Any] = []  # the fit's ModelCheckpoints that save every N batches
        self.epoch_steps: dict[int, EpochSteps] = {}
        self.triggered: list[tuple[int, TriggerEvent, BottleneckReport | None]] = []
        self._trig_event: TriggerEvent | None = None  # the firing whose window is open now
        self._trigger_last: int | None = None  # the last step of the open triggered window
        self._trig_pending: list[tuple[Any, Path, TriggerEvent]] = []  # closed, analysed at the epoch's end
        self._trig_steps_total = 0  # clean steps seen by the trigger over the fit (its step numbering)
        self._trigger_pipeline = WindowPipeline(
            top_k=self.config.top_k,
            max_trace_mb=self.max_trace_mb,
            keep_last_windows=self.keep_last_windows,
            warn=self._warn_once,
        )

    def __getstate__(self) -> dict[str, Any]:
        """Copy and pickle (``copy.deepcopy``, ``pickle.dumps``) before, after and between fits: a window being
        profiled and the other callbacks of the running fit are not copied (the copy has no window open)."""
        state = self.__dict__.copy()
        state.update(
            _window=None,
            _closed={},
            _armed=False,
            _step_open=False,
            _tb_profilers=[],
            _tb_done=[],
            _csv_loggers=[],
            _guards=[],
            _mirror=None,
            _count_pending=False,
            _fetch_timer=None,
            _checkpoints=[],
            _trigger_last=None,
            _trig_event=None,
            _trig_pending=[],
        )
        return state

    # -- helpers -------------------------------------------------------------------------------------------

    @property
    def reports(self) -> dict[int, BottleneckReport]:
        """The report of each profiled epoch of the last ``fit`` (0-based epoch -> report)."""
        return self._pipeline.reports

    @property
    def trace_paths(self) -> dict[int, Path]:
        """The trace of each profiled epoch of the last ``fit``."""
        return self._pipeline.trace_paths

    def _warn_count_items(self, message: str) -> None:
        self._warn_once("count-items", message)

    def _profiles_rank(self) -> bool:
        return _config.profiles_rank(self.ranks, self._rank)

    def _new_window(self, suffix: str = "") -> Any:
        if self.backend == "tensorflow":
            from fitprof.profilers.tensorflow import TFProfileWindow

            return TFProfileWindow(self._run_dir, epoch=self._epoch, rank=self._rank, world=self._world, suffix=suffix)
        if self.backend == "jax":
            from fitprof.profilers.jax import JaxProfileWindow

            return JaxProfileWindow(self._run_dir, epoch=self._epoch, rank=self._rank, world=self._world, suffix=suffix)
        from fitprof.keras._torch_backend import TorchKerasWindow

        return TorchKerasWindow(
            self._run_dir,
            epoch=self._epoch,
            rank=self._rank,
            warn=self._warn_once,
            options=self.torch_options,
            suffix=suffix,
        )

    def _open_window(self, suffix: str = "") -> None:
        self._last_begun = 0  # a new window: no step of it marked yet
        window = self._new_window(suffix)
        try:
            window.start()
        except Exception as err:
            self._warn_once("start", f"fitprof: profiling skipped for epoch {self._epoch}: {err}")
            if not suffix and self._coverage.blocked is None:  # the scheduled window's (a triggered one is extra)
                self._coverage.blocked = str(err)
            return
        self._window = window
        self._guard_train_function()

    def _guard_train_function(self) -> None:
        """While a window is open, wrap what ``fit`` calls so that an exception flushes and analyses the partial
        window, and stops the profiler, before it goes on unchanged: ``model.train_function`` (an error in the
        user's step or, on TensorFlow, in the input pipeline; ``KeyboardInterrupt``), the hooks of ``fit``'s
        ``CallbackList`` (an error in another callback) and, on the torch backend, the batch iterator of
        ``fit``'s epoch iterator (an error in the user's data). Keras has no exception hook; outside the window
        nothing is wrapped. What cannot be found (Keras internals moved) is left alone: a window still open when
        ``fit`` has raised is then stopped at the next ``fit``'s start or when the callback is deleted."""
        model = getattr(self, "model", None)
        if model is None:
            return
        self._wrap(model, "train_function", drop_open_step=True)  # the failing step never finished
        if self.backend == "jax":
            self._annotate_fetch(model)
        fit_locals = _fit_locals(model)
        callbacks = fit_locals.get("callbacks")
        if isinstance(callbacks, keras.callbacks.CallbackList):
            for hook in _GUARDED_HOOKS:
                # A batch-begin hook raised before its step ran; after the others, the open step had finished.
                self._wrap(callbacks, hook, drop_open_step=hook == "on_train_batch_begin")
        epoch_iterator = fit_locals.get("epoch_iterator")
        current = getattr(epoch_iterator, "_current_iterator", None)
        if self.backend == "torch" and current is not None and not isinstance(current, _GuardedIterator):
            self._replace(
                epoch_iterator,
                "_current_iterator",
                current,
                _GuardedIterator(current, lambda: self._flush_on_exception(drop_open_step=True)),
            )

    def _annotate_fetch(self, model: Any) -> None:
        """On JAX, Keras's ``train_function(state, iterator)`` fetches its batch with ``next(iterator)``, after
        ``on_train_batch_begin``: hand it the iterator wrapped by the window, so each fetch is an input span inside
        the step marker."""
        original, window = getattr(model, "train_function", None), self._window
        if original is None or not hasattr(window, "annotate_input"):
            return

        def annotated(state: Any, iterator: Any, *args: Any, **kwargs: Any) -> Any:
            return original(state, window.annotate_input(iterator), *args, **kwargs)

        self._replace(model, "train_function", original, annotated)

    def _wrap(self, owner: Any, name: str, *, drop_open_step: bool) -> None:
        original = getattr(owner, name, None)
        if original is None or getattr(original, "_fitprof_guard", False):
            return

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except BaseException:
                self._flush_on_exception(drop_open_step=drop_open_step)
                raise

        guarded._fitprof_guard = True  # type: ignore[attr-defined]
        self._replace(owner, name, original, guarded)

    def _replace(self, owner: Any, name: str, original: Any, replacement: Any) -> None:
        had_own = name in getattr(owner, "__dict__", {})
        try:
            setattr(owner, name, replacement)
        except Exception:  # pragma: no cover - a read-only attribute: nothing wrapped
            return
        self._guards.append((owner, name, original, replacement, had_own))

    def _unguard_train_function(self) -> None:
        """Put back what :meth:`_guard_train_function` wrapped (unless something else replaced it since)."""
        guards, self._guards = self._guards, []
        for owner, name, original, replacement, had_own in reversed(guards):
            try:
                if getattr(owner, name, None) is replacement:
                    if had_own:
                        setattr(owner, name, original)
                    else:  # a method wrapped on the instance: the class's method again
                        delattr(owner, name)
            except Exception:  # pragma: no cover - defensive
                pass

    def _flush_on_exception(self, *, drop_open_step: bool) -> None:
        try:
            self._armed = False
            self._close_window(drop_open_step=drop_open_step)
            self._in_flush = True
            self.on_epoch_end(self._epoch, None)
            if self._mirror is not None:  # no on_train_end follows: copy to the URL, delete the staging folder
                self._events.close()
                self._close_mirror()
        except Exception as err:
            log.warning("fitprof: could not flush the window after an exception: %s", err)
        finally:  # no on_train_end follows: never leave the fetch timer patched in after the fit
            self._stop_step_timing()

    def _close_window(self, *, drop_open_step: bool = False) -> None:
        """Stop the window and remember its trace for this epoch's analysis (warn and drop on failure)."""
        window, self._window = self._window, None
        self._step_open = False
        event, self._trig_event, self._trigger_last = self._trig_event, None, None
        marked = self._last_begun > 0
        if window is None:
            return
        self._unguard_train_function()
        if not marked:  # only the warm-up step ran (the epoch ended before the first analysed step)
            window.abort()
            return
        if event is None:  # the samples are the scheduled window's only (a triggered window counts no work)
            self._work.window_closed(self.model)
        try:
            trace = window.stop(drop_open_step=drop_open_step)
            if event is None:
                self._closed[self._epoch] = (window, trace)
            else:
                self._trig_pending.append((window, trace, event))
        except Exception as err:
            self._warn_once("stop", f"fitprof: the window of epoch {self._epoch} was dropped: {err}")
            window.abort()
            return
        if window.session_dir is None:
            self._warn_once(
                "write",
                f"fitprof: could not write the profile under {self.log_dir} "
                f"({getattr(window, 'save_error', None)}); its figures are still computed and put in the epoch logs.",
            )

    # -- Keras hooks ---------------------------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._window is not None:  # a previous fit ended inside a window (exception): flush it now
            self._close_window()
        self._pipeline.clear()
        self._trigger_pipeline.clear()
        self._closed = {}
        self._trig_pending = []
        self._logged = {}
        self.epoch_steps = {}
        self.triggered = []
        self._trig_steps_total = 0
        self.steps = StepRecorder()
        if self._slowdown is not None:
            self._slowdown.reset()
        self._csv_loggers = _csv_loggers(sys._getframe(1))
        self._steps_seen = 0
        self._coverage.begin_fit()
        self._in_flush = False  # a new fit: its epochs join the cross-rank gather again
        self._open_run_dir()
        from fitprof.keras._distributed import rank_and_world

        self._rank, self._world = rank_and_world(self.model, self.backend)
        self._work.begin_fit(self.model, self._world)
        self._warn_once.reset()  # a new fit warns again when a cause repeats
        self._warn_once.rank = self._rank  # only rank 0 issues Python warnings; the others log
        if self.backend == "tensorflow" and self._rank > 0 and self._profiles_rank():
            self._warn_once(
                "tf-non-chief",
                f"fitprof: rank {self._rank} is a non-chief TensorFlow worker. TensorFlow's profiler (2.21) can "
                "abort such a worker when a window stops (heap corruption in TraceMeRecorder, from all-reduces "
                "that end on another thread). Pass ranks=[0] to profile the chief only.",
            )
        unknown = _config.unknown_ranks_message(self.ranks, self._world)
        if unknown and self._rank == 0:
            self._warn_once("ranks", f"fitprof: {unknown}")
        self._coverage.left_out = not self._profiles_rank()
        fit_callbacks = self._fit_callbacks()
        self._tb_profilers = [cb for cb in fit_callbacks if _tensorboard_profiles(cb)]
        self._checkpoints = [cb for cb in fit_callbacks if _saves_every_n_batches(cb)]
        spe = getattr(self.model, "steps_per_execution", 1) or 1
        self._spe = max(int(spe), 1)
        self._start_step_timing()
        if int(spe) > 1:
            self._warn_once(
                "spe",
                f"fitprof: steps_per_execution={int(spe)}: Keras runs {int(spe)} batches per call, so each "
                "profiled step holds that many batches and step_time_ms is per execution, not per batch.",
            )

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        # Every rank marks the epoch (all take part in the epoch-end gather); only the chosen ranks profile it.
        self._epoch_profiled = self.config.enabled and self.config.profiles_epoch(epoch)
        self._armed = self._epoch_profiled and self._profiles_rank()
        self._coverage.epoch(epoch)
        self._step_seen = self._last_begun = 0
        self._work.begin_epoch()
        self.steps.begin_epoch(None)  # the first batch-begin only sets the origin
        self._prev_samples = None
        if self._slowdown is not None:
            self._slowdown.reset_run()  # a new epoch (new iterator, maybe a new learning rate): a fresh baseline
        # The warm-up step: the call before the first analysed one (steps_per_execution batches a call).
        first, last = self.config.first_step, self.config.last_step
        self._warm_up = max(first - self._spe, 1)
        self._tb_done = [_tb_batches(tb) for tb in self._tb_profilers]
        if self._armed and self._tb_profilers:
            self._yield_to_tensorboard()  # may take the warm-up step away, or the whole window
        # The FLOPs: on the call before the warm-up call when there is one (the first call at or after
        # ``_count_step``), else on the first call after the window.
        self._count_step = max(self._warm_up - self._spe, 1) if 1 < self._warm_up < first else last + 1
        self._count_pending = self._armed

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        now = time.perf_counter_ns()
        step = batch + 1
        window = self._window
        if window is not None:
            self._window_step(window, now, step)
            return
        fired = self._time_step(now, step)
        if fired is None and not self._armed and not self._count_pending:
            return  # the usual step outside every window: the timing above and three comparisons
        if self._armed:
            self._step_seen = step
        if fired is not None:  # _may_trigger allowed it: no overlap with the scheduled window or its FLOP count
            self._open_triggered(fired, step)
        elif self._armed:
            self._open_scheduled(step)
        if self._window is not None:
            self.steps.exclude_next()  # the window's steps (its warm-up step first) and the one after
        else:
            self._count_flops(step)

    def _window_step(self, window: Any, now: int, step: int) -> None:
        """A batch begin while a window is open: all of this hook's work (the step timing, the markers, closing the
        window, the FLOP count that may follow) is fitprof's own, inside ``fitprof/overhead`` (a no-op once the
        window stopped: stopping closes the span first)."""
        window.begin_overhead()
        try:
            self._time_step(now, step)  # a window's steps are excluded: nothing is recorded and nothing fires
            if self._armed:
                self._step_seen = step
            if self._trig_event is not None:
                self._mark_triggered(window, step)
            else:
                self._mark_scheduled(window, step)
            self.steps.exclude_next()  # a window's steps and the one after: the profiler's own cost
            if self._window is None:  # the window closed here: the FLOPs may be counted on the call after it
                self._count_flops(step)
        finally:
            window.end_overhead()

    def _count_flops(self, step: int) -> None:
        """Count the FLOPs of this call (``_count_step``; >=: steps_per_execution skips step numbers), never while
        a window is open (its guard wraps the same ``train_function``); the counted step is left out of the step
        timing and the trigger's baseline (counting slows it)."""
        if self._count_pending and step >= self._count_step:
            self._count_pending = False
            self.steps.exclude_next(1)
            self._work.count_next_call(self.model)

    def _time_step(self, now: int, step: int) -> TriggerEvent | None:
        """Record the step that ends at this batch begin (``step - 1``) and feed it to the slowdown trigger.

        The step time is ``now`` less the previous batch begin's stamp: on TensorFlow the step's traced function
        (its ``IteratorGetNext`` included) and every batch-end hook; on torch and JAX also the next batch's fetch,
        which Keras runs in Python before this hook (``FetchTimer`` gives its wait on torch). A step during which
        a ``ModelCheckpoint(save_freq=N)`` saved, and the one after it, are excluded.
        """
        recorder = self.steps
        if self._checkpoints and any(_saved_in_last_step(cb) for cb in self._checkpoints):
            recorder.exclude_next()
        timer = self._fetch_timer
        if timer is not None:
            wait, samples = timer.wait_ns, self._prev_samples
            self._prev_samples = timer.samples
        else:
            wait, samples = None, self._adapter_samples
        step_ns = recorder.step(now, step - 1, input_ns=wait, samples=samples)
        if step_ns is None or self._slowdown is None:
            return None
        self._trig_steps_total += 1
        # Only a slow step can fire it: the (longer) check whether a window may open now is made for those only.
        allowed = step_ns <= self._slowdown.threshold_ms * 1e6 or self._may_trigger(step - 1)
        event = self._slowdown.observe(step_ns, self._trig_steps_total, allowed=allowed)
        if event is None:
            return None
        return TriggerEvent(step - 1, event.step_time_ms, event.baseline_ms, event.threshold_ms)  # in the epoch

    def _may_trigger(self, n: int) -> bool:
        """Whether a triggered window may open after step ``n``: no window open, this rank profiles, the epoch goes
        on past the window's warm-up step, and the window (warm-up call ``n+1``, analysed calls after it, closed on
        the call after its last) closes before this epoch's ``profile_batch`` block starts: its FLOP-count call or,
        without one before it, its warm-up call; and no ``keras.callbacks.TensorBoard`` of the fit is tracing or
        will trace any call from the warm-up call to the closing one (two profilers cannot run at once)."""
        if self._window is not None or not self._profiles_rank():
            return False
        spe = self._spe
        closing = n + 1 + spe * (self._trigger_length() + 1)  # the call that stops the triggered window
        if self._tb_profilers and self._tensorboard_overlaps(n + 1, closing):
            return False
        if self._armed:
            start = self._warm_up
            if self._count_pending and self._count_step < start:
                start = self._count_step
            if closing >= start:
                return False
        known = int((self.params or {}).get("steps") or 0)
        return not known or n + 1 + spe <= known  # the warm-up call is not the epoch's last

    def _tensorboard_overlaps(self, first: int, last: int) -> bool:
        """Whether a profiling ``keras.callbacks.TensorBoard`` of this fit is tracing now, or its ``profile_batch``
        range (its global train batches, one per call, counted as :meth:`_yield_to_tensorboard` does) meets this
        epoch's calls ``first..last`` (steps, 1-based). The closing call counts: in its batch begin TensorBoard
        may start before fitprof stops, whatever the order of the callbacks."""
        spe = self._spe
        for tb, done in zip(self._tb_profilers, self._tb_done, strict=False):
            try:
                if getattr(tb, "_is_tracing", False):
                    return True
                start, stop = int(tb._start_batch), int(tb._stop_batch)
            except (AttributeError, TypeError, ValueError):
                continue
            if start <= done + (last - 1) // spe + 1 and done + (first - 1) // spe + 1 <= stop:
                return True
        return False

    def _trigger_length(self) -> int:
        """Steps in a triggered window: as many as the ``profile_batch`` window (5 when that is off)."""
        return self.config.num_steps if self.config.enabled else 5

    def _start_step_timing(self) -> None:
        """The sources of the input wait and the samples per step (see :meth:`_time_step`)."""
        self._stop_step_timing()
        self._adapter_samples = None
        if self.backend == "torch":
            from fitprof.keras._torch_backend import FetchTimer

            self._fetch_timer = FetchTimer()
            self._fetch_timer.install()
            return
        # TensorFlow and JAX: the fetch is not visible (TF: inside the traced step); the batch size is the data
        # adapter's when Keras knows it (arrays, a tf.data pipeline with a static batch dimension).
        adapter = getattr(_fit_locals(self.model).get("epoch_iterator"), "data_adapter", None)
        try:
            n = getattr(adapter, "batch_size", None)
            n = None if n is None else int(n)
        except Exception:  # an adapter whose batch size is unknown raises or gives a symbolic dimension
            n = None
        self._adapter_samples = n * self._spe if n else None

    def _stop_step_timing(self) -> None:
        timer, self._fetch_timer = self._fetch_timer, None
        if timer is not None:
            timer.uninstall()

    def _open_triggered(self, event: TriggerEvent, step: int) -> None:
        """Open the window the slowdown trigger asked for at this step boundary, through the same path as the
        ``profile_batch`` window, in a session named ``<time>_epoch<N>_trigger_step<S>`` (``S`` = ``event.step``,
        the last slow step). As in the scheduled window (and Lightning's triggered one), step ``step`` (``S + 1``)
        is its warm-up step, recorded but not marked; the next ``_trigger_length()`` calls are analysed."""
        self._open_window(trigger_suffix(event.step))
        if self._window is None:
            return
        self._trig_event = event
        self._trigger_last = step + self._spe * self._trigger_length()

    def _mark_triggered(self, window: Any, step: int) -> None:
        try:
            window.end_step()
            if self._trigger_last is not None and step > self._trigger_last:
                self._close_window()
                return
            window.begin_step(step)
            self._last_begun = step
            self._step_open = True
        except Exception as err:
            self._drop_window(f"could not mark step {step} ({err!r})")

    def _open_scheduled(self, step: int) -> None:
        """Open the ``profile_batch`` window at its warm-up call (``_warm_up``), or at its first step when it takes
        none; ``<=``: steps_per_execution skips step numbers."""
        if not self._warm_up <= step <= self.config.last_step:
            return
        self._open_window()
        window = self._window
        if window is None:
            self._armed = False
            return
        if step < self.config.first_step:
            return  # the warm-up step runs unmarked: it takes the profiler's start-up
        window.begin_overhead()  # no warm-up step: marking the first step is fitprof's own time
        try:
            self._mark_scheduled(window, step)
        finally:
            window.end_overhead()

    def _mark_scheduled(self, window: Any, step: int) -> None:
        """The open ``profile_batch`` window: mark each step, close it after its last (the caller holds the
        ``fitprof/overhead`` span)."""
        try:
            window.end_step()
            if step > self.config.last_step:
                self._armed = False
                self._close_window()
                return
            if not self._last_begun:
                self._coverage.windows += 1  # the window's first analysed step: a window was profiled
                self._work.window_opened(self.model)  # the samples Keras counted before it
            window.begin_step(step)
            self._last_begun = step
            self._step_open = True
        except Exception as err:  # a step marker failed: drop the window, training goes on
            self._drop_window(f"could not mark step {step} ({err!r})")

    def _drop_window(self, reason: str) -> None:
        """Stop the open window without keeping it (one warning naming ``reason``)."""
        if self._trig_event is None:
            self._armed = False  # the scheduled window: this epoch opens no other (a triggered one leaves it armed)
        window, self._window = self._window, None
        self._step_open = False
        self._trigger_last = self._trig_event = None
        self._unguard_train_function()
        self._warn_once("mark", f"fitprof: {reason}; the window of epoch {self._epoch} was dropped.")
        if window is not None:
            try:
                window.abort()
            except Exception as err:  # pragma: no cover - abort is guarded in each window
                log.warning("fitprof: could not stop the profiler: %s", err)
        if window is not None and window.session_dir is not None:
            with contextlib.suppress(OSError):
                window.session_dir.rmdir()  # no empty session in the Profile tab

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        # Validation at the end of an epoch is not training: end the window before it.
        if self._window is not None:
            self._armed = False
            self._close_window()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._steps_seen = max(self._steps_seen, int(self.params.get("steps") or 0) if self.params else 0)
        self.epoch_steps[epoch] = self.steps.summary()
        if self._trig_event is not None:  # a triggered window cut short by the epoch's end: analyse what it has
            self._close_window()
        if self._armed or self._window is not None:  # a profiled epoch of this rank: its steps, as counted
            self._coverage.steps(self._steps_this_epoch())
        if self._window is not None and self._last_begun + self._spe - 1 >= self.config.last_step:
            self._close_window()  # the window's last step was the epoch's last: the window is complete
        if self._window is not None and not self._last_begun:
            self._close_window()  # the epoch ended on the warm-up step: nothing to analyse (dropped)
        if self._window is not None:
            self._warn_once(
                "short",
                f"fitprof: epoch {epoch} ended inside the window (profile_batch="
                f"{self.config.first_step},{self.config.last_step}); the steps profiled so far are analysed.",
            )
            self._close_window()
        self._armed = False
        if self._epoch_profiled and epoch not in self.reports:  # not flushed already after an exception
            self._logged[epoch] = self._analyze_and_publish(epoch)
        timing = self._publish_step_timing(epoch)
        if logs is not None:  # every epoch gets every key (NaN where nothing was profiled): History, CSVLogger
            logs.update(every_key(self._logged.get(epoch, {}), self.config.top_k, self._world))
            logs.update(timing)
            _no_val_columns(self._csv_loggers, logs)

    def _publish_step_timing(self, epoch: int) -> dict[str, float]:
        """The epoch's always-on scalars and its triggered windows: every ``fitprof/epoch/*`` and
        ``fitprof/trigger/*`` key (NaN where there is no figure; the trigger's are the epoch's last firing's).

        Each triggered window closed in this epoch is analysed (:class:`fitprof.window.WindowPipeline`, its own
        session and report file) and compared with the last ``profile_batch`` window
        (:func:`fitprof.window.compare_windows`); rank 0 writes the finite scalars and one summary per triggered
        window (``fitprof/trigger/summary``) to the event file (step = epoch) and prints its line when
        ``verbose``. Each rank times its own steps and triggers on its own signal: nothing is gathered here, so
        the epoch-end gather of the scheduled window stays the only collective whatever each rank captured."""
        figures = self.epoch_steps.get(epoch) or self.steps.summary()
        out = epoch_scalars(figures)
        out.update({m.key: math.nan for m in metrics.TRIGGER_METRICS})
        pending, self._trig_pending = self._trig_pending, []
        normal_epoch = max(self.reports) if self.reports else None
        normal = None if normal_epoch is None else self.reports[normal_epoch]
        texts = []
        for window, trace, event in pending:
            report = self._trigger_pipeline.analyze(
                epoch,
                trace,
                log_dir=self._run_dir,
                session=window.session_dir.name if window.session_dir is not None else None,
                rank=self._rank,
                world_size=self._world,
                discard=window.cleanup,
            )
            self.triggered.append((epoch, event, report))
            line = trigger_line(epoch, event, report, compare_windows(report, normal, normal_epoch) if report else "")
            if self.verbose and self._rank == 0 and (self.params or {}).get("verbose", 1) != 0:
                print(line, flush=True)
            texts.append(line if report is None else f"{line}\n\n{report.summary_markdown()}")
            out.update(trigger_scalars(event))
        if self._rank == 0:
            self._write_events({k: v for k, v in out.items() if math.isfinite(v)}, epoch, texts)
        return out

    def _write_events(self, scalars: dict[str, float], epoch: int, trigger_texts: list[str]) -> None:
        try:
            self._events.scalars(scalars, step=epoch)
            for text in trigger_texts:
                self._events.text(metrics.TRIGGER_SUMMARY_TAG, text, step=epoch)
            self._events.flush()
        except ModuleNotFoundError:  # no tensorboard: warned once by _log; the figures still reach the logs
            pass
        except OSError as err:
            self._warn_once("write", f"fitprof: could not write summaries to {self.log_dir}: {err}")

    def _analyze_and_publish(self, epoch: int) -> dict[str, float]:
        report = None
        closed = self._closed.pop(epoch, None)
        if closed is not None:
            window, trace = closed
            session = window.session_dir.name if window.session_dir is not None else None
            report = self._pipeline.analyze(
                epoch,
                trace,
                log_dir=self._run_dir,
                session=session,
                rank=self._rank,
                world_size=self._world,
                discard=window.cleanup,
                work=self._work.work(),
            )
        # Every rank takes part in the gather, with or without a report of its own, so it always completes.
        gather = self._gather if self._world > 1 and not self._in_flush else None
        logged = self._pipeline.publish(
            epoch,
            report,
            rank=self._rank,
            world_size=self._world,
            gather=gather,
            log=self._log,
            epoch_steps=self.epoch_steps.get(epoch),
        )
        if closed is not None and (self._mirror is None or self._mirror.sync()):
            self._say_where(epoch, self.log_dir, closed[0].session_dir)
        return logged

    def _gather(self, vector: list[float]) -> list[list[float]]:
        from fitprof.keras import _distributed

        return _distributed.all_gather_vectors(self.model, self.backend, vector, self._world)

    def _log(self, entry: EpochLog) -> None:
        """Rank 0: write the scalars (by rank and, for TensorBoard, the operators by name) and the summary to
        fitprof's event file in ``log_dir`` (step = epoch); print the one-line summary when ``verbose`` and
        ``fit(verbose != 0)``."""
        if self.verbose and (self.params or {}).get("verbose", 1) != 0:
            print(entry.line, flush=True)
        try:
            self._events.scalars({**entry.scalars, **entry.op_scalars}, step=entry.epoch)
            self._events.text(metrics.SUMMARY_TAG, entry.text, step=entry.epoch)
            self._events.flush()
        except ModuleNotFoundError as err:  # the event-file writer is optional (Keras on torch needs no TensorFlow)
            self._warn_once(
                "tensorboard",
                f"fitprof: `{(err.name or 'tensorboard').split('.')[0]}` is not installed, so the figures are not written to an "
                f"event file in {self.log_dir} (they still reach the epoch logs and History): pip install tensorboard",
            )
        except OSError as err:
            self._warn_once("write", f"fitprof: could not write summaries to {self.log_dir}: {err}")

    def __del__(self) -> None:
        # A fit that raised where nothing was wrapped leaves the window open: never leave the profiler running.
        if getattr(self, "_window", None) is not None:
            with contextlib.suppress(Exception):
                self._window.abort()
                self._window = None
        with contextlib.suppress(Exception):  # nor the fetch timer patched into Keras's torch epoch iterator
            self._stop_step_timing()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._work.restore()
        if self._window is not None:
            self._close_window()
        self._stop_step_timing()
        never = self._coverage.message("fitprof: ")
        if never:
            self._warn_once("never", never)
        self._tb_profilers = []
        self._events.close()
        self._close_mirror()
        self._csv_loggers = []  # hold no other callback (or its open file) past the fit: deepcopy / pickle

    def _open_run_dir(self) -> None:
        """A URL ``log_dir``: a fresh local staging folder for this fit, copied there through ``tf.io.gfile``
        (TensorFlow backend, as Keras's ``TensorBoard`` callback) or fsspec (torch backend)."""
        self._close_mirror()
        if _fs.is_remote(self.log_dir):
            if self.backend == "tensorflow":
                from fitprof.profilers.tensorflow import GFileStore

                self._mirror = _fs.Mirror(self.log_dir, self._warn_once, GFileStore)
            else:
                self._mirror = _fs.Mirror(self.log_dir, self._warn_once)
            self._run_dir = str(self._mirror.local)
            self._events = TBEventFile(self._run_dir)

    def _say_where(self, epoch: int, url: str, session_dir: Path | None) -> None:
        """TensorFlow logged "Collecting XSpace to repository: <temp folder>": one line naming where it really is
        (unless ``verbose=False``)."""
        if session_dir is not None and self.backend == "tensorflow" and self.verbose:
            where = (
                _fs.join(url, "plugins", "profile", session_dir.name)
                if _fs.is_remote(url)
                else os.path.join(url, "plugins", "profile", session_dir.name)
            )
            print(f"fitprof: the profile of epoch {epoch} is in {where}", file=sys.stderr)

    def _close_mirror(self) -> None:
        mirror, self._mirror = self._mirror, None
        if mirror is not None:
            mirror.close()

    def _steps_this_epoch(self) -> int:
        """The training batches this epoch really ran: Keras's count when it has one, else the batch hooks seen.

        With data of unknown length (a generator, ``.filter``) on the TensorFlow backend, Keras calls
        ``on_train_batch_begin`` once more, for the call that finds the data exhausted (the optimizer's counter
        moves on that call too, so it cannot tell either): that call is not counted.
        """
        known = int((self.params or {}).get("steps") or 0)
        if known or not self._step_seen:
            return known
        counted = self._step_seen + self._spe - 1  # the last call runs up to steps_per_execution batches
        if self.backend == "tensorflow" and not getattr(self.model, "stop_training", False):
            counted -= self._spe
        return counted

    def _fit_callbacks(self) -> list[Any]:
        """The callbacks of the running ``fit``: Keras gives a callback no handle on the others, so find the
        ``CallbackList`` that is calling this hook up the stack (empty when there is none)."""
        frame = inspect.currentframe()
        try:
            f = frame.f_back if frame is not None else None
            while f is not None:
                owner = f.f_locals.get("self")
                if isinstance(owner, keras.callbacks.CallbackList):
                    found = list(getattr(owner, "callbacks", []) or [])
                    if any(cb is self for cb in found):
                        return found
                f = f.f_back
        except Exception:  # a frame we cannot read: no detection, the profiler's own failure warns instead
            pass
        finally:
            del frame
        return []

    def _yield_to_tensorboard(self) -> None:
        """Leave this epoch's window to a ``keras.callbacks.TensorBoard`` that profiles any of its steps.

        TensorBoard profiles the fit's global train batches ``start..stop`` once (its own counter, one per
        ``on_train_batch_begin``, 1-based from the fit's start; one per execution under ``steps_per_execution``);
        two profilers cannot run at once, and whichever starts second loses its profile. So, whatever the order
        of the callbacks, fitprof leaves those steps to TensorBoard, says so once, and profiles no window in
        this epoch. A TensorBoard profile that ends on the warm-up step (just before the window) only costs the
        window its warm-up step: the profiler then starts at the window's first step.
        """
        first, last, spe = self.config.first_step, self.config.last_step, self._spe
        for tb in self._tb_profilers:
            try:
                done = int(tb._global_train_batch)  # batches TensorBoard counted before this epoch
                start, stop = int(tb._start_batch), int(tb._stop_batch)
                if getattr(tb, "_is_tracing", False):
                    start = done + 1
                elif start <= done:
                    continue  # TensorBoard's profile is behind us
            except (AttributeError, TypeError, ValueError):
                continue
            ours = (done + (first - 1) // spe + 1, done + (last - 1) // spe + 1)
            warm_up = done + (self._warm_up - 1) // spe + 1
            if warm_up <= stop < ours[0]:
                # TensorBoard still profiles the step before the window: take no warm-up step, so its profile
                # is kept and fitprof's window starts after it stops (at the window's first step).
                self._warm_up = first
                continue
            if ours[0] <= stop and start <= ours[1]:
                self._armed = False
                reason = (
                    f"keras.callbacks.TensorBoard(profile_batch=({tb._start_batch}, {tb._stop_batch})) profiles "
                    f"the same steps"
                )
                if self._coverage.blocked is None:
                    self._coverage.blocked = reason
                self._warn_once(
                    "tensorboard",
                    f"fitprof: {reason} as the window of epoch {self._epoch} (profile_batch={first},{last}); "
                    "two profilers cannot run at once, so fitprof leaves those steps to TensorBoard and profiles "
                    "no window in that epoch. Give the two callbacks different steps to get both profiles.",
                )
                return


def _saves_every_n_batches(callback: Any) -> bool:
    """Whether ``callback`` is a ``keras.callbacks.ModelCheckpoint`` that saves every N batches."""
    freq = getattr(callback, "save_freq", None)
    return isinstance(callback, keras.callbacks.ModelCheckpoint) and isinstance(freq, int) and freq > 0


def _saved_in_last_step(checkpoint: Any) -> bool:
    """Whether a ``ModelCheckpoint(save_freq=N)`` saved in the step that just ended: keras 3.15 sets its batch
    counter back to 0 when it saves (``callbacks/model_checkpoint.py``, ``_should_save_on_batch``)."""
    return getattr(checkpoint, "_last_batch_seen", None) is not None and not getattr(
        checkpoint, "_batches_seen_since_last_saving", 1
    )


def _tb_batches(callback: Any) -> int:
    """The train batches a ``keras.callbacks.TensorBoard`` has counted in this fit (0 when unreadable)."""
    try:
        return int(callback._global_train_batch)
    except (AttributeError, TypeError, ValueError):
        return 0


def _tensorboard_profiles(callback: Any) -> bool:
    """Whether ``callback`` is a ``keras.callbacks.TensorBoard`` with profiling on (``profile_batch`` != 0)."""
    return isinstance(callback, keras.callbacks.TensorBoard) and bool(getattr(callback, "_should_trace", False))


def _csv_loggers(frame: Any) -> list[Any]:
    """The ``keras.callbacks.CSVLogger`` instances of the fit, read from the ``CallbackList`` that called
    ``on_train_begin`` (``frame`` is its frame); empty when the caller is something else."""
    try:
        caller = frame.f_locals.get("self")
        if not isinstance(caller, keras.callbacks.CallbackList):
            return []
        return [cb for cb in caller.callbacks if isinstance(cb, keras.callbacks.CSVLogger)]
    except Exception:
        return []


def _no_val_columns(csv_loggers: list[Any], logs: dict[str, Any]) -> None:
    """Keep ``val_fitprof/*`` columns out of a ``CSVLogger`` placed after FitProfiler.

    At its first epoch end ``CSVLogger`` fixes its columns to the sorted keys of ``logs`` and, when none starts
    with ``val_`` (no validation in that epoch), adds ``val_<key>`` for every key (keras 3.15
    ``callbacks/csv_logger.py``): columns that stay ``NA`` for fitprof's keys, since validation is never
    profiled. For each CSVLogger that has not fixed its columns yet, set them as it would, without the
    ``val_fitprof/*`` ones. A CSVLogger placed before FitProfiler has fixed them already and is left alone."""
    keys = sorted(logs)
    if any(k.startswith("val_") for k in keys):
        return  # CSVLogger adds nothing
    for cb in csv_loggers:
        try:
            if cb.keys is None:
                cb.keys = keys + [f"val_{k}" for k in keys if not k.startswith(metrics.PREFIX)]
        except Exception:
            continue


_GUARDED_HOOKS = (
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_test_begin",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_test_end",
)
"""The ``CallbackList`` hooks wrapped while a window is open: another callback raising in one of them ends
``fit`` without ``on_train_end``."""


def _fit_locals(model: Any) -> dict[str, Any]:
    """The local variables of the running ``model.fit`` call (its frame is found on the stack by name and
    ``self``); empty when there is none."""
    frame = sys._getframe(1)
    for _ in range(64):
        if frame is None:
            break
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return dict(frame.f_locals)
        frame = frame.f_back  # type: ignore[assignment]
    return {}


class _GuardedIterator:
    """An iterator that calls ``on_error`` before an exception (other than ``StopIteration``) of the wrapped
    iterator goes on: the torch backend fetches each batch in Python, outside ``train_function``."""

    _fitprof_guard = True

    def __init__(self, iterator: Any, on_error: Any) -> None:
        self._iterator = iterator
        self._on_error = on_error

    def __iter__(self) -> _GuardedIterator:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._iterator)
        except StopIteration:
            raise
        except BaseException:
            self._on_error()
            raise

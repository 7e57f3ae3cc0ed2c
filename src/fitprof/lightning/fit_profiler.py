"""``FitProfiler``: profile a few training steps per epoch and log where the step time goes."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks.callback import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.profilers import PyTorchProfiler
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from fitprof import _config, _fs, metrics
from fitprof._batch import batch_size
from fitprof._coverage import FitCoverage
from fitprof._retention import DEFAULT_MAX_TRACE_MB
from fitprof._session import session_name, session_taken, trigger_suffix
from fitprof._warn import WarnOnce
from fitprof.analysis import BottleneckReport
from fitprof.metrics import SUMMARY_TAG
from fitprof.profilers.flops_torch import (
    TorchFlopCount,
    compute_dtype,
    conv_compute_dtype,
    device_name,
    lightning_dtype,
)
from fitprof.profilers.torch import TorchProfileWindow, profiler_running
from fitprof.steps import AFTER_PAUSE_STEPS, EpochSteps, SlowdownTrigger, StepRecorder, TriggerEvent
from fitprof.throughput import WorkLog
from fitprof.window import EpochLog, WindowPipeline, compare_windows, epoch_scalars, trigger_line, trigger_scalars

log = logging.getLogger(__name__)


class FitProfiler(Callback):
    r"""Profile steps ``profile_batch`` of every ``every_n_epochs``-th epoch and log the bottleneck figures.

    For each profiled epoch the callback opens a ``torch.profiler`` window around training steps
    ``first..last`` (1-based, within the epoch), writes the gzipped Kineto trace
    ``<log_dir>/<host>_rank<global rank>.<session>.pt.trace.json.gz`` and its XSpace copy
    ``<log_dir>/plugins/profile/<session>/<host>.xplane.pb`` (TensorBoard's Profile tab), analyses the trace
    with :func:`fitprof.analyze` at the end of the epoch and logs the figures through every logger.

    Step boundaries: Lightning fetches batch ``N`` (and copies it to the device) after
    ``on_train_batch_end(N-1)`` and before ``on_train_batch_start(N)``, so a step is marked from the end of
    step ``N-1`` to the end of step ``N`` (``ProfilerStep#N``): it holds its batch fetch, the host-to-device
    copy, forward, backward and optimizer step. Only training steps count (never the sanity check, never
    validation); validation run inside a window is wrapped in the ``fitprof/validation`` annotation and left
    out of the step time. An epoch with fewer than ``last`` steps flushes what it has (one warning).

    The profiler starts one step early (at the end of step ``first - 2``, or at the epoch's start): step
    ``first - 1`` is the window's warm-up step, recorded but not marked, so the profiler's start-up is never in
    an analysed step. With ``first == 1`` there is no earlier step: the profiler starts at the epoch's start and
    step 1 opens at once. Inside the window the batch hook's own work is wrapped in ``fitprof/overhead``, left
    out of step time and logged as ``fitprof/self_ms_per_step``.

    Outside the window the batch hooks do one or two integer comparisons; nothing is wrapped.

    Two torch profilers at once raise and can crash the process (segfault), so: with
    ``Trainer(profiler="pytorch")`` (Lightning's ``PyTorchProfiler``, which starts and stops torch.profiler
    on its own schedule, validation included) the callback turns itself off for the run with one warning;
    if another torch profiler (your own ``torch.profiler.profile``) is running when a window should start,
    that window is skipped with one warning. A profiler failure never stops training. Warnings are
    :class:`fitprof.FitProfilerWarning` (``"fitprof: ..."``), once per problem per ``fit``, pointing at the
    ``fit`` call, on rank 0 (other ranks log them); under ``-W error`` they go to ``logging``.

    Resuming with ``fit(ckpt_path=...)`` from a checkpoint saved mid-epoch (Lightning then calls no
    ``on_train_epoch_start``): the epoch starts at its first resumed batch, steps numbered ``batch_idx + 1`` as
    Lightning numbers them; the window is profiled when its first step lies ahead (else one warning).

    Distributed training (``torch.distributed`` initialised with more than one rank, e.g. ``strategy="ddp"``):
    every rank in ``ranks`` (default: all) profiles the same steps and writes its own trace, report file and
    ``plugins/profile/<session>/<host>_rank<global rank>.xplane.pb``; the ranks of one window share its session
    folder (rank 0 picks the name at epoch start and broadcasts it). At the end of each profiled epoch every
    rank all-gathers :func:`fitprof.cross_rank.pack` of its report (a float64 tensor; on the CPU for gloo, on the
    rank's device otherwise), also when its window was empty or its analysis failed, so the collective always
    completes. Rank 0 logs the cross-rank figures.

    Logged metrics (``pl_module.log`` in ``on_train_epoch_end`` of each profiled epoch, on every rank with the
    same gathered values, ``sync_dist=False``: ``trainer.callback_metrics``, monitors, every logger with the
    epoch; see :mod:`fitprof.metrics` for the definitions): ``fitprof/step_time_ms``, ``fitprof/input_percent``
    (both also in the progress bar), ``fitprof/htod_ms_per_step``, ``fitprof/htod_percent``,
    ``fitprof/collective_percent``, their exposed parts ``fitprof/htod_exposed_percent`` and
    ``fitprof/collective_exposed_percent`` (what the verdict rests on), ``fitprof/steps_analyzed``,
    ``fitprof/self_ms_per_step`` and
    ``fitprof/top_op_<i>_ms`` (ms per step, the
    i-th operator by self time); with a ``TensorBoardLogger`` (rank 0) also ``fitprof/top_ops/<op name>`` and
    the text ``fitprof/summary`` (verdict, advice, top-operator table). With several ranks the first five
    are means over the ranks that reported, ``steps_analyzed`` their sum, the top operators rank 0's own, and
    ``fitprof/step_time_ms_max``, ``fitprof/input_percent_max``, their ``..._max_rank`` (global rank) and
    ``fitprof/ranks_reported`` are added (:func:`fitprof.cross_rank.combine`); the summary starts with a line
    naming those ranks. Under DDP the all-reduce evens out step times, so ``input_percent_max_rank`` is the
    figure that names a rank starved of data.

    Always-on step timing (every epoch, profiled or not; :mod:`fitprof.steps`): each training step's wall time from
    one ``on_train_batch_end`` to the next (``time.perf_counter_ns``, no device synchronisation), the time inside
    Lightning's batch fetch (the ``[_TrainingEpochLoop].train_dataloader_next`` action, timed by wrapping
    ``trainer.profiler.start/stop`` on that instance) and the batch size; warm-up steps, steps holding validation or
    a checkpoint save, and the steps of a window are excluded (README, "Always-on step timing"). At each epoch end
    ``fitprof/epoch/step_time_ms_p50``, ``_p90``, ``_max``, ``fitprof/epoch/input_percent``,
    ``fitprof/epoch/samples_per_s`` and ``fitprof/epoch/steps_timed`` are logged through ``pl_module.log`` (this
    rank's own, ``sync_dist=False``), and a window's summary says when it is not representative of its epoch.
    With ``trigger="slowdown"`` a triggered window also logs ``fitprof/trigger/step``,
    ``fitprof/trigger/step_time_ms`` and ``fitprof/trigger/baseline_ms`` (the last one of its epoch) and, with a
    ``TensorBoardLogger`` on rank 0, the text ``fitprof/trigger/summary``.

    Args:
        log_dir: where traces go. Default: the first logger's ``log_dir`` (``trainer.log_dir``), or
            ``trainer.default_root_dir`` without a logger. A URL (``s3://``, ``gs://``, ``memory://``...; see
            the README, "Remote log directories") is written through fsspec: the window records into a local
            staging folder, copied to the URL at the end of each profiled epoch and deleted at ``teardown``
            (``trace_paths`` and ``xplane_paths`` then name the staging copies). A filesystem that cannot be
            opened or written gives one warning; the figures are still logged.
        profile_batch: the steps to profile in each profiled epoch, 1-based and inclusive: an int ``n``
            (step ``n`` only), a ``(first, last)`` pair or a ``"first,last"`` string. Default ``(6, 10)``
            skips five warm-up steps. ``0`` turns profiling off. A fit that profiles nothing ends with one warning
            naming why (epochs too short for the window, with their real step count and the Trainer argument that
            cut them, ``every_n_epochs`` picking none of the fit's epochs, another profiler holding the profiler).
        every_n_epochs: profile epochs 0, N, 2N, ... (0-based epoch index).
        top_k: how many operators to rank and log.
        max_trace_mb: warn (once, naming the file) when a window's trace is larger than this many MB; None
            never warns.
        keep_last_windows: keep the trace files of only the last N windows (older traces and ``.xplane.pb``
            files are deleted after their analysis); the logged scalars and report files of every window stay.
            None keeps all.
        ranks: the global ranks that profile: an int or a list, tuple, set or range of ints; None (default)
            profiles every rank (rank 0 warns when none of them exists in the run). A
            rank left out opens no window but still takes part in the epoch-end all-gather
            (``fitprof/ranks_reported`` counts the ranks that profiled).
        verbose: print one line per profiled epoch on rank 0 (step time, input and HtoD share, top operator,
            verdict; :func:`fitprof.window.summary_line`).
        record_shapes: torch only: record operator input shapes (``torch.profiler.profile(record_shapes=...)``).
        profile_memory: torch only: record allocations and frees.
        with_stack: torch only: record Python and C++ stacks (the largest traces).
        with_flops: torch only: estimate FLOPs (torch 2.13 writes none to the exported trace; shapes are
            recorded). The four are off by default; their measured cost is in the README.
        count_items: a function of one batch (as the batch hooks get it) returning its items, e.g.
            tokens, for ``fitprof/items_per_s``; None (default) logs NaN there. A call that raises gives one
            warning and NaN for that window. It runs at the end of each profiled step, inside fitprof's own
            ``fitprof/overhead`` span (``fitprof/self_ms_per_step``, left out of step time): keep it cheap (shapes,
            no ``.item()``, which waits for the device and changes the steps it measures).

    Throughput (:mod:`fitprof.throughput`): ``fitprof/samples_per_s`` counts the samples of each profiled step's
    batch (its first tensor's leading dimension, :func:`fitprof._batch.batch_size`); ``fitprof/flops_per_step``
    is counted with ``torch.utils.flop_counter.FlopCounterMode`` on the step just before the window's warm-up
    step (``first - 2``; the one just after the window, ``last + 1``, when there is no such step in the epoch:
    counting slows the step it counts, so it is never an analysed step nor the warm-up step the profiler records),
    ``fitprof/flops_per_s`` divides it by the step time, and on a GPU of
    :data:`fitprof.throughput.PEAK_FLOPS` ``fitprof/mfu`` divides that by the dense peak of the Trainer's
    precision, matrix products and convolutions each at their own (``32-true`` on compute capability 8.0 or later:
    convolutions in TF32 unless ``torch.backends.cudnn.allow_tf32`` is False, matrix products in TF32 when
    ``torch.set_float32_matmul_precision`` is not ``"highest"``; see :mod:`fitprof.profilers.flops_torch`).
        trigger: ``"slowdown"`` opens an extra profiling window when training steps stay slower than their
            recent baseline (:class:`fitprof.steps.SlowdownTrigger`: 5 clean steps in a row above the median of
            the last 64 clean steps plus the larger of 8 robust standard deviations and 25%); the window opens
            at the next step boundary through the same path as the ``profile_batch`` window (that next step is its
            warm-up step: a slowdown seen after step ``S`` is analysed from step ``S + 2``), lasts as many steps,
            gets its own session ``<time>_epoch<N>_trigger_step<S>`` and is analysed at the end of its epoch.
            None (default): no triggered windows. Step timing runs either way.
        trigger_max_windows: the most triggered windows per ``fit`` (>= 1).
        trigger_min_spacing: the fewest clean steps between two triggered windows (>= 0).

    Attributes:
        reports: the :class:`~fitprof.BottleneckReport` of each profiled epoch (0-based epoch -> report; a
            later ``fit`` with the same callback overwrites the epochs it profiles again).
        trace_paths: the Kineto trace of each profiled epoch.
        xplane_paths: the ``.xplane.pb`` of each profiled epoch.
        analysis_seconds: wall time of the end-of-epoch analysis + XSpace conversion, per epoch (s).
        steps: the always-on :class:`fitprof.steps.StepRecorder` (the current or last epoch's clean steps).
        epoch_steps: the :class:`fitprof.steps.EpochSteps` of each epoch (0-based epoch -> figures).
        triggered: one ``(epoch, TriggerEvent, report or None)`` per triggered window, in order.
        cross_rank: with several ranks, the cross-rank scalars of each profiled epoch (the same on every rank;
            empty when no rank reported).

    Raises:
        TypeError: if an argument has the wrong type (e.g. ``top_k=1.5``, ``log_dir=3``).
        ValueError: if ``profile_batch`` is malformed or out of range, ``every_n_epochs`` / ``top_k`` < 1,
            ``ranks`` is empty or holds a rank < 0, ``trigger`` is not None or ``"slowdown"``, or a trigger limit
            is out of range.

    Example::

        trainer = Trainer(callbacks=[FitProfiler(profile_batch=(6, 10))], logger=TensorBoardLogger("logs"))
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        profile_batch: int | tuple[int, int] | str = (6, 10),
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
        self.ranks = _config.check_ranks(ranks)
        self.verbose = _config.check_flag("verbose", verbose)
        self.torch_options = _config.torch_options(
            record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops
        )
        self.log_dir = None if log_dir is None else _config.normalize_log_dir(log_dir)
        self.config = _config.make_config(profile_batch, every_n_epochs, top_k)
        self.max_trace_mb = _config.check_optional_limit("max_trace_mb", max_trace_mb, integer=False)
        self.keep_last_windows = _config.check_optional_limit("keep_last_windows", keep_last_windows, integer=True)
        self._warn_rank = WarnOnce()
        self._pipeline = WindowPipeline(
            top_k=self.config.top_k,
            max_trace_mb=self.max_trace_mb,
            keep_last_windows=self.keep_last_windows,
            warn=self._warn_rank,
        )
        # The pipeline's results, under the names this callback documents.
        self.reports: dict[int, BottleneckReport] = self._pipeline.reports
        self.trace_paths: dict[int, Path] = self._pipeline.trace_paths
        self.xplane_paths: dict[int, Path] = self._pipeline.xplane_paths
        self.analysis_seconds: dict[int, float] = self._pipeline.analysis_seconds
        self.cross_rank: dict[int, dict[str, float]] = self._pipeline.cross_rank
        self._window = TorchProfileWindow(warn=self._warn_rank, **self.torch_options)
        self._dir: Path | None = None
        self._mirror: _fs.Mirror | None = None  # a URL log_dir: the local staging folder copied to it
        # hot-path state: plain ints and bools
        self._first = self.config.first_step
        self._last = self.config.last_step
        self._epoch_profiled = False  # the current epoch is one to profile (the same on every rank)
        self._epoch_on = False  # the current epoch has a window that has not finished
        self._open = False  # the window is open now
        self._val_annotated = False
        self._session: str | None = None
        self._pending: Path | None = None  # trace of this epoch's window, analysed at epoch end
        self._epoch = -1
        self._epoch_started = False  # this epoch's start was seen (on_train_epoch_start or a resumed first batch)
        self._rank = 0
        self._world_size = 1
        self._coverage = FitCoverage(self.config)
        self._steps_seen = 0  # the last training step seen in this profiled epoch, before its window
        # Throughput: the profiled steps' batches, and the FLOPs of one step outside the window (the step before
        # its warm-up step, or the one after it when the epoch has no such step): counting slows the step it
        # counts, so it is neither an analysed step nor the warm-up step the profiler records. Set per epoch.
        self._work = WorkLog(self.count_items, self._warn_count_items)
        self._flops = TorchFlopCount()
        self._count_step = self._last + 1
        self._count_pending = False  # this epoch's FLOPs are still to be counted
        self._flops_batch: Any = None
        # always-on step timing (issue 15): perf_counter_ns stamps, ints only on the hot path
        self.steps = StepRecorder()
        self.epoch_steps: dict[int, EpochSteps] = {}
        self._prev_end_ns: int | None = None  # the last step boundary (on_train_batch_end, or the epoch start)
        self._fetched_ns: int | None = None  # on_train_batch_start of the step in progress
        self._fetch_ns = 0  # time inside Lightning's batch fetch since the last step boundary
        self._fetch_t0 = 0
        self._hooked: Any = None  # the trainer profiler whose start/stop we wrap (see _hook_fetch)
        self._hooked_fns: tuple[Any, Any] = (None, None)  # our wrappers, removed only while still in place
        self._samples: int | None = None
        self._cuda_events: list[Any] | None = None  # on a CUDA device: one timing event per step boundary
        self._cuda_capped = False  # this epoch passed _MAX_CUDA_EVENTS: no more events until the next one
        self._epoch_first_step = 1
        self._trigger: SlowdownTrigger | None = None
        if self.trigger is not None:
            self._trigger = SlowdownTrigger(max_windows=trigger_max_windows, min_spacing=trigger_min_spacing)
        self._trigger_pipeline = WindowPipeline(
            top_k=self.config.top_k,
            max_trace_mb=self.max_trace_mb,
            keep_last_windows=self.keep_last_windows,
            warn=self._warn_rank,
        )
        self.triggered: list[tuple[int, TriggerEvent, BottleneckReport | None]] = []
        self._trig_event: TriggerEvent | None = None  # the triggered window open now
        self._trig_session: str | None = None
        self._trig_last = 0  # its last step
        self._trig_pending: list[tuple[Path, str, TriggerEvent]] = []  # closed, analysed at epoch end
        self._trig_steps_total = 0  # clean steps seen by the trigger over the run (its step numbering)

    @property
    def profile_batch(self) -> tuple[int, int]:
        """The checked ``(first, last)`` steps (1-based, inclusive)."""
        return self._first, self._last

    # ------------------------------------------------------------------------------------------- lifecycle
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._warn_rank.reset()  # a new fit warns again when a cause repeats
        self._warn_rank.rank = self._rank = int(trainer.global_rank)  # only rank 0 issues Python warnings
        self._coverage.begin_fit()
        self.triggered.clear()
        self._trig_pending = []  # a window stopped by an exception in an earlier fit is not this fit's
        self.epoch_steps = {}
        self._trig_steps_total = 0
        if self._trigger is not None:
            self._trigger.reset()
        self._coverage.limit = _epoch_limit(trainer, self._first)
        if isinstance(getattr(trainer, "profiler", None), PyTorchProfiler):
            self._dir = None
            self._coverage.said = True  # the warning below says nothing is profiled, and why
            self._warn_rank(
                "lightning-profiler",
                "fitprof: FitProfiler is off for this run because Trainer(profiler='pytorch') (Lightning's "
                "PyTorchProfiler) drives torch.profiler too; its validation profiling interleaved with a "
                "FitProfiler window crashes the process (segfault). Use one or the other.",
            )
            return
        log_dir = self.log_dir
        if log_dir is None:
            log_dir = trainer.log_dir or trainer.default_root_dir  # trainer.log_dir: call on every rank
        log_dir = os.fspath(log_dir)
        self._close_mirror()
        if _fs.is_remote(log_dir):  # record locally, copy to the URL at each profiled epoch's end
            self._mirror = _fs.Mirror(log_dir, self._warn_rank)
            self._dir = self._mirror.local
        else:
            self._dir = Path(_fs.local_path(log_dir))
        self._world_size = int(trainer.world_size)
        self._hook_fetch(trainer)
        self._cuda_events = [] if _on_cuda(trainer) else None
        unknown = _config.unknown_ranks_message(self.ranks, self._world_size)
        if unknown and self._rank == 0:
            self._warn_rank("ranks", f"fitprof: {unknown}")
        self._coverage.left_out = not _config.profiles_rank(self.ranks, self._rank)
        try:
            device = trainer.strategy.root_device
            self._work.device_name = device_name(device)
            self._work.dtype = compute_dtype(lightning_dtype(trainer.precision), device)
            self._work.conv_dtype = conv_compute_dtype(lightning_dtype(trainer.precision), device)
        except Exception:  # no device known: FLOP/s only
            self._work.device_name = self._work.dtype = self._work.conv_dtype = ""

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_started = False

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._begin_epoch(trainer, next_step=1)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._fetched_ns = time.perf_counter_ns()  # the batch is here: the time since the last step end was input
        if not self._epoch_started:
            # ``fit(ckpt_path=...)`` from a checkpoint saved mid-epoch resumes that epoch at ``batch_idx`` without
            # calling ``on_train_epoch_start``: the epoch starts here, its steps numbered as Lightning numbers them.
            self._begin_epoch(trainer, next_step=batch_idx + 1)
        if self._open:  # the step's batch work runs at its end, inside fitprof/overhead (on_train_batch_end)
            return
        self._samples = batch_size(batch)
        if self._count_pending and batch_idx + 1 == self._count_step:
            self._count_pending = False
            self._flops_batch = batch
            self.steps.exclude_next(1)  # counting slows this step: out of the always-on figures and the baseline
            self._flops.start()

    def _begin_epoch(self, trainer: pl.Trainer, *, next_step: int) -> None:
        """Mark the start of an epoch whose next step is ``next_step`` (1 unless resumed mid-epoch); open the window
        now when it starts at that step."""
        self._epoch_started = True
        self._epoch = int(trainer.current_epoch)
        self._fetch_ns = 0
        self._epoch_first_step = next_step
        self._cuda_capped = False
        if self._cuda_events is not None:
            self._cuda_events = [_cuda_event()] if next_step == 1 else [None]
        if next_step == 1:
            self._prev_end_ns = time.perf_counter_ns()
            self.steps.begin_epoch(self._prev_end_ns)
        else:  # resumed mid-epoch: this step's start is unknown, the first boundary only sets the origin
            self._prev_end_ns = None
            self.steps.begin_epoch(None)
        if self._trigger is not None:
            self._trigger.reset_run()  # a new epoch (new iterator, maybe a new learning rate): a fresh baseline
        self._epoch_profiled = self._dir is not None and self.config.enabled and self.config.profiles_epoch(self._epoch)
        if self._dir is not None:
            self._coverage.epoch(self._epoch)
        self._steps_seen = 0
        # Every rank marks the epoch (all take part in the all-gather); only the chosen ranks open a window.
        self._epoch_on = self._epoch_profiled and _config.profiles_rank(self.ranks, self._rank)
        self._session = self._shared_session(trainer) if self._epoch_profiled else None
        self._work.reset()
        if self._epoch_on and next_step > self._first:
            self._epoch_on = False  # the window's first step ran before the resume
            self._warn_rank(
                "resumed-past",
                f"fitprof: epoch {self._epoch} was resumed at step {next_step}, after the window's first step "
                f"(profile_batch={self._first},{self._last}); that epoch is not profiled.",
            )
        elif self._epoch_on and next_step >= self._first - 1:
            # The next step is the window's warm-up step (first - 1) or, with no step before it, its first step.
            self._start(next_step)
        # The FLOPs: on the step before the warm-up step when this epoch runs it, else on the step after the window.
        self._count_step = self._first - 2 if self._first - 2 >= next_step else self._last + 1
        self._count_pending = self._epoch_on

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        if self._open:
            # This hook's own time is fitprof's, never the step's: one span holds all of it, the step's batch work
            # included (its size and count_items, moved here from on_train_batch_start, which gets the same batch:
            # a second span there would cost more than the work it holds).
            window = self._window
            window.begin_overhead()
            try:
                self._samples = batch_size(batch)
                # the scheduled window's analysed steps (not its warm-up step; a triggered window has no FLOPs)
                if self._trig_event is None and window.step_num is not None:
                    self._work.add_step(batch)
                self._batch_end(trainer, batch_idx)
            finally:
                window.end_overhead()  # a no-op once the window stopped (stopping closes the span first)
        else:
            self._batch_end(trainer, batch_idx)

    def _batch_end(self, trainer: pl.Trainer, batch_idx: int) -> None:
        """Step ``batch_idx + 1`` ended: time it, feed the trigger, mark or close the window, or start it."""
        if self._flops.running:
            self._stop_flops()
        now = time.perf_counter_ns()
        n = batch_idx + 1
        fetched, self._fetched_ns = self._fetched_ns, None
        prev, self._prev_end_ns = self._prev_end_ns, now
        if self._hooked is not None:  # the exact time inside the fetch
            wait: int | None = self._fetch_ns
        else:  # the gap from the last step's end to this one's start (fetch, transfer, hooks)
            wait = None if fetched is None or prev is None else fetched - prev
        self._fetch_ns = 0
        if self._cuda_events is not None and not self._cuda_capped:
            if len(self._cuda_events) <= _MAX_CUDA_EVENTS:
                self._cuda_events.append(_cuda_event())
            else:  # bounded: no more events this epoch, which keeps the host clock's figures
                self._cuda_capped = True
                self._cuda_events = [None]
        dt = self.steps.step(now, n, input_ns=wait, samples=self._samples)
        if self._trig_event is not None:
            if self._epoch_on:
                self._steps_seen = n
            self._advance_triggered(trainer, n)
            return
        if dt is not None and self._trigger is not None:
            self._trig_steps_total += 1
            slow = dt > self._trigger.threshold_ms * 1e6  # the checks below only for a step that may fire
            event = self._trigger.observe(dt, self._trig_steps_total, allowed=slow and self._may_trigger(trainer, n))
            if event is not None:
                self._open_triggered(n, event)
                return
        if not self._epoch_on:
            return
        self._steps_seen = n
        if self._open:
            window = self._window
            if window.step_num is None:  # the warm-up step (first - 1) ended: the analysed steps begin
                if self._epoch_ends_after_this(trainer, n):
                    self._open = self._epoch_on = False
                    window.stop(export=False)
                else:
                    self._begin_first_step(self._first)
            elif n >= self._last:
                self._stop()
            elif self._epoch_ends_after_this(trainer, n):
                self._warn_short(n)
                self._stop()
            else:
                window.begin_step(n + 1)  # closes ProfilerStep#n
        elif n == self._first - 2:
            if self._epoch_ends_after_this(trainer, n + 1):
                self._epoch_on = False
            else:
                self._start(n + 1)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.steps.exclude_next(1 + AFTER_PAUSE_STEPS)  # validation runs inside the next step's interval
        if self._open and not trainer.sanity_checking:
            self._window.begin_annotation()
            self._val_annotated = True

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._val_annotated:
            self._val_annotated = False
            self._window.end_annotation()

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self.steps.exclude_next(1 + AFTER_PAUSE_STEPS)  # the save lands in this step or the next

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_started = False
        epoch_steps = self.epoch_steps[self._epoch] = self.steps.summary(self._device_step_ms())
        self._log_epoch_steps(pl_module, epoch_steps)
        if self._open and self._trig_event is not None:
            self._stop_triggered(drop_open_step=True)
        if self._open:  # the epoch ended inside the window without our noticing: flush what there is
            self._stop(drop_open_step=True)
        if self._epoch_profiled:
            self._coverage.steps(self._steps_seen)  # counted here: iterable datasets report no length
        self._epoch_on = False
        path, self._pending = self._pending, None
        report = None if path is None else self._analyze(self._epoch, path)
        if self._epoch_profiled:  # every rank, whatever its window gave: the all-gather must complete
            self._epoch_profiled = False
            self._publish(trainer, report, gather=_distributed(), pl_module=pl_module, epoch_steps=epoch_steps)
        # Triggered windows after the gather, with no collective of their own: each rank triggers on its own signal.
        triggered = self._publish_triggered(trainer, pl_module)
        if (path is not None or triggered) and self._mirror is not None:
            self._mirror.sync()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._abort()
        never = self._coverage.message("fitprof: ")
        if never:
            self._warn_rank("never", never)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Flush and analyse the partial window (the failing step left out); Lightning re-raises the exception.
        try:
            if self._trig_event is not None:
                self._stop_triggered(drop_open_step=True)
            if self._open or self._window.started_here:
                self._stop(drop_open_step=True)
            self._epoch_profiled = False
            path, self._pending = self._pending, None
            if path is not None and self._epoch not in self.reports:
                report = self._analyze(self._epoch, path)
                # No all-gather here: the other ranks may be anywhere (or gone); rank 0 logs its own figures.
                self._publish(trainer, report, gather=False, pl_module=None)
        except Exception as err:  # the user's exception matters more
            log.warning("fitprof: could not flush the window after an exception: %s", err)
        finally:
            self._abort(export=False)
            self._close_mirror()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._unhook_fetch()
        self._abort()
        self._close_mirror()

    # -------------------------------------------------------------------------------------------- internal
    def _epoch_ends_after_this(self, trainer: pl.Trainer, n: int) -> bool:
        """Whether step ``n`` is the epoch's last (so no ``ProfilerStep#n+1`` may be opened)."""
        try:
            if n >= trainer.num_training_batches:
                return True
            if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
                return True
            max_steps = trainer.max_steps
            return bool(max_steps is not None and max_steps >= 0 and trainer.global_step >= max_steps)
        except Exception:  # private loop state moved: the epoch-end flush handles it
            return False

    def _new_session(self) -> str:
        assert self._dir is not None
        return session_name(self._dir, self._epoch)

    def _shared_session(self, trainer: pl.Trainer) -> str:
        """This epoch's session name, rank 0's on every rank, so that all ranks write into one session folder.

        Called in ``on_train_epoch_start`` of every profiled epoch, on every rank (a broadcast: each rank
        choosing its own timestamp would split the ranks over two folders whenever they straddle a second).
        """
        name = self._new_session()
        if _distributed():
            try:
                name = str(trainer.strategy.broadcast(name, src=0))
            except Exception as err:
                self._warn_rank("broadcast", f"fitprof: could not share the session name across ranks ({err!r}).")
        return name

    def _warn_count_items(self, message: str) -> None:
        self._warn_rank("count-items", message)

    def _stop_flops(self) -> None:
        flops = self._flops.stop()
        n = batch_size(self._flops_batch)
        self._flops_batch = None
        self._work.set_flops(
            flops, math.nan if n is None else float(n), self._flops.note, conv_flops=self._flops.conv_flops
        )

    def _start(self, step: int, session: str | None = None) -> bool:
        """Start the profiler before step ``step``: this epoch's scheduled window, or (``session`` given) a
        triggered one. Returns whether it started.

        ``step`` is the window's warm-up step, recorded but not marked, which takes the profiler's start-up: for
        the scheduled window ``first - 1``, for a triggered one the step after the slowdown was seen (its analysed
        steps are the next ``_trigger_length()``). A scheduled window with no step before its first (``first ==
        1``, or an epoch resumed at ``first``) has no warm-up step: ``step == first`` opens at once, after one span
        of fitprof's own that makes the first recorded event fall before it. The exclusion from the always-on
        step timing starts at ``step``: the warm-up step carries the profiler's start-up too."""
        assert self._dir is not None
        if session is None and self._session is None:
            self._session = self._new_session()
        name = session or self._session
        assert name is not None
        if self._window.start(self._dir, name, rank=self._rank):
            self._open = True
            # the window's steps carry the profiler's cost: out of the always-on figures and the trigger's baseline
            self.steps.exclude_next(self._last - step + 1 if session is None else self._trigger_length() + 1)
            if session is None and step >= self._first:  # no warm-up step
                self._window.begin_overhead()
                self._begin_first_step(step)
                self._window.end_overhead()
            return True
        if session is None:
            self._epoch_on = False
            if self._coverage.blocked is None:
                self._coverage.blocked = (
                    "another torch profiler was running" if profiler_running() else "the torch profiler did not start"
                )
        return False

    def _begin_first_step(self, step: int) -> None:
        """Open ``ProfilerStep#step``, the window's first analysed step: from here on it counts as profiled."""
        self._window.begin_step(step)
        self._coverage.windows += 1

    def _stop(self, *, drop_open_step: bool = False) -> None:
        self.steps.exclude_next(1 + AFTER_PAUSE_STEPS)  # the stop and export land in the next step
        self._open = False
        self._epoch_on = False
        self._val_annotated = False
        if self._window.step_num is None:  # only the warm-up step ran: nothing to analyse
            self._window.stop(export=False)
            return
        if drop_open_step:
            self._warn_short(self._window.step_num - 1)
        self._pending = self._window.stop(drop_open_step=drop_open_step)

    def _warn_short(self, steps_done: int) -> None:
        self._warn_rank(
            "short",
            f"fitprof: epoch {self._epoch} ended after step {steps_done}, before the last profiled step "
            f"{self._last} (profile_batch={self._first},{self._last}); that window holds fewer steps.",
        )

    def _abort(self, *, export: bool = True) -> None:
        if self._flops.running:
            self._flops.stop()
        self._trig_event = None
        if self._open or self._window.started_here:
            self._open = False
            self._epoch_on = False
            self._val_annotated = False
            path = self._window.stop(export=export, drop_open_step=True)
            if path is not None:
                self.trace_paths[self._epoch] = path

    def _close_mirror(self) -> None:
        """Copy what is left to a URL log dir and delete the local staging folder."""
        mirror, self._mirror = self._mirror, None
        if mirror is not None:
            mirror.close()

    def _analyze(self, epoch: int, path: Path) -> BottleneckReport | None:
        """Analyse this rank's trace and write its report file and ``.xplane.pb`` (the shared pipeline)."""
        assert self._dir is not None and self._session is not None
        temporary = self._window.temporary  # log_dir cannot be written: the figures are logged, nothing is kept
        return self._pipeline.analyze(
            epoch,
            path,
            log_dir=self._dir,
            session=None if temporary else self._session,
            rank=self._rank,
            world_size=self._world_size,
            discard=lambda: shutil.rmtree(path.parent, ignore_errors=True),
            work=self._work.work(),
        )

    def _publish(
        self,
        trainer: pl.Trainer,
        report: BottleneckReport | None,
        *,
        gather: bool,
        pl_module: pl.LightningModule | None,
        epoch_steps: EpochSteps | None = None,
    ) -> None:
        """Hand this epoch's report to the shared pipeline (cross-rank gather when ``gather``), then log.

        From ``on_train_epoch_end`` (``pl_module`` given) every rank logs the scalars through
        ``pl_module.log`` with the same, already gathered values (``sync_dist=False``): they reach
        ``trainer.callback_metrics`` / ``logged_metrics`` on every rank (so ``EarlyStopping`` and
        ``ModelCheckpoint(monitor=...)`` work under DDP) and every logger on rank 0, each row with its epoch. After
        an exception (``pl_module`` None, where ``log`` is not allowed) rank 0 writes them to the loggers directly.
        """
        scalars = self._pipeline.publish(
            self._epoch,
            report,
            rank=self._rank,
            world_size=self._world_size,
            gather=(lambda vector: _all_gather(trainer, vector)) if gather else None,
            log=lambda entry: self._log(trainer, pl_module, entry),
            epoch_steps=epoch_steps,
        )
        if pl_module is None or not scalars:
            return
        try:
            for key, value in scalars.items():
                pl_module.log(
                    key,
                    value,
                    prog_bar=key in _PROGRESS_BAR_KEYS,
                    on_step=False,
                    on_epoch=True,
                    sync_dist=False,  # gathered already: the same value on every rank
                    batch_size=1,
                )
        except Exception as err:
            self._warn_rank("log", f"fitprof: could not log the figures through pl_module.log ({err!r}).")

    # ------------------------------------------------------------------------ step timing and triggered windows
    def _log_epoch_steps(self, pl_module: pl.LightningModule, figures: EpochSteps) -> None:
        """Log the epoch's always-on figures (``fitprof/epoch/*``, finite ones) through ``pl_module.log``, this
        rank's own (``sync_dist=False``: no collective), so they reach ``callback_metrics`` and every logger."""
        values = epoch_scalars(figures)
        self._log_scalars(pl_module, {k: v for k, v in values.items() if v == v})  # NaN != NaN

    def _log_scalars(self, pl_module: pl.LightningModule | None, scalars: dict[str, float]) -> None:
        if pl_module is None:
            return
        try:
            for key, value in scalars.items():
                pl_module.log(key, float(value), on_step=False, on_epoch=True, sync_dist=False, batch_size=1)
        except Exception as err:
            self._warn_rank("log", f"fitprof: could not log the figures through pl_module.log ({err!r}).")

    def _device_step_ms(self) -> list[float] | None:
        """On a CUDA device: each clean step's device time (ms) between the CUDA events recorded at its two
        boundaries (non-blocking ``record()`` at every ``on_train_batch_end``), read now, at the epoch's end, after
        waiting for the last event only. None elsewhere, or when any event is missing (one debug log)."""
        events = self._cuda_events
        if not events or events[-1] is None:
            return None
        self._cuda_events = []
        try:
            events[-1].synchronize()
            # events[0]: the start of the epoch's first step (None when resumed mid-epoch); events[k]: the end of
            # step first + k - 1
            first = self._epoch_first_step
            return [float(events[n - first].elapsed_time(events[n - first + 1])) for n in self.steps.step_index]
        except Exception as err:  # an event missing or not recorded: the host clock's figures stand
            log.debug("fitprof: CUDA step timing unavailable this epoch (%r)", err)
            return None

    def _hook_fetch(self, trainer: pl.Trainer) -> None:
        """Time Lightning's batch fetch exactly: the training loop brackets ``next(data_fetcher)`` with
        ``trainer.profiler.start/stop("[_TrainingEpochLoop].train_dataloader_next")`` (whatever the profiler, the
        default one doing nothing); wrap the two methods on this trainer's profiler instance, delegate every call,
        and add up the time between the two for that action. Undone at ``teardown``. Where this fails, the input
        wait is the gap from the previous step's end to this step's start (fetch, copy and other hooks)."""
        self._unhook_fetch()
        profiler = getattr(trainer, "profiler", None)
        if profiler is None or isinstance(profiler, PyTorchProfiler):
            return
        try:
            start, stop = profiler.start, profiler.stop

            def timed_start(action_name: str) -> None:
                if action_name == _FETCH_ACTION:
                    self._fetch_t0 = time.perf_counter_ns()
                start(action_name)

            def timed_stop(action_name: str) -> None:
                stop(action_name)
                if action_name == _FETCH_ACTION and self._fetch_t0:
                    self._fetch_ns += time.perf_counter_ns() - self._fetch_t0
                    self._fetch_t0 = 0

            profiler.start, profiler.stop = timed_start, timed_stop
            self._hooked = profiler
            self._hooked_fns = (timed_start, timed_stop)
        except Exception as err:  # a profiler that refuses attributes: fall back to the gap
            log.debug("fitprof: cannot time the batch fetch through the trainer's profiler (%r)", err)

    def _unhook_fetch(self) -> None:
        profiler, self._hooked = self._hooked, None
        if profiler is not None:
            for name, ours in zip(("start", "stop"), self._hooked_fns, strict=True):
                if vars(profiler).get(name) is ours:  # not one wrapped again since by someone else
                    with contextlib.suppress(Exception):
                        delattr(profiler, name)  # the class's own methods again
        self._hooked_fns = (None, None)

    def _may_trigger(self, trainer: pl.Trainer, n: int) -> bool:
        """Whether a triggered window may open after step ``n``: no window open, a writable log dir, this rank
        profiles, the epoch goes on past the window's warm-up step, and the window (warm-up ``n+1``, analysed
        ``n+2`` .. ``n+1+L``) ends before the scheduled one starts (its profiler starts at the end of step
        ``first - 2``)."""
        if (
            self._open
            or self._window.started_here
            or self._dir is None
            or not _config.profiles_rank(self.ranks, self._rank)
        ):
            return False
        if self._epoch_on and n + 1 + self._trigger_length() >= self._first - 2:
            return False
        if self._epoch_ends_after_this(trainer, n):
            return False
        try:  # nor may its warm-up step (n + 1) be the epoch's last: the window would analyse nothing
            if n + 1 >= trainer.num_training_batches:
                return False
            max_steps = trainer.max_steps
            return not (max_steps is not None and max_steps >= 0 and trainer.global_step + 1 >= max_steps)
        except Exception:  # private loop state moved: an epoch ending on the warm-up step drops the window
            return True

    def _trigger_length(self) -> int:
        """Steps in a triggered window: as many as the ``profile_batch`` window (5 when that is off)."""
        return self.config.num_steps if self.config.enabled else 5

    def _open_triggered(self, n: int, event: TriggerEvent) -> None:
        """Start the triggered window at the next step boundary through :meth:`_start`: step ``n + 1`` is its
        warm-up step, ``n + 2`` .. ``n + 1 + L`` its analysed steps."""
        assert self._dir is not None
        suffix = trigger_suffix(n)
        session = session_name(self._dir, self._epoch, suffix)
        if session_taken(self._dir, session):  # pragma: no cover - session_name already avoids it
            return
        event = TriggerEvent(n, event.step_time_ms, event.baseline_ms, event.threshold_ms)  # numbered in the epoch
        if self._start(n + 1, session=session):
            self._trig_event, self._trig_session = event, session
            self._trig_last = n + 1 + self._trigger_length()

    def _advance_triggered(self, trainer: pl.Trainer, n: int) -> None:
        """Step ``n`` of an open triggered window ended: mark the next step, or close the window."""
        if self._window.step_num is None:  # its warm-up step ended: the analysed steps begin
            if self._epoch_ends_after_this(trainer, n):
                self._stop_triggered()  # nothing analysed: dropped
            else:
                self._begin_first_step(n + 1)
        elif n >= self._trig_last:
            self._stop_triggered()
        elif self._epoch_ends_after_this(trainer, n):
            self._stop_triggered(drop_open_step=True)
        else:
            self._window.begin_step(n + 1)

    def _stop_triggered(self, *, drop_open_step: bool = False) -> None:
        event, session = self._trig_event, self._trig_session
        self._trig_event = self._trig_session = None
        self.steps.exclude_next(1 + AFTER_PAUSE_STEPS)
        self._open = False
        self._val_annotated = False
        if self._window.step_num is None:  # only the warm-up step ran: nothing to analyse
            self._window.stop(export=False)
            return
        path = self._window.stop(drop_open_step=drop_open_step)
        if path is not None and event is not None and session is not None:
            self._trig_pending.append((path, session, event))

    def _publish_triggered(self, trainer: pl.Trainer, pl_module: pl.LightningModule | None) -> bool:
        """Analyse this epoch's triggered windows (this rank's own, no collective), log ``fitprof/trigger/*``
        (the last one of the epoch) and, on rank 0, the summary comparing each with the last normal window."""
        pending, self._trig_pending = self._trig_pending, []
        if not pending or self._dir is None:
            return False
        normal_epoch = max(self.reports) if self.reports else None
        normal = None if normal_epoch is None else self.reports[normal_epoch]
        for path, session, event in pending:
            temporary = self._window.temporary
            report = self._trigger_pipeline.analyze(
                self._epoch,
                path,
                log_dir=self._dir,
                session=None if temporary else session,
                rank=self._rank,
                world_size=self._world_size,
                discard=functools.partial(shutil.rmtree, path.parent, ignore_errors=True),
            )
            self.triggered.append((self._epoch, event, report))
            line = trigger_line(
                self._epoch, event, report, compare_windows(report, normal, normal_epoch) if report else ""
            )
            if self._rank == 0:
                if self.verbose:
                    if pl_module is not None:
                        pl_module.print(line)
                    else:
                        print(line, flush=True)
                text = line if report is None else f"{line}\n\n{report.summary_markdown()}"
                for logger in trainer.loggers:
                    if isinstance(logger, TensorBoardLogger):
                        try:
                            logger.experiment.add_text(
                                metrics.TRIGGER_SUMMARY_TAG, text, global_step=_epoch_end_step(trainer)
                            )
                        except Exception as err:
                            self._warn_rank("log-trigger", f"fitprof: logging the triggered window failed ({err!r}).")
        _, last, _ = self.triggered[-1]
        self._log_scalars(pl_module, trigger_scalars(last))
        return True

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule | None, entry: EpochLog) -> None:
        """Rank 0: the one-line summary (``verbose``), and for TensorBoard loggers the operators by name and the
        Markdown summary (Text tab). Without ``pl_module`` (after an exception) also the scalars, to every
        logger."""
        if self.verbose:
            if pl_module is not None:
                pl_module.print(entry.line)
            else:
                print(entry.line, flush=True)
        for logger in trainer.loggers:
            try:
                if pl_module is None:
                    logger.log_metrics({**entry.scalars, "epoch": float(entry.epoch)}, step=_epoch_end_step(trainer))
                if isinstance(logger, TensorBoardLogger):
                    step = _epoch_end_step(trainer)
                    for key, value in entry.op_scalars.items():
                        logger.experiment.add_scalar(key, value, global_step=step)
                    logger.experiment.add_text(SUMMARY_TAG, entry.text, global_step=step)
            except Exception as err:
                self._warn_rank(
                    f"log-{type(logger).__name__}",
                    f"fitprof: logging to {type(logger).__name__} failed ({err!r}).",
                )


_FETCH_ACTION = "[_TrainingEpochLoop].train_dataloader_next"
"""The profiler action Lightning's training loop wraps around each batch fetch (``training_epoch_loop.py``)."""


_PROGRESS_BAR_KEYS = frozenset({metrics.STEP_TIME_MS.key, metrics.INPUT_PERCENT.key})
"""The figures also shown in Lightning's progress bar (``trainer.progress_bar_metrics``)."""


def _epoch_limit(trainer: pl.Trainer, first_step: int) -> str | None:
    """The Trainer argument that cuts the training epochs short, as the user wrote it (None: none does)."""
    fast_dev_run = getattr(trainer, "fast_dev_run", False)
    if fast_dev_run:
        return f"Trainer(fast_dev_run={fast_dev_run!r}) runs {int(fast_dev_run)} training step(s)"
    limit = getattr(trainer, "limit_train_batches", None)
    if limit is not None and limit != 1.0:
        return f"Trainer(limit_train_batches={limit!r})"
    max_steps = getattr(trainer, "max_steps", -1)
    if max_steps is not None and 0 <= max_steps < first_step:
        return f"Trainer(max_steps={max_steps})"
    return None


def _on_cuda(trainer: pl.Trainer) -> bool:
    """Whether this rank trains on a CUDA device (step times then also come from CUDA events)."""
    try:
        import torch

        return bool(torch.cuda.is_available() and trainer.strategy.root_device.type == "cuda")
    except Exception:
        return False


_MAX_CUDA_EVENTS = 10_000
"""The most CUDA timing events one epoch records (one per step boundary, read at the epoch's end): past it the
events are released and none is created until the next epoch, whose steps the host clock times alone."""


def _cuda_event() -> Any:
    """A CUDA timing event recorded on the current stream, without waiting (None when that fails)."""
    try:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    except Exception:
        return None


def _epoch_end_step(trainer: pl.Trainer) -> int:
    """The logger step of the epoch's last batch, for what fitprof writes to a logger itself: the operators by name
    and the Markdown summaries (at the step ``pl_module.log`` gives the epoch-end scalars in ``on_train_epoch_end``),
    and after an exception the scalars too (at the step of the last batch's ``on_step`` values).

    Lightning counts the batches that stepped (``fit_loop.epoch_loop._batches_that_stepped``, per batch whatever
    the optimizers did, so not ``global_step`` under manual optimization) and logs a batch's values at the count
    before it: ``FitLoop`` logs epoch-end metrics with the count one back, so that they sit at the last batch's
    step. During a validation run inside fit the last batch's count is not advanced yet, so it is the count itself.
    Where a Lightning version lacks the count, ``trainer.global_step`` stands for it. Never below 0.
    """
    stepped = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "_batches_that_stepped", None)
    count = stepped if isinstance(stepped, int) else trainer.global_step
    return max(int(count) - (0 if trainer.validating else 1), 0)


def _all_gather(trainer: pl.Trainer, vector: list[float]) -> list[list[float]]:
    """All-gather one vector per rank (index = global rank): a float64 tensor, on the CPU for gloo / MPI, on the
    rank's device otherwise. Raises on failure."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend())
    device = torch.device("cpu") if ("gloo" in backend or "mpi" in backend) else trainer.strategy.root_device
    local = torch.tensor(vector, dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return [[float(x) for x in t.cpu().tolist()] for t in gathered]


def _distributed() -> bool:
    """Whether ``torch.distributed`` is initialised with more than one rank."""
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
    except Exception:  # a broken process group: behave as a single process
        return False

"""``FitProfiler``: profile a few training steps per epoch and log where the step time goes."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks.callback import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.profilers import PyTorchProfiler
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from fitprof import _fs, metrics
from fitprof._retention import DEFAULT_MAX_TRACE_MB
from fitprof._session import session_name
from fitprof._warn import WarnOnce
from fitprof.analysis import BottleneckReport
from fitprof.fit import FitEngine, Probe
from fitprof.fit.boundary import LIGHTNING
from fitprof.fit.config import (
    DEFAULT_PROFILE_BATCH,
    SharedAttributes,
    check_arguments,
    normalize_log_dir,
    shared,
    unknown_ranks_message,
)
from fitprof.fit.epoch_close import PART_KEYS, part_figures
from fitprof.fit.hooks import Saves
from fitprof.fit.loader import LoaderProbe, process_cpu_ns
from fitprof.fit.probes import finite
from fitprof.fit.result import EpochLog
from fitprof.fit.setup import torch_module_setup
from fitprof.fit.steps import EpochSteps, StepRecorder, TriggerEvent
from fitprof.fit.voice import Voice, profile_place
from fitprof.lightning import _trainer
from fitprof.lightning._timing import StepTiming
from fitprof.metrics import ADVICE_TAG, SUMMARY_TAG, TRIGGER_SUMMARY_TAG
from fitprof.profilers.flops_torch import (
    TorchFlopCount,
    compute_dtype,
    conv_compute_dtype,
    device_name,
    lightning_dtype,
)
from fitprof.profilers.loader import AttachOnIter, DataLoaderTiming, LoaderSet, loaders_in
from fitprof.profilers.memory import torch_device
from fitprof.profilers.torch import TorchProfileWindow
from fitprof.throughput import WorkLog

log = logging.getLogger(__name__)


class FitProfiler(Callback, SharedAttributes):
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

    Logged metrics (in ``on_train_epoch_end`` of each profiled epoch, on every rank with the same gathered values,
    no collective: ``trainer.callback_metrics`` and ``logged_metrics`` as 0-d float64 CPU tensors, so monitors
    see them; every logger as one row with the epoch at the step of Lightning's epoch-end values; written
    directly, not through ``pl_module.log``: docs/lightning.md, "How the figures reach Lightning"; see
    :mod:`fitprof.metrics` for the definitions): ``fitprof/step_time_ms``, ``fitprof/input_percent``
    (both also in the progress bar), ``fitprof/htod_ms_per_step``, ``fitprof/htod_percent``,
    ``fitprof/collective_percent``, their exposed parts ``fitprof/htod_exposed_percent`` and
    ``fitprof/collective_exposed_percent`` (what the verdict rests on), ``fitprof/steps_analyzed``,
    ``fitprof/self_ms_per_step`` and
    ``fitprof/top_op_<i>_ms`` (ms per step, the
    i-th operator by self time); with a ``TensorBoardLogger`` (rank 0) also ``fitprof/top_ops/<op name>`` and
    the text ``fitprof/summary/text_summary`` in TensorBoard (verdict, advice, top-operator table). With several
    ranks the first five are means over the ranks that reported, ``steps_analyzed`` their sum, the top operators rank 0's own, and
    ``fitprof/step_time_ms_max``, ``fitprof/input_percent_max``, their ``..._max_rank`` (global rank) and
    ``fitprof/ranks_reported`` are added (:func:`fitprof.cross_rank.combine`); the summary starts with a line
    naming those ranks. Under DDP the all-reduce evens out step times, so ``input_percent_max_rank`` is the
    figure that names a rank starved of data.

    Always-on step timing (every epoch, profiled or not; :mod:`fitprof.fit.steps`): each training step's wall time from
    one ``on_train_batch_end`` to the next (``time.perf_counter_ns``, no device synchronisation), the time inside
    Lightning's batch fetch (the ``[_TrainingEpochLoop].train_dataloader_next`` action, timed by wrapping
    ``trainer.profiler.start/stop`` on that instance) and the batch size; warm-up steps, steps holding validation
    and the steps of a window are excluded, and a checkpoint save's time is taken out of its step
    (docs/lightning.md, "Always-on step timing"). At each epoch end
    ``fitprof/epoch/step_time_ms_p50``, ``_p90``, ``_max``, ``fitprof/epoch/input_percent``,
    ``fitprof/epoch/samples_per_s`` and ``fitprof/epoch/steps_timed`` are logged the same way (this rank's own,
    no collective), in the window's row, and a window's summary says when it is not representative of its epoch.
    With ``trigger="slowdown"`` a triggered window also logs ``fitprof/trigger/step``,
    ``fitprof/trigger/step_time_ms`` and ``fitprof/trigger/baseline_ms`` (the last one of its epoch) and, with a
    ``TensorBoardLogger`` on rank 0, the text ``fitprof/trigger/summary/text_summary``.

    Where each epoch's time went (``fitprof/epoch/wall_s`` and its parts, :mod:`fitprof.fit.epoch_parts`): an epoch
    closes after every callback's ``on_train_epoch_end``, at the next epoch's ``on_train_epoch_start`` or at
    ``on_train_end``, so that ``ModelCheckpoint``'s save at its end (Lightning runs it after every other callback)
    is its own (:mod:`fitprof.fit.epoch_close`). In ``on_train_epoch_end`` the parts so far reach
    ``trainer.callback_metrics`` only (monitors); at the close the final parts reach ``callback_metrics`` and every
    logger (one more row at the epoch's step, with its ``epoch``), and rank 0 writes the epoch's line to the
    per-epoch file and prints the epoch's lines (``verbose``).

    Args:
        log_dir: where traces go. Default: the first logger's ``log_dir`` (``trainer.log_dir``), or
            ``trainer.default_root_dir`` without a logger. A URL (``s3://``, ``gs://``, ``memory://``...; see
            docs/files.md, "Remote log directories") is written through fsspec: the window records into a local
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
            verdict; :func:`fitprof.fit.pipeline.summary_line`).
        record_shapes: torch only: record operator input shapes (``torch.profiler.profile(record_shapes=...)``).
        profile_memory: torch only: record allocations and frees.
        with_stack: torch only: record Python and C++ stacks (the largest traces).
        with_flops: torch only: estimate FLOPs (torch 2.13 writes none to the exported trace; shapes are
            recorded). The four are off by default; their measured cost is in docs/arguments.md.
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
            recent baseline (:class:`fitprof.fit.steps.SlowdownTrigger`: 5 clean steps in a row above the median of
            the last 64 clean steps plus the larger of 8 robust standard deviations and 25%); the window opens
            at the next step boundary through the same path as the ``profile_batch`` window (that next step is its
            warm-up step: a slowdown seen after step ``S`` is analysed from step ``S + 2``), lasts as many steps,
            gets its own session ``<time>_epoch<N>_trigger_step<S>`` and is analysed at the end of its epoch.
            None (default): no triggered windows. Step timing runs either way.
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

    Attributes:
        reports: the :class:`~fitprof.BottleneckReport` of each profiled epoch of the last ``fit`` (0-based epoch
            -> report; each ``fit`` starts afresh, as in the Keras callback).
        trace_paths: the Kineto trace of each profiled epoch.
        xplane_paths: the ``.xplane.pb`` of each profiled epoch (written off the training path from the window's stop:
            by a thread of this process under 10^4 events, else by a background process; a window that ends with the
            fit, or a large one, after ``fit`` returns, :func:`fitprof.wait_for_profiles` waits for them,
            :mod:`fitprof.fit.xplane_worker`).
        analysis_seconds: wall time of the end-of-epoch analysis and report file, per epoch (s): what the training
            loop waits for (the ``.xplane.pb`` is written in the background).
        steps: the always-on :class:`fitprof.fit.steps.StepRecorder` (the current or last epoch's clean steps).
        epoch_steps: the :class:`fitprof.fit.steps.EpochSteps` of each epoch (0-based epoch -> figures).
        triggered: one ``(epoch, TriggerEvent, report or None)`` per triggered window, in order.
        cross_rank: with several ranks, the cross-rank scalars of each profiled epoch (the same on every rank;
            empty when no rank reported).
        fit_seconds: where the last ``fit``'s wall time went (s): ``wall`` and its parts ``setup``, ``epochs``,
            ``teardown``, with ``profiling``, ``sanity_check`` and ``checkpoint`` inside them (``fitprof/fit/*``,
            docs/metrics.md); empty until a ``fit`` ends.

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
        self.log_dir = None if log_dir is None else normalize_log_dir(log_dir)
        args = check_arguments(**shared(locals()))  # the names, types and defaults of fitprof.fit.config
        args.bind(self)
        self._warn_rank = WarnOnce()
        self.fit_seconds: dict[str, float] = {}
        self._work = WorkLog(self.count_items, self._warn_count_items, TorchFlopCount(), self._warn_samples)
        self._loader = LoaderProbe(
            process_clock=process_cpu_ns
        )  # the train DataLoader's workers (fitprof/epoch/loader_*)
        self._loader_hook: AttachOnIter | None = None
        self._loader_timing: LoaderSet | None = None
        self._engine = FitEngine(
            args.config,
            new_window=self._new_window,
            warn=self._warn_rank,
            boundary=LIGHTNING,
            work=self._work,
            probes=(self._loader, *args.probes),
            **args.engine_settings(),
        )
        self._dir: Path | None = None
        self._mirror: _fs.Mirror | None = None  # a URL log_dir: the local staging folder copied to it
        self._voice = Voice()  # what the fit prints: each sentence once
        self._session: str | None = None  # this epoch's session, rank 0's on every rank
        self._epoch_started = False  # this epoch's start was seen (on_train_epoch_start or a resumed first batch)
        self._last_ended = 0  # the last step whose on_train_batch_end ran
        self._held: tuple[int, str | None] = (0, None)  # the held epoch's logger step and its profile's place
        # each step's input wait and device time, the callbacks' hooks and the saves, for the always-on timing
        saves = Saves(begin=self._engine.save_begin, end=self._engine.save_end)
        self._timing = StepTiming(self._engine.spans, saves)

    @property
    def profile_batch(self) -> tuple[int, int]:
        """The checked ``(first, last)`` steps (1-based, inclusive)."""
        return self.config.first_step, self.config.last_step

    # The engine's results, under the names this callback documents.
    reports = property(lambda self: self._engine.pipeline.reports)
    trace_paths = property(lambda self: self._engine.pipeline.trace_paths)
    xplane_paths = property(lambda self: self._engine.pipeline.xplane_paths)
    analysis_seconds = property(lambda self: self._engine.pipeline.analysis_seconds)
    cross_rank = property(lambda self: self._engine.pipeline.cross_rank)
    steps: StepRecorder = property(lambda self: self._engine.steps)  # type: ignore[assignment]
    epoch_steps: dict[int, EpochSteps] = property(lambda self: self._engine.epoch_steps)  # type: ignore[assignment]
    triggered: list[tuple[int, TriggerEvent, BottleneckReport | None]] = property(  # type: ignore[assignment]
        lambda self: self._engine.triggered
    )
    _window = property(lambda self: self._engine)  # ``started_here``: a window of this callback is open

    def _warn_count_items(self, message: str) -> None:
        self._warn_rank("count-items", message)

    def _warn_samples(self, message: str) -> None:
        self._warn_rank("samples", message)

    def _new_window(self, epoch: int, suffix: str) -> TorchProfileWindow:
        assert self._dir is not None
        return TorchProfileWindow(
            self._dir,
            epoch=epoch,
            rank=self._engine.rank,
            session=None if suffix else self._session,
            suffix=suffix,
            warn=self._warn_rank,
            options=self.torch_options,
        )

    # ------------------------------------------------------------------------------------------- lifecycle
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._time_loader(trainer)
        self.fit_seconds = {}
        self._voice.begin_fit()
        rank, engine = int(trainer.global_rank), self._engine
        self._close_mirror()
        if isinstance(getattr(trainer, "profiler", None), PyTorchProfiler):
            self._dir = None
            engine.fit_start(
                log_dir=None, rank=rank, memory_device=torch_device(getattr(trainer.strategy, "root_device", None))
            )
            engine.coverage.said = True  # the warning below says nothing is profiled, and why
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
        if _fs.is_remote(log_dir):  # record locally, copy to the URL at each profiled epoch's end
            self._mirror = _fs.Mirror(log_dir, self._warn_rank)
            self._dir = self._mirror.local
        else:
            self._dir = Path(_fs.local_path(log_dir))
        world = int(trainer.world_size)
        engine.fit_start(
            log_dir=str(self._dir),
            rank=rank,
            world=world,
            ends_after=lambda step: self._ends_after(trainer, step),
            memory_device=torch_device(getattr(trainer.strategy, "root_device", None)),
        )
        engine.coverage.limit = _trainer.epoch_limit(trainer, self.config.first_step)
        engine.warm_up(kineto=True)  # the reader and the .xplane.pb process now, not at the first window's end
        self._timing.fit_start(trainer)
        unknown = unknown_ranks_message(self.ranks, world)
        if unknown and rank == 0:
            self._warn_rank("ranks", f"fitprof: {unknown}")
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
        # here, not in setup(): configure_model() and the strategy have made and placed the parameters by now
        self._engine.publisher.setup = torch_module_setup(
            pl_module,
            precision=str(getattr(trainer, "precision", "") or ""),
            device=self._work.device_name or str(getattr(getattr(trainer.strategy, "root_device", None), "type", "")),
        )
        # the train loaders' first iter() has been (or will not be) seen, unless Lightning makes new ones at later
        # epochs: then the hook stays until teardown
        if self._loader_hook is not None and not getattr(trainer, "reload_dataloaders_every_n_epochs", 0):
            self._loader_hook.uninstall()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._begin_epoch(trainer, next_step=1, pl_module=pl_module)

    def _begin_epoch(self, trainer: pl.Trainer, *, next_step: int, pl_module: pl.LightningModule | None) -> None:
        """An epoch whose next step is ``next_step`` (1 unless resumed mid-epoch) begins; the last one closes."""
        self._close_epoch(trainer, pl_module)
        self._epoch_started = True
        epoch = int(trainer.current_epoch)
        self._last_ended = next_step - 1
        self._timing.epoch_start(next_step)
        cfg = self.config
        profiled = self._dir is not None and cfg.enabled and cfg.profiles_epoch(epoch)
        self._session = self._shared_session(trainer, epoch) if profiled else None
        threads, workers = _trainer.threads_and_workers(trainer)
        self._engine.cpu_share(threads=threads, workers=workers)
        self._engine.epoch_start(epoch, next_step=next_step)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now: int | None = self._timing.step_start()  # the batch is here: the time since the last step end was input
        if not self._epoch_started:
            # ``fit(ckpt_path=...)`` from a checkpoint saved mid-epoch resumes that epoch at ``batch_idx`` without
            # calling ``on_train_epoch_start``: the epoch starts here, its steps numbered as Lightning numbers them.
            self._begin_epoch(trainer, next_step=batch_idx + 1, pl_module=pl_module)
            now = None  # the epoch began after that stamp: the engine reads its clock again
        self._engine.step_start(batch_idx + 1, batch, now_ns=now)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        if self._work.counting:  # the FLOP-count step ended
            self._work.stop_count()
        now = time.perf_counter_ns()  # one stamp for the fetch timer and the engine (the engine's clock)
        wait = self._timing.step_end(now)
        self._last_ended = batch_idx + 1
        self._engine.step_end(batch_idx + 1, batch, input_ns=wait, now_ns=now)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._engine.validation_start()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._engine.validation_end()

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._engine.checkpoint_start()  # Lightning tells one point: the save lands in this step or the next
        self._engine.checkpoint_end()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_started = False
        engine = self._engine
        result = engine.epoch_end(
            engine.epoch,
            device_ms=self._timing.device_step_ms(self._engine.steps.step_index),
            gather=(lambda vector: _trainer.all_gather(trainer, vector)) if _trainer.distributed() else None,
            log=lambda entry: self._log(trainer, pl_module, entry),
        )
        # This rank's own step timing (no collective), the window's gathered figures and a triggered window's: one
        # row, as Lightning's own epoch-end values. The epoch's parts are final only at its close (ModelCheckpoint's
        # save runs after this hook): here they reach trainer.callback_metrics only (monitors), and every logger
        # gets the final ones at the close.
        figures = finite(result.epoch)
        rest = {k: v for k, v in figures.items() if k not in PART_KEYS}
        self._log_scalars(
            trainer,
            {**rest, **result.window, **(result.trigger if result.triggered else {})},
            progress_bar=_PROGRESS_BAR_KEYS,
        )
        self._log_scalars(trainer, part_figures(figures), logger=False)
        synced = (result.profiled or bool(result.triggered)) and (self._mirror is None or self._mirror.sync())
        url = self._mirror.url if self._mirror is not None else str(self._dir)
        self._held = (_trainer.epoch_end_step(trainer), profile_place(url, result.session_dir) if synced else None)
        if engine.rank == 0:
            for triggered in result.triggered:
                self._log_text(trainer, TRIGGER_SUMMARY_TAG, triggered.text)

    def _close_epoch(self, trainer: pl.Trainer, pl_module: pl.LightningModule | None) -> None:
        """The epoch whose ``on_train_epoch_end`` ran closes (:mod:`fitprof.fit.epoch_close`: the next epoch's start
        or the fit's end, after every callback's epoch-end hook, ``ModelCheckpoint``'s save included). Its final
        parts to ``callback_metrics`` and every logger, one more row at the epoch's step; on rank 0 its lines
        printed, its new advice to the Text tab."""
        engine = self._engine
        result = engine.close_epoch()
        if result is None:
            return
        step, where = self._held
        # Every rank, as at the hook: each rank's callback_metrics hold its final parts; only rank 0's loggers write.
        self._log_scalars(trainer, finite(part_figures(result.epoch)), epoch=engine.epoch, step=step)
        if engine.rank != 0:
            return
        lines = self._voice.lines(engine.epoch, result, where)
        for line in lines if self.verbose else ():
            self._print(pl_module, line)
        if self._voice.new:
            self._log_text(trainer, ADVICE_TAG, "\n\n".join(self._voice.new), step=step)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close_epoch(trainer, pl_module)  # the last epoch: every callback's epoch-end hook has run
        self._engine.fit_end()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Flush and analyse the partial window (the failing step left out); Lightning re-raises the exception.
        # No all-gather: the other ranks may be anywhere (or gone); rank 0 logs its own figures to the loggers.
        try:
            self._engine.exception(exception, log=lambda entry: self._log(trainer, None, entry))
        finally:
            self._close_mirror()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # The fit ends here, not at on_train_end: the loops' teardown (loader workers stopped) runs in between.
        fit = self._engine.fit_teardown() if stage == "fit" else None
        if fit is not None:
            self.fit_seconds = fit.seconds()
        if fit is not None and self._engine.rank == 0:  # self.log is refused here: the loggers, before they finalize
            try:
                for logger in trainer.loggers:
                    logger.log_metrics(fit.scalars(), step=int(trainer.global_step))
            except Exception as err:
                self._warn_rank("log", f"fitprof: could not log the fit's figures to the loggers ({err!r}).")
        self._untime_loader()
        self._timing.fit_end()
        self._engine.abort()
        self._close_mirror()

    # -------------------------------------------------------------------------------------------- internal
    def _time_loader(self, trainer: pl.Trainer) -> None:
        """Time the workers of every train ``DataLoader`` Lightning iterates (one, or the loaders of a
        ``CombinedLoader``, list or dict), each from the first start of its workers (``FitLoop.setup_data``, before
        ``on_train_start``; with ``reload_dataloaders_every_n_epochs``, the new loaders at the epoch they are first
        iterated, the ones they replace given back); read together as a :class:`fitprof.profilers.loader.LoaderSet`.
        Undone in :meth:`teardown`."""
        self._untime_loader()
        loaders = LoaderSet(sequential=lambda: _sequential(trainer))
        self._loader_timing = loaders

        def wanted(loader: Any) -> bool:
            return any(loader is x for x in loaders_in(trainer.train_dataloader))

        def found(timing: DataLoaderTiming) -> None:
            loaders.add(timing, wanted)
            self._loader.attach(loaders)

        self._loader_hook = AttachOnIter(wanted, found)
        self._loader_hook.install()

    def _untime_loader(self) -> None:
        hook, timing, self._loader_hook, self._loader_timing = self._loader_hook, self._loader_timing, None, None
        if hook is not None:
            hook.uninstall()
        if timing is not None:
            timing.detach()
        self._loader.attach(None)

    def _ends_after(self, trainer: pl.Trainer, step: int) -> bool:
        """Whether step ``step`` (the one that just ended, or the next) is the epoch's last."""
        try:
            if step >= trainer.num_training_batches:
                return True
            ahead = step - self._last_ended
            if ahead <= 0 and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
                return True
            max_steps = trainer.max_steps
            return bool(max_steps is not None and max_steps >= 0 and trainer.global_step + ahead >= max_steps)
        except Exception:  # private loop state moved: the epoch-end flush handles it
            return False

    def _shared_session(self, trainer: pl.Trainer, epoch: int) -> str:
        """This epoch's session name, rank 0's on every rank, so that all ranks write into one session folder.

        Called at the start of every profiled epoch, on every rank (a broadcast: each rank choosing its own
        timestamp would split the ranks over two folders whenever they straddle a second).
        """
        assert self._dir is not None
        name = session_name(self._dir, epoch)
        if _trainer.distributed():
            try:
                name = str(trainer.strategy.broadcast(name, src=0))
            except Exception as err:
                self._warn_rank("broadcast", f"fitprof: could not share the session name across ranks ({err!r}).")
        return name

    def _close_mirror(self) -> None:
        """Copy what is left to a URL log dir and delete the local staging folder."""
        mirror, self._mirror = self._mirror, None
        if mirror is not None:
            mirror.close()

    def _log_scalars(
        self,
        trainer: pl.Trainer,
        scalars: dict[str, float],
        progress_bar: frozenset[str] = frozenset(),
        *,
        logger: bool = True,
        epoch: int | None = None,
        step: int | None = None,
    ) -> None:
        """Hand the figures to ``trainer.callback_metrics`` (``EarlyStopping``, ``ModelCheckpoint(monitor=...)``)
        on every rank, with the values given (gathered already, or this rank's own: no collective), and, unless
        ``logger`` is False, to every logger as one row with ``epoch`` (None: the engine's epoch) at ``step`` (None:
        the step Lightning gives the current epoch's end) (:func:`fitprof.lightning._trainer.log_figures`). Not
        through ``pl_module.log``: Lightning's result object per key cost 37-58 ms of CPU for the ~53 figures of a
        profiled epoch's end, and its walk at the fit's teardown 13-24 ms more (``benchmarks/lightning_log_cost.py``);
        and Lightning refuses ``pl_module.log`` outside an epoch's hooks, where an epoch's final parts are logged."""

        def failed(logger: Any, err: Exception) -> None:
            name = type(logger).__name__
            self._warn_rank(f"log-{name}", f"fitprof: logging to {name} failed ({err!r}).")

        try:
            _trainer.log_figures(
                trainer,
                scalars,
                epoch=self._engine.epoch if epoch is None else epoch,
                step=step,
                progress_bar=progress_bar,
                loggers=logger,
                failed=failed,
            )
        except Exception as err:
            self._warn_rank("log", f"fitprof: could not log the figures to Lightning ({err!r}).")

    def _print(self, pl_module: pl.LightningModule | None, line: str) -> None:
        if pl_module is not None:
            pl_module.print(line)
        else:
            print(line, flush=True)

    def _log_text(self, trainer: pl.Trainer, tag: str, text: str, step: int | None = None) -> None:
        """Rank 0: ``text`` under ``tag`` in each TensorBoard logger's Text tab (a triggered window's summary, the
        epoch's new advice) at ``step`` (None: the epoch's last batch's step, :func:`_trainer.epoch_end_step`)."""
        step = _trainer.epoch_end_step(trainer) if step is None else step
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                try:
                    logger.experiment.add_text(tag, text, global_step=step)
                except Exception as err:
                    self._warn_rank(f"log-text-{tag}", f"fitprof: logging {tag} failed ({err!r}).")

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule | None, entry: EpochLog) -> None:
        """Rank 0: for TensorBoard loggers the operators by name and the Markdown summary (Text tab); the one-line
        summary is printed with the epoch's result, or here after an exception. Without ``pl_module`` (after an exception) also the scalars, to every
        logger."""
        if pl_module is None and self.verbose:
            print(entry.line, flush=True)
        if pl_module is None:
            self._log_scalars(trainer, entry.scalars, epoch=entry.epoch)
        for logger in trainer.loggers:
            try:
                if isinstance(logger, TensorBoardLogger):
                    step = _trainer.epoch_end_step(trainer)
                    for key, value in entry.op_scalars.items():
                        logger.experiment.add_scalar(key, value, global_step=step)
                    logger.experiment.add_text(SUMMARY_TAG, entry.text, global_step=step)
            except Exception as err:
                self._warn_rank(
                    f"log-{type(logger).__name__}",
                    f"fitprof: logging to {type(logger).__name__} failed ({err!r}).",
                )


_PROGRESS_BAR_KEYS = frozenset({metrics.STEP_TIME_MS.key, metrics.INPUT_PERCENT.key})
"""The figures also shown in Lightning's progress bar (``trainer.progress_bar_metrics``)."""


def _sequential(trainer: pl.Trainer) -> bool:
    """Whether the fit's ``CombinedLoader`` takes one batch a step from its loaders in turn (mode ``sequential``)."""
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    return getattr(combined, "_mode", None) == "sequential"

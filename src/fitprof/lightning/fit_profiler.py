"""``FitProfiler``: profile a few training steps per epoch and log where the step time goes."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks.callback import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.profilers import PyTorchProfiler
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from fitprof import _config, _fs, metrics
from fitprof._coverage import FitCoverage
from fitprof._retention import DEFAULT_MAX_TRACE_MB
from fitprof._session import session_name
from fitprof._warn import WarnOnce
from fitprof.analysis import BottleneckReport
from fitprof.metrics import SUMMARY_TAG
from fitprof.profilers.torch import TorchProfileWindow, profiler_running
from fitprof.window import EpochLog, WindowPipeline

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
    ``fitprof/collective_percent``, ``fitprof/steps_analyzed``, ``fitprof/self_ms_per_step`` and
    ``fitprof/top_op_<i>_ms`` (ms per step, the
    i-th operator by self time); with a ``TensorBoardLogger`` (rank 0) also ``fitprof/top_ops/<op name>`` and
    the text ``fitprof/summary`` (verdict, advice, top-operator table). With several ranks the first five
    are means over the ranks that reported, ``steps_analyzed`` their sum, the top operators rank 0's own, and
    ``fitprof/step_time_ms_max``, ``fitprof/input_percent_max``, their ``..._max_rank`` (global rank) and
    ``fitprof/ranks_reported`` are added (:func:`fitprof.cross_rank.combine`); the summary starts with a line
    naming those ranks. Under DDP the all-reduce evens out step times, so ``input_percent_max_rank`` is the
    figure that names a rank starved of data.

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

    Attributes:
        reports: the :class:`~fitprof.BottleneckReport` of each profiled epoch (0-based epoch -> report; a
            later ``fit`` with the same callback overwrites the epochs it profiles again).
        trace_paths: the Kineto trace of each profiled epoch.
        xplane_paths: the ``.xplane.pb`` of each profiled epoch.
        analysis_seconds: wall time of the end-of-epoch analysis + XSpace conversion, per epoch (s).
        cross_rank: with several ranks, the cross-rank scalars of each profiled epoch (the same on every rank;
            empty when no rank reported).

    Raises:
        TypeError: if an argument has the wrong type (e.g. ``top_k=1.5``, ``log_dir=3``).
        ValueError: if ``profile_batch`` is malformed or out of range, ``every_n_epochs`` / ``top_k`` < 1, or
            ``ranks`` is empty or holds a rank < 0.

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
    ) -> None:
        super().__init__()
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
        unknown = _config.unknown_ranks_message(self.ranks, self._world_size)
        if unknown and self._rank == 0:
            self._warn_rank("ranks", f"fitprof: {unknown}")
        self._coverage.left_out = not _config.profiles_rank(self.ranks, self._rank)

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
        if not self._epoch_started:
            # ``fit(ckpt_path=...)`` from a checkpoint saved mid-epoch resumes that epoch at ``batch_idx`` without
            # calling ``on_train_epoch_start``: the epoch starts here, its steps numbered as Lightning numbers them.
            self._begin_epoch(trainer, next_step=batch_idx + 1)

    def _begin_epoch(self, trainer: pl.Trainer, *, next_step: int) -> None:
        """Mark the start of an epoch whose next step is ``next_step`` (1 unless resumed mid-epoch); open the window
        now when it starts at that step."""
        self._epoch_started = True
        self._epoch = int(trainer.current_epoch)
        self._epoch_profiled = self._dir is not None and self.config.enabled and self.config.profiles_epoch(self._epoch)
        if self._dir is not None:
            self._coverage.epoch(self._epoch)
        self._steps_seen = 0
        # Every rank marks the epoch (all take part in the all-gather); only the chosen ranks open a window.
        self._epoch_on = self._epoch_profiled and _config.profiles_rank(self.ranks, self._rank)
        self._session = self._shared_session(trainer) if self._epoch_profiled else None
        if self._epoch_on and next_step > self._first:
            self._epoch_on = False  # the window's first step ran before the resume
            self._warn_rank(
                "resumed-past",
                f"fitprof: epoch {self._epoch} was resumed at step {next_step}, after the window's first step "
                f"(profile_batch={self._first},{self._last}); that epoch is not profiled.",
            )
        elif self._epoch_on and next_step >= self._first - 1:
            # The next step is the window's warm-up step (first - 1) or, with no step before it, its first step.
            self._start(warm_up=next_step < self._first)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        if not self._epoch_on:
            return
        n = batch_idx + 1
        self._steps_seen = n
        if self._open:
            window = self._window
            window.begin_overhead()  # this hook's own time is fitprof's, never the step's
            try:
                if window.step_num is None:  # the warm-up step (first - 1) ended: the analysed steps begin
                    if self._epoch_ends_after_this(trainer, n):
                        self._open = self._epoch_on = False
                        window.stop(export=False)
                    else:
                        self._begin_first_step()
                elif n >= self._last:
                    self._stop()
                elif self._epoch_ends_after_this(trainer, n):
                    self._warn_short(n)
                    self._stop()
                else:
                    window.begin_step(n + 1)  # closes ProfilerStep#n
            finally:
                window.end_overhead()
        elif n == self._first - 2:
            if self._epoch_ends_after_this(trainer, n + 1):
                self._epoch_on = False
            else:
                self._start(warm_up=True)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._open and not trainer.sanity_checking:
            self._window.begin_annotation()
            self._val_annotated = True

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._val_annotated:
            self._val_annotated = False
            self._window.end_annotation()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_started = False
        if self._open:  # the epoch ended inside the window without our noticing: flush what there is
            self._stop(drop_open_step=True)
        if self._epoch_profiled:
            self._coverage.steps(self._steps_seen)  # counted here: iterable datasets report no length
        self._epoch_on = False
        path, self._pending = self._pending, None
        report = None if path is None else self._analyze(self._epoch, path)
        if self._epoch_profiled:  # every rank, whatever its window gave: the all-gather must complete
            self._epoch_profiled = False
            self._publish(trainer, report, gather=_distributed(), pl_module=pl_module)
        if path is not None and self._mirror is not None:
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

    def _start(self, *, warm_up: bool) -> None:
        """Start the profiler. ``warm_up``: one step (``first - 1``) before the analysed ones, recorded but not
        marked, takes the profiler's start-up; else (no step before the first: ``first == 1``, or an epoch resumed
        at ``first``) the first step opens at once, after one span of fitprof's own that makes the first recorded
        event fall before it."""
        assert self._dir is not None
        if self._session is None:
            self._session = self._new_session()
        if self._window.start(self._dir, self._session, rank=self._rank):
            self._open = True
            if not warm_up:
                self._window.begin_overhead()
                self._begin_first_step()
                self._window.end_overhead()
        else:
            self._epoch_on = False
            if self._coverage.blocked is None:
                self._coverage.blocked = (
                    "another torch profiler was running" if profiler_running() else "the torch profiler did not start"
                )

    def _begin_first_step(self) -> None:
        """Open ``ProfilerStep#first``: from here on the window is counted as profiled."""
        self._window.begin_step(self._first)
        self._coverage.windows += 1

    def _stop(self, *, drop_open_step: bool = False) -> None:
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
        )

    def _publish(
        self,
        trainer: pl.Trainer,
        report: BottleneckReport | None,
        *,
        gather: bool,
        pl_module: pl.LightningModule | None,
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
                    logger.log_metrics({**entry.scalars, "epoch": float(entry.epoch)}, step=trainer.global_step)
                if isinstance(logger, TensorBoardLogger):
                    for key, value in entry.op_scalars.items():
                        logger.experiment.add_scalar(key, value, global_step=trainer.global_step)
                    logger.experiment.add_text(SUMMARY_TAG, entry.text, global_step=trainer.global_step)
            except Exception as err:
                self._warn_rank(
                    f"log-{type(logger).__name__}",
                    f"fitprof: logging to {type(logger).__name__} failed ({err!r}).",
                )


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

"""Lightning: where each training step's input wait and device time come from, for the always-on step timing,
and where the epoch's other time goes.

Lightning's training loop brackets each batch fetch with ``trainer.profiler.start/stop`` of the action
:data:`~fitprof.fit.hooks.FETCH_ACTION` (whatever the profiler, the default one doing nothing), and each callback hook with an action
named after the callback: :class:`StepTiming` wraps those two methods on the trainer's profiler instance once
(:class:`fitprof.fit.hooks.ProfilerHooks`), adds up the fetch time (``time.perf_counter_ns``) and hands the
callbacks' hooks to the epoch-parts probe; it also times ``trainer.save_checkpoint`` as a save
(:func:`fitprof.fit.hooks.wrap_save`). Where wrapping fails, the input wait is the gap from the previous step's end
to this step's start (fetch, copy and other hooks). On a CUDA device each step boundary also records a CUDA timing
event (non-blocking), read at the epoch's end.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks.callback import Callback
from lightning.pytorch.profilers import PyTorchProfiler

from fitprof.fit.hooks import ProfilerHooks, Saves, Spans, wrap_around, wrap_save

log = logging.getLogger(__name__)

_MAX_CUDA_EVENTS = 10_000
"""The most CUDA timing events one epoch records (one per step boundary, read at the epoch's end): past it the
events are released and none is created until the next epoch, whose steps the host clock times alone."""


class StepTiming:
    """The input wait of each step and, on a CUDA device, its device time (see the module docstring).

    Args:
        parts: where the timed hooks' spans go, the engine's :attr:`~fitprof.fit.engine.FitEngine.spans` (None: the
            fetch time only).
        saves: the adapter's saves (each one annotated in a window and taken out of its step).
    """

    def __init__(self, parts: Spans | None = None, saves: Saves | None = None) -> None:
        self.parts = parts
        self.saves = saves or Saves()
        self._hooks = ProfilerHooks(parts, saves=self.saves)
        self._undo_save: Any = None
        self._undo_loops: list[Any] = []
        self._prev_end_ns: int | None = None  # the last step boundary (on_train_batch_end, or the epoch start)
        self._fetched_ns: int | None = None  # on_train_batch_start of the step in progress
        self._hooked: Any = None  # the trainer profiler whose start/stop we wrap
        self._cuda_events: list[Any] | None = None  # on a CUDA device: one timing event per step boundary
        self._cuda_capped = False  # this epoch passed _MAX_CUDA_EVENTS: no more events until the next one
        self._epoch_first_step = 1

    def fit_start(self, trainer: pl.Trainer) -> None:
        self._hook_fetch(trainer)
        self._cuda_events = [] if _on_cuda(trainer) else None
        parts = self.parts
        if parts is not None and self._undo_save is None:
            self._undo_save = wrap_save(parts, self.saves, trainer, "save_checkpoint")
        if parts is not None and not self._undo_loops:
            # Work Lightning does outside every hook: epoch 0's loader built (workers started, the sampler's
            # __iter__) before on_train_epoch_start, and each validation loader's reset() before
            # on_validation_start: the first is epoch 0's start-up, the second validation (before the first
            # epoch: the sanity check).
            loop = getattr(trainer, "fit_loop", None)
            val_loop = getattr(getattr(loop, "epoch_loop", None), "val_loop", None)
            undo = (
                wrap_around(loop, "setup_data", parts.data_start) if loop is not None else None,
                wrap_around(val_loop, "run", parts.validation_start, parts.validation_end)
                if val_loop is not None
                else None,
            )
            self._undo_loops = [u for u in undo if u is not None]

    def fit_end(self) -> None:
        self._unhook_fetch()
        undo, self._undo_save = self._undo_save, None
        if undo is not None:
            undo()
        loops, self._undo_loops = self._undo_loops, []
        for undo_loop in loops:
            undo_loop()

    def epoch_start(self, next_step: int) -> None:
        """An epoch begins at step ``next_step`` (resumed mid-epoch: this step's start is unknown, the first
        boundary only sets the origin)."""
        self._hooks.take_fetch()
        self._epoch_first_step = next_step
        self._cuda_capped = False
        if self._cuda_events is not None:
            self._cuda_events = [_cuda_event()] if next_step == 1 else [None]
        self._prev_end_ns = time.perf_counter_ns() if next_step == 1 else None

    def step_start(self) -> int:
        """A step's batch is here: its stamp (``time.perf_counter_ns``), which the adapter hands on to the engine."""
        now = self._fetched_ns = time.perf_counter_ns()
        return now

    def step_end(self, now: int) -> int | None:
        """A step ended at ``now`` (``time.perf_counter_ns``, read once by the adapter for this and the engine): its
        input wait (ns; None when unknown)."""
        fetched, self._fetched_ns = self._fetched_ns, None
        prev, self._prev_end_ns = self._prev_end_ns, now
        wait: int | None
        if self._hooked is not None:  # the exact time inside the fetch (take_fetch, written out: every step)
            hooks = self._hooks
            wait, hooks.fetch_ns = hooks.fetch_ns, 0
        else:  # the gap from the last step's end to this one's start (fetch, transfer, hooks)
            wait = None if fetched is None or prev is None else fetched - prev
        if self._cuda_events is not None and not self._cuda_capped:
            if len(self._cuda_events) <= _MAX_CUDA_EVENTS:
                self._cuda_events.append(_cuda_event())
            else:  # bounded: no more events this epoch, which keeps the host clock's figures
                self._cuda_capped = True
                self._cuda_events = [None]
        return wait

    def device_step_ms(self, step_index: list[int]) -> list[float] | None:
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
            return [float(events[n - first].elapsed_time(events[n - first + 1])) for n in step_index]
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
        self._hooks.overrides = _overrides(trainer)
        if self._hooks.install(profiler):
            self._hooked = profiler
        else:  # a profiler that refuses attributes: fall back to the gap
            log.debug("fitprof: cannot time the batch fetch through the trainer's profiler")

    def _unhook_fetch(self) -> None:
        self._hooked = None
        self._hooks.uninstall()
        self._hooks.overrides = None  # it holds the trainer's callbacks, which a copy of this callback must not


def _overrides(trainer: pl.Trainer) -> Any:
    """``(state_key, hook) -> bool``: whether the trainer's callback of that state key overrides that hook (Lightning
    calls every hook of every callback; an empty default one is not worth a span)."""
    callbacks = {}
    for cb in getattr(trainer, "callbacks", []) or []:
        with contextlib.suppress(Exception):
            callbacks[cb.state_key] = cb

    def overrides(key: str, hook: str) -> bool:
        cb = callbacks.get(key)
        if cb is None:
            return True
        return getattr(type(cb), hook, None) is not getattr(Callback, hook, None)

    return overrides


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

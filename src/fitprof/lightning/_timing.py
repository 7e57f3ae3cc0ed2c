"""Lightning: where each training step's input wait and device time come from, for the always-on step timing.

Lightning's training loop brackets each batch fetch with ``trainer.profiler.start/stop`` of the action
:data:`_FETCH_ACTION` (whatever the profiler, the default one doing nothing): :class:`StepTiming` wraps those two
methods on the trainer's profiler instance and adds up the time between them (``time.perf_counter_ns``). Where that
fails, the input wait is the gap from the previous step's end to this step's start (fetch, copy and other hooks).
On a CUDA device each step boundary also records a CUDA timing event (non-blocking), read at the epoch's end.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.profilers import PyTorchProfiler

log = logging.getLogger(__name__)

_FETCH_ACTION = "[_TrainingEpochLoop].train_dataloader_next"
"""The profiler action Lightning's training loop wraps around each batch fetch (``training_epoch_loop.py``)."""

_MAX_CUDA_EVENTS = 10_000
"""The most CUDA timing events one epoch records (one per step boundary, read at the epoch's end): past it the
events are released and none is created until the next epoch, whose steps the host clock times alone."""


class StepTiming:
    """The input wait of each step and, on a CUDA device, its device time (see the module docstring)."""

    def __init__(self) -> None:
        self._prev_end_ns: int | None = None  # the last step boundary (on_train_batch_end, or the epoch start)
        self._fetched_ns: int | None = None  # on_train_batch_start of the step in progress
        self._fetch_ns = 0  # time inside Lightning's batch fetch since the last step boundary
        self._fetch_t0 = 0
        self._hooked: Any = None  # the trainer profiler whose start/stop we wrap
        self._hooked_fns: tuple[Any, Any] = (None, None)  # our wrappers, removed only while still in place
        self._cuda_events: list[Any] | None = None  # on a CUDA device: one timing event per step boundary
        self._cuda_capped = False  # this epoch passed _MAX_CUDA_EVENTS: no more events until the next one
        self._epoch_first_step = 1

    def fit_start(self, trainer: pl.Trainer) -> None:
        self._hook_fetch(trainer)
        self._cuda_events = [] if _on_cuda(trainer) else None

    def fit_end(self) -> None:
        self._unhook_fetch()

    def epoch_start(self, next_step: int) -> None:
        """An epoch begins at step ``next_step`` (resumed mid-epoch: this step's start is unknown, the first
        boundary only sets the origin)."""
        self._fetch_ns = 0
        self._epoch_first_step = next_step
        self._cuda_capped = False
        if self._cuda_events is not None:
            self._cuda_events = [_cuda_event()] if next_step == 1 else [None]
        self._prev_end_ns = time.perf_counter_ns() if next_step == 1 else None

    def step_start(self) -> None:
        self._fetched_ns = time.perf_counter_ns()

    def step_end(self) -> int | None:
        """A step ended: its input wait (ns; None when unknown)."""
        now = time.perf_counter_ns()
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

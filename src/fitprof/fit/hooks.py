"""The frameworks' hooks, timed for the epoch-parts probe (framework-free: the frameworks' objects are duck-typed).

Lightning's loops bracket each batch fetch and each callback hook call with ``trainer.profiler.start(action)`` /
``stop(action)``, whatever the profiler (the default one does nothing): the fetch as
``[_TrainingEpochLoop].train_dataloader_next``, a hook as ``[Callback]<state_key>.<hook>``. :class:`ProfilerHooks`
wraps the two methods of one profiler instance once, delegates every call, adds up the fetch time, and hands each
callback hook to an :class:`~fitprof.fit.epoch_parts.EpochParts` probe as a span (``ModelCheckpoint`` as a save,
fitprof's own as profiling, any other as that callback's).

Keras calls every callback's hook from its ``CallbackList`` in turn; :class:`CallbackHooks` replaces, on each
callback instance, the hook methods it overrides (a default, empty hook, marked ``_is_default``, is left alone:
Keras decides from them whether batch-end hooks may run asynchronously) with a wrapper that opens a span around the
call: a checkpointing callback's (the classes the adapter passes: Keras ``ModelCheckpoint``, ``BackupAndRestore``)
as a save, fitprof's own as profiling, any other as that callback's, by class name. Only calls on the thread that
installed the wrappers are timed (Keras may dispatch batch-end hooks to a thread pool).

A save seen another way (the framework's save method, :func:`wrap_save`) is a checkpoint span too. All of them report
to one :class:`Saves`, whose outermost span calls ``begin()`` / ``end(ns)``, so that the adapter can annotate the save
inside a window and take it out of the step's time (:meth:`fitprof.fit.steps.StepRecorder.take_out`) once per save.
``uninstall`` removes the wrappers still in place.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from fitprof.fit.epoch_parts import CALLBACKS, CHECKPOINT, PROFILING, lightning_hook_part

__all__ = [
    "FETCH_ACTION",
    "KERAS_HOOKS",
    "CallbackHooks",
    "ProfilerHooks",
    "Saves",
    "Spans",
    "wrap_around",
    "wrap_save",
]


class Spans(Protocol):
    """Where the timed hooks report their spans: the engine's epoch-parts probe
    (:attr:`fitprof.fit.engine.FitEngine.spans`, an :class:`~fitprof.fit.epoch_parts.EpochParts`)."""

    def enter(self, part: int, name: str = "", now_ns: int | None = None) -> None:
        """A span of ``part`` (``name``: whose) begins at ``now_ns``."""

    def leave(self, now_ns: int | None = None) -> None:
        """The innermost span ends at ``now_ns``."""

    def data_start(self, now_ns: int | None = None) -> None:
        """The first epoch's loader starts being built before the epoch-start hook."""

    def validation_start(self, now_ns: int | None = None) -> None:
        """A validation run starts (its loader's start-up included)."""

    def validation_end(self, now_ns: int | None = None) -> None:
        """The validation run ends."""


class Saves:
    """One adapter's checkpoint saves, however each was seen (a checkpointing callback's hook, the framework's save
    method, both nested): the outermost one calls ``begin()`` when it starts and ``end(ns)`` with its duration
    when it ends, once per save.

    Args:
        begin: e.g. open the ``fitprof/checkpoint`` annotation when a window is open.
        end: e.g. close it and take the save out of the step's time (:meth:`fitprof.fit.steps.StepRecorder.take_out`).

    Attributes:
        count: the outermost saves seen.
        total_ns: their summed duration (ns).
    """

    def __init__(self, begin: Callable[[], None] | None = None, end: Callable[[int], None] | None = None) -> None:
        self.on_begin = begin
        self.on_end = end
        self.count = 0
        self.total_ns = 0
        self._depth = 0
        self._t0 = 0

    def begin(self, now: int) -> None:
        """A save span starts at ``now`` (ns)."""
        self._depth += 1
        if self._depth == 1:
            self._t0 = now
            if self.on_begin is not None:
                self.on_begin()

    def end(self, now: int) -> None:
        """The innermost open save span ends at ``now`` (ns); an unmatched call is ignored."""
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            ns = now - self._t0
            self.count += 1
            self.total_ns += ns
            if self.on_end is not None:
                self.on_end(ns)


def _timed_save(method: Callable[..., Any], parts: Spans, saves: Saves, name: str, thread: int) -> Any:
    clock, get_ident = time.perf_counter_ns, threading.get_ident

    @functools.wraps(method)
    def timed_save(*args: Any, **kwargs: Any) -> Any:
        if get_ident() != thread:
            return method(*args, **kwargs)
        t0 = clock()
        parts.enter(CHECKPOINT, name, t0)
        saves.begin(t0)
        try:
            return method(*args, **kwargs)
        finally:
            now = clock()
            parts.leave(now)
            saves.end(now)

    return timed_save


def wrap_save(parts: Spans, saves: Saves, obj: Any, attr: str) -> Callable[[], None] | None:
    """Time every call of ``obj.<attr>`` (a save method: Lightning's ``trainer.save_checkpoint``, Keras's
    ``model.save``) as a checkpoint save on this thread, wrapped on the instance; returns the function that undoes
    it (only while the wrapper is still in place), None when the object refuses."""
    method = getattr(obj, attr, None)
    if method is None:
        return None
    wrapper = _timed_save(method, parts, saves, "save", threading.get_ident())
    try:
        setattr(obj, attr, wrapper)
    except Exception:
        return None

    def undo() -> None:
        if vars(obj).get(attr) is wrapper:
            with contextlib.suppress(Exception):
                delattr(obj, attr)

    return undo


def wrap_around(
    obj: Any, attr: str, before: Callable[[int], None], after: Callable[[int], None] | None = None
) -> Callable[[], None] | None:
    """Call ``before(now)`` before and ``after(now)`` after every call of ``obj.<attr>`` on this thread (``now``:
    ``time.perf_counter_ns``), wrapped on the instance: the work a framework does outside every hook (Lightning's
    ``FitLoop.setup_data``, which builds epoch 0's loader before the epoch-start hook; ``_EvaluationLoop.run``,
    whose ``reset()`` starts the validation loader's workers before ``on_validation_start``). Returns the function
    that undoes it (only while the wrapper is still in place), None when the object has no such method or refuses
    attributes."""
    method = getattr(obj, attr, None)
    if not callable(method):
        return None
    clock, get_ident, thread = time.perf_counter_ns, threading.get_ident, threading.get_ident()

    @functools.wraps(method)
    def around(*args: Any, **kwargs: Any) -> Any:
        if get_ident() != thread:
            return method(*args, **kwargs)
        before(clock())
        try:
            return method(*args, **kwargs)
        finally:
            if after is not None:
                after(clock())

    try:
        setattr(obj, attr, around)
    except Exception:
        return None

    def undo() -> None:
        if vars(obj).get(attr) is around:
            with contextlib.suppress(Exception):
                delattr(obj, attr)

    return undo


FETCH_ACTION = "[_TrainingEpochLoop].train_dataloader_next"
"""The profiler action Lightning's training loop wraps around each batch fetch (``training_epoch_loop.py``)."""

_FETCH = (-1, "")
_MISSING = (-2, "")
_MAX_ACTIONS = 4096  # the action names seen are a fixed set (loops, hooks); bound the cache all the same


class ProfilerHooks:
    """Wraps one trainer profiler's ``start`` / ``stop`` (see the module docstring); undone by :meth:`uninstall`.

    Args:
        parts: the probe that gets the callback spans (None: the fetch time only).
        own: fitprof's callback class name (its hooks are fitprof's own time).
        overrides: ``(state_key, hook) -> bool``: whether that callback overrides that hook. Lightning calls every
            hook of every callback, the empty default ones too; only the overridden ones are timed (a span costs
            about a microsecond, an empty hook nothing worth naming). None: every hook is timed.
        saves: the adapter's :class:`Saves` (the window annotation and the step take-out of each save).

    Attributes:
        fetch_ns: time inside the batch fetch since :meth:`take_fetch` last read it (ns).
        installed: whether the wrappers are in place.
    """

    def __init__(
        self,
        parts: Spans | None = None,
        *,
        own: str = "FitProfiler",
        overrides: Callable[[str, str], bool] | None = None,
        saves: Saves | None = None,
    ) -> None:
        self.parts = parts
        self.own = own
        self.overrides = overrides
        self.saves = saves or Saves()
        self.fetch_ns = 0
        self._fetch_t0 = 0
        self._kinds: dict[str, tuple[int, str] | None] = {}
        self._profiler: Any = None
        self._ours: tuple[Any, Any] = (None, None)

    @property
    def installed(self) -> bool:
        return self._profiler is not None

    def take_fetch(self) -> int:
        """The fetch time since the last call (ns), and start again from 0."""
        ns, self.fetch_ns = self.fetch_ns, 0
        return ns

    def _kind(self, action: str) -> tuple[int, str] | None:
        if action == FETCH_ACTION:
            kind: tuple[int, str] | None = _FETCH
        else:
            kind = lightning_hook_part(action, self.own) if self.parts is not None else None
            if kind is not None and self.overrides is not None:
                key, _, hook = action[len("[Callback]") :].rpartition(".")
                try:
                    if not self.overrides(key, hook):
                        kind = None
                except Exception:  # an unknown key: time it
                    pass
        if len(self._kinds) < _MAX_ACTIONS:
            self._kinds[action] = kind
        return kind

    def install(self, profiler: Any) -> bool:
        """Wrap ``profiler.start`` / ``stop`` (on the instance); False when the profiler refuses attributes."""
        self.uninstall()
        try:
            start, stop = profiler.start, profiler.stop
        except AttributeError:
            return False
        kinds = self._kinds
        parts = self.parts
        clock = time.perf_counter_ns

        enter = parts.enter if parts is not None else None
        leave = parts.leave if parts is not None else None
        missing = _MISSING
        saves = self.saves

        def timed_start(action_name: str) -> None:
            kind = kinds.get(action_name, missing)
            if kind is missing:
                kind = self._kind(action_name)
            if kind is not None:
                now = clock()
                if kind is _FETCH:
                    self._fetch_t0 = now
                elif enter is not None:
                    enter(kind[0], kind[1], now)
                    if kind[0] == CHECKPOINT:
                        saves.begin(now)
            start(action_name)

        def timed_stop(action_name: str) -> None:
            stop(action_name)
            kind = kinds.get(action_name)
            if kind is not None:
                now = clock()
                if kind is _FETCH:
                    if self._fetch_t0:
                        self.fetch_ns += now - self._fetch_t0
                        self._fetch_t0 = 0
                elif leave is not None:
                    leave(now)
                    if kind[0] == CHECKPOINT:
                        saves.end(now)

        try:
            profiler.start, profiler.stop = timed_start, timed_stop
        except Exception:  # a profiler that refuses attributes: nothing is timed through it
            return False
        self._profiler = profiler
        self._ours = (timed_start, timed_stop)
        return True

    def uninstall(self) -> None:
        """Put the profiler's own methods back (only where our wrappers are still in place)."""
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            for name, ours in zip(("start", "stop"), self._ours, strict=True):
                if vars(profiler).get(name) is ours:  # not one wrapped again since by someone else
                    with contextlib.suppress(Exception):
                        delattr(profiler, name)
        self._ours = (None, None)
        self._fetch_t0 = 0


KERAS_HOOKS = (
    "on_epoch_begin",
    "on_epoch_end",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_batch_begin",
    "on_batch_end",
    "on_test_begin",
    "on_test_end",
    "on_test_batch_begin",
    "on_test_batch_end",
)
"""The hooks timed: those called inside an epoch."""


class CallbackHooks:
    """Times the hooks of a fit's callbacks (see the module docstring).

    Args:
        parts: the probe that gets the spans.
        own: fitprof's own callback (its hooks are profiling).
        checkpointing: the classes whose hooks are saves (Keras ``ModelCheckpoint``, ``BackupAndRestore``).
        saves: the adapter's :class:`Saves` (the window annotation and the step take-out of each save).
    """

    def __init__(
        self,
        parts: Spans,
        *,
        own: object = None,
        checkpointing: tuple[type, ...] = (),
        saves: Saves | None = None,
    ) -> None:
        self.parts = parts
        self.own = own
        self.checkpointing = checkpointing
        self.saves = saves or Saves()
        self._wrapped: list[tuple[Any, str, Any]] = []
        self._thread = 0

    def install(self, callbacks: Iterable[Any]) -> int:
        """Wrap the overridden hooks of each callback (fitprof's own included); returns how many were wrapped."""
        self.uninstall()
        self._thread = threading.get_ident()
        for cb in callbacks:
            if cb is self.own:
                part, name = PROFILING, type(cb).__name__
            elif self.checkpointing and isinstance(cb, self.checkpointing):
                part, name = CHECKPOINT, type(cb).__name__
            else:
                part, name = CALLBACKS, type(cb).__name__
            for hook in KERAS_HOOKS:
                method = getattr(cb, hook, None)
                if method is None or getattr(method, "_is_default", False):
                    continue
                wrapper = self._wrap(method, part, name)
                try:
                    setattr(cb, hook, wrapper)
                except Exception:  # a callback that refuses attributes: its hooks are other time
                    continue
                self._wrapped.append((cb, hook, wrapper))
        return len(self._wrapped)

    def _wrap(self, method: Callable[..., Any], part: int, name: str) -> Callable[..., Any]:
        enter, leave, clock, thread = self.parts.enter, self.parts.leave, time.perf_counter_ns, self._thread
        get_ident = threading.get_ident

        if part != CHECKPOINT:

            @functools.wraps(method)
            def timed(*args: Any, **kwargs: Any) -> Any:
                if get_ident() != thread:
                    return method(*args, **kwargs)
                enter(part, name, clock())
                try:
                    return method(*args, **kwargs)
                finally:
                    leave(clock())

            return timed

        return _timed_save(method, self.parts, self.saves, name, thread)

    def uninstall(self) -> None:
        """Remove the wrappers still in place (the class's methods are the callbacks' own again)."""
        wrapped, self._wrapped = self._wrapped, []
        for cb, hook, wrapper in wrapped:
            if vars(cb).get(hook) is wrapper:
                with contextlib.suppress(Exception):
                    delattr(cb, hook)

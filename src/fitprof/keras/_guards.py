"""Keras: while a profiling window is open, wrap what ``fit`` calls so that an exception flushes the window first.

Keras has no exception hook: ``model.train_function`` (an error in the user's step or, on TensorFlow, in the
input pipeline; ``KeyboardInterrupt``), the hooks of ``fit``'s ``CallbackList`` (an error in another callback) and,
where Keras fetches each batch in Python (torch), the batch iterator of ``fit``'s epoch iterator (an error in the
user's data) are wrapped while a window is open, and put back when it closes. Outside the window nothing is
wrapped. What cannot be found (Keras internals moved) is left alone: a window still open when ``fit`` has raised is
then stopped at the next ``fit``'s start or when the callback is deleted.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

import keras

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

OnError = Callable[[bool], None]
"""Called before an exception goes on, with whether the open step never finished (``drop_open_step``)."""


class Guards:
    """What is wrapped while one window is open (see the module docstring)."""

    def __init__(self) -> None:
        self._guards: list[tuple[Any, str, Any, Any, bool]] = []

    def __bool__(self) -> bool:
        return bool(self._guards)

    def install(self, model: Any, window: Any, *, python_fetch: bool, on_error: OnError) -> None:
        """Wrap ``model.train_function``, ``fit``'s callback hooks and (``python_fetch``) its batch iterator; on
        JAX hand ``train_function`` the iterator wrapped by the window, so each fetch is an input span."""
        if model is None:
            return
        self._wrap(model, "train_function", lambda: on_error(True))  # the failing step never finished
        self._annotate_fetch(model, window)
        fit_locals = fit_frame_locals(model)
        callbacks = fit_locals.get("callbacks")
        if isinstance(callbacks, keras.callbacks.CallbackList):
            for hook in _GUARDED_HOOKS:
                # A batch-begin hook raised before its step ran; after the others, the open step had finished.
                self._wrap(callbacks, hook, functools.partial(on_error, hook == "on_train_batch_begin"))
        epoch_iterator = fit_locals.get("epoch_iterator")
        current = getattr(epoch_iterator, "_current_iterator", None)
        if python_fetch and current is not None and not isinstance(current, _GuardedIterator):
            self._replace(
                epoch_iterator, "_current_iterator", current, _GuardedIterator(current, lambda: on_error(True))
            )

    def _annotate_fetch(self, model: Any, window: Any) -> None:
        """Keras's JAX ``train_function(state, iterator)`` fetches its batch with ``next(iterator)``, after
        ``on_train_batch_begin``: hand it the iterator wrapped by a window that annotates input."""
        original = getattr(model, "train_function", None)
        if original is None or not hasattr(window, "annotate_input"):
            return

        def annotated(state: Any, iterator: Any, *args: Any, **kwargs: Any) -> Any:
            return original(state, window.annotate_input(iterator), *args, **kwargs)

        self._replace(model, "train_function", original, annotated)

    def _wrap(self, owner: Any, name: str, on_error: Callable[[], None]) -> None:
        original = getattr(owner, name, None)
        if original is None or getattr(original, "_fitprof_guard", False):
            return

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except BaseException:
                on_error()
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

    def remove(self) -> None:
        """Put back what :meth:`install` wrapped (unless something else replaced it since)."""
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


def frame_locals(frame: Any) -> dict[str, Any]:
    """A copy of the local variables of ``frame`` (a frame object), leaving no reference to them in the frame.

    Before Python 3.13, ``frame.f_locals`` of a function's frame is a snapshot dict that the frame keeps until it
    is read again. Kept, the snapshot of ``fit`` would hold the previous epoch's locals, its ``tf.data`` iterator
    among them, until the next read at a window's start, which would then drop them inside the profile: the
    iterator's teardown (seconds with a slow pipeline) recorded before the window's steps. So the snapshot is
    emptied after the copy: it is a cache that Python refills before each use (a trace function's call), never
    the function's variables. A module or class body's ``f_locals`` is its namespace itself, and from 3.13 a view:
    both are left alone.
    """
    snapshot = frame.f_locals
    found = dict(snapshot)
    if type(snapshot) is dict and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        snapshot.clear()
    return found


def fit_frame_locals(model: Any) -> dict[str, Any]:
    """The local variables of the running ``model.fit`` call (its frame is found on the stack by name and
    ``self``; :func:`frame_locals`); empty when there is none."""
    frame = sys._getframe(1)
    for _ in range(64):
        if frame is None:
            break
        if frame.f_code.co_name == "fit":
            found = frame_locals(frame)
            if found.get("self") is model:
                return found
        frame = frame.f_back  # type: ignore[assignment]
    return {}


class _GuardedIterator:
    """An iterator that calls ``on_error`` before an exception (other than ``StopIteration``) of the wrapped
    iterator goes on: the torch backend fetches each batch in Python, outside ``train_function``."""

    _fitprof_guard = True

    def __init__(self, iterator: Any, on_error: Callable[[], None]) -> None:
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

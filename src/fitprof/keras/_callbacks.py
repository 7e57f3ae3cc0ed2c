"""The other callbacks of the running ``fit`` that fitprof reads: found up the stack (Keras gives a callback no
handle on the others), their hooks timed for the epoch's parts, the saves of ``ModelCheckpoint(save_freq=N)``, the
steps a profiling ``keras.callbacks.TensorBoard`` holds, and the callback before whose ``on_epoch_end`` the epoch
closes (:func:`close_before`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from typing import Any

import keras

from fitprof.fit import Busy, FitEngine
from fitprof.fit.hooks import CallbackHooks, Saves
from fitprof.keras._guards import frame_locals


def fit_callbacks(own: Any) -> list[Any]:
    """The callbacks of the running ``fit``: the ``CallbackList`` up the stack that holds ``own`` (empty when
    there is none)."""
    frame = inspect.currentframe()
    try:
        f = frame.f_back if frame is not None else None
        while f is not None:
            owner = frame_locals(f).get("self")
            if isinstance(owner, keras.callbacks.CallbackList):
                found = list(getattr(owner, "callbacks", []) or [])
                if any(cb is own for cb in found):
                    return found
            f = f.f_back
    except Exception:  # a frame we cannot read: no detection, the profiler's own failure warns instead
        pass
    finally:
        del frame
    return []


def time_hooks(
    engine: FitEngine,
    own: Any,
    callbacks: list[Any],
    warn: Callable[[str, str], None],
    *,
    threads: Callable[[], int] | None,
) -> CallbackHooks:
    """Time every callback's overridden hooks for the epoch's parts (``own``'s as profiling, Keras's
    checkpointing callbacks as saves: annotated inside a window and taken out of their step's time); where the
    backend knows its intra-op thread count (``threads``), the epoch parts get it. Undone by the returned hooks' ``uninstall``."""
    hooks = CallbackHooks(
        engine.spans,
        own=own,
        checkpointing=(keras.callbacks.ModelCheckpoint, keras.callbacks.BackupAndRestore),
        saves=Saves(begin=engine.save_begin, end=engine.save_end),
    )
    try:
        hooks.install(callbacks)
    except Exception as err:  # untimed hooks are other time; training goes on
        warn("hooks", f"fitprof: could not time the callbacks' hooks ({err!r}).")
    if threads is not None:
        with contextlib.suppress(Exception):
            engine.cpu_share(threads=threads())
    return hooks


def close_point(own: Any, callbacks: list[Any]) -> tuple[Any | None, bool]:
    """Where the epoch closes: ``(history, later)``. ``history`` is the first ``History`` listed after ``own``
    (Keras appends one after the callbacks given to ``fit``, then ``ProgbarLogger``): the epoch closes just before
    its ``on_epoch_end``, after every callback that can save or log, and it records the final figures. Without one,
    ``later`` says whether any callback comes after ``own`` (the epoch then closes at the next epoch's start or the
    fit's end; else at ``own``'s hook, after which nothing runs)."""
    after = next((callbacks[i + 1 :] for i, cb in enumerate(callbacks) if cb is own), [])
    history = next((cb for cb in after if isinstance(cb, keras.callbacks.History)), None)
    return history, bool(after)


def close_before(callback: Any, close: Callable[[Any], None]) -> Callable[[], None] | None:
    """Call ``close(logs)`` before every ``callback.on_epoch_end(epoch, logs)`` (wrapped on the instance, around
    whatever is there: install it after the hook timers, so that the close is outside their spans). Returns the
    function that undoes it (only while the wrapper is in place), None when the callback refuses attributes."""
    had = "on_epoch_end" in vars(callback)
    method = callback.on_epoch_end

    @functools.wraps(method)
    def closing(epoch: int, logs: Any = None) -> Any:
        close(logs)
        return method(epoch, logs)

    try:
        callback.on_epoch_end = closing
    except Exception:
        return None

    def undo() -> None:
        if vars(callback).get("on_epoch_end") is closing:
            with contextlib.suppress(Exception):
                if had:
                    callback.on_epoch_end = method
                else:
                    del callback.on_epoch_end

    return undo


def saves_every_n_batches(callback: Any) -> bool:
    """Whether ``callback`` is a ``keras.callbacks.ModelCheckpoint`` that saves every N batches."""
    freq = getattr(callback, "save_freq", None)
    return isinstance(callback, keras.callbacks.ModelCheckpoint) and isinstance(freq, int) and freq > 0


def saved_in_last_step(checkpoint: Any) -> bool:
    """Whether a ``ModelCheckpoint(save_freq=N)`` saved in the step that just ended: keras 3.15 sets its batch
    counter back to 0 when it saves (``callbacks/model_checkpoint.py``, ``_should_save_on_batch``)."""
    return getattr(checkpoint, "_last_batch_seen", None) is not None and not getattr(
        checkpoint, "_batches_seen_since_last_saving", 1
    )


def tensorboard_profiles(callback: Any) -> bool:
    """Whether ``callback`` is a ``keras.callbacks.TensorBoard`` with profiling on (``profile_batch`` != 0)."""
    return isinstance(callback, keras.callbacks.TensorBoard) and bool(getattr(callback, "_should_trace", False))


def tensorboard_steps(tb_profilers: list[Any], spe: int) -> list[Busy]:
    """The steps of this epoch the profiling ``keras.callbacks.TensorBoard`` callbacks ``tb_profilers`` hold
    (``spe``: batches per step).

    TensorBoard profiles the fit's global train batches ``start..stop`` once (its own counter, one per
    ``on_train_batch_begin``, 1-based from the fit's start; one per execution under ``steps_per_execution``):
    as steps of this epoch, from the first batch of its first call to the last batch of its last. Whatever
    the order of the callbacks, the engine leaves them to TensorBoard (two profilers cannot run at once)."""
    busy = []
    for tb in tb_profilers:
        try:
            done = int(tb._global_train_batch)  # batches TensorBoard counted before this epoch
            start, stop = int(tb._start_batch), int(tb._stop_batch)
            if getattr(tb, "_is_tracing", False):
                start = done + 1
            elif start <= done:
                continue  # TensorBoard's profile is behind us
        except (AttributeError, TypeError, ValueError):
            continue
        who = f"keras.callbacks.TensorBoard(profile_batch=({tb._start_batch}, {tb._stop_batch}))"
        busy.append(Busy((start - done - 1) * spe + 1, (stop - done) * spe, who, "TensorBoard"))
    return busy

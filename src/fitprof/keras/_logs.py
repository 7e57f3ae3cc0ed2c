"""What Keras's own logging callbacks see of fitprof's keys: the progress bar shows a handful, and a
``CSVLogger`` placed after ``FitProfiler`` gets no ``val_fitprof/*`` columns."""

from __future__ import annotations

import math
from typing import Any

import keras

from fitprof import metrics
from fitprof.keras._guards import frame_locals

PROGBAR_KEYS = (
    metrics.STEP_TIME_MS.key,
    metrics.INPUT_PERCENT.key,
    metrics.SAMPLES_PER_S.key,
    metrics.EPOCH_STEP_TIME_MS_P50.key,
)
"""The fitprof keys Keras's progress bar shows at an epoch's end (when finite): the step time and input share of
the window, its throughput, and the always-on median step time. Every other key, and these, stay in ``logs``, so
``History``, ``CSVLogger`` and ``TensorBoard`` get them all; the bar line stays readable (about 40 keys, NaN
among them, would be printed otherwise)."""


def quiet_progbars(frame: Any) -> list[Any]:
    """The fit's ``keras.callbacks.ProgbarLogger`` instances (``frame``: the ``CallbackList`` that called
    ``on_train_begin``), each given an ``on_epoch_end`` that prints only :data:`PROGBAR_KEYS` of fitprof's keys.

    Keras's progress bar prints every key of ``logs`` it is handed (``Progbar.update(current, values)``; there is no
    key filter, ``stateful_metrics`` only says how a value is averaged), and ``History`` and the bar are handed the
    same dict. So the bar's own hook is given a copy without the other ``fitprof/*`` keys; the instance attribute is
    removed by :func:`restore_progbars`, the class's method takes over again."""
    try:
        caller = frame_locals(frame).get("self")
        if not isinstance(caller, keras.callbacks.CallbackList):
            return []
        progbars = [cb for cb in caller.callbacks if isinstance(cb, keras.callbacks.ProgbarLogger)]
    except Exception:
        return []
    for progbar in progbars:
        original = type(progbar).on_epoch_end

        def on_epoch_end(epoch: int, logs: dict[str, Any] | None = None, _bar: Any = progbar, _f: Any = original):
            return _f(_bar, epoch, progbar_logs(logs))

        progbar.on_epoch_end = on_epoch_end
    return progbars


def say(progbars: list[Any], lines: list[str]) -> None:
    """Print ``lines`` to stdout, each on its own line: a progress bar left mid-line by its last update (Keras's
    ``Progbar.update`` writes ``\\r`` or ``\\n`` before each line and the line break only when it finalizes, which
    its ``ProgbarLogger`` does after FitProfiler's ``on_epoch_end``) gets its line ended first."""
    if not lines:
        return
    midline = keras.config.is_interactive_logging_enabled() and any(
        getattr(cb, "verbose", 0) == 1 and getattr(getattr(cb, "progbar", None), "_last_update", 0) for cb in progbars
    )
    print(("\n" if midline else "") + "\n".join(lines), flush=True)


def restore_progbars(progbars: list[Any]) -> None:
    """Give each progress bar of :func:`quiet_progbars` its class's own ``on_epoch_end`` again."""
    for progbar in progbars:
        progbar.__dict__.pop("on_epoch_end", None)


def progbar_logs(logs: dict[str, Any] | None) -> dict[str, Any] | None:
    """``logs`` without the ``fitprof/*`` keys the progress bar does not show (:data:`PROGBAR_KEYS`, finite)."""
    if logs is None:
        return None

    def shown(key: str, value: Any) -> bool:
        if not key.startswith("fitprof/"):
            return True
        try:
            return key in PROGBAR_KEYS and math.isfinite(float(value))
        except (TypeError, ValueError):
            return False

    return {k: v for k, v in logs.items() if shown(k, v)}


ALWAYS_ON = {
    metrics.STEP_TIME_MS.key: metrics.EPOCH_STEP_TIME_MS_P50.key,
    metrics.INPUT_PERCENT.key: metrics.EPOCH_INPUT_PERCENT.key,
    metrics.SAMPLES_PER_S.key: metrics.EPOCH_SAMPLES_PER_S.key,
}
"""A window key -> the always-on ``fitprof/epoch/*`` key that measures the same over every epoch."""

_MODE = {
    metrics.EPOCH_STEP_TIME_MS_P50.key: "min",
    metrics.EPOCH_INPUT_PERCENT.key: "min",
    metrics.EPOCH_SAMPLES_PER_S.key: "max",
}
"""The ``mode`` a Keras monitor needs for an always-on key: with ``mode="auto"`` Keras raises for any key that is
not a compiled metric or a loss."""


def unwatchable_monitors(frame: Any, every_n_epochs: int) -> list[str]:
    """One sentence for each callback of the fit (``frame``: the ``CallbackList`` that called ``on_train_begin``)
    whose ``monitor`` is a window key while not every epoch is profiled (``every_n_epochs`` > 1): such a key is
    NaN in the epochs without a window (``logs`` keep every key every epoch, for ``CSVLogger``), and Keras's
    monitors count NaN as no improvement (``ReduceLROnPlateau`` cuts the learning rate, ``EarlyStopping``
    stops). The sentence names the always-on key to watch instead."""
    if every_n_epochs <= 1:
        return []
    try:
        caller = frame_locals(frame).get("self")
        callbacks = caller.callbacks if isinstance(caller, keras.callbacks.CallbackList) else []
    except Exception:
        return []
    out = []
    for cb in callbacks:
        key = getattr(cb, "monitor", None)
        if not isinstance(key, str) or key.startswith("val_"):
            continue
        if key.startswith(metrics.PREFIX) and not key.startswith(metrics.EPOCH_PREFIX):
            instead = ALWAYS_ON.get(key, f"a {metrics.EPOCH_PREFIX}* key")
            mode = f" (mode={_MODE[instead]!r})" if instead in _MODE else ""
            out.append(
                f"fitprof: {type(cb).__name__}(monitor={key!r}) watches a key that is NaN in the epochs fitprof does "
                f"not profile (every_n_epochs={every_n_epochs}), which it counts as no improvement; watch {instead} "
                f"instead{mode}, measured every epoch."
            )
    return out


def csv_loggers(frame: Any) -> list[Any]:
    """The ``keras.callbacks.CSVLogger`` instances of the fit, read from the ``CallbackList`` that called
    ``on_train_begin`` (``frame`` is its frame); empty when the caller is something else."""
    try:
        caller = frame_locals(frame).get("self")
        if not isinstance(caller, keras.callbacks.CallbackList):
            return []
        return [cb for cb in caller.callbacks if isinstance(cb, keras.callbacks.CSVLogger)]
    except Exception:
        return []


def no_val_columns(loggers: list[Any], logs: dict[str, Any]) -> None:
    """Keep ``val_fitprof/*`` columns out of a ``CSVLogger`` placed after FitProfiler.

    At its first epoch end ``CSVLogger`` fixes its columns to the sorted keys of ``logs`` and, when none starts
    with ``val_`` (no validation in that epoch), adds ``val_<key>`` for every key (keras 3.15
    ``callbacks/csv_logger.py``): columns that stay ``NA`` for fitprof's keys, since validation is never
    profiled. For each CSVLogger that has not fixed its columns yet, set them as it would, without the
    ``val_fitprof/*`` ones. A CSVLogger placed before FitProfiler has fixed them already and is left alone."""
    keys = sorted(logs)
    if any(k.startswith("val_") for k in keys):
        return  # CSVLogger adds nothing
    for cb in loggers:
        try:
            if cb.keys is None:
                cb.keys = keys + [f"val_{k}" for k in keys if not k.startswith(metrics.PREFIX)]
        except Exception:
            continue

"""Keras: where an epoch closes, whatever the order of the callbacks (``tests/test_epoch_saves.py`` has the real
fits). No training: a ``CallbackList`` is driven the way ``fit`` drives it (as in ``test_keras_logged_keys.py``), in
process; each epoch's save is a ``ModelCheckpoint`` whose ``_save_model`` sleeps :data:`SAVE_S` of that epoch
(nothing written), read back from ``History`` and the per-epoch file. Tolerance: the sleep, up to 15% plus 30 ms
more (a scheduler's delay; a sleep is never shorter).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")

from fitprof import metrics  # noqa: E402
from fitprof.keras import FitProfiler  # noqa: E402
from fitprof.report_files import epoch_file_path, read_epoch_file  # noqa: E402

SAVE_S = (0.10, 0.16, 0.13)
CHECKPOINT_S = metrics.EPOCH_CHECKPOINT_S.key


class SleepySave(keras.callbacks.ModelCheckpoint):  # type: ignore[misc]
    """A ``ModelCheckpoint`` (fitprof counts its hooks as saves) whose save is a sleep of the epoch's length."""

    def __init__(self) -> None:
        super().__init__("unused.keras", save_freq="epoch")
        self.slept: list[float] = []

    def _save_model(self, epoch: int, batch: Any, logs: Any) -> None:
        t0 = time.perf_counter()
        time.sleep(SAVE_S[epoch])
        self.slept.append(time.perf_counter() - t0)


def _drive(tmp: Path, order: str) -> tuple[list[float], list[float], list[float]]:
    """Three epochs through a ``CallbackList`` in ``order`` (``p``: fitprof, ``s``: the save, ``h``: History);
    returns the saves' own times, History's ``checkpoint_s`` and the per-epoch file's."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    fp = FitProfiler(log_dir=tmp, profile_batch=0, verbose=False)
    save, history = SleepySave(), keras.callbacks.History()
    chosen = [{"p": fp, "s": save, "h": history}[c] for c in order]
    callbacks = keras.callbacks.CallbackList(chosen, model=model, epochs=3, steps=4, verbose=0)
    callbacks.on_train_begin()
    for epoch in range(3):
        callbacks.on_epoch_begin(epoch)
        for step in range(4):
            callbacks.on_train_batch_begin(step)
            time.sleep(0.005)
            callbacks.on_train_batch_end(step, {"loss": 1.0})
        callbacks.on_epoch_end(epoch, {"loss": 1.0})
    callbacks.on_train_end()
    records = read_epoch_file(epoch_file_path(tmp, 0))
    assert [r.epoch for r in records] == [0, 1, 2]
    return save.slept, history.history.get(CHECKPOINT_S, []), [r.figures[CHECKPOINT_S] for r in records]


def _own(got: list[float], slept: list[float]) -> bool:
    return len(got) == 3 and all(s <= g <= 1.15 * s + 0.030 for g, s in zip(got, slept, strict=True))


def test_a_save_listed_after_fitprof_is_in_its_epoch_and_in_history(tmp_path: Path) -> None:
    slept, history, written = _drive(tmp_path, "psh")
    print(f"saves {slept}, History {history}, file {written}")
    assert _own(history, slept), (history, slept)  # History records the final parts
    assert written == pytest.approx(history, rel=1e-6)


def test_without_a_history_after_fitprof_the_epoch_closes_at_the_next_epoch(tmp_path: Path) -> None:
    """A ``History`` of the user's own listed first: the epoch closes at the next epoch's start (the last at the
    fit's end): the per-epoch file holds each epoch's own save."""
    slept, history, written = _drive(tmp_path, "hps")
    assert _own(written, slept), (written, slept)
    assert history == []  # it records the logs before fitprof's hook adds its keys


def test_a_save_listed_before_fitprof_was_in_its_epoch_already(tmp_path: Path) -> None:
    slept, history, written = _drive(tmp_path, "sph")
    assert _own(history, slept) and written == pytest.approx(history, rel=1e-6), (history, written, slept)

"""Keras: the keys fitprof adds to ``logs`` are the same, written-out list every epoch, so ``History`` holds one
value per epoch under each (a ``CSVLogger`` fixes its columns at the first epoch it sees).

No training: Keras's ``CallbackList`` is driven the way a custom training loop drives callbacks, each step a few
eager matmuls (what the profiled window sees) and a short sleep (the step time). It runs in-process in a few
seconds; ``test_keras_logs.py`` checks the same keys after a real ``fit``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from expected_keys import EPOCH_KEYS, TRIGGER_KEYS, WINDOW_KEYS  # noqa: E402
from fitprof.keras import FitProfiler  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="needs KERAS_BACKEND=tensorflow")

EPOCHS = (1, 2, 3)  # every_n_epochs=2: epoch 2 profiled, 1 and 3 not
STEPS = 10
TOP_K = 3


@pytest.fixture(scope="module")
def driven(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list[float]], FitProfiler]:
    """Three epochs of ten steps driven through a ``CallbackList`` holding FitProfiler and History."""
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    fp = FitProfiler(
        log_dir=tmp_path_factory.mktemp("keys"), profile_batch=(2, 4), every_n_epochs=2, top_k=TOP_K, verbose=False
    )
    history = keras.callbacks.History()
    callbacks = keras.callbacks.CallbackList([fp, history], model=model, epochs=EPOCHS[-1] + 1, steps=STEPS, verbose=0)
    a = tf.ones((64, 64))
    work = tf.function(lambda x: tf.nn.relu(tf.math.add(tf.linalg.matmul(x, x), x)))
    callbacks.on_train_begin()
    for epoch in EPOCHS:
        callbacks.on_epoch_begin(epoch)
        for step in range(STEPS):
            callbacks.on_train_batch_begin(step)
            work(a).numpy()
            time.sleep(0.005)
            callbacks.on_train_batch_end(step, {"loss": 1.0})
        callbacks.on_epoch_end(epoch, {"loss": 1.0})
    callbacks.on_train_end()
    return history.history, fp


def test_history_holds_the_written_out_keys_once_per_epoch(driven: tuple[dict[str, list[float]], Any]) -> None:
    hist, fp = driven
    assert sorted(fp.reports) == [2]
    assert sorted(hist) == sorted(["loss", *WINDOW_KEYS, *EPOCH_KEYS, *TRIGGER_KEYS])
    lengths = {key: len(values) for key, values in hist.items()}
    assert set(lengths.values()) == {len(EPOCHS)}, lengths  # a short list would be spread over every epoch


def test_unprofiled_epochs_log_nan_and_the_profiled_one_its_report(
    driven: tuple[dict[str, list[float]], Any],
) -> None:
    hist, fp = driven
    report = fp.reports[2]
    for i, epoch in enumerate(EPOCHS):
        window = {k: hist[k][i] for k in WINDOW_KEYS}
        if epoch != 2:
            assert all(math.isnan(v) for v in window.values()), (epoch, window)
            continue
        assert window["fitprof/steps_analyzed"] == 3  # profile_batch=(2, 4)
        assert window["fitprof/step_time_ms"] == pytest.approx(report.step_time_ms, rel=1e-6)
        assert window["fitprof/step_time_ms"] >= 5.0  # each step sleeps 5 ms
        assert len(report.top_ops) == TOP_K
        for k, op in enumerate(report.top_ops, start=1):
            assert window[f"fitprof/top_op_{k}_ms"] == pytest.approx(op.self_ms_per_step, rel=1e-6)
    for i, _ in enumerate(EPOCHS):
        # the clean steps: not the epoch's first ones, nor the window's steps and the step after it
        assert 1 <= hist["fitprof/epoch/steps_timed"][i] < STEPS
        assert hist["fitprof/epoch/step_time_ms_p50"][i] >= 5.0
        assert all(math.isnan(hist[k][i]) for k in TRIGGER_KEYS)

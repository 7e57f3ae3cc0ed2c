"""Keras: the whole dict fitprof adds to each epoch's ``logs``, compared key by key and value by value, on a fake
clock (``time.perf_counter_ns`` patched, as Lightning's ``ThroughputMonitor`` tests patch theirs).

Keras's ``CallbackList`` is driven by hand (as in ``test_keras_logged_keys.py``): every step a few eager matmuls,
which the profiled window records, and 10 ms of the fake clock. The window's figures must be its report's, every
figure timed by fitprof's clock is known exactly, and the process's own readings must be finite numbers.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

sys.path.insert(0, str(Path(__file__).parent))
from engine_fakes import Clock  # noqa: E402
from fitprof import metrics  # noqa: E402
from fitprof.keras import FitProfiler  # noqa: E402
from logged_dict import MEASURED, NAN, PROCESS_EPOCH_KEYS, compare, window_from_report  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="needs KERAS_BACKEND=tensorflow")

EPOCHS, STEPS, STEP_MS, TOP_K = 3, 10, 10.0, 3


class _Logs(keras.callbacks.Callback):
    """Keeps a copy of each epoch's ``logs`` as the callbacks after fitprof see them."""

    def __init__(self) -> None:
        super().__init__()
        self.epochs: list[dict[str, Any]] = []

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epochs.append(dict(logs or {}))


@pytest.fixture(scope="module")
def driven(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Any]:
    clock = Clock()
    patch = pytest.MonkeyPatch()
    patch.setattr(time, "perf_counter_ns", clock)  # every fitprof clock read, the hook timers' included
    try:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        fp = FitProfiler(
            log_dir=tmp_path_factory.mktemp("dict"), profile_batch=(2, 4), every_n_epochs=2, top_k=TOP_K, verbose=False
        )
        fp._engine.clock = fp._engine.parts._clock = clock  # bound when the engine was made
        seen = _Logs()
        callbacks = keras.callbacks.CallbackList([fp, seen], model=model, epochs=EPOCHS, steps=STEPS, verbose=0)
        a = tf.ones((64, 64))
        work = tf.function(lambda x: tf.nn.relu(tf.math.add(tf.linalg.matmul(x, x), x)))
        callbacks.on_train_begin()
        for epoch in range(EPOCHS):
            callbacks.on_epoch_begin(epoch)
            for step in range(STEPS):
                callbacks.on_train_batch_begin(step)
                work(a).numpy()
                clock.tick(STEP_MS)
                callbacks.on_train_batch_end(step, {"loss": 1.0})
            callbacks.on_epoch_end(epoch, {"loss": 1.0})
        callbacks.on_train_end()
    finally:
        patch.undo()
    return seen.epochs, fp


def _expected(fp: Any, epoch: int) -> dict[str, Any]:
    wall_s = STEPS * STEP_MS / 1e3  # the fake clock moves only inside the steps
    expected: dict[str, Any] = {"loss": 1.0, **window_from_report(fp.reports.get(epoch), TOP_K)}
    expected.update(
        {
            metrics.EPOCH_STEP_TIME_MS_P50.key: STEP_MS,
            metrics.EPOCH_STEP_TIME_MS_P90.key: STEP_MS,
            metrics.EPOCH_STEP_TIME_MS_MAX.key: STEP_MS,
            metrics.EPOCH_INPUT_PERCENT.key: NAN,  # TensorFlow's fetch runs inside the traced step: not timed
            metrics.EPOCH_SAMPLES_PER_S.key: NAN,  # driven by hand: no data adapter to give a batch size
            metrics.EPOCH_STEPS_TIMED.key: float(fp.epoch_steps[epoch].steps_timed),
            metrics.EPOCH_WALL_S.key: wall_s,
            metrics.EPOCH_TRAIN_STEPS_S.key: wall_s,
            metrics.EPOCH_INPUT_S.key: NAN,
            metrics.EPOCH_VALIDATION_S.key: 0.0,
            metrics.EPOCH_CHECKPOINT_S.key: 0.0,
            metrics.EPOCH_CALLBACKS_S.key: 0.0,
            metrics.EPOCH_STARTUP_S.key: 0.0,
            metrics.EPOCH_PROFILING_S.key: 0.0,
            metrics.EPOCH_OTHER_S.key: 0.0,
            **dict.fromkeys(PROCESS_EPOCH_KEYS, MEASURED),
            metrics.EPOCH_MEMORY_GROWTH_MB.key: NAN if epoch == 0 else MEASURED,  # against the previous epoch
            **{m.key: NAN for m in metrics.LOADER_METRICS},  # no DataLoader or PyDataset
            **{m.key: NAN for m in metrics.TRIGGER_METRICS},  # no trigger
        }
    )
    return expected


@pytest.mark.parametrize("epoch", range(EPOCHS))
def test_each_epoch_logs_the_whole_expected_dict(driven: tuple[list[dict[str, Any]], Any], epoch: int) -> None:
    logs, fp = driven
    assert sorted(fp.reports) == [0, 2]  # every_n_epochs=2
    assert compare(logs[epoch], _expected(fp, epoch)) == []

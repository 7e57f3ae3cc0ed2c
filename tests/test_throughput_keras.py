"""Issue 16 part 3 on Keras (TensorFlow backend): FLOPs of a training step counted exactly against hand counts
(an MLP and a small CNN, forward and backward), and samples/s and FLOP/s read back from the event file."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from fitprof.keras import FitProfiler  # noqa: E402
from flops_counts import assert_rates, mlp_train_flops  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="needs KERAS_BACKEND=tensorflow")

B = 8
BATCHES = 5
PROFILE = (3, 4)  # FLOPs are counted on step 1, the step before the window's warm-up step (2)


def _scalars(run_dir: Path) -> dict[str, float]:
    """The last value of every scalar in the run's event files, read with tensorboard's own reader."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    out: dict[str, float] = {}
    for tag in acc.Tags()["tensors"]:
        events = acc.Tensors(tag)
        if events and events[0].tensor_proto.dtype != tf.string.as_datatype_enum:
            out[tag] = float(tensor_util.make_ndarray(events[-1].tensor_proto))
    return out


def _fit(tmp: Path, model: Any, x: Any, y: Any, *, dataset: bool) -> FitProfiler:
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    fp = FitProfiler(log_dir=str(tmp), profile_batch=PROFILE, verbose=False)
    if dataset:  # no drop_remainder: the batch dimension is unknown (None) in the element_spec
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(B), epochs=1, verbose=0, callbacks=[fp])
    else:
        model.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False, callbacks=[fp])
    return fp


@pytest.mark.slow
def test_mlp_flops_match_the_hand_count_and_throughput_reads_back(tmp_path: Path) -> None:
    rng = __import__("numpy").random.default_rng(0)
    x = rng.standard_normal((BATCHES * B, 12)).astype("float32")
    y = rng.integers(0, 4, BATCHES * B)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
    fp = _fit(tmp_path, model, x, y, dataset=True)
    report = fp.reports[0]
    assert report.flops_per_step == mlp_train_flops(B)
    logged = _scalars(tmp_path)
    assert_rates(logged, report, batch=B, flops=mlp_train_flops(B), window=PROFILE, rel=1e-5)
    assert "fitprof/mfu" not in logged and "fitprof/items_per_s" not in logged  # CPU; no count_items
    assert math.isnan(report.mfu)


@pytest.mark.slow
def test_cnn_flops_match_the_hand_count(tmp_path: Path) -> None:
    rng = __import__("numpy").random.default_rng(0)
    x = rng.standard_normal((BATCHES * B, 10, 10, 3)).astype("float32")
    y = rng.integers(0, 4, BATCHES * B)
    model = keras.Sequential(
        [
            keras.Input((10, 10, 3)),
            keras.layers.Conv2D(6, 3, activation="relu"),
            keras.layers.Conv2D(5, 3, strides=2, padding="same"),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
        ]
    )
    fp = _fit(tmp_path, model, x, y, dataset=False)
    conv1 = 2 * B * 6 * 8 * 8 * 3 * 3 * 3  # 2 * B * Cout * Hout * Wout * Cin * kh * kw, 10x10 -> 8x8
    conv2 = 2 * B * 5 * 4 * 4 * 6 * 3 * 3  # stride 2, "same" padding: 8x8 -> 4x4
    linear = 2 * B * 80 * 4
    forward = conv1 + conv2 + linear
    # backward: grad-weight of all three, grad-input of conv2 and the dense layer (the first conv's input needs none)
    backward = conv1 + 2 * conv2 + 2 * linear
    assert fp.reports[0].flops_per_step == forward + backward
    assert fp.reports[0].samples_per_step == B


@pytest.mark.slow
def test_the_counted_call_is_the_one_before_the_warm_up_step(tmp_path: Path) -> None:
    """Issue 19 with issue 16: counting slows the step it counts, so the counted call is the one before the window's
    warm-up step (recorded by the profiler), never the warm-up step itself: what ``fit`` calls at each batch, seen
    by a callback placed after FitProfiler (the counting wrapper, then the window's guard, then Keras's own)."""
    seen: list[str] = []

    class Spy(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            seen.append(getattr(self.model.train_function, "__name__", ""))

    rng = __import__("numpy").random.default_rng(0)
    x = rng.standard_normal((BATCHES * B, 12)).astype("float32")
    y = rng.integers(0, 4, BATCHES * B)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    fp = FitProfiler(log_dir=str(tmp_path), profile_batch=PROFILE, verbose=False)
    model.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False, callbacks=[fp, Spy()])
    # step 1 counted; step 2 the warm-up step and steps 3-4 analysed, all inside the window; step 5 plain
    assert seen[:4] == ["counting", "guarded", "guarded", "guarded"], seen
    assert seen[4] not in ("counting", "guarded") and len(seen) == BATCHES, seen
    assert fp.reports[0].steps_analyzed == 2 and fp.reports[0].flops_per_step == 2 * (
        2 * B * 12 * 4
    )  # forward, grad-weight

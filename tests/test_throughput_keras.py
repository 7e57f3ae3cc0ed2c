"""On Keras (TensorFlow backend): FLOPs of a training step counted exactly against hand counts
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
    """Counting slows the step it counts, so the counted call is the one before the window's
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


class GuideModel(keras.Model):
    """A custom ``train_step`` as the keras.io guide "Customizing what happens in fit()" writes it: the loss from
    ``compute_loss``, then each metric updated, the loss metric with the mean loss and no sample weight (so a
    metric's count grows by 1 a step, not by the batch). ``own_tracker``: the guide's variant with its own
    ``Mean`` loss tracker instead of Keras's."""

    def __init__(self, *args: Any, own_tracker: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.own_tracker = keras.metrics.Mean(name="loss") if own_tracker else None

    @property
    def metrics(self) -> list[Any]:
        return [self.own_tracker] if self.own_tracker is not None else super().metrics

    def train_step(self, data: Any) -> dict[str, Any]:
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def _guide_mlp(own_tracker: bool) -> Any:
    inputs = keras.Input((12,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    return GuideModel(inputs, keras.layers.Dense(4)(hidden), own_tracker=own_tracker)


@pytest.mark.parametrize("own_tracker", [False, True], ids=["keras-tracker", "own-tracker"])
def test_a_custom_train_step_reads_the_batch_from_the_data(tmp_path: Path, own_tracker: bool) -> None:
    rng = __import__("numpy").random.default_rng(0)
    x = rng.standard_normal((BATCHES * B, 12)).astype("float32")
    y = rng.integers(0, 4, BATCHES * B)
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fp = _fit(tmp_path, _guide_mlp(own_tracker), x, y, dataset=False)
    assert not [str(w.message) for w in seen if "fitprof" in str(w.message)]
    report = fp.reports[0]
    assert report.samples_per_step == B  # the metric's count grew by 1 a step
    forward = 2 * B * 12 * 16 + 2 * B * 16 * 4
    backward = 2 * B * 12 * 16 + (2 * B * 16 * 4 + 2 * B * 16 * 4)
    assert report.flops_per_step == forward + backward
    logged = _scalars(tmp_path)
    summed_s = report.step_time_ms * report.steps_analyzed / 1000.0
    assert logged["fitprof/samples_per_s"] == pytest.approx(B * report.steps_analyzed / summed_s, rel=1e-5)


def test_a_custom_train_step_on_data_of_unknown_batch_size_gives_nan_with_one_warning(tmp_path: Path) -> None:
    rng = __import__("numpy").random.default_rng(0)
    x = rng.standard_normal((BATCHES * B, 12)).astype("float32")
    y = rng.integers(0, 4, BATCHES * B)
    import fitprof

    with pytest.warns(fitprof.FitProfilerWarning, match="samples per step are unknown") as seen:
        fp = _fit(tmp_path, _guide_mlp(False), x, y, dataset=True)  # no drop_remainder: no static batch size
    assert len([w for w in seen if "samples per step" in str(w.message)]) == 1
    report = fp.reports[0]
    assert math.isnan(report.samples_per_step) and math.isnan(report.samples_per_s)
    assert "fitprof/samples_per_s" not in _scalars(tmp_path)


_MIRRORED_CHILD = """
import json, os, sys, warnings
os.environ["KERAS_BACKEND"] = "tensorflow"
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np
from fitprof.keras import FitProfiler
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
rng = np.random.default_rng(0)
B = int(sys.argv[2])
x = rng.standard_normal((5 * B, 12)).astype("float32")
y = rng.integers(0, 4, 5 * B)
fp = FitProfiler(log_dir=sys.argv[1], profile_batch=(3, 4), verbose=False)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    model.fit(x, y, batch_size=B, epochs=1, verbose=0, callbacks=[fp])
r = fp.reports[0]
print("RESULT" + json.dumps({"replicas": strategy.num_replicas_in_sync, "samples_per_step": r.samples_per_step,
    "flops_per_step": r.flops_per_step, "mfu_note": r.mfu_note,
    "warnings": [str(w.message) for w in seen if "fitprof" in str(w.message)]}))
"""


@pytest.mark.slow
def test_mirrored_strategy_in_one_process_counts_one_replicas_flops(tmp_path: Path) -> None:
    from keras_child import run_result

    got, _ = run_result(["-c", _MIRRORED_CHILD, str(tmp_path), str(B)])
    assert got["replicas"] == 2
    per_replica = B // 2
    forward = 2 * per_replica * 12 * 16 + 2 * per_replica * 16 * 4
    backward = 2 * per_replica * 12 * 16 + 2 * (2 * per_replica * 16 * 4)
    assert got["samples_per_step"] == B  # the whole batch: both replicas' samples
    assert got["flops_per_step"] == forward + backward  # one replica's step, against one device's peak
    assert got["warnings"] == [] and 'File "' not in got["mfu_note"], got


def test_no_note_or_warning_carries_a_traceback() -> None:
    """The note TensorFlow's tracing error gave under MirroredStrategy, as the FLOP count wrapped it (``{err!r}``),
    and a Python traceback: each reaches the user as its error line only."""
    import warnings

    from fitprof._warn import describe_error, no_traceback, warn

    tf_note = (
        "the training step could not be traced for counting (ValueError('in user code:\\n\\n    File "
        '"/venv/keras/src/backend/tensorflow/trainer.py", line 59, in train_step  *\\n        y_pred = self(x, '
        'training=True)\\n    File "/venv/keras/src/layers/layer.py", line 907, in __call__\\n        raise '
        "ValueError(\\n\\n    ValueError: Only input tensors may be passed as positional arguments. PerReplica:{\\n"
        '      0: Tensor("data:0", shape=(4, 12), dtype=float32)\\n    }\'))'
    )
    short = no_traceback(tf_note)
    assert 'File "' not in short and "in user code" not in short and "y_pred = self" not in short
    assert short.startswith("the training step could not be traced for counting (ValueError(")
    assert "Only input tensors may be passed as positional arguments" in short and "\\n" not in short

    try:
        exec(compile("def f():\n    raise KeyError('k')\nf()", "user.py", "exec"))
    except KeyError as err:
        import traceback

        dumped = "".join(traceback.format_exception(err))
    assert "Traceback" in dumped and describe_error(KeyError("k")) == "KeyError: 'k'"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warn(f"fitprof: the count failed:\n{dumped}")
    (message,) = [str(w.message) for w in seen]
    assert message == "fitprof: the count failed: KeyError: 'k'"
    plain = "fitprof: a plain warning\nwith two lines"
    assert no_traceback(plain) == plain

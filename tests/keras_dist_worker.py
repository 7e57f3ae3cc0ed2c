"""One process of the Keras distributed tests (run by tests/test_distributed_keras.py, not collected by pytest).

python keras_dist_worker.py mirrored LOGDIR
python keras_dist_worker.py mwms LOGDIR TASK_INDEX PORT0,PORT1 [SLOW_TASK [RANKS]]   (RANKS: "0" or "0,1")
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["KERAS_BACKEND"] = "tensorflow"
mode, logdir = sys.argv[1], sys.argv[2]
task = int(sys.argv[3]) if mode == "mwms" else 0
if mode == "mwms":
    ports = sys.argv[4].split(",")
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": task}}
    )
slow_task = int(sys.argv[5]) if len(sys.argv) > 5 else -1
ranks = [int(r) for r in sys.argv[6].split(",")] if len(sys.argv) > 6 else None

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if mode == "mirrored":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy: tf.distribute.Strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

import keras  # noqa: E402

from fitprof.keras import FitProfiler  # noqa: E402

rng = np.random.default_rng(0)
x = rng.random((16 * 14, 16), dtype=np.float32)
y = rng.integers(0, 4, 16 * 14)


def produce(a: np.ndarray) -> np.ndarray:
    if task == slow_task:
        time.sleep(0.02)  # the planted straggler: 20 ms per sample in this rank's input pipeline
    return a


ds = tf.data.Dataset.from_tensor_slices((x, y))
ds = ds.map(lambda a, b: (tf.ensure_shape(tf.numpy_function(produce, [a], tf.float32), (16,)), b)).batch(16)
options = tf.data.Options()
options.experimental_optimization.inject_prefetch = False
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
ds = ds.with_options(options)

with strategy.scope():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
profiler = FitProfiler(logdir, profile_batch=(3, 6), ranks=ranks)
if mode == "mirrored":
    hist = model.fit(ds, epochs=2, verbose=0, callbacks=[profiler]).history
else:
    # Keras 3's fit() fails under MultiWorkerMirroredStrategy with or without any callback ("Invalid reduction
    # dimension 0 for input with 0 dimensions", tensorflow/tensorflow#72388, still so in keras 3.15.1), so the
    # callback is driven the way a custom training loop drives Keras callbacks: a CallbackList around a
    # strategy.run step. The fetch (next(iterator)) happens after on_train_batch_begin, as in fit().
    optimizer = keras.optimizers.SGD()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    dist_ds = strategy.experimental_distribute_dataset(ds)

    @tf.function
    def train_step(batch):
        def step_fn(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True)) / 16.0
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        per_replica = strategy.run(step_fn, args=batch)
        return strategy.reduce("SUM", per_replica, axis=None)

    history = keras.callbacks.History()
    callbacks = keras.callbacks.CallbackList([profiler, history], model=model)
    callbacks.on_train_begin()
    for epoch in range(2):
        callbacks.on_epoch_begin(epoch)
        iterator = iter(dist_ds)
        for step in range(14):
            callbacks.on_train_batch_begin(step)
            loss = train_step(next(iterator))
            callbacks.on_train_batch_end(step, {"loss": float(loss)})
        callbacks.on_epoch_end(epoch, {})
    callbacks.on_train_end()
    hist = history.history
print(
    "RESULT"
    + json.dumps(
        {
            "rank": profiler._engine.rank,  # the rank and world size fitprof detected
            "world": profiler._engine.world,
            "reports": {str(e): r.scalars() for e, r in profiler.reports.items()},
            "history": {k: v for k, v in hist.items() if k.startswith("fitprof/")},
            "traces": {str(e): str(p) for e, p in profiler.trace_paths.items()},
        }
    ),
    flush=True,
)

"""Cost of fitprof's Keras hooks outside the profiled window, and of the epoch-end analysis.

    python benchmarks/keras_overhead.py [--repeats 7] [--steps 200]

In one process, interleaved: the same model and data are fit for one epoch of ``--steps`` steps with
(a) no callback, (b) ``FitProfiler`` whose window lies outside the epoch (only its hooks run), (c) Keras's
``TensorBoard(profile_batch=0)`` (its hooks, no profiling). Prints the median wall time per step and the
ratios to (a); then the analysis time of one 5-step window (XSpace read + analysis), median of repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    import fitprof
    from fitprof.keras import FitProfiler

    rng = np.random.default_rng(0)
    x = rng.random((args.steps * 32, 16), dtype=np.float32)
    y = rng.integers(0, 10, args.steps * 32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).cache().prefetch(4)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=1, verbose=0)  # compile and warm up once
    tmp = tempfile.mkdtemp()

    def callbacks(kind: str) -> list[keras.callbacks.Callback]:
        if kind == "fitprof":
            return [FitProfiler(os.path.join(tmp, "fp"), profile_batch=(10**6, 10**6))]
        if kind == "keras_tensorboard":
            return [keras.callbacks.TensorBoard(os.path.join(tmp, "tb"), profile_batch=0, write_graph=False)]
        return []

    kinds = ["none", "fitprof", "keras_tensorboard"]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    warnings.simplefilter("ignore")
    for rep in range(args.repeats):
        for kind in kinds[rep % 3 :] + kinds[: rep % 3]:  # rotate the order: no kind always runs first
            cbs = callbacks(kind)
            t0 = time.perf_counter()
            model.fit(ds, epochs=1, verbose=0, callbacks=cbs)
            times[kind].append((time.perf_counter() - t0) / args.steps * 1e3)
    base = statistics.median(times["none"])
    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, {args.steps} steps/epoch, {args.repeats} repeats")
    print(f"{'callbacks':<20} {'ms/step (median)':>16} {'ratio to none':>14}")
    for kind in kinds:
        med = statistics.median(times[kind])
        print(f"{kind:<20} {med:>16.4f} {med / base:>14.4f}")

    # The hook itself, called directly outside the window.
    hook = FitProfiler(os.path.join(tmp, "hook"), profile_batch=(10**6, 10**6))
    hook.on_epoch_begin(0)
    n = 200_000
    t0 = time.perf_counter()
    for b in range(n):
        hook.on_train_batch_begin(b)
    print(f"on_train_batch_begin outside the window: {(time.perf_counter() - t0) / n * 1e9:.0f} ns per call")

    # Analysis time of one window: profile steps 6-10 of a real fit, then time read + analysis.
    prof = FitProfiler(os.path.join(tmp, "window"))
    model.fit(ds.take(20), epochs=1, verbose=0, callbacks=[prof])
    path = prof.trace_paths[0]
    t = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        fitprof.analyze(path)
        t.append(time.perf_counter() - t0)
    print(f"epoch-end analysis of a 5-step window ({path.stat().st_size} bytes): {statistics.median(t) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()

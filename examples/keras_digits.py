"""A small convolutional classifier on scikit-learn's handwritten digits, profiled by fitprof.

    python examples/keras_digits.py --logdir logs/keras [--epochs N] [--slow-input]

The data (``sklearn.datasets.load_digits``: 1,797 8x8 images, shipped with scikit-learn, no download) is fed
through ``tf.data``. By default the pipeline is fast (cached, prefetched). ``--slow-input`` adds real
per-sample CPU augmentation (random rotation and blur with SciPy, in a ``py_function``) without parallel
calls, which makes the run input-bound. It runs on every Keras backend (``KERAS_BACKEND=tensorflow``, ``torch`` or
``jax``); on JAX the fast pipeline is input-bound too (Keras iterates ``tf.data`` eagerly there, see the README).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np


def make_dataset(slow_input: bool, batch_size: int = 32) -> tuple[Any, Any]:
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int32")
    n_train = 1536
    train = tf.data.Dataset.from_tensor_slices((x[:n_train], y[:n_train]))
    val = tf.data.Dataset.from_tensor_slices((x[n_train:], y[n_train:])).batch(batch_size)
    if slow_input:
        from scipy import ndimage

        rng = np.random.default_rng(0)

        def augment(image: np.ndarray) -> np.ndarray:
            img = image[..., 0]
            big = ndimage.zoom(img, 8, order=3)  # 64x64: enough real work per sample
            big = ndimage.rotate(big, rng.uniform(-15, 15), reshape=False, order=3)
            big = ndimage.gaussian_filter(big, sigma=rng.uniform(0.2, 1.0))
            return ndimage.zoom(big, 1 / 8, order=1)[..., None].astype("float32")

        def tf_augment(image: Any, label: Any) -> tuple[Any, Any]:
            out = tf.numpy_function(augment, [image], tf.float32)
            return tf.ensure_shape(out, (8, 8, 1)), label

        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False  # keep the wait visible, as written
        train = train.shuffle(n_train, seed=0).map(tf_augment).batch(batch_size).with_options(options)
    else:
        train = train.cache().shuffle(n_train, seed=0).batch(batch_size).prefetch(tf.data.AUTOTUNE)
    return train, val


def build_model() -> Any:
    import keras

    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main(argv: list[str] | None = None) -> dict[int, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logdir", required=True, help="TensorBoard run directory")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--slow-input", action="store_true", help="real per-sample CPU augmentation")
    args = parser.parse_args(argv)

    from fitprof.profilers.quiet import quiet_profiler_lines

    # TensorFlow's C++ logs "oneDNN custom operations are on" (and absl's "All log messages before
    # absl::InitializeLog()" line), twice, as it is imported, before TF_CPP_MIN_LOG_LEVEL applies: held back here
    with quiet_profiler_lines():
        import keras
        import tensorflow  # noqa: F401  (tf.data feeds every backend)
    from _table import print_reports

    from fitprof.keras import FitProfiler

    keras.utils.set_random_seed(0)
    train, val = make_dataset(args.slow_input)
    profiler = FitProfiler(log_dir=args.logdir)
    model = build_model()
    model.fit(train, validation_data=val, epochs=args.epochs, callbacks=[profiler], verbose=2, shuffle=False)
    print_reports(profiler.reports, args.logdir)
    return profiler.reports


if __name__ == "__main__":
    main()

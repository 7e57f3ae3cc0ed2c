"""A full log disk under Keras on TensorFlow: the window's ``.xplane.pb`` cannot be moved into its session folder.
The window is analysed from the profiler's temporary copy, one warning per fit says the profile was not kept, and
no empty session folder is left for the Profile tab."""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import fitprof.profilers.tensorflow as tf_window  # noqa: E402
from fitprof._warn import WarnOnce  # noqa: E402
from fitprof.keras import FitProfiler  # noqa: E402
from fitprof.traces import read_trace  # noqa: E402
from small_disk import nearly_full_disk  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="needs KERAS_BACKEND=tensorflow")


def _no_room(src: object, dst: object) -> None:
    raise OSError(28, "No space left on device")


def test_a_profile_that_cannot_be_moved_is_analysed_from_its_copy_and_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tf_window, "move_into_place", _no_room)
    said: list[str] = []
    warn = WarnOnce(said.append)
    paths = []
    for epoch in range(2):
        window = tf_window.TFProfileWindow(str(tmp_path), epoch=epoch, warn=warn)
        window.start()
        for step in (1, 2):
            window.begin_step(step)
            tf.reduce_sum(tf.ones((64, 64)) @ tf.ones((64, 64))).numpy()
        path = window.stop()
        assert window.session_dir is None and isinstance(window.save_error, OSError)
        assert path.is_file() and not path.is_relative_to(tmp_path)
        assert len(read_trace(path)) > 0  # the copy reads: the window's figures come from it
        window.cleanup()
        paths.append(path)
    assert not any(p.exists() for p in paths)  # each copy deleted after its analysis
    assert len(said) == 1 and "could not write the profile" in said[0] and "No space left" in said[0], said
    assert list(tmp_path.glob("plugins/profile/*")) == []  # no empty session for the Profile tab


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


def _data() -> tf.data.Dataset:
    x = tf.random.stateless_uniform((96, 8), seed=(1, 2))
    return tf.data.Dataset.from_tensor_slices((x, tf.reduce_sum(x, axis=1))).batch(8)


@pytest.mark.slow
def test_keras_on_a_full_disk_logs_every_window_and_warns_once(tmp_path: Path) -> None:
    with nearly_full_disk(tmp_path / "disk") as disk:
        log_dir = disk / "logs"
        before = set(Path(tempfile.gettempdir()).glob("fitprof-tf-*"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hist = _model().fit(
                _data(), epochs=3, verbose=0, callbacks=[FitProfiler(str(log_dir), profile_batch=(2, 4))]
            )
        messages = [str(w.message) for w in caught if str(w.message).startswith("fitprof: ")]
        assert hist.history["fitprof/steps_analyzed"] == [3.0, 3.0, 3.0]
        assert sum("could not write" in m for m in messages) == 1, messages
        assert [p for p in log_dir.glob("plugins/profile/*") if not any(p.iterdir())] == []  # no empty session
        assert set(Path(tempfile.gettempdir()).glob("fitprof-tf-*")) <= before  # the temporary copies deleted

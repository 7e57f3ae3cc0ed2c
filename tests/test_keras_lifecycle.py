"""Keras lifecycle cases that must never break a fit: exceptions inside the window, a log_dir that cannot be
written, fit twice, fit then evaluate/predict."""

from __future__ import annotations

import gc
import os
import stat
import sys
import warnings
import weakref
from pathlib import Path

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from fitprof import FitProfilerWarning  # noqa: E402
from fitprof.keras import FitProfiler  # noqa: E402
from fitprof.keras._guards import fit_frame_locals, frame_locals  # noqa: E402
from fitprof.traces import read_trace  # noqa: E402
from host_memory import needs_statm, rss_mb  # noqa: E402
from warned import fitprof_messages  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="needs KERAS_BACKEND=tensorflow")


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


def _data(n_batches: int = 12) -> tf.data.Dataset:
    x = tf.random.stateless_uniform((n_batches * 8, 8), seed=(1, 2))
    return tf.data.Dataset.from_tensor_slices((x, tf.reduce_sum(x, axis=1))).batch(8)


def _profiler_running() -> bool:
    try:
        tf.profiler.experimental.start(os.devnull)
    except Exception:  # AlreadyExistsError: somebody's profiler is still running
        return True
    tf.profiler.experimental.stop(save=False)
    return False


class Boom(Exception):
    pass


@pytest.mark.slow
def test_exception_in_user_step_flushes_window_and_reaches_user(tmp_path: Path) -> None:
    calls = {"n": 0}

    def failing_gen():  # a data source that fails at batch 5, inside the window (steps 3-6)
        for i in range(12):
            calls["n"] += 1
            if i == 4:
                raise Boom("user error at batch 5")
            yield tf.ones((8, 8)), tf.ones((8,))

    ds = tf.data.Dataset.from_generator(failing_gen, output_signature=(tf.TensorSpec((8, 8)), tf.TensorSpec((8,))))
    profiler = FitProfiler(tmp_path, profile_batch=(3, 6))
    with pytest.raises(Exception, match="user error at batch 5"):
        _model().fit(ds, epochs=1, verbose=0, callbacks=[profiler])
    assert not _profiler_running()  # stopped
    assert 0 in profiler.reports  # the partial window was flushed and analysed
    assert profiler.reports[0].steps_analyzed == 2  # steps 3 and 4 completed before step 5 failed
    assert len(list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))) == 1


@pytest.mark.slow
def test_keyboard_interrupt_inside_window(tmp_path: Path) -> None:
    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 3:
                raise KeyboardInterrupt

    profiler = FitProfiler(tmp_path, profile_batch=(3, 6))
    with pytest.raises(KeyboardInterrupt):
        _model().fit(_data(), epochs=1, verbose=0, callbacks=[profiler, Interrupt()])
    # The interrupt came from a hook, not the step: fit's callback list is wrapped while the window is open.
    assert not _profiler_running()
    assert profiler.reports[0].steps_analyzed == 2  # steps 3 and 4 had run
    hist = _model().fit(_data(), epochs=1, verbose=0, callbacks=[profiler])
    assert not _profiler_running()
    assert "fitprof/step_time_ms" in hist.history


@pytest.mark.slow
def test_unwritable_log_dir_warns_and_logs_still_get_scalars(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root ignores permission bits: use a path under a regular file instead, which nobody can create
        blocker = tmp_path / "file"
        blocker.write_text("not a directory")
        log_dir = blocker / "logs"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
        log_dir = ro / "logs"
    profiler = FitProfiler(log_dir, profile_batch=(2, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = _model().fit(_data(), epochs=2, verbose=0, callbacks=[profiler])
    assert len(hist.history["loss"]) == 2
    assert hist.history["fitprof/steps_analyzed"] == [3.0, 3.0]
    messages = [str(w.message) for w in caught if str(w.message).startswith("fitprof: ")]
    assert sum("could not write" in m for m in messages) == 1, messages  # one warning, not one per epoch
    assert not log_dir.exists()


@pytest.mark.slow
def test_fit_twice_and_evaluate_predict(tmp_path: Path) -> None:
    model = _model()
    profiler = FitProfiler(tmp_path / "run dir é", profile_batch=(2, 3))  # spaces and non-ASCII
    model.fit(_data(), epochs=1, verbose=0, callbacks=[profiler])
    model.evaluate(_data(4), verbose=0, callbacks=[profiler])
    model.predict(_data(4), verbose=0, callbacks=[profiler])
    hist = model.fit(_data(), epochs=2, verbose=0, callbacks=[profiler])
    assert hist.history["fitprof/steps_analyzed"] == [2.0, 2.0]  # windows counted from this fit's start
    assert sorted(profiler.reports) == [0, 1]
    assert len(list((tmp_path / "run dir é").glob("plugins/profile/*/*.xplane.pb"))) == 3
    assert not _profiler_running()


@pytest.mark.slow
def test_windows_separators_in_log_dir(tmp_path: Path) -> None:
    profiler = FitProfiler(str(tmp_path) + "\\runs\\first run", profile_batch=(2, 3))
    _model().fit(_data(4), epochs=1, verbose=0, callbacks=[profiler])
    assert len(list((tmp_path / "runs" / "first run").glob("plugins/profile/*/*.xplane.pb"))) == 1


@pytest.mark.slow
def test_epoch_shorter_than_window_profiles_what_there_is(tmp_path: Path) -> None:
    profiler = FitProfiler(tmp_path, profile_batch=(3, 50))
    with pytest.warns(FitProfilerWarning, match="ended after step 6, inside the window"):
        hist = _model().fit(_data(6), epochs=1, verbose=0, callbacks=[profiler])
    assert hist.history["fitprof/steps_analyzed"] == [4.0]  # steps 3-6


_caught = fitprof_messages


@pytest.mark.slow
def test_keras_tensorboard_profiling_the_same_steps(tmp_path: Path) -> None:
    tb = keras.callbacks.TensorBoard(str(tmp_path / "tb"), profile_batch=(3, 5), write_graph=False)
    profiler = FitProfiler(tmp_path / "fp", profile_batch=(3, 5))
    hist: dict = {}
    msgs = _caught(lambda: hist.update(_model().fit(_data(), epochs=2, verbose=0, callbacks=[tb, profiler]).history))
    assert len(hist["loss"]) == 2
    # fitprof leaves TensorBoard's steps (epoch 0) to it, says so once, and profiles epoch 1
    assert sum("leaves those steps to TensorBoard" in m for m in msgs) == 1
    assert list((tmp_path / "tb").rglob("*.xplane.pb"))  # Keras's profile is intact
    assert sorted(profiler.reports) == [1]
    assert not _profiler_running()


@pytest.mark.slow
def test_profiler_that_fails_to_start_or_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_stop = tf.profiler.experimental.stop

    def broken_stop(*args: object, **kwargs: object) -> None:
        real_stop(save=False)
        raise RuntimeError("simulated stop failure")

    monkeypatch.setattr(tf.profiler.experimental, "stop", broken_stop)
    profiler = FitProfiler(tmp_path / "a", profile_batch=(2, 3))
    hist: dict = {}
    msgs = _caught(lambda: hist.update(_model().fit(_data(), epochs=2, verbose=0, callbacks=[profiler]).history))
    assert len(hist["loss"]) == 2 and profiler.reports == {}
    assert sum("dropped" in m and "simulated stop failure" in m for m in msgs) == 1
    monkeypatch.undo()
    assert not _profiler_running()

    def broken_start(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated start failure")

    monkeypatch.setattr(tf.profiler.experimental, "start", broken_start)
    profiler = FitProfiler(tmp_path / "b", profile_batch=(2, 3))
    msgs = _caught(lambda: _model().fit(_data(), epochs=2, verbose=0, callbacks=[profiler]))
    assert sum("profiling skipped" in m and "simulated start failure" in m for m in msgs) == 1
    # and at the end, once: nothing was profiled, because the profiler could not start
    assert sum("nothing was profiled" in m and "simulated start failure" in m for m in msgs) == 1
    assert profiler.reports == {}


@pytest.mark.slow
def test_stop_training_inside_the_window_flushes_it(tmp_path: Path) -> None:
    class StopAt4(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 3:  # step 4
                self.model.stop_training = True

    profiler = FitProfiler(tmp_path, profile_batch=(3, 6))
    _caught(lambda: _model().fit(_data(), epochs=3, verbose=0, callbacks=[profiler, StopAt4()]))
    assert sorted(profiler.reports) == [0]
    assert profiler.reports[0].steps_analyzed == 2  # steps 3 and 4
    assert not _profiler_running()


@pytest.mark.slow
def test_steps_per_execution_is_said(tmp_path: Path) -> None:
    model = _model()
    model.compile("sgd", "mse", steps_per_execution=2)
    profiler = FitProfiler(tmp_path, profile_batch=(2, 5))
    msgs = _caught(lambda: model.fit(_data(), epochs=1, verbose=0, callbacks=[profiler]))
    assert any("steps_per_execution=2" in m for m in msgs)
    # Keras calls on_train_batch_begin at batches 0, 2, 4, ...: the window opens at the first call inside it
    # (step 3) and marks each execution of two batches as one step (3-4, 5-6).
    assert profiler.reports[0].steps_analyzed == 2


@pytest.mark.slow
def test_trace_size_warning_names_the_file(tmp_path: Path) -> None:
    profiler = FitProfiler(tmp_path, profile_batch=(2, 3), max_trace_mb=0.001)
    msgs = _caught(lambda: _model().fit(_data(), epochs=2, verbose=0, callbacks=[profiler]))
    sized = [m for m in msgs if "max_trace_mb=0.001" in m]
    assert len(sized) == 1 and str(profiler.trace_paths[0]) in sized[0]


@pytest.mark.slow
def test_keep_last_windows_keeps_scalars_and_reports(tmp_path: Path) -> None:
    profiler = FitProfiler(tmp_path, profile_batch=(2, 3), keep_last_windows=2)
    hist = _model().fit(_data(6), epochs=4, verbose=0, callbacks=[profiler]).history
    assert len(hist["fitprof/step_time_ms"]) == 4
    assert len(list(tmp_path.glob("plugins/profile/*"))) == 2  # the last two windows' sessions
    assert len(list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))) == 2
    assert len(list(tmp_path.glob("plugins/fitprof/*.json"))) == 4  # every window's report stays
    assert not profiler.trace_paths[0].exists() and profiler.trace_paths[3].exists()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_trace_mb": 0}, ValueError),
        ({"max_trace_mb": "big"}, TypeError),
        ({"keep_last_windows": 0}, ValueError),
        ({"keep_last_windows": 1.5}, TypeError),
        ({"ranks": []}, ValueError),
        ({"ranks": [0, -1]}, ValueError),
        ({"ranks": "0"}, TypeError),
        ({"ranks": [True]}, TypeError),
    ],
)
def test_bad_limits(kwargs: dict, error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(kwargs))):
        FitProfiler(**kwargs)


@pytest.mark.slow
def test_a_rank_left_out_opens_no_window(tmp_path: Path) -> None:
    """One process is rank 0 of 1: ranks=[1] profiles nothing, and rank 0 says that rank 1 does not exist."""
    left_out = FitProfiler(tmp_path / "out", profile_batch=(2, 3), ranks=[1])
    msgs = _caught(lambda: _model().fit(_data(), epochs=1, verbose=0, callbacks=[left_out]))
    assert (left_out.ranks, left_out.reports) == (frozenset({1}), {})
    assert msgs == ["fitprof: ranks=[1] names no rank of this run (ranks 0-0); nothing is profiled."]
    assert not list((tmp_path / "out").glob("plugins/profile/*/*.xplane.pb"))
    chosen = FitProfiler(tmp_path / "in", profile_batch=(2, 3), ranks=0)
    _model().fit(_data(), epochs=1, verbose=0, callbacks=[chosen])
    assert chosen.reports[0].steps_analyzed == 2


@pytest.mark.slow
def test_a_fit_after_an_exception_joins_the_gather_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 of 2 (the other rank's vector empty): a window flushed after an exception is not gathered (the other
    ranks may be anywhere), but every profiled epoch of the next fit is, as on a rank that never profiled."""
    from fitprof import cross_rank
    from fitprof.keras import _distributed

    gathers: list[int] = []

    def gather(model, backend, vector, world):
        gathers.append(len(vector))
        return [vector, cross_rank.pack(None)]

    monkeypatch.setattr(_distributed, "rank_and_world", lambda model, backend: (0, 2))
    monkeypatch.setattr(_distributed, "all_gather_vectors", gather)

    def failing_gen():
        for i in range(12):
            if i == 4:
                raise Boom("user error at batch 5")
            yield tf.ones((8, 8)), tf.ones((8,))

    ds = tf.data.Dataset.from_generator(failing_gen, output_signature=(tf.TensorSpec((8, 8)), tf.TensorSpec((8,))))
    profiler = FitProfiler(tmp_path, profile_batch=(3, 6))
    model = _model()
    with pytest.raises(Exception, match="user error at batch 5"):
        model.fit(ds, epochs=1, verbose=0, callbacks=[profiler])
    assert (profiler.reports[0].steps_analyzed, gathers) == (2, [])  # steps 3-4; step 5 raised
    hist = model.fit(_data(), epochs=2, verbose=0, callbacks=[profiler]).history
    assert len(gathers) == 2 and hist["fitprof/ranks_reported"] == [1.0, 1.0]


@pytest.mark.slow
@needs_statm
def test_host_memory_flat_with_a_window_every_epoch(tmp_path: Path) -> None:
    """RSS after epoch 4 and after epoch 14 of a tiny model profiled every epoch: growth under 40 MB, i.e. under
    4 MB per window (a window's profile is ~20 KB; the bound leaves room for allocator noise)."""
    rss: dict[int, float] = {}

    class Rss(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            rss[epoch] = rss_mb()

    profiler = FitProfiler(tmp_path, profile_batch=(2, 3), keep_last_windows=1)
    _model().fit(_data(4), epochs=15, verbose=0, callbacks=[profiler, Rss()])
    assert len(profiler.reports) == 15
    growth = rss[14] - rss[4]
    print(f"RSS epoch 4: {rss[4]:.1f} MB, epoch 14: {rss[14]:.1f} MB, growth {growth:.1f} MB")
    assert growth < 40, rss


class _RaiseIn(keras.callbacks.Callback):
    """Raises ``Boom`` in one hook, at one epoch or batch."""

    def __init__(self, hook: str, at: int) -> None:
        super().__init__()
        setattr(self, hook, self._raise)
        self.at = at

    def _raise(self, index: int, logs: dict | None = None) -> None:
        if index == self.at:
            raise Boom(f"raised at {index}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hook", "at", "profile_batch", "steps"),
    [
        ("on_train_batch_end", 4, (3, 6), 3),  # after step 5 ran: steps 3-5 are kept
        ("on_train_batch_begin", 5, (3, 6), 3),  # listed after FitProfiler: step 6 was marked but never ran
        ("on_epoch_end", 0, (11, 12), 2),  # listed before FitProfiler: the window still open at the epoch's end
    ],
)
def test_an_exception_outside_train_function_stops_the_profiler(
    tmp_path: Path, hook: str, at: int, profile_batch: tuple[int, int], steps: int
) -> None:
    """Another callback raising ends fit without on_train_end: the profiler is stopped and the partial window
    analysed before the exception reaches the user, unchanged."""
    profiler = FitProfiler(tmp_path, profile_batch=profile_batch)
    order = [_RaiseIn(hook, at), profiler] if hook == "on_epoch_end" else [profiler, _RaiseIn(hook, at)]
    with pytest.raises(Boom, match=f"raised at {at}"):
        _model().fit(_data(), epochs=2, verbose=0, callbacks=order)
    assert not _profiler_running()  # a new tf.profiler.experimental.start succeeds
    assert profiler.reports[0].steps_analyzed == steps
    assert len(list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))) == 1


@pytest.mark.slow
def test_an_exception_in_on_epoch_begin_leaves_no_profiler(tmp_path: Path) -> None:
    profiler = FitProfiler(tmp_path, profile_batch=(2, 3))
    with pytest.raises(Boom):
        _model().fit(_data(4), epochs=3, verbose=0, callbacks=[profiler, _RaiseIn("on_epoch_begin", 1)])
    assert not _profiler_running()
    assert sorted(profiler.reports) == [0]
    # no on_train_end follows the exception: the event file is closed all the same, not left to the collector
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del profiler
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


@pytest.mark.slow
def test_a_step_marker_that_fails_drops_the_window_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fitprof.profilers.tensorflow import TFProfileWindow

    original = TFProfileWindow.begin_step

    def failing(self: TFProfileWindow, step: int) -> None:
        if step == 4:
            raise RuntimeError("marker broke")
        original(self, step)

    monkeypatch.setattr(TFProfileWindow, "begin_step", failing)
    profiler = FitProfiler(tmp_path, profile_batch=(3, 5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = _model().fit(_data(), epochs=2, verbose=0, callbacks=[profiler])
    messages = [str(w.message) for w in caught if issubclass(w.category, FitProfilerWarning)]
    assert messages == [
        "fitprof: could not mark step 4 (RuntimeError('marker broke')); the window of epoch 0 was dropped."
    ]
    assert len(hist.history["loss"]) == 2 and not _profiler_running()
    assert sorted(profiler.reports) == []  # both epochs' windows broke at step 4: nothing half-marked is analysed
    assert not list(tmp_path.glob("plugins/profile/*"))


@pytest.mark.slow
def test_warnings_one_channel_one_category_pointing_at_user_code_again_each_fit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    profiler = FitProfiler(tmp_path, profile_batch=(2, 3), ranks=[1])
    for _ in range(2):  # a later fit warns again when the cause repeats
        with warnings.catch_warnings(record=True) as caught, caplog.at_level("WARNING"):
            warnings.simplefilter("always")
            _model().fit(_data(4), epochs=2, verbose=0, callbacks=[profiler])
        ours = [w for w in caught if "fitprof" in str(w.message)]
        assert [(w.category, str(w.message)) for w in ours] == [
            (FitProfilerWarning, "fitprof: ranks=[1] names no rank of this run (ranks 0-0); nothing is profiled.")
        ]
        assert ours[0].filename == __file__  # stacklevel points at the fit call, not into Keras
        assert not [r for r in caplog.records if "fitprof" in r.getMessage()]  # not printed twice through logging
        caplog.clear()


@pytest.mark.slow
def test_warnings_as_errors_never_break_training(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """python -W error (here for fitprof's category only: Keras warns of its own in this fit): the warning goes to
    logging instead of raising out of a hook."""
    profiler = FitProfiler(tmp_path, profile_batch=(3, 50))
    with warnings.catch_warnings(), caplog.at_level("WARNING"):
        warnings.simplefilter("error", FitProfilerWarning)
        hist = _model().fit(_data(6), epochs=1, verbose=0, callbacks=[profiler])
    assert hist.history["fitprof/steps_analyzed"] == [4.0]
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fitprof: ")]
    assert len(logged) == 1 and "ended after step 6, inside the window" in logged[0]


@pytest.mark.slow
def test_keras_without_tensorflow_names_tensorflow() -> None:
    """An import error names the package really missing: Keras is installed, its TensorFlow backend is not."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['tensorflow'] = None\n"
        "try:\n    import fitprof.keras\n"
        "except ModuleNotFoundError as err:\n    print('ERR', err.name, '|', err)\n"
    )
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("ERR"))
    assert line.startswith("ERR tensorflow | fitprof.keras needs `tensorflow` (imported by `keras`), which is not")
    assert "keras is not installed" not in line and "pip install 'fitprof[keras]' tensorflow" in line


@pytest.mark.slow
def test_initial_epoch_numbers_epochs_as_keras_does(tmp_path: Path) -> None:
    """A resume with initial_epoch: Keras numbers epochs from initial_epoch and steps from 1 in each epoch;
    every_n_epochs and the event-file steps follow Keras's epoch numbers."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    profiler = FitProfiler(tmp_path, profile_batch=(2, 3), every_n_epochs=2)
    hist = _model().fit(_data(4), epochs=5, initial_epoch=1, verbose=0, callbacks=[profiler])
    assert sorted(profiler.reports) == [2, 4] and all(r.steps_analyzed == 2 for r in profiler.reports.values())
    assert len(hist.history["loss"]) == 4
    acc = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    logged = acc.Tensors("fitprof/steps_analyzed")
    assert [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in logged] == [(2, 2.0), (4, 2.0)]


def test_reading_fit_locals_leaves_no_snapshot_holding_them() -> None:
    """``fit_frame_locals`` copies ``fit``'s locals and keeps nothing: a local rebound afterwards (the next epoch's
    iterator) frees the old object at once, and the frame's variables are untouched. A module frame's namespace
    (its ``f_locals`` itself) is left whole."""

    class Iterator:
        pass

    model = object()

    def fit(self: object) -> tuple[bool, bool]:
        iterator = Iterator()
        old = weakref.ref(iterator)
        found = fit_frame_locals(self)
        assert found["iterator"] is iterator and found["self"] is self
        del found
        iterator = Iterator()  # the next epoch's: the first one has no other reference
        return old() is None, isinstance(iterator, Iterator)

    assert fit(model) == (True, True)
    namespace: dict = {"frame_locals": frame_locals, "sys": sys}
    exec("x = 1\ncopy = frame_locals(sys._getframe())", namespace)
    assert namespace["x"] == 1 and namespace["copy"]["x"] == 1


@pytest.mark.slow
def test_the_previous_epochs_iterator_is_freed_before_the_next_window(tmp_path: Path) -> None:
    """Epoch 0's ``tf.data`` iterator is gone at epoch 1's second step, before that epoch's window opens (warm-up
    step 3), so its teardown is never inside the profile: epoch 1's profile begins with the warm-up step's call on
    the Python thread, no tensor deletion first (read back from the ``.xplane.pb``)."""
    iterators: dict[int, weakref.ref] = {}
    alive: list[bool] = []

    class Watch(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            original = self.model.train_function

            def recorded(iterator, *args, **kwargs):
                iterators.setdefault(self.epoch, weakref.ref(iterator))
                return original(iterator, *args, **kwargs)

            self.model.train_function = recorded

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if self.epoch == 1 and batch == 1:
                gc.collect()
                alive.append(iterators[0]() is not None)

    profiler = FitProfiler(tmp_path, profile_batch=(4, 5))
    _model().fit(_data(8), epochs=2, verbose=0, callbacks=[Watch(), profiler])
    assert alive == [False]
    (xplane,) = (tmp_path / "plugins" / "profile").glob("*_epoch1/*.xplane.pb")
    table = read_trace(xplane)
    python = table[table["tid"] == "python"].sort_values("ts_us")
    assert len(python) and python["name"].iloc[0] != "TFE_DeleteTensorHandle", python.head(5).to_string()

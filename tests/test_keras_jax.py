"""Keras 3 on the JAX backend: the same callback through fitprof's ``jax.profiler`` window.

The backend is chosen when Keras is imported, so every JAX fit runs in one child process: the lifecycle cases and
a slow-input run timed against a truth first, then the digits example with ``--slow-input`` (its ``main``, its
printed table captured; it imports TensorFlow for ``tf.data``, so it comes after the timed run). The tests read
their outputs back: report files and event files, the ``.xplane.pb`` through fitprof's reader and xprof's own
``input_pipeline_analyzer``, and the Profile tab through TensorBoard's HTTP API.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("jax")
pytest.importorskip("keras")

from contention import measured, tolerates_load
from fitprof.report_files import find_report_files
from fitprof.traces import Kind, read_trace
from keras_child import child_env, run_result

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import json, sys, time, warnings
    import numpy as np
    import keras
    from fitprof import FitProfilerWarning
    from fitprof.keras import FitProfiler

    assert keras.backend.backend() == "jax"
    logdir = sys.argv[1]
    out = {{}}
    keras.utils.set_random_seed(0)

    def model():
        m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
        m.compile("sgd", "mse")
        return m

    # Bad arguments: the same errors as on the other backends.
    errors = []
    for kwargs in ({{"profile_batch": -1}}, {{"every_n_epochs": 0}}, {{"log_dir": ""}}):
        try:
            FitProfiler(**kwargs)
        except ValueError as err:
            errors.append(str(err))
    out["errors"] = errors

    class Slow(keras.utils.PyDataset):
        # Each batch costs {sleep_ms} ms to make; the time spent making it is the truth, timed here.
        def __init__(self, n, fail_at=None):
            super().__init__()
            self.n, self.fail_at, self.made, self.calls = n, fail_at, [], 0
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            t0 = time.perf_counter()
            self.calls += 1
            if self.calls == self.fail_at:
                raise RuntimeError("user error in the data")
            time.sleep({sleep_ms} / 1e3)
            rng = np.random.default_rng(i)
            batch = rng.random((32, 16), dtype="float32"), rng.random((32, 1), dtype="float32")
            self.made.append((i, t0, time.perf_counter()))
            return batch

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.begins.append((batch, time.perf_counter()))
        def on_epoch_begin(self, epoch, logs=None):
            self.begins = []

    # A slow input, fit twice with the same callback (one window per epoch each time).
    data, before, clock = Slow(12), Clock(), Clock()
    profiler = FitProfiler(logdir + "/slow", profile_batch=(4, 10))
    m = model()
    m.fit(data, epochs=2, verbose=0, callbacks=[before, profiler, clock])
    made = [t1 - t0 for _, t0, t1 in data.made[-12:]]  # the last epoch's batches, in the order fit took them
    # The window's 7 steps (0-based batches 3-9): from step 4's begin after the profiler's hook (which starts the
    # window) to step 11's begin before it (which stops it), so neither is in the truth, as in fitprof's steps.
    wall = dict(before.begins)[10] - dict(clock.begins)[3]
    out["truth_pct"] = 100 * sum(made[3:10]) / wall
    out["truth_step_ms"] = 1e3 * wall / 7
    out["slow"] = {{str(e): r.scalars() for e, r in profiler.reports.items()}}
    hist = m.fit(data, epochs=1, verbose=0, callbacks=[profiler])
    out["refit"] = {{str(e): r.scalars() for e, r in profiler.reports.items()}}
    out["refit_history"] = sorted(hist.history)
    out["traces"] = [str(p) for p in profiler.trace_paths.values()]

    # An exception inside the window: the partial window is analysed, the error reaches the user.
    # The 7th batch made fails (Keras may make one more first, to build the model): a step inside the window.
    profiler, clock = FitProfiler(logdir + "/boom", profile_batch=(3, 8)), Clock()
    try:
        model().fit(Slow(12, fail_at=7), epochs=1, verbose=0, callbacks=[profiler, clock])
    except Exception as err:
        out["boom"] = str(err)
    out["boom_begun"] = [b + 1 for b, _ in clock.begins]  # the 1-based steps begun, the last one failed
    out["boom_reports"] = {{str(e): r.scalars() for e, r in profiler.reports.items()}}

    # The window never reached: one warning, training goes on.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = model().fit(Slow(4), epochs=1, verbose=0, callbacks=[FitProfiler(logdir + "/never", profile_batch=(6, 8))])
    out["never"] = [str(w.message) for w in caught if issubclass(w.category, FitProfilerWarning)]
    out["never_history"] = sorted(hist.history)

    # A PyDataset with worker threads: the loader figures and their prediction, re-measured (tests/pydataset_loop.py).
    sys.path.insert(0, {tests!r})
    import pydataset_loop
    out["pydataset_loader"] = pydataset_loop.step_pulls(logdir + "/loader")

    # The digits example with --slow-input, as `python examples/keras_digits.py` runs it; a failure is reported
    # to its own test.
    import contextlib, io, traceback
    sys.path.insert(0, {examples!r})
    import keras_digits
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            keras_digits.main(["--logdir", logdir + "/digits/slow", "--slow-input", "--epochs", "1"])
    except Exception:
        out["digits_error"] = traceback.format_exc()
    out["digits_stdout"] = printed.getvalue()
    print("RESULT" + json.dumps(out))
    """
)
SLEEP_MS = 30  # the fetch's own CPU time (Keras's adapter, JAX's copy) stays a small share of the step under load


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    logdir = tmp_path_factory.mktemp("keras_jax")
    script = SCRIPT.format(sleep_ms=SLEEP_MS, examples=str(ROOT / "examples"), tests=str(ROOT / "tests"))
    with measured(__name__):  # the timings its tests read are made here
        result, _ = run_result(["-c", script, str(logdir)], env=child_env(KERAS_BACKEND="jax"))
    return {"logdir": logdir, **result}


@pytest.fixture(scope="module")
def digits_run(jax_run: dict[str, Any]) -> dict[str, Any]:
    """The digits example's run in the same child: its run folder and what it printed."""
    assert "digits_error" not in jax_run, jax_run["digits_error"]
    return {"logdir": jax_run["logdir"] / "digits" / "slow", "stdout": jax_run["digits_stdout"]}


def test_bad_arguments_raise_as_on_other_backends(jax_run: dict[str, Any]) -> None:
    errors = jax_run["errors"]
    assert len(errors) == 3, errors
    assert "profile_batch" in errors[0] and "every_n_epochs" in errors[1] and "log_dir" in errors[2]


def test_slow_input_is_input_bound_within_3pp_of_the_truth(jax_run: dict[str, Any]) -> None:
    last = jax_run["slow"]["1"]
    detail = f"fitprof {last['fitprof/input_percent']:.1f}% vs truth {jax_run['truth_pct']:.1f}%"
    assert abs(last["fitprof/input_percent"] - jax_run["truth_pct"]) <= 3.0, detail
    assert last["fitprof/input_percent"] >= 20.0, detail  # input-bound (the verdict's threshold)
    assert last["fitprof/steps_analyzed"] == 7
    assert last["fitprof/step_time_ms"] == pytest.approx(jax_run["truth_step_ms"], rel=0.05)


def test_fit_twice_gives_new_windows_and_files(jax_run: dict[str, Any]) -> None:
    assert sorted(jax_run["slow"]) == ["0", "1"]
    assert sorted(jax_run["refit"]) == ["0"]  # the second fit's reports replace the first's
    assert "fitprof/input_percent" in jax_run["refit_history"]
    sessions = sorted((jax_run["logdir"] / "slow" / "plugins" / "profile").iterdir())
    assert len(sessions) == 3 and all(len(list(s.glob("*.xplane.pb"))) == 1 for s in sessions)
    assert len(find_report_files(jax_run["logdir"] / "slow")) == 3


def test_jax_trace_steps_input_and_xla_ops(jax_run: dict[str, Any]) -> None:
    table = read_trace(jax_run["traces"][0])
    steps = table[table["kind"] == Kind.STEP]
    assert sorted(steps["step_num"].astype(int)) == list(range(4, 11))
    inputs = table[table["kind"] == Kind.INPUT]
    # One annotated fetch per step, each inside its step's marker, and one more before the first marker: the
    # window's warm-up step, recorded but not analysed.
    assert len(inputs) == 8
    warm_up = inputs[inputs["ts_us"] + inputs["dur_us"] <= steps["ts_us"].min()]
    assert len(warm_up) == 1
    for _, row in inputs.drop(warm_up.index).iterrows():
        inside = steps[
            (steps["ts_us"] <= row["ts_us"]) & (row["ts_us"] + row["dur_us"] <= steps["ts_us"] + steps["dur_us"])
        ]
        assert len(inside) == 1
    ops = table[table["kind"] == Kind.OP]
    assert len(ops) > 0  # the XLA-compiled step's HLO thunks
    own = table[table["name"] == "fitprof/overhead"]  # fitprof's own spans (jax.profiler.TraceAnnotation)
    assert len(own) > 0 and (own["kind"] == Kind.NOT_TRAINING).all()

    xprof = pytest.importorskip("xprof.convert.raw_to_tool_data")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    data = xprof.xspace_to_tool_data([jax_run["traces"][0]], "input_pipeline_analyzer", {})
    ipa = json.loads(data[0] if isinstance(data, tuple) else data)
    # xprof finds the marked steps: 7 profiled, the first and the last dropped (it does so above 5).
    assert [r["c"][0]["v"] for r in ipa[1]["rows"]] == [f"train {n}" for n in range(5, 10)]


def test_exception_in_window_flushes_and_reaches_user(jax_run: dict[str, Any]) -> None:
    assert "user error in the data" in jax_run["boom"]
    finished = [s for s in jax_run["boom_begun"][:-1] if 3 <= s <= 8]  # window steps begun before the failing one
    assert len(finished) >= 2, jax_run["boom_begun"]
    assert jax_run["boom_reports"]["0"]["fitprof/steps_analyzed"] == len(finished)
    assert len(find_report_files(jax_run["logdir"] / "boom")) == 1


def test_window_never_reached_warns_once(jax_run: dict[str, Any]) -> None:
    assert len(jax_run["never"]) == 1 and "nothing was profiled" in jax_run["never"][0]
    assert "loss" in jax_run["never_history"]
    assert not (jax_run["logdir"] / "never" / "plugins" / "profile").exists()


@tolerates_load
def test_digits_example_slow_input_and_profile_tab(digits_run: dict[str, Any]) -> None:
    from tbserver import get, tensorboard, wait_for

    assert "input-bound" in digits_run["stdout"], digits_run["stdout"]
    (report,) = [json.loads(p.read_text()) for p in find_report_files(digits_run["logdir"])]
    assert report["report"]["verdict"] == "input-bound"
    assert report["report"]["steps_analyzed"] == 5
    root = digits_run["logdir"].parent
    with tensorboard(root) as base:
        runs = wait_for(lambda: [r for r in get(base, "/data/plugin/profile/runs") if r.startswith("slow/")])
        assert len(runs) == 1, runs
        hosts = get(base, "/data/plugin/profile/hosts", run=runs[0], tag="overview_page")
        host = hosts[0]["hostname"] if isinstance(hosts[0], dict) else hosts[0]
        ipa = get(base, "/data/plugin/profile/data", run=runs[0], tag="input_pipeline_analyzer", host=host)
        assert len(ipa[1]["rows"]) == 5  # steps 6-10: xprof keeps all when 5 are profiled
        assert "No step marker observed" not in json.dumps(
            get(base, "/data/plugin/profile/data", run=runs[0], tag="overview_page", host=host)
        )
        tags = get(base, "/data/plugin/scalars/tags")
        assert "fitprof/input_percent" in tags["slow"]


def test_samples_per_s_from_keras_sample_count_and_no_flops_on_jax(jax_run: dict[str, Any]) -> None:
    """The window's samples are the growth of Keras's own count (batches of 32); FLOPs are not
    counted on JAX."""
    for scalars in jax_run["slow"].values():
        summed_s = scalars["fitprof/step_time_ms"] * scalars["fitprof/steps_analyzed"] / 1000.0
        assert scalars["fitprof/samples_per_s"] == pytest.approx(32 * scalars["fitprof/steps_analyzed"] / summed_s)
        assert math.isnan(scalars["fitprof/flops_per_step"]) and math.isnan(scalars["fitprof/mfu"])


@tolerates_load
def test_pydataset_workers_are_timed_where_the_step_pulls_its_batch(jax_run: dict[str, Any]) -> None:
    """The loader figures of a ``PyDataset(workers=N)`` on JAX, which pulls each batch inside ``train_function``: the
    wait is timed around the adapter's generator, and the prediction holds for 2, 3 and 4 threads re-measured."""
    from step_pulls import check_step_pulls

    check_step_pulls(jax_run["pydataset_loader"], "jax")

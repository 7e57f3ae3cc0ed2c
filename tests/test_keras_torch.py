"""Keras 3 on the torch backend: same callback, same scalars, through fitprof's torch.profiler window.

The backend is chosen when Keras is imported, so the fit runs in one child process; the test reads its
outputs back (event files with tensorboard's reader, the Kineto traces and the converted XSpace via the core).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("keras")

import fitprof
from fitprof.keras._torch_backend import INPUT_ANNOTATION
from keras_child import child_env, run_result

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import keras
    from keras.src.backend.torch.trainer import TorchEpochIterator

    keras_next = TorchEpochIterator.__dict__.get("__next__")  # Keras's own (inherited: None), before any fit
    sys.path.insert(0, {examples!r})
    import keras_digits
    from fitprof.keras import FitProfiler
    from sklearn.datasets import load_digits

    assert keras.backend.backend() == "torch"
    keras.utils.set_random_seed(0)
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None][:640]
    y = digits.target[:640]
    profiler = FitProfiler({logdir!r}, profile_batch=(3, 6))
    model = keras_digits.build_model()
    hist = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[profiler])
    digits_run = {{
        "reports": {{str(e): r.scalars() for e, r in profiler.reports.items()}},
        "history_keys": sorted(hist.history),
        "traces": {{str(e): str(p) for e, p in profiler.trace_paths.items()}},
    }}
    """
)


DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter"


@pytest.fixture(scope="module")
def torch_child(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One child process on the torch backend (importing Keras and torch costs most of a child's time): the
    digits fit of :data:`SCRIPT` in ``<tmp>/digits``, then the hostile fits of :data:`HOSTILE` in ``<tmp>/hostile``,
    which take tensorboard away and break the conversion for the rest of the process."""
    root = tmp_path_factory.mktemp("keras_torch")
    examples = Path(__file__).resolve().parents[1] / "examples"
    code = SCRIPT.format(examples=str(examples), logdir=str(root / "digits")) + HOSTILE.format(
        logdir=str(root / "hostile")
    )
    result, _ = run_result(["-c", code], env=child_env(KERAS_BACKEND="torch"))
    return {"root": root, **result}


@pytest.fixture(scope="module")
def torch_run(torch_child: dict) -> dict:
    return {"logdir": torch_child["root"] / "digits", **torch_child["digits"]}


@pytest.mark.slow
def test_same_scalars_as_tensorflow_backend(torch_run: dict) -> None:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    acc = event_accumulator.EventAccumulator(str(torch_run["logdir"]), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = set(acc.Tags()["tensors"])
    for key in ("step_time_ms", "input_percent", "htod_ms_per_step", "htod_percent", "steps_analyzed"):
        assert f"fitprof/{key}" in tags
    steps = [float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors("fitprof/steps_analyzed")]
    assert steps == [4.0, 4.0]  # profile_batch=(3, 6), two epochs
    for epoch, scalars in torch_run["reports"].items():
        logged = acc.Tensors("fitprof/step_time_ms")[int(epoch)]
        assert float(tensor_util.make_ndarray(logged.tensor_proto)) == pytest.approx(scalars["fitprof/step_time_ms"])
        assert "fitprof/top_op_1_ms" in scalars  # logs: operators by rank; TensorBoard: also by name
    assert any(t.startswith("fitprof/top_ops/aten::") for t in tags)
    assert "fitprof/input_percent" in torch_run["history_keys"]


@pytest.mark.slow
def test_traces_and_xspace_per_window(torch_run: dict) -> None:
    logdir: Path = torch_run["logdir"]
    xplanes = sorted(logdir.glob("plugins/profile/*/*.xplane.pb"))
    assert len(xplanes) == 2 and len({p.parent for p in xplanes}) == 2
    for epoch, trace in torch_run["traces"].items():
        assert trace.endswith(".pt.trace.json.gz") and "_rank0." in trace
        report = fitprof.analyze(trace)
        assert report.steps_analyzed == 4
        # Every step span holds exactly one fetch: Keras's whole fetch (fitprof's annotation) around torch's
        # DataLoader span; the warm-up step before the first one (recorded, not marked) holds one more.
        table = fitprof.read_trace(trace)
        inputs = table[table["kind"] == "input"]
        first_step = table.loc[table["kind"] == "step", "ts_us"].min()
        for fetch in (inputs[inputs["name"] == INPUT_ANNOTATION], inputs[inputs["name"].str.startswith(DATALOADER)]):
            assert len(fetch) == 5
            assert (fetch["ts_us"] < first_step).sum() == 1
        assert report.scalars()["fitprof/step_time_ms"] == pytest.approx(
            torch_run["reports"][epoch]["fitprof/step_time_ms"]
        )


@pytest.mark.slow
def test_each_window_reads_the_same_from_its_trace_and_its_xplane(torch_run: dict) -> None:
    """The ``.xplane.pb`` TensorBoard's Profile tab reads gives the report of the Kineto trace it was converted from."""
    from agreement import assert_same_report

    for trace in torch_run["traces"].values():
        session = Path(trace).name.split(".")[1]  # <host>_rank<r>.<session>.pt.trace.json.gz
        (xplane,) = (Path(torch_run["logdir"]) / "plugins" / "profile" / session).glob("*.xplane.pb")
        kineto = fitprof.analyze(trace)
        assert kineto.steps_analyzed == 4 and kineto.top_ops
        assert_same_report(kineto, fitprof.analyze(xplane))


HOSTILE = textwrap.dedent(
    """
    import gc, json, logging, sys, warnings
    # a Keras-torch user without tensorboard installed: every tensorboard module the digits fit loaded is dropped,
    # and importing one fails as a missing package does
    for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")]:
        del sys.modules[name]
    sys.modules["tensorboard"] = None
    import numpy as np
    import keras
    import torch
    import fitprof
    import fitprof.traces.xspace_write as xw
    from fitprof.keras import FitProfiler
    from fitprof.profilers.torch import profiler_running

    def keras_own():
        return TorchEpochIterator.__dict__.get("__next__") is keras_next

    def no_xspace(*args, **kwargs):
        raise RuntimeError("conversion broke")

    xw.write_xspace = no_xspace  # only the .xplane.pb conversion fails
    # the .xplane.pb is written by a background interpreter, started on this one's sys.path: plant it there too
    import pathlib, tempfile
    plant = pathlib.Path(tempfile.mkdtemp())
    (plant / "sitecustomize.py").write_text(
        "import fitprof.traces.xspace_write as xw\\n"
        "def no_xspace(*args, **kwargs):\\n    raise RuntimeError('conversion broke')\\n"
        "xw.write_xspace = no_xspace\\n"
    )
    sys.path.insert(0, str(plant))
    logged = []
    logging.getLogger("fitprof").addHandler(type("H", (logging.Handler,), {{"emit": lambda s, r: logged.append(r.getMessage())}})())

    def model():
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
        m.compile("sgd", "mse")
        return m

    x, y = np.ones((96, 8), "float32"), np.ones((96,), "float32")
    out = {{}}
    profiler = FitProfiler({logdir!r}, profile_batch=(2, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = model().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[profiler])
    out["warnings"] = [[w.category.__name__, str(w.message)] for w in caught if "fitprof" in str(w.message)]
    out["history"] = hist.history.get("fitprof/steps_analyzed")
    out["traces"] = {{str(e): str(p) for e, p in profiler.trace_paths.items()}}

    class Failing(keras.utils.PyDataset):  # the user's data raises at batch 5, inside the window (steps 3-6)
        def __len__(self):
            return 12
        def __getitem__(self, i):
            if i == 4:
                raise ValueError("bad batch 5")
            return np.ones((8, 8), "float32"), np.ones((8,), "float32")

    second = FitProfiler({logdir!r} + "/data_error", profile_batch=(3, 6))
    try:
        model().fit(Failing(), epochs=1, verbose=0, shuffle=False, callbacks=[second])
    except ValueError as err:
        out["raised"] = str(err)
    out["running_after_raise"] = profiler_running()
    out["next_after_raise"] = keras_own()  # the fetch timer is taken out with the flushed window
    out["flushed"] = {{str(e): r.steps_analyzed for e, r in second.reports.items()}}

    class Boom(keras.callbacks.Callback):  # raises in the third step, before fitprof's window: nothing is guarded
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise ValueError("boom")

    early = FitProfiler({logdir!r} + "/early_error", profile_batch=(9, 10))
    try:
        model().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[early, Boom()])
    except ValueError:
        pass
    out["next_before_del"] = keras_own()
    del early
    gc.collect()
    out["next_after_del"] = keras_own()  # the callback gone, the patch with it

    both = [FitProfiler({logdir!r} + f"/both{{i}}", profile_batch=0) for i in range(2)]
    model().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=both)  # taken out in install order
    out["next_after_two"] = keras_own()

    third = FitProfiler({logdir!r} + "/w_error", profile_batch=(3, 50))
    with warnings.catch_warnings():
        warnings.simplefilter("error", fitprof.FitProfilerWarning)  # python -W error
        hist = model().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[third])
    out["w_error_history"] = hist.history.get("fitprof/steps_analyzed")
    out["logged"] = logged
    print("RESULT" + json.dumps({{"digits": digits_run, "hostile": out}}))
    """
)


@pytest.mark.slow
def test_no_tensorboard_broken_conversion_data_error_and_warnings_as_errors(torch_child: dict) -> None:
    """Keras on torch without tensorboard, with a failing .xplane.pb conversion: the figures reach History, the
    Kineto traces stay readable, one warning each; an error in the user's data stops the torch profiler; with
    fitprof's warnings turned into errors training still ends and the warnings go to logging."""
    out, tmp_path = torch_child["hostile"], torch_child["root"] / "hostile"
    assert out["history"] == [3.0, 3.0]
    categories = {c for c, _ in out["warnings"]}
    messages = [m for _, m in out["warnings"]]
    assert categories == {"FitProfilerWarning"}
    assert sum("`tensorboard` is not installed" in m and "pip install tensorboard" in m for m in messages) == 1
    assert sum("could not write the .xplane.pb" in m and "conversion broke" in m for m in messages) == 1
    assert len(messages) == 2, messages
    assert sorted(out["traces"]) == ["0", "1"]
    for trace in out["traces"].values():  # the Kineto traces were kept and read back
        assert fitprof.analyze(trace).steps_analyzed == 3
    assert not list(tmp_path.glob("*.tfevents*")) and not list(tmp_path.glob("plugins/profile/*"))  # no empty session
    assert out["raised"] == "bad batch 5"
    assert out["running_after_raise"] is False
    # the step timing's patch of Keras's TorchEpochIterator.__next__ never outlives a fit that raised (in its
    # window: taken out with the flush; before it: when the callback is collected), nor two FitProfilers
    assert out["next_after_raise"] is True
    assert out["next_before_del"] is False, out
    assert out["next_after_del"] is True, out
    assert out["next_after_two"] is True
    assert out["flushed"] == {"0": 1}  # step 3 complete; step 4's span held the failing fetch of batch 5
    assert out["w_error_history"] == [10.0]  # steps 3-12 of 12
    assert sum("ended after step" in m and "inside the window" in m for m in out["logged"]) == 1


@pytest.mark.slow
def test_flops_and_samples_on_the_torch_backend_match_hand_counts(torch_run: dict) -> None:
    """``FlopCounterMode`` around the step before the window, on the example's CNN (batch 32)."""
    b = 32
    conv1 = 2 * b * 32 * 8 * 8 * 1 * 3 * 3  # 2 * B * Cout * H * W * Cin * kh * kw ("same" padding: 8x8)
    conv2 = 2 * b * 32 * 8 * 8 * 32 * 3 * 3
    dense1 = 2 * b * (4 * 4 * 32) * 64  # after 2x2 max pooling
    dense2 = 2 * b * 64 * 10
    forward = conv1 + conv2 + dense1 + dense2
    backward = conv1 + 2 * (conv2 + dense1 + dense2)  # no grad-input for the first convolution
    for scalars in torch_run["reports"].values():
        assert scalars["fitprof/flops_per_step"] == forward + backward
        summed_s = scalars["fitprof/step_time_ms"] * scalars["fitprof/steps_analyzed"] / 1000.0
        expected = b * scalars["fitprof/steps_analyzed"] / summed_s
        assert scalars["fitprof/samples_per_s"] == pytest.approx(expected, rel=1e-9)

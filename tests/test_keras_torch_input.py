"""Keras on the torch backend with ``PyDataset(workers>0, use_multiprocessing=False)``: the time the fit loop
waits for its next batch is counted as input, against a truth timed in the same run.

The child process trains a tiny model on a ``PyDataset`` whose ``__getitem__`` sleeps; two callbacks time, for
each batch, the gap from the end of the previous step's ``on_train_batch_end`` to this step's
``on_train_batch_begin``: the loop's wait for the batch (Keras fetches in between, nothing else). fitprof's input
time per step must account for that wait.
"""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("keras")

from fitprof.traces import read_trace
from keras_child import child_env, run_result

FIRST, LAST = 6, 25

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np, keras
    from keras.src.backend.torch.trainer import TorchEpochIterator
    from fitprof.keras import FitProfiler

    assert keras.backend.backend() == "torch"

    class Slow(keras.utils.PyDataset):
        def __init__(self):
            super().__init__(workers=2, use_multiprocessing=False)
        def __len__(self):
            return {batches}
        def __getitem__(self, i):
            time.sleep(0.25)
            return np.ones((16, 8), "float32"), np.ones((16, 1), "float32")

    ends, begins = {{}}, {{}}

    class Begin(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            begins[batch] = time.perf_counter()

    class End(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends[batch] = time.perf_counter()

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    fp = FitProfiler({logdir!r}, profile_batch=({first}, {last}), verbose=False)
    model.fit(Slow(), epochs=1, verbose=0, callbacks=[Begin(), fp, End()])
    # Step n (1-based) spans [begin(batch n-1), begin(batch n)): it holds the fetch of 0-based batch n.
    waits = [begins[b] - ends[b - 1] for b in range({first}, {last} + 1)]
    r = fp.reports[0]
    print("RESULT" + json.dumps({{
        "waits_ms": [1000 * w for w in waits],
        "step_time_ms": r.step_time_ms,
        "input_percent": r.input_percent,
        "steps": r.steps_analyzed,
        "trace": str(fp.trace_paths[0]),
        "restored": "__next__" not in TorchEpochIterator.__dict__,
    }}))
    """
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    logdir = tmp_path_factory.mktemp("keras_torch_input")
    code = SCRIPT.format(logdir=str(logdir), first=FIRST, last=LAST, batches=LAST + 4)
    result, _ = run_result(["-c", code], env=child_env(KERAS_BACKEND="torch"))
    return result


@pytest.mark.slow
def test_every_step_holds_one_annotated_fetch_and_the_wrapper_is_removed(run: dict) -> None:
    from fitprof.keras._torch_backend import INPUT_ANNOTATION

    assert run["steps"] == LAST - FIRST + 1
    table = read_trace(run["trace"])
    steps = table[table["kind"] == "step"]
    fetches = table[table["name"] == INPUT_ANNOTATION]
    assert set(fetches["kind"]) == {"input"}
    for _, step in steps.iterrows():
        inside = (fetches["ts_us"] >= step["ts_us"]) & (fetches["ts_us"] < step["ts_us"] + step["dur_us"])
        assert int(inside.sum()) == 1, step["name"]
    assert run["restored"]  # outside the window Keras's own __next__ runs, unwrapped


@pytest.mark.slow
def test_input_time_matches_the_wait_timed_in_the_loop(run: dict) -> None:
    waits = run["waits_ms"]
    truth = sum(waits) / len(waits)  # ms the loop waited per step, timed by the callbacks around the fetch
    counted = run["input_percent"] / 100 * run["step_time_ms"]
    # The fetch annotation lies inside the timed gap, so it can only be shorter, by the callbacks' dispatch
    # between the gap's ends and the fetch. Measured in 2 runs on 2 CPU cores at load average 11: counted/truth
    # 0.998 and 0.999 (truth 82.9 and 83.4 ms/step, a shortfall of 0.08-0.19 ms/step); 0.95 leaves 25x that.
    assert truth > 20  # the dataset is really the bottleneck: two threads, 250 ms per batch
    assert counted <= truth * 1.01
    assert counted >= 0.85 * truth, (counted, truth)

"""The loader figures in a Keras fit on the torch backend fed a DataLoader: the FitProfiler times its workers and
predicts the step time with more of them; the prediction is checked by re-measuring with that many workers.

Sleep-modelled work (tests/loader_loop.py): a layer sleeps as a host waits for its GPU, each ``__getitem__`` sleeps.
The backend is chosen when Keras is imported, so the fits run in one child process; the test reads Keras's History
back. Tolerances are the issue's: 20% for the prediction, 10 pp for the busy share against the truth the dataset
and collate time themselves. The modelled step (20 ms) and samples (60 ms) are longer than Lightning's: Keras's own
step on torch takes several ms of the main thread's CPU, which stretches as the thread gets busier on 2 shared
cores (with a 6 ms sleep and 20 ms samples the step without its wait grew from 9.6 ms with one worker to 13-15.6 ms
with 2-4, and 4 workers re-measured 40% slower than predicted); at this scale 2, 3 and 4 workers re-measured
+2.1%, +3.9%, +4.2% from the prediction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from contention import tolerates_load

pytest.importorskip("torch")
pytest.importorskip("keras")

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import ctypes, json, multiprocessing, sys, time, warnings
    warnings.filterwarnings("ignore")
    sys.path.insert(0, {tests!r})
    import keras, torch
    from torch.utils.data import DataLoader
    from loader_loop import ModelledCollate, ModelledDataset
    from fitprof.keras import FitProfiler

    assert keras.backend.backend() == "torch"
    torch.set_num_threads(1)
    BATCH, STEPS, ITEM_MS, STEP_MS = 2, 40, 60.0, 20.0

    class Pairs(ModelledDataset):
        def __getitem__(self, i):
            x = super().__getitem__(i)
            return x, x[:1]

    class Wait(keras.layers.Layer):
        def call(self, x):
            time.sleep(STEP_MS * 1e-3)  # the host waiting for its GPU
            return x

    def fit(workers):
        truth = multiprocessing.get_context("fork").RawArray(ctypes.c_int64, 9)
        loader = DataLoader(
            Pairs(STEPS * BATCH, ITEM_MS, truth), batch_size=BATCH, num_workers=workers,
            collate_fn=ModelledCollate(0.0, truth), multiprocessing_context="fork" if workers else None,
        )
        model = keras.Sequential([keras.Input((8,)), Wait(), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
        cb = FitProfiler({logdir!r} + f"/w{{workers}}", profile_batch=0, verbose=False)

        class Clock(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.before, self.t0 = list(truth), time.perf_counter_ns()
            def on_epoch_end(self, epoch, logs=None):
                self.wall = time.perf_counter_ns() - self.t0

        clock = Clock()
        hist = model.fit(loader, epochs=1, verbose=0, callbacks=[clock, cb])
        h = {{k: v[-1] for k, v in hist.history.items() if k.startswith("fitprof/epoch/")}}
        done = [a - b for a, b in zip(truth, clock.before)]
        e = cb._loader.last
        return {{
            "history": h,
            "truth_busy": 100.0 * sum(done[1:]) / (workers * clock.wall) if workers else None,
            "step_ms": BATCH * 1000.0 / h["fitprof/epoch/samples_per_s"],
            "predict": {{n: e.predict(n) * 1e-6 for n in (2, 3, 4)}} if e else None,
            "init_fn_back": loader.worker_init_fn is None,
            "advice": cb._loader.advice(),
        }}

    out = {{"one": fit(1)}}
    for n in (2, 3, 4):
        out[str(n)] = fit(n)
    print("RESULT" + json.dumps(out))
    """
)


@tolerates_load
def test_the_prediction_holds_when_re_measured(tmp_path: Path) -> None:
    tests = str(Path(__file__).resolve().parent)
    env = dict(os.environ, KERAS_BACKEND="torch")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=tests, logdir=str(tmp_path))],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))[len("RESULT") :])
    one = out["one"]
    h = one["history"]
    assert one["init_fn_back"]
    assert h["fitprof/epoch/loader_workers"] == 1
    assert h["fitprof/epoch/loader_batch_ms"] >= 2 * 20.0  # two 20 ms sleeps a batch, at least
    assert abs(h["fitprof/epoch/loader_busy_percent"] - one["truth_busy"]) <= 10.0
    assert h["fitprof/epoch/loader_workers_needed"] >= 4  # sleeping workers: more than the 2 cores pay off
    assert one["advice"].startswith(f"num_workers={int(h['fitprof/epoch/loader_workers_needed'])} would bring")
    for n in ("2", "3", "4"):
        again = out[n]
        want, got = one["predict"][n], again["step_ms"]
        assert abs(want - got) <= 0.2 * got, (n, want, got)
        assert again["history"]["fitprof/epoch/loader_workers"] == int(n)
        assert abs(again["history"]["fitprof/epoch/loader_busy_percent"] - again["truth_busy"]) <= 10.0

"""A Keras fit on a ``PyDataset`` with modelled work, profiled by ``FitProfiler``, and its truth.

The step sleeps (a host waiting for its GPU: a layer on torch, the batch's end on TensorFlow and JAX); each batch's ``__getitem__`` sleeps ``batch_ms`` (or burns that
much CPU time in Python, ``cpu=True``) and adds its own wall time and one batch to a shared truth array under a lock:
the truth the probe's busy share is compared with. Keras picks its backend at import, so this module sets
``KERAS_BACKEND`` (torch unless set) and must be imported before Keras (a child process: ``tests/test_loader_pydataset.py``,
``benchmarks/loader_prediction.py --source pydataset``). Run as a script it prints ``RESULT`` and the JSON of
:func:`fit` for each ``workers`` given: ``python tests/pydataset_loop.py --workers 1 2 --processes``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "torch")
warnings.filterwarnings("ignore")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from fitprof.keras import FitProfiler  # noqa: E402
from fitprof.profilers.pydataset import TimedPyDataset  # noqa: E402
from step_pulls import STEP_PULLS_BATCH_MS, STEP_PULLS_STEP_MS  # noqa: E402

BACKEND = keras.backend.backend()
if BACKEND == "torch":
    import torch

    torch.set_num_threads(1)


def burn(ns: int) -> None:
    """Python bytecode for ``ns`` of this thread's CPU time (it holds the GIL throughout)."""
    end = time.thread_time_ns() + ns
    x = 0
    while time.thread_time_ns() < end:
        x += 1


class Batches(keras.utils.PyDataset):
    """``steps`` batches of 2 samples; each ``__getitem__`` sleeps ``batch_ms`` (``cpu``: burns it) and adds its wall
    time to ``truth[0]`` and one batch to ``truth[1]``, under ``lock``."""

    def __init__(self, steps: int, batch_ms: float, truth: Any, lock: Any, *, cpu: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.steps, self.ns, self.truth, self.lock, self.cpu = steps, int(batch_ms * 1e6), truth, lock, cpu

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        t0 = time.perf_counter_ns()
        if self.cpu:
            burn(self.ns)
        else:
            time.sleep(self.ns * 1e-9)
        x = np.full((2, 8), float(i), np.float32)
        with self.lock:
            self.truth[0] += time.perf_counter_ns() - t0
            self.truth[1] += 1
        return x, x[:, :1]


class Wait(keras.layers.Layer):
    """The host waiting for its GPU: sleeps ``ms`` a step."""

    def __init__(self, ms: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.ms = ms

    def call(self, x: Any) -> Any:
        time.sleep(self.ms * 1e-3)
        return x


class Clock(keras.callbacks.Callback):
    """The epoch's wall time, the truth array's counts at its start and each batch's start; ``step_ms`` > 0: the
    host's wait for its GPU, slept at each batch's end (TensorFlow and JAX trace the model's ``call``, so a sleeping
    layer would sleep only while traced)."""

    def __init__(self, truth: Any, step_ms: float = 0.0) -> None:
        super().__init__()
        self.truth, self.step_s = truth, step_ms * 1e-3

    def on_train_begin(self, logs: Any = None) -> None:
        from fitprof.keras._guards import fit_frame_locals

        self.adapter = getattr(fit_frame_locals(self.model).get("epoch_iterator"), "data_adapter", None)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.before, self.t0, self.begins = list(self.truth), time.perf_counter_ns(), []

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.begins.append(time.perf_counter_ns())

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.step_s:
            time.sleep(self.step_s)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.wall = time.perf_counter_ns() - self.t0

    def steady_step_ms(self) -> float:
        """The mean time from one batch's start to the next over the epoch's second half (its first half holds the
        workers' start and the batches made before the epoch)."""
        b = self.begins[len(self.begins) // 2 :]
        return (b[-1] - b[0]) * 1e-6 / (len(b) - 1)


def fit(
    workers: int,
    *,
    processes: bool,
    logdir: str,
    steps: int = 40,
    batch_ms: float = 120.0,
    step_ms: float = 20.0,
    cpu: bool = False,
    predict: tuple[int, ...] = (2, 3, 4),
    epochs: int = 1,
    max_queue_size: int = 10,
) -> dict[str, Any]:
    """``epochs`` epochs with ``workers`` (threads, or ``processes``); the last epoch's figures as fitprof logged
    them, its truth, and the checks that the user's dataset and Keras's table are left as they were.

    The model is built by a step on arrays first: a ``fit`` that builds it pulls a first batch from the dataset, and
    Keras's enqueuer keeps the batches its pool made meanwhile (up to ``max_queue_size``) for epoch 0, which then
    runs faster than its workers can feed it until that backlog is gone (as does every later epoch, which gets the
    batches made after the previous one's last step)."""
    truth = multiprocessing.RawArray(ctypes.c_int64, 2)
    lock = multiprocessing.Lock()
    ds = Batches(
        steps,
        batch_ms,
        truth,
        lock,
        cpu=cpu,
        workers=workers,
        use_multiprocessing=processes,
        max_queue_size=max_queue_size,
    )
    attrs = dict(vars(ds))
    in_layer = BACKEND == "torch"
    model = keras.Sequential([keras.Input((8,)), *([Wait(step_ms)] if in_layer else []), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    model.fit(np.zeros((2, 8), np.float32), np.zeros((2, 1), np.float32), epochs=1, verbose=0)
    cb = FitProfiler(f"{logdir}/w{workers}{'p' if processes else 't'}", profile_batch=0, verbose=False)
    clock = Clock(truth, 0.0 if in_layer else step_ms)
    hist = model.fit(ds, epochs=epochs, verbose=0, callbacks=[clock, cb])
    h = {k: v[-1] for k, v in hist.history.items() if k.startswith("fitprof/epoch/")}
    done = [a - b for a, b in zip(truth, clock.before, strict=True)]
    e = cb._loader.last
    from keras.src.trainers.data_adapters import py_dataset_adapter

    table = py_dataset_adapter._SHARED_SEQUENCES
    return {
        "workers": workers,
        "processes": processes,
        "history": h,
        "truth_busy": 100.0 * done[0] / (workers * clock.wall) if workers else None,
        "truth_batch_ms": done[0] * 1e-6 / max(1, done[1]),
        "step_ms": 2 * 1000.0 / h["fitprof/epoch/samples_per_s"] if in_layer else clock.steady_step_ms(),
        "clock_step_ms": clock.steady_step_ms(),
        "predict": {n: e.predict(n) * 1e-6 for n in predict} if e else None,
        "needed": e.needed if e else None,
        "process_needed": e.process_needed if e else None,
        "rest_ms": e.step_ns * 1e-6 if e else None,
        "batch_cpu_ms": e.batch_cpu_ns * 1e-6 if e else None,
        "worker_cpu_cores": e.worker_cpu_cores if e else None,
        "free_cores": e.free_cores if e else None,
        "advice": cb._loader.advice(),
        "dataset_left_alone": type(ds) is Batches and vars(ds) == attrs,
        "table_left_alone": not any(isinstance(v, TimedPyDataset) for v in table.values()),
        # the adapter's generator methods are the class's own again (TensorFlow and JAX time the wait around them)
        "adapter_left_alone": not any(callable(v) for v in vars(clock.adapter).values()),
        "load": os.getloadavg()[0],
        "backend": BACKEND,
    }


def step_pulls(logdir: str) -> dict[str, Any]:
    """TensorFlow and JAX, where the step pulls its batch: 2, 3 and 4 worker threads (24 steps each) and one thread
    (Keras loads in the main thread; 8 steps), for :func:`step_pulls.check_step_pulls`. Run in a child whose Keras backend is
    set, after anything that counts warnings (this module ignores them).

    The enqueuer's queue holds as many batches as there are threads (all of them still load at once): with Keras's
    10, the batches made while the fit started could last into the measured second half of a 16-step epoch (3
    threads of 100 ms batches re-measured 30.3 ms a step, faster than they can load)."""
    kw: dict[str, Any] = dict(processes=False, logdir=logdir, batch_ms=STEP_PULLS_BATCH_MS, step_ms=STEP_PULLS_STEP_MS)
    return {"threads": [fit(n, steps=24, max_queue_size=n, **kw) for n in (2, 3, 4)], "main": fit(1, steps=8, **kw)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", required=True)
    parser.add_argument("--processes", action="store_true")
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-ms", type=float, default=120.0)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    out = [
        fit(
            n,
            processes=args.processes,
            logdir=args.logdir,
            steps=args.steps,
            batch_ms=args.batch_ms,
            step_ms=args.step_ms,
            cpu=args.cpu,
            epochs=args.epochs,
        )
        for n in args.workers
    ]
    print("RESULT" + json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()

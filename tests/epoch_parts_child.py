"""The fits of the epoch-parts tests (``tests/test_epoch_parts_fit.py``), one after another in one process: the
framework import (several seconds) is paid once, and the framework, the Keras backend and the thread count are
chosen before it.

    python tests/epoch_parts_child.py {lightning|keras} LOGROOT SCENARIO [SCENARIO ...]

SCENARIO is one of ``validation``, ``checkpoint``, ``callback``, ``startup``, or ``threads`` (alone: it sets the
thread count). Each fit logs under ``LOGROOT/SCENARIO`` with a new model, Trainer (or ``fit`` call) and
:class:`FitProfiler`, plants one cost and times its truth in the same run, by code of its own, not fitprof's:

* ``validation``: 4 validation batches of 40 ms each epoch; truth: a callback's validation start to end;
* ``checkpoint``: a state of :data:`BIG` float32 values saved every 2 steps (``ModelCheckpoint``); truth: the time
  inside each save (``trainer.save_checkpoint`` / Keras ``ModelCheckpoint._save_model``), by epoch, and each save's
  own time in order (``save_s``);
* ``callback``: a callback sleeping 15 ms in ``on_train_batch_end``; truth: its own sleeps;
* ``startup``: 2 loader workers whose ``worker_init_fn`` sleeps 0.4 s, ``persistent_workers=False``; truth: a
  callback's epoch start to first batch start;
* ``threads``: 8 intra-op threads and 2 loader workers on a matmul model (oversubscribed on purpose);
* ``seams`` (Lightning): a train loader of 2 workers (``worker_init_fn`` 0.5 s) behind a sampler whose ``__iter__``
  sleeps 0.3 s, and a validation loader of 2 workers (``worker_init_fn`` 0.4 s), ``persistent_workers=False``;
  a sanity check of 2 batches; truths: the sanity check's hooks, epoch 0's start-up from
  ``on_sanity_check_end`` (Lightning builds epoch 0's loader after it, before ``on_train_epoch_start``) to the
  first batch, validation from the last training batch's end to
  ``on_validation_end`` (the validation loader's workers start in between);
* ``epoch_saves``: a :data:`BIG` state saved at every epoch's end by a checkpoint callback that runs after
  fitprof's epoch-end hook (Lightning's ``ModelCheckpoint``, which Lightning moves last; Keras's after the profiler
  in ``callbacks``); truth: the time inside each save.

Every fit also reports ``fit``: the profiler's ``fit_seconds``, and ``fit_clock``: a clock around ``fit()``.

Every step also sleeps 10 ms in the model, so that the planted costs stand out of the noise of a busy machine.
Prints ``RESULT`` and one JSON object, by scenario: the ``fitprof/epoch/*`` figures each epoch logged (Lightning:
the ``CSVLogger``'s ``metrics.csv`` is read by the test; Keras: ``History``), the truths by epoch, the window's
scalars, each save's time; or ``{"error": traceback}`` for a fit that raised, so that one broken fit never hides the others.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

FRAMEWORK, LOGROOT, SCENARIOS = sys.argv[1], sys.argv[2], sys.argv[3:]
if "threads" in SCENARIOS and SCENARIOS != ["threads"]:
    raise SystemExit("threads sets the process's thread count: run it alone")
THREADS = 8 if SCENARIOS == ["threads"] else 1
os.environ["OMP_NUM_THREADS"] = str(THREADS)
os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(THREADS)
STEPS = 20
BATCH = 8
EPOCHS = 2
STEP_SLEEP_S = 0.010
VAL_SLEEP_S = 0.040
CALLBACK_SLEEP_S = 0.015
INIT_SLEEP_S = 0.4
TRAIN_INIT_SLEEP_S = 0.5
SAMPLER_SLEEP_S = 0.3
BIG = 10_000_000
"""The checkpointed state, in float32 values (40 MB). The test needs the window's saves to stand well out of its
step time: a step must be under half the saves' share of a step, which Lightning's window (2 saves in 5 steps) makes
the tightest. Measured at load 3-7 on 2 cores: window steps of 14-25 ms; 20 MB saves of 49-452 ms, whose share left
a margin under 2x (Lightning's window saves summed to 228-285 ms: 23-29 ms against steps of 14-16 ms); 40 MB saves of
79-570 ms (862 ms in Lightning's window: 86 ms against a 17 ms step)."""


class Samples(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return STEPS * BATCH

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return np.ones(64, dtype="float32"), np.ones(1, dtype="float32")


def slow_init(_: int) -> None:
    time.sleep(INIT_SLEEP_S)


def slow_train_init(_: int) -> None:
    time.sleep(TRAIN_INIT_SLEEP_S)


class SlowSampler(torch.utils.data.Sampler):  # type: ignore[misc]
    def __len__(self) -> int:
        return STEPS * BATCH

    def __iter__(self) -> Any:
        time.sleep(SAMPLER_SLEEP_S)
        return iter(range(STEPS * BATCH))


def loader(scenario: str) -> Any:
    if scenario == "seams":
        return torch.utils.data.DataLoader(
            Samples(),
            batch_size=BATCH,
            sampler=SlowSampler(),
            num_workers=2,
            persistent_workers=False,
            worker_init_fn=slow_train_init,
        )
    workers = 2 if scenario in ("startup", "threads") else 0
    return torch.utils.data.DataLoader(
        Samples(),
        batch_size=BATCH,
        num_workers=workers,
        persistent_workers=False,
        worker_init_fn=slow_init if scenario == "startup" else None,
    )


def work(scenario: str) -> None:
    time.sleep(STEP_SLEEP_S)
    if scenario == "threads":
        a = torch.ones(384, 384)
        for _ in range(6):
            a = a @ a / 384


class Clock:
    """One fit's truths (seconds) by kind and epoch, and each save's own time by epoch, stamped by both frameworks'
    truth callbacks."""

    def __init__(self) -> None:
        self.truth: dict[str, dict[str, float]] = {
            k: {} for k in ("validation", "validation_run", "checkpoint", "callback", "startup", "wall")
        }
        self.save_s: dict[str, list[float]] = {}
        self.epoch = 0
        self.epoch_t0 = 0.0
        self.first = True
        self.val_t0 = 0.0
        self.fit_t0 = 0.0  # Lightning's on_fit_start: epoch 0's loader is built after it, before the epoch's hook
        self.batch_t1 = 0.0  # the last training batch's end
        self.sanity_t0 = 0.0

    def fit_started(self) -> None:
        self.fit_t0 = time.perf_counter()

    def batch_end(self) -> None:
        self.batch_t1 = time.perf_counter()

    def validation_from_batch_end(self) -> None:
        self.add("validation_run", time.perf_counter() - self.batch_t1)

    def add(self, kind: str, seconds: float) -> None:
        by_epoch = self.truth[kind]
        by_epoch[str(self.epoch)] = by_epoch.get(str(self.epoch), 0.0) + seconds

    def epoch_start(self, epoch: int) -> None:
        now = time.perf_counter()
        if epoch > 0:  # the last epoch ran until this one's start: its callbacks' epoch-end hooks are its own
            self.truth["wall"][str(self.epoch)] = now - self.epoch_t0
        self.epoch, self.epoch_t0, self.first = epoch, now, True
        if epoch == 0 and self.fit_t0:
            self.epoch_t0 = self.fit_t0

    def batch_start(self) -> None:
        if self.first:
            self.add("startup", time.perf_counter() - self.epoch_t0)
            self.first = False

    def validation_start(self) -> None:
        self.val_t0 = time.perf_counter()

    def validation_end(self) -> None:
        self.add("validation", time.perf_counter() - self.val_t0)

    def saved(self, t0: float) -> None:
        seconds = time.perf_counter() - t0
        self.add("checkpoint", seconds)
        self.save_s.setdefault(str(self.epoch), []).append(seconds)

    def sleep_in_hook(self) -> None:
        t0 = time.perf_counter()
        time.sleep(CALLBACK_SLEEP_S)
        self.add("callback", time.perf_counter() - t0)


def run_lightning(scenario: str, logdir: str, clock: Clock) -> dict[str, Any]:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    from fitprof.lightning import FitProfiler

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(64, 1)
            if scenario == "checkpoint":
                self.register_buffer("big", torch.zeros(BIG))
            if scenario == "epoch_saves":
                self.register_buffer("big", torch.zeros(BIG))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            work(scenario)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            time.sleep(VAL_SLEEP_S)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Truth(pl.Callback):
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            clock.fit_started()

        def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
            clock.sanity_t0 = time.perf_counter()

        def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
            clock.fit_started()  # epoch 0's loader is built after the sanity check
            clock.truth["sanity_check"] = {"0": clock.fit_t0 - clock.sanity_t0}

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            clock.epoch_start(trainer.current_epoch)

        def on_train_batch_start(self, *args: Any) -> None:
            clock.batch_start()

        def on_train_batch_end(self, *args: Any) -> None:
            clock.batch_end()

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            if not trainer.sanity_checking:
                clock.validation_start()

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if not trainer.sanity_checking:
                clock.validation_end()
                clock.validation_from_batch_end()

    class Sleepy(pl.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            clock.sleep_in_hook()

    profiler = FitProfiler(logdir, verbose=False)
    callbacks: list[Any] = [Truth(), profiler]
    if scenario == "callback":
        callbacks.append(Sleepy())
    if scenario == "checkpoint":
        callbacks.append(
            pl.callbacks.ModelCheckpoint(dirpath=os.path.join(logdir, "ckpt"), every_n_train_steps=2, save_top_k=-1)
        )
    if scenario == "epoch_saves":
        callbacks.insert(0, pl.callbacks.ModelCheckpoint(dirpath=os.path.join(logdir, "ckpt"), save_top_k=-1))
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        callbacks=callbacks,
        logger=CSVLogger(logdir, name="csv", version=0),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=scenario in ("checkpoint", "epoch_saves"),
        num_sanity_val_steps=2 if scenario == "seams" else 0,
        limit_val_batches=4 if scenario in ("validation", "seams") else 0,
        accelerator="cpu",
        devices=1,
    )
    save = trainer.save_checkpoint

    def timed_save(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return save(*args, **kwargs)
        finally:
            clock.saved(t0)

    trainer.save_checkpoint = timed_save  # type: ignore[method-assign]
    val = torch.utils.data.DataLoader(Samples(), batch_size=BATCH) if scenario == "validation" else None
    if scenario == "seams":
        val = torch.utils.data.DataLoader(
            Samples(), batch_size=BATCH, num_workers=2, persistent_workers=False, worker_init_fn=slow_init
        )
    model, train = Model(), loader(scenario)
    t0 = time.perf_counter()
    trainer.fit(model, train, val)
    fit_clock = time.perf_counter() - t0
    return {
        "window": {str(e): r.scalars() for e, r in profiler.reports.items()},
        "fit": profiler.fit_seconds,
        "fit_clock": fit_clock,
    }


def run_keras(scenario: str, logdir: str, clock: Clock) -> dict[str, Any]:
    import keras

    from fitprof.keras import FitProfiler

    class Model(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(1)
            if scenario in ("checkpoint", "epoch_saves"):
                self.big = self.add_weight(shape=(BIG,), initializer="zeros", trainable=False)

        def call(self, x: Any) -> Any:
            work(scenario)
            return self.dense(x)

    class SlowValidation(keras.utils.PyDataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> Any:
            time.sleep(VAL_SLEEP_S)
            return np.ones((BATCH, 64), dtype="float32"), np.ones((BATCH, 1), dtype="float32")

    class Truth(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            clock.epoch_start(epoch)

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            clock.batch_start()

        def on_test_begin(self, logs: Any = None) -> None:
            clock.validation_start()

        def on_test_end(self, logs: Any = None) -> None:
            clock.validation_end()

    class Sleepy(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            clock.sleep_in_hook()

    class TimedCheckpoint(keras.callbacks.ModelCheckpoint):
        def _save_model(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._save_model(*args, **kwargs)
            finally:
                clock.saved(t0)

    profiler = FitProfiler(logdir, verbose=False)
    callbacks: list[Any] = [Truth(), profiler]
    if scenario == "callback":
        callbacks.append(Sleepy())
    if scenario == "checkpoint":
        path = os.path.join(logdir, "ckpt", "m_{epoch}_{batch}.weights.h5")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        callbacks.append(TimedCheckpoint(path, save_weights_only=True, save_freq=2))
    if scenario == "epoch_saves":  # after the profiler: its save runs after fitprof's on_epoch_end
        path = os.path.join(logdir, "ckpt", "m_{epoch}.weights.h5")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        callbacks.append(TimedCheckpoint(path, save_weights_only=True, save_freq="epoch"))
    model = Model()
    model.compile(optimizer="sgd", loss="mse")
    train = loader(scenario)
    t0 = time.perf_counter()
    hist = model.fit(
        train,
        epochs=EPOCHS,
        verbose=0,
        callbacks=callbacks,
        validation_data=SlowValidation() if scenario == "validation" else None,
    )
    fit_clock = time.perf_counter() - t0
    history = {k: [float(v) for v in vals] for k, vals in hist.history.items() if k.startswith("fitprof/")}
    return {
        "history": history,
        "window": {str(e): r.scalars() for e, r in profiler.reports.items()},
        "fit": profiler.fit_seconds,
        "fit_clock": fit_clock,
    }


def run(scenario: str) -> dict[str, Any]:
    """One fit of ``scenario`` under ``LOGROOT/scenario``: its figures and truths, or the error it raised."""
    clock = Clock()
    fit = run_lightning if FRAMEWORK == "lightning" else run_keras
    try:
        out = fit(scenario, os.path.join(LOGROOT, scenario), clock)
    except Exception:
        return {"error": traceback.format_exc()}
    out["truth"] = clock.truth
    out["save_s"] = clock.save_s
    return out


if __name__ == "__main__":
    print("RESULT" + json.dumps({scenario: run(scenario) for scenario in SCENARIOS}))

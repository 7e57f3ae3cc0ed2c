"""One fit for the epoch-parts tests (``tests/test_epoch_parts_fit.py``), in its own process: the framework, the
Keras backend and the thread count are chosen before the import.

    python tests/epoch_parts_child.py {lightning|keras} {validation|checkpoint|callback|startup|threads} LOGDIR

Each scenario plants one cost and times its truth in the same run, by code of its own, not fitprof's:

* ``validation``: 4 validation batches of 40 ms each epoch; truth: a callback's validation start to end;
* ``checkpoint``: an 80 MB state saved every 2 steps (``ModelCheckpoint``); truth: the time inside each save
  (``trainer.save_checkpoint`` / Keras ``ModelCheckpoint._save_model``), by epoch;
* ``callback``: a callback sleeping 15 ms in ``on_train_batch_end``; truth: its own sleeps;
* ``startup``: 2 loader workers whose ``worker_init_fn`` sleeps 0.4 s, ``persistent_workers=False``; truth: a
  callback's epoch start to first batch start;
* ``threads``: 8 intra-op threads and 2 loader workers on a matmul model (oversubscribed on purpose).

Every step also sleeps 10 ms in the model, so that the planted costs stand out of the noise of a busy machine.
Prints ``RESULT`` and one JSON object: the ``fitprof/epoch/*`` figures each epoch logged (Lightning: the
``CSVLogger``'s ``metrics.csv`` is read by the test; Keras: ``History``), the truths by epoch, the window's scalars.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

FRAMEWORK, SCENARIO, LOGDIR = sys.argv[1], sys.argv[2], sys.argv[3]
THREADS = 8 if SCENARIO == "threads" else 1
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
BIG = 20_000_000  # float32: 80 MB of state
T = {"validation": {}, "checkpoint": {}, "callback": {}, "startup": {}, "wall": {}}


def add(kind: str, epoch: int, seconds: float) -> None:
    T[kind][str(epoch)] = T[kind].get(str(epoch), 0.0) + seconds


class Samples(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return STEPS * BATCH

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return np.ones(64, dtype="float32"), np.ones(1, dtype="float32")


def slow_init(_: int) -> None:
    time.sleep(INIT_SLEEP_S)


def loader() -> Any:
    workers = 2 if SCENARIO in ("startup", "threads") else 0
    return torch.utils.data.DataLoader(
        Samples(),
        batch_size=BATCH,
        num_workers=workers,
        persistent_workers=False,
        worker_init_fn=slow_init if SCENARIO == "startup" else None,
    )


def work() -> None:
    time.sleep(STEP_SLEEP_S)
    if SCENARIO == "threads":
        a = torch.ones(384, 384)
        for _ in range(6):
            a = a @ a / 384


class Clock:
    """The truths' stamps, shared by both frameworks' truth callbacks."""

    def __init__(self) -> None:
        self.epoch = 0
        self.epoch_t0 = 0.0
        self.first = True
        self.val_t0 = 0.0

    def epoch_start(self, epoch: int) -> None:
        self.epoch, self.epoch_t0, self.first = epoch, time.perf_counter(), True

    def batch_start(self) -> None:
        if self.first:
            add("startup", self.epoch, time.perf_counter() - self.epoch_t0)
            self.first = False

    def validation_start(self) -> None:
        self.val_t0 = time.perf_counter()

    def validation_end(self) -> None:
        add("validation", self.epoch, time.perf_counter() - self.val_t0)

    def epoch_end(self) -> None:
        add("wall", self.epoch, time.perf_counter() - self.epoch_t0)

    def sleep_in_hook(self) -> None:
        t0 = time.perf_counter()
        time.sleep(CALLBACK_SLEEP_S)
        add("callback", self.epoch, time.perf_counter() - t0)


CLOCK = Clock()


def run_lightning() -> dict[str, Any]:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    from fitprof.lightning import FitProfiler

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(64, 1)
            if SCENARIO == "checkpoint":
                self.register_buffer("big", torch.zeros(BIG))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            work()
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            time.sleep(VAL_SLEEP_S)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Truth(pl.Callback):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            CLOCK.epoch_start(trainer.current_epoch)

        def on_train_batch_start(self, *args: Any) -> None:
            CLOCK.batch_start()

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            if not trainer.sanity_checking:
                CLOCK.validation_start()

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if not trainer.sanity_checking:
                CLOCK.validation_end()

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            CLOCK.epoch_end()

    class Sleepy(pl.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            CLOCK.sleep_in_hook()

    profiler = FitProfiler(LOGDIR, verbose=False)
    callbacks: list[Any] = [Truth(), profiler]
    if SCENARIO == "callback":
        callbacks.append(Sleepy())
    if SCENARIO == "checkpoint":
        callbacks.append(
            pl.callbacks.ModelCheckpoint(dirpath=os.path.join(LOGDIR, "ckpt"), every_n_train_steps=2, save_top_k=-1)
        )
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        callbacks=callbacks,
        logger=CSVLogger(LOGDIR, name="csv", version=0),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=SCENARIO == "checkpoint",
        num_sanity_val_steps=0,
        limit_val_batches=4 if SCENARIO == "validation" else 0,
        accelerator="cpu",
        devices=1,
    )
    save = trainer.save_checkpoint

    def timed_save(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return save(*args, **kwargs)
        finally:
            add("checkpoint", CLOCK.epoch, time.perf_counter() - t0)

    trainer.save_checkpoint = timed_save  # type: ignore[method-assign]
    val = torch.utils.data.DataLoader(Samples(), batch_size=BATCH) if SCENARIO == "validation" else None
    trainer.fit(Model(), loader(), val)
    return {"window": {str(e): r.scalars() for e, r in profiler.reports.items()}}


def run_keras() -> dict[str, Any]:
    import keras

    from fitprof.keras import FitProfiler

    class Model(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(1)
            if SCENARIO == "checkpoint":
                self.big = self.add_weight(shape=(BIG,), initializer="zeros", trainable=False)

        def call(self, x: Any) -> Any:
            work()
            return self.dense(x)

    class SlowValidation(keras.utils.PyDataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> Any:
            time.sleep(VAL_SLEEP_S)
            return np.ones((BATCH, 64), dtype="float32"), np.ones((BATCH, 1), dtype="float32")

    class Truth(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            CLOCK.epoch_start(epoch)

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            CLOCK.batch_start()

        def on_test_begin(self, logs: Any = None) -> None:
            CLOCK.validation_start()

        def on_test_end(self, logs: Any = None) -> None:
            CLOCK.validation_end()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            CLOCK.epoch_end()

    class Sleepy(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            CLOCK.sleep_in_hook()

    class TimedCheckpoint(keras.callbacks.ModelCheckpoint):
        def _save_model(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._save_model(*args, **kwargs)
            finally:
                add("checkpoint", CLOCK.epoch, time.perf_counter() - t0)

    profiler = FitProfiler(LOGDIR, verbose=False)
    callbacks: list[Any] = [Truth(), profiler]
    if SCENARIO == "callback":
        callbacks.append(Sleepy())
    if SCENARIO == "checkpoint":
        path = os.path.join(LOGDIR, "ckpt", "m_{epoch}_{batch}.weights.h5")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        callbacks.append(TimedCheckpoint(path, save_weights_only=True, save_freq=2))
    model = Model()
    model.compile(optimizer="sgd", loss="mse")
    hist = model.fit(
        loader(),
        epochs=EPOCHS,
        verbose=0,
        callbacks=callbacks,
        validation_data=SlowValidation() if SCENARIO == "validation" else None,
    )
    history = {k: [float(v) for v in vals] for k, vals in hist.history.items() if k.startswith("fitprof/")}
    return {"history": history, "window": {str(e): r.scalars() for e, r in profiler.reports.items()}}


if __name__ == "__main__":
    out = run_lightning() if FRAMEWORK == "lightning" else run_keras()
    out["truth"] = T
    print("RESULT" + json.dumps(out))

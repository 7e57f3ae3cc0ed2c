"""The fits of ``tests/test_epoch_saves.py``: a save at every epoch's end made by a callback that runs after fitprof's
epoch-end hook, in one child process per framework (the framework, and Keras's backend, chosen before the import).

    python tests/epoch_saves_child.py {lightning|keras} LOGDIR

Three epochs of 10 steps (10 ms each), each epoch's save modelled by a sleep of its own length (:data:`SAVE_S`: a
save charged to the wrong epoch shows as the wrong length), timed by the child's own clock around the save method
(the truth). On Lightning the checkpoint callback is a ``ModelCheckpoint`` listed *before* fitprof: Lightning moves
it after every other callback, so its save runs after fitprof's ``on_train_epoch_end``; the model's
``on_save_checkpoint`` sleeps (inside ``trainer.save_checkpoint``, whose whole call is the truth); a ``CSVLogger``
and a ``TensorBoardLogger`` log the epochs. On Keras (torch backend) a ``ModelCheckpoint`` and a callback that sleeps
:data:`HOOK_S` in ``on_epoch_end`` are listed after fitprof.

Prints ``RESULT`` and one JSON object: ``saves``, ``hooks`` and ``other`` (:class:`Truth`), ``fit`` (``FitProfiler.fit_seconds``), ``history`` (Keras: ``History``'s ``fitprof/epoch/*`` lists),
``callback_metrics`` (Lightning: the ``fitprof/epoch/*`` keys ``trainer.callback_metrics`` holds at the end); or
``{"error": traceback}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

FRAMEWORK, LOGDIR = sys.argv[1], sys.argv[2]
os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
STEPS, BATCH, EPOCHS = 10, 8, 3
STEP_S = 0.010
SAVE_S = (0.20, 0.30, 0.25)
"""Each epoch's save (s): three lengths, so that a save counted in the next epoch reads as another length."""
HOOK_S = 0.05
"""Keras: another callback's ``on_epoch_end`` after fitprof's (s): callback time, also the epoch's own."""


class Samples(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return STEPS * BATCH

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return np.ones(16, dtype="float32"), np.ones(1, dtype="float32")


def loader() -> Any:
    return torch.utils.data.DataLoader(Samples(), batch_size=BATCH)


class Truth:
    """Seconds by epoch: ``saves`` inside the save method, ``hooks`` inside the checkpoint callback's epoch-end hook
    (the save and the callback's own work around it: what fitprof counts as checkpoint time), ``other`` inside
    Keras's sleeping hook."""

    def __init__(self) -> None:
        self.saves: dict[str, float] = {}
        self.hooks: dict[str, float] = {}
        self.other: dict[str, float] = {}

    @staticmethod
    def add(where: dict[str, float], epoch: int, t0: float) -> None:
        where[str(epoch)] = where.get(str(epoch), 0.0) + time.perf_counter() - t0


def run_lightning(truth: Truth) -> dict[str, Any]:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from fitprof.lightning import FitProfiler

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(16, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            time.sleep(STEP_S)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            time.sleep(SAVE_S[self.trainer.current_epoch])  # the save's cost, inside trainer.save_checkpoint

    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=os.path.join(LOGDIR, "ckpt"), save_top_k=-1)
    hook = checkpoint.on_train_epoch_end

    def timed_hook(trainer: Any, pl_module: Any) -> None:  # on the instance: still ModelCheckpoint's hook
        t0 = time.perf_counter()
        hook(trainer, pl_module)
        Truth.add(truth.hooks, trainer.current_epoch, t0)

    checkpoint.on_train_epoch_end = timed_hook  # type: ignore[method-assign]
    profiler = FitProfiler(LOGDIR, verbose=True)
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        callbacks=[checkpoint, profiler],
        logger=[CSVLogger(LOGDIR, name="csv", version=0), TensorBoardLogger(LOGDIR, name="tb", version=0)],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        accelerator="cpu",
        devices=1,
    )
    save = trainer.save_checkpoint

    def timed_save(*args: Any, **kwargs: Any) -> Any:  # the truth: the whole save, file written
        t0 = time.perf_counter()
        try:
            return save(*args, **kwargs)
        finally:
            Truth.add(truth.saves, trainer.current_epoch, t0)

    trainer.save_checkpoint = timed_save  # type: ignore[method-assign]
    trainer.fit(Model(), loader())
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("fitprof/epoch/")}
    return {"fit": profiler.fit_seconds, "callback_metrics": metrics}


def run_keras(truth: Truth) -> dict[str, Any]:
    import keras

    from fitprof.keras import FitProfiler

    class Model(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x: Any) -> Any:
            time.sleep(STEP_S)
            return self.dense(x)

    class SleepySave(keras.callbacks.ModelCheckpoint):
        def _save_model(self, epoch: int, batch: Any, logs: Any) -> None:
            t0 = time.perf_counter()
            time.sleep(SAVE_S[epoch])
            super()._save_model(epoch, batch, logs)
            Truth.add(truth.saves, epoch, t0)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            t0 = time.perf_counter()
            super().on_epoch_end(epoch, logs)
            Truth.add(truth.hooks, epoch, t0)

    class SlowHook(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            t0 = time.perf_counter()
            time.sleep(HOOK_S)
            Truth.add(truth.other, epoch, t0)

    profiler = FitProfiler(LOGDIR, verbose=False)
    path = os.path.join(LOGDIR, "ckpt", "m_{epoch}.weights.h5")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    model = Model()
    model.compile(optimizer="sgd", loss="mse")
    hist = model.fit(
        loader(),
        epochs=EPOCHS,
        verbose=0,
        callbacks=[profiler, SleepySave(path, save_weights_only=True, save_freq="epoch"), SlowHook()],
    )
    history = {k: [float(v) for v in vals] for k, vals in hist.history.items() if k.startswith("fitprof/epoch/")}
    return {"fit": profiler.fit_seconds, "history": history}


if __name__ == "__main__":
    truth = Truth()
    try:
        out = (run_lightning if FRAMEWORK == "lightning" else run_keras)(truth)
        out.update(saves=truth.saves, hooks=truth.hooks, other=truth.other)
    except Exception:
        out = {"error": traceback.format_exc()}
    print("RESULT" + json.dumps(out))

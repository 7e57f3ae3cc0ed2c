"""The loader figures in a Lightning fit: the FitProfiler times the train DataLoader's workers and predicts the step
time with more of them; the prediction is checked by re-measuring with that many workers (sleep-modelled work:
the training step sleeps as a host waits for its GPU, each ``__getitem__`` sleeps; tests/loader_loop.py).

Tolerances are the issue's: the predicted step time within 20% of the re-measured one, the busy share within 10 pp
of the truth the dataset and collate time themselves. The modelled step (20 ms) and samples (60 ms) are long against
Lightning's own few ms of main-thread CPU a step, which stretch as the thread gets busier on 2 shared cores: with a
6 ms step and 20 ms samples, 4 and 5 workers re-measured 23% and 52% slower than predicted at load 8. At this scale,
load 10: 2, 3, 4 workers re-measured −2.6%, +2.6%, +9.0% from the prediction; the busy
share 2.2-4.8 pp above the truth (Lightning's epoch hooks, the truth's clock, are not the probe's).
"""

from __future__ import annotations

import csv
import ctypes
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from contention import tolerates_load  # noqa: E402
from fitprof.lightning import FitProfiler  # noqa: E402
from loader_loop import ModelledCollate, ModelledDataset  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

BATCH, STEPS, ITEM_MS, STEP_MS = 2, 40, 60.0, 20.0


class Sleepy(pl.LightningModule):
    """A training step that waits ``STEP_MS`` (a host waiting for its GPU) around a tiny linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        time.sleep(STEP_MS * 1e-3)
        return self.layer(batch).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.0)


class EpochClock(pl.Callback):
    """The epoch's wall time, next to the profiler's own epoch boundaries."""

    def __init__(self) -> None:
        self.start = self.end = 0

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.start = time.perf_counter_ns()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.end = time.perf_counter_ns()


def fit(tmp_path: Path, workers: int, *, persistent: bool = False, epochs: int = 1) -> dict[str, Any]:
    """One fit; the logged figures, the truth's busy share of the last epoch and the probe's last epoch."""
    torch.set_num_threads(1)
    truth = multiprocessing.get_context("fork").RawArray(ctypes.c_int64, 9)
    loader = DataLoader(
        ModelledDataset(STEPS * BATCH, ITEM_MS, truth),
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=ModelledCollate(0.0, truth),
        multiprocessing_context="fork" if workers else None,
        persistent_workers=persistent,
    )
    cb, clock = FitProfiler(log_dir=str(tmp_path / f"w{workers}"), profile_batch=0, verbose=False), EpochClock()
    trainer = pl.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[cb, clock],
    )
    before = [0] * 9

    class Snapshot(pl.Callback):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            before[:] = list(truth)

    trainer.callbacks.append(Snapshot())
    trainer.fit(Sleepy(), train_dataloaders=loader)
    done = [a - b for a, b in zip(truth, before, strict=True)]
    wall = clock.end - clock.start
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("fitprof/epoch/")}
    return {
        "metrics": metrics,
        "truth_busy": 100.0 * sum(done[1:]) / (workers * wall) if workers else float("nan"),
        "probe": cb._loader.last,
        "step_ms": BATCH * 1000.0 / metrics["fitprof/epoch/samples_per_s"],
        "init_fn": loader.worker_init_fn,
    }


@tolerates_load
def test_the_prediction_holds_when_re_measured(tmp_path: Path) -> None:
    """One worker: the logged figures, the busy share against the truth, and the step time predicted for 2, 3 and 4
    workers, each re-measured by a fit with that many workers (its logged samples/s). The advised count is not
    re-measured here: it runs the workers close to the step's own time, where the load of a shared machine decides
    (re-measured +9.4% and -24.5% from its prediction in two fits at load 10-11)."""
    one = fit(tmp_path, 1)
    m, e = one["metrics"], one["probe"]
    assert e is not None and one["init_fn"] is None  # the loader's worker_init_fn is given back
    assert m["fitprof/epoch/loader_workers"] == 1
    assert m["fitprof/epoch/loader_batch_ms"] == pytest.approx(e.batch_ns * 1e-6)
    assert m["fitprof/epoch/loader_batch_ms"] >= BATCH * ITEM_MS  # two 20 ms sleeps a batch, at least
    assert abs(m["fitprof/epoch/loader_busy_percent"] - one["truth_busy"]) <= 10.0
    needed = int(m["fitprof/epoch/loader_workers_needed"])
    assert needed >= 4  # sleeping workers: more than the 2 cores pay off
    assert m["fitprof/epoch/step_time_if_enough_workers_ms"] == pytest.approx(e.predict(needed) * 1e-6)
    predicted = {n: e.predict(n) * 1e-6 for n in (2, 3, 4)}
    for n, want in sorted(predicted.items()):
        again = fit(tmp_path, n)
        got = again["step_ms"]
        assert abs(want - got) <= 0.2 * got, (n, want, got)
        assert abs(again["metrics"]["fitprof/epoch/loader_busy_percent"] - again["truth_busy"]) <= 10.0
        assert again["metrics"]["fitprof/epoch/loader_workers"] == n


def test_persistent_workers_are_timed_every_epoch(tmp_path: Path) -> None:
    two = fit(tmp_path, 2, persistent=True, epochs=2)
    m = two["metrics"]  # the last epoch's
    assert m["fitprof/epoch/loader_workers"] == 2
    assert abs(m["fitprof/epoch/loader_busy_percent"] - two["truth_busy"]) <= 10.0
    assert m["fitprof/epoch/loader_batch_ms"] >= BATCH * ITEM_MS


def test_no_workers(tmp_path: Path) -> None:
    zero = fit(tmp_path, 0)
    m = zero["metrics"]
    assert m["fitprof/epoch/loader_workers"] == 0
    assert m["fitprof/epoch/loader_batch_ms"] >= BATCH * ITEM_MS  # the main process's wait is the loading
    assert m["fitprof/epoch/loader_workers_needed"] >= 2


class CountedCollate(ModelledCollate):
    """:class:`ModelledCollate` that also counts the batches it makes (``count``, a shared value with its lock):
    Lightning calls ``iter()`` twice on a train loader it has just set up, and the first iterator's workers make
    batches the loop never gets."""

    def __init__(self, truth: Any, count: Any) -> None:
        super().__init__(0.0, truth)
        self.count = count

    def __call__(self, samples: list[Any]) -> Any:
        out = super().__call__(samples)
        with self.count.get_lock():
            self.count.value += 1
        return out


class TwoLoaders(pl.LightningModule):
    """Two train loaders in a dict (one worker each: 2 samples of ``A_MS``, of ``B_MS``), made again at every epoch
    (``reload_dataloaders_every_n_epochs=1``); each sample times itself into its loader's truth array."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.steps = steps
        ctx = multiprocessing.get_context("fork")
        self.truths = {"a": ctx.RawArray(ctypes.c_int64, 9), "b": ctx.RawArray(ctypes.c_int64, 9)}
        self.counts = {"a": ctx.Value(ctypes.c_int64, 0), "b": ctx.Value(ctypes.c_int64, 0)}
        self.made: list[dict[str, DataLoader]] = []

    def train_dataloader(self) -> Any:
        loaders = {
            name: DataLoader(
                ModelledDataset(self.steps * BATCH, ms, self.truths[name]),
                batch_size=BATCH,
                num_workers=1,
                collate_fn=CountedCollate(self.truths[name], self.counts[name]),
                multiprocessing_context="fork",
            )
            for name, ms in (("a", A_MS), ("b", B_MS))
        }
        self.made.append(loaders)
        return loaders

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        time.sleep(STEP_MS * 1e-3)
        return self.layer(batch["a"]).sum() + self.layer(batch["b"]).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.0)


A_MS, B_MS = 30.0, 20.0


def test_reloaded_and_several_loaders_are_all_timed(tmp_path: Path) -> None:
    """Two loaders feeding each step, made again at the second epoch: that epoch's figures come from the new loaders'
    workers, both of them (2 workers; the worker time per step is both batches', 2 x 30 + 2 x 20 ms, and the busy
    share is both workers' against the truth the samples time themselves), and every loader of the fit gets its
    ``worker_init_fn`` back."""
    torch.set_num_threads(1)
    steps = 16
    module = TwoLoaders(steps)
    cb, clock = FitProfiler(log_dir=str(tmp_path), profile_batch=0, verbose=False), EpochClock()
    before: list[int] = []

    class Snapshot(pl.Callback):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            before[:] = [*module.truths["a"], *module.truths["b"], module.counts["a"].value, module.counts["b"].value]

    trainer = pl.Trainer(
        max_epochs=2,
        reload_dataloaders_every_n_epochs=1,
        logger=CSVLogger(tmp_path, name="csv"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[cb, clock, Snapshot()],
    )
    trainer.fit(module)
    assert len(module.made) == 2  # the second epoch ran on new loaders
    after = [*module.truths["a"], *module.truths["b"], module.counts["a"].value, module.counts["b"].value]
    done = [a - b for a, b in zip(after, before, strict=True)]
    worker_ns = sum(done[1:9]) + sum(done[10:18])  # slot 0 of each: the main process
    combined = (done[18] + done[19]) / 2  # steps' worth of batches made, one from each loader a step
    with open(next(tmp_path.glob("csv/*/metrics.csv")), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    last = [r for r in rows if r["epoch"] == "1" and r.get("fitprof/epoch/loader_workers")]
    assert len(last) == 1, rows  # the second epoch's figures, logged (a NaN figure is not)
    m = {k: float(v) for k, v in last[0].items() if k.startswith("fitprof/epoch/") and v}
    assert m["fitprof/epoch/loader_workers"] == 2
    assert abs(m["fitprof/epoch/loader_busy_percent"] - 100.0 * worker_ns / (2 * (clock.end - clock.start))) <= 10.0
    assert combined >= steps
    per_step = worker_ns * 1e-6 / combined
    assert per_step >= BATCH * (A_MS + B_MS)
    assert abs(m["fitprof/epoch/loader_batch_ms"] - per_step) <= 0.1 * per_step
    for loaders in module.made:
        assert all(loader.worker_init_fn is None for loader in loaders.values())

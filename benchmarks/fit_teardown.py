"""What fitprof adds between the last epoch's end and the return of ``fit``: paired Lightning fits in one process.

Each repeat runs, interleaved, three fits of the same quickstart-sized model (an MLP, 2 epochs of 14 steps, 1 torch
thread, CPU): no fitprof (``none``); ``FitProfiler(profile_batch=(2, 6))`` as shipped, whose last window's
``.xplane.pb`` is converted after ``fit`` returns (``fitprof``); and the same with ``FITPROF_WAIT_FOR_PROFILES=1``, the
end of the fit waiting for that conversion as it did before (``waiting``); and, to tell Lightning's share from
fitprof's, a plain callback that logs as many float figures as fitprof logs, the way it logs them (``self.log``,
``on_epoch=True``; ``log-only``): Lightning's teardown moves every logged result to the CPU. A callback placed after fitprof's takes
the time at the last ``on_train_epoch_end``; the time after ``trainer.fit`` returns closes the span. After each
fitprof fit (outside the span) :func:`fitprof.wait_for_profiles` waits for its files, so no conversion runs into the
next fit. The load average is printed before and after.

    python benchmarks/fit_teardown.py --repeats 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

import fitprof
from fitprof.fit.xplane_worker import WAIT_ENV
from fitprof.lightning import FitProfiler


class Mlp(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class LogOnly(pl.Callback):
    """Logs ``keys`` float figures at each epoch's end as fitprof's callback logs its own, and nothing else."""

    def __init__(self, keys: int) -> None:
        self.keys = keys

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for i in range(self.keys):
            pl_module.log(f"bench/figure_{i}", float(i), on_step=False, on_epoch=True, sync_dist=False, batch_size=1)


class LastEpochEnd(pl.Callback):
    """The time of the last ``on_train_epoch_end`` (after every callback before it in the list)."""

    def __init__(self) -> None:
        self.t: float | None = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.t = time.perf_counter()


def loader() -> Any:
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(14 * 16, 32, generator=g), torch.randn(14 * 16, 1, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=16)


def one_fit(arm: str, root: Path, keys: int = 0) -> tuple[float, int]:
    """The seconds from the last epoch's end to ``fit``'s return, and the figures fitprof logged (0 without it)."""
    clock = LastEpochEnd()
    callbacks: list[Any] = [clock]
    run = root / f"{arm}-{time.monotonic_ns()}"
    profiler = None
    if arm == "log-only":
        callbacks.insert(0, LogOnly(keys))
    elif arm != "none":
        profiler = FitProfiler(log_dir=str(run), profile_batch=(2, 6), verbose=False)
        callbacks.insert(0, profiler)
    if arm == "waiting":
        os.environ[WAIT_ENV] = "1"
    else:
        os.environ.pop(WAIT_ENV, None)
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=run,
    )
    trainer.fit(Mlp(), loader())
    end = time.perf_counter()
    assert clock.t is not None
    logged = 0
    if profiler is not None:
        fitprof.wait_for_profiles(run, timeout=300)
        assert list(run.glob("plugins/profile/*/*.xplane.pb")), "no .xplane.pb written"
        logged = sum(1 for k in trainer.callback_metrics if k.startswith("fitprof/"))
    return end - clock.t, logged


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(1)
    arms = ["none", "fitprof", "waiting", "log-only"]
    print(f"load before: {Path('/proc/loadavg').read_text().strip()}")
    gaps: dict[str, list[float]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="fit-teardown-") as tmp:
        keys = 0
        for arm in arms:  # the first fit of each arm pays imports and Lightning's set-up: not counted
            keys = max(keys, one_fit(arm, Path(tmp), keys)[1])
        print(f"fitprof logged {keys} figures; log-only logs as many")
        for r in range(args.repeats):
            order = arms if r % 2 == 0 else arms[::-1]
            for arm in order:
                gaps[arm].append(one_fit(arm, Path(tmp), keys)[0])
            print(f"repeat {r}: " + ", ".join(f"{a} {1e3 * gaps[a][-1]:.1f} ms" for a in arms), flush=True)
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    print("\nlast epoch's end to fit's return, ms: median [min, max]")
    for arm in arms:
        v = [1e3 * x for x in gaps[arm]]
        print(f"  {arm:8s} {statistics.median(v):8.1f} [{min(v):.1f}, {max(v):.1f}]")
    for arm in arms[1:]:
        d = [1e3 * (a - b) for a, b in zip(gaps[arm], gaps["none"], strict=True)]
        print(f"  {arm} - none, paired by repeat: median {statistics.median(d):.1f} ms [{min(d):.1f}, {max(d):.1f}]")


if __name__ == "__main__":
    main()

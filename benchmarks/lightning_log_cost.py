"""What handing a profiled epoch's figures to Lightning costs at the epoch's end, by route, interleaved in one fit.

A tiny fit (one ``Linear``, 2 steps an epoch, 1 torch thread, CPU; the module logs its loss per step and per epoch,
as most do; ``--loggers``: a ``CSVLogger`` and a ``TensorBoardLogger`` by default) whose callback hands ``--keys``
float figures (two of them progress-bar keys) to Lightning in ``on_train_epoch_end``, by one route an epoch, the
routes taking turns:

- ``self.log``: ``pl_module.log(key, value, prog_bar=..., on_step=False, on_epoch=True, sync_dist=False,
  batch_size=1, reduce_fx="max")`` per key, as ``FitProfiler`` logged them up to 2026-12-04;
- ``direct``: :func:`fitprof.lightning._trainer.log_figures`, as ``FitProfiler`` logs them now
  (``callback_metrics`` written directly, one ``log_metrics`` row per logger).

Timed in the training thread (``time.thread_time``, CPU) and on the wall clock: the route's own calls, and the whole
epoch end, from the callback's ``on_train_epoch_end`` to the next epoch's ``on_train_epoch_start`` (Lightning writes
``self.log``'s values to the loggers after the hooks, so only the whole span compares the routes fairly). Each
route's first epoch (where ``self.log`` builds its result objects) is reported apart from the later ones.

``--teardown-fits N``: then N more fits, one route each, alternating, each timed from ``on_train_end`` to
``trainer.fit``'s return: Lightning walks the logged result objects at the fit's teardown.

At the end the figures are read back: each epoch's row of ``metrics.csv`` (with ``csv`` among the loggers) must
hold that epoch's values, and ``trainer.callback_metrics`` the last epoch's.

    python benchmarks/lightning_log_cost.py [--keys 53] [--epochs 12] [--routes self.log direct]
        [--loggers csv tb] [--teardown-fits 6]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROUTES = ("self.log", "direct")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=53, help="figures per epoch end (a profiled epoch's: 37-53)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    parser.add_argument("--loggers", nargs="*", default=["csv", "tb"], choices=["csv", "tb"])
    parser.add_argument("--teardown-fits", type=int, default=0)
    args = parser.parse_args()

    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from fitprof.lightning._trainer import log_figures

    torch.set_num_threads(1)
    keys = [f"fitprof/k{i}" for i in range(args.keys)]
    bar = frozenset(keys[:2])

    def figures(epoch: int) -> dict[str, float]:
        return {k: epoch + i / 1000 for i, k in enumerate(keys)}

    def hand(route: str, trainer: Any, pl_module: Any, epoch: int) -> None:
        if route == "direct":
            log_figures(trainer, figures(epoch), epoch=epoch, progress_bar=bar)
            return
        for key, value in figures(epoch).items():
            pl_module.log(key, float(value), prog_bar=key in bar, on_step=False, on_epoch=True, sync_dist=False,
                          batch_size=1, reduce_fx="max")  # fmt: skip

    def clocks() -> tuple[float, float]:
        return time.perf_counter(), time.thread_time()

    class Handing(pl.Callback):
        def __init__(self, routes: list[str]) -> None:
            self.routes = routes
            self.calls: dict[int, tuple[str, float, float]] = {}  # epoch -> route, wall, CPU (ms)
            self.spans: dict[int, tuple[float, float]] = {}
            self.began: tuple[int, float, float] | None = None
            self.teardown: tuple[float, float] | None = None

        def route(self, epoch: int) -> str:
            return self.routes[epoch % len(self.routes)]

        def close_span(self) -> None:
            if self.began is not None:
                epoch, w0, c0 = self.began
                w, c = clocks()
                self.spans[epoch] = ((w - w0) * 1e3, (c - c0) * 1e3)
                self.began = None

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.close_span()

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            epoch = int(trainer.current_epoch)
            w0, c0 = clocks()
            self.began = (epoch, w0, c0)
            hand(self.route(epoch), trainer, pl_module, epoch)
            w, c = clocks()
            self.calls[epoch] = (self.route(epoch), (w - w0) * 1e3, (c - c0) * 1e3)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.close_span()
            self.teardown = clocks()

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def training_step(self, batch: Any, idx: int) -> Any:
            loss = self.lin(batch[0]).pow(2).mean()
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    root = Path(tempfile.mkdtemp(prefix="fitprof-logcost-"))

    def fit(routes: list[str], epochs: int, name: str) -> tuple[Any, Handing, tuple[float, float]]:
        loggers: list[Any] = []
        if "csv" in args.loggers:
            loggers.append(CSVLogger(root, name=f"{name}-csv", version=0))
        if "tb" in args.loggers:
            loggers.append(TensorBoardLogger(root, name=f"{name}-tb", version=0))
        handing = Handing(routes)
        trainer = pl.Trainer(
            max_epochs=epochs, callbacks=[handing], logger=loggers or False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", log_every_n_steps=1,
        )  # fmt: skip
        trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=4))
        w, c = clocks()
        assert handing.teardown is not None
        return trainer, handing, ((w - handing.teardown[0]) * 1e3, (c - handing.teardown[1]) * 1e3)

    trainer, handing, _ = fit(args.routes, args.epochs, "interleaved")
    print(
        f"{args.keys} figures an epoch end, routes {' / '.join(args.routes)} taking turns over {args.epochs} epochs, "
        f"loggers: {', '.join(args.loggers) or 'none'}; load {os.getloadavg()[0]:.2f}"
    )
    for route in args.routes:
        epochs = sorted(e for e, (r, _, _) in handing.calls.items() if r == route)
        for label, chosen in (("first epoch", epochs[:1]), (f"later ({len(epochs) - 1})", epochs[1:])):
            if not chosen:
                continue
            call_cpu = [handing.calls[e][2] for e in chosen]
            span_cpu = [handing.spans[e][1] for e in chosen if e in handing.spans]
            span_wall = [handing.spans[e][0] for e in chosen if e in handing.spans]
            print(
                f"  {route:8s} {label:11s}: calls CPU median {statistics.median(call_cpu):6.2f} ms "
                f"[{min(call_cpu):.2f}, {max(call_cpu):.2f}]; epoch end CPU median {statistics.median(span_cpu):6.2f} ms "
                f"[{min(span_cpu):.2f}, {max(span_cpu):.2f}], wall {statistics.median(span_wall):6.2f} ms"
            )
    check(trainer, handing, keys, root, args)
    if args.teardown_fits:
        ends: dict[str, list[tuple[float, float]]] = {r: [] for r in args.routes}
        for i in range(args.teardown_fits):
            route = args.routes[i % len(args.routes)]
            _, _, end = fit([route], 2, f"teardown{i}")
            ends[route].append(end)
        print(f"fit end (on_train_end to fit's return), 2-epoch fits alternating; load {os.getloadavg()[0]:.2f}")
        for route, got in ends.items():
            cpu = [c for _, c in got]
            print(f"  {route:8s}: CPU median {statistics.median(cpu):6.2f} ms [{min(cpu):.2f}, {max(cpu):.2f}] "
                  f"over {len(cpu)} fits")  # fmt: skip


def check(trainer: Any, handing: Any, keys: list[str], root: Path, args: Any) -> None:
    """Each epoch's figures, read back from ``metrics.csv`` and ``callback_metrics``; raises on a difference."""
    last = args.epochs - 1
    got = [float(trainer.callback_metrics[k]) for k in keys]
    assert got == [float(last + i / 1000) for i in range(len(keys))] or all(
        abs(g - (last + i / 1000)) < 1e-4 for i, g in enumerate(got)
    ), got
    if "csv" not in args.loggers:
        print("callback_metrics: the last epoch's values")
        return
    with open(root / "interleaved-csv" / "version_0" / "metrics.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get(keys[0])]
    by_epoch = {int(r["epoch"]): r for r in rows}
    assert sorted(by_epoch) == list(range(args.epochs)) and len(rows) == args.epochs, [r["epoch"] for r in rows]
    for epoch, row in by_epoch.items():
        for i, k in enumerate(keys):
            assert abs(float(row[k]) - (epoch + i / 1000)) < 1e-4, (epoch, k, row[k])
    steps = {handing.route(e): int(r["step"]) - 2 * e for e, r in by_epoch.items()}
    print(f"read back: metrics.csv one row an epoch with its values, step of epoch e at 2e + {steps}; "
          "callback_metrics the last epoch's")  # fmt: skip


if __name__ == "__main__":
    main()

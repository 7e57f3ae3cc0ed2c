"""What Lightning's ``self.log`` costs per call at an epoch's end, the way ``FitProfiler`` logs its figures.

A tiny fit (one ``Linear``, 2 steps an epoch, 1 torch thread, CPU, no logger) whose callback logs ``--keys`` float
figures in ``on_train_epoch_end`` through ``pl_module.log(key, value, on_step=False, on_epoch=True,
sync_dist=False, batch_size=1, reduce_fx=...)``, as fitprof does, and times each call (wall and the thread's CPU
time). The first epoch creates Lightning's result object of each key; later epochs reuse them.

    python benchmarks/lightning_log_cost.py [--keys 53] [--epochs 4] [--reduce-fx max mean]

``--reduce-fx``: one set of ``--keys`` keys per reduction, logged in turn in every epoch (the order alternates from
epoch to epoch), so the reductions are compared in one process, interleaved. Prints, per epoch and reduction, the
median call and the sum over the calls (ms), wall and CPU, and the values that reached ``trainer.callback_metrics``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=53, help="figures logged per epoch (fitprof's profiled epoch: 53)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--reduce-fx", nargs="+", default=["max"], help="Lightning reductions to compare")
    args = parser.parse_args()

    import lightning.pytorch as pl
    import torch

    torch.set_num_threads(1)
    calls: dict[tuple[int, str], list[tuple[float, float]]] = {}

    class LogMany(pl.Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            epoch = int(trainer.current_epoch)
            order = args.reduce_fx if epoch % 2 == 0 else args.reduce_fx[::-1]
            for fx in order:
                out = calls.setdefault((epoch, fx), [])
                for i in range(args.keys):
                    t0, c0 = time.perf_counter(), time.thread_time()
                    pl_module.log(
                        f"{fx}/{i}", i + 0.1, on_step=False, on_epoch=True, sync_dist=False, batch_size=1, reduce_fx=fx
                    )
                    out.append((time.perf_counter() - t0, time.thread_time() - c0))

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def training_step(self, batch: Any, idx: int) -> Any:
            loss = self.lin(batch[0]).pow(2).mean()
            self.log("train_loss", loss)  # as most modules do: Lightning's one-time logging set-up happens here
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        callbacks=[LogMany()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=4))
    print(f"{args.keys} self.log calls per epoch end and reduction; load {os.getloadavg()[0]:.2f}")
    for (epoch, fx), out in sorted(calls.items()):
        wall = [w * 1e3 for w, _ in out]
        cpu = [c * 1e3 for _, c in out]
        print(
            f"epoch {epoch} reduce_fx={fx}: per call median wall {statistics.median(wall):.3f} ms, "
            f"CPU {statistics.median(cpu):.3f} ms; sum wall {sum(wall):.1f} ms, CPU {sum(cpu):.1f} ms"
        )
    metrics = trainer.callback_metrics
    print("callback_metrics:", {fx: [float(metrics[f"{fx}/{i}"]) for i in (0, args.keys - 1)] for fx in args.reduce_fx})


if __name__ == "__main__":
    main()

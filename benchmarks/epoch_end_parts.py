"""Where a profiled Lightning epoch end goes: the training thread's CPU time (and wall) of its parts, one fit.

The fit of ``epoch_end_gap.py`` (an 8-layer MLP, 6 steps an epoch, ``FitProfiler(profile_batch=(2, 6),
every_n_epochs=2)``; ``big``: 800 small operators a step, a window of about 10^5 events), with the functions of the
epoch end wrapped in ``time.thread_time`` / ``time.perf_counter`` spans (a function missing from the source tree
under test is skipped, so two trees can be compared by ``PYTHONPATH``). Nested spans overlap: ``TorchProfiler.stop``
holds torch's stop and the export.

    python benchmarks/epoch_end_parts.py [--workload big|tiny]

Prints the load, then per function the CPU and wall time summed over its calls (ms) and the calls; ``GAP`` is the
time from the epoch's last batch to the next epoch's first.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import tempfile
import time
from typing import Any

STEPS = 6
PARTS = (
    ("torch.profiler.profiler", "profile.stop"),
    ("torch.profiler.profiler", "profile.export_chrome_trace"),
    ("fitprof.profilers.torch", "TorchProfiler.stop"),
    ("fitprof.profilers.torch", "_export_gzipped"),
    ("fitprof.profilers.torch", "_odd_names"),
    ("fitprof.profilers.torch", "_gzip_file"),
    ("fitprof.profilers.torch", "_hand_over"),
    ("fitprof.fit.pipeline", "WindowPipeline.analyze"),
    ("fitprof.fit.pipeline", "WindowPipeline.gather"),
    ("fitprof.traces.kineto", "read_kineto"),
    ("fitprof.analysis.table", "analyze_table"),
    ("fitprof.report_files", "write_report_file"),
    ("fitprof.fit.xplane_worker", "XplaneWorker.submit"),
    ("fitprof.lightning.fit_profiler", "FitProfiler._log_scalars"),
    ("fitprof.lightning.fit_profiler", "FitProfiler.on_train_epoch_end"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=["tiny", "big"], default="big")
    args = parser.parse_args()

    import lightning.pytorch as pl
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    spans: dict[str, list[float]] = {}

    def wrap(module: str, qualname: str) -> None:
        owner: Any = importlib.import_module(module)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name, None)
        if original is None:
            print(f"skipped {qualname}: not in this source tree")
            return

        @functools.wraps(original)
        def timed(*a: Any, **k: Any) -> Any:
            c0, t0 = time.thread_time(), time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                span = spans.setdefault(qualname, [0.0, 0.0, 0])
                span[0] += time.thread_time() - c0
                span[1] += time.perf_counter() - t0
                span[2] += 1

        setattr(owner, name, timed)

    for module, qualname in PARTS:
        wrap(module, qualname)
    import fitprof.fit.pipeline as pipeline
    import fitprof.report_files as report_files

    pipeline.write_report_file = report_files.write_report_file  # the name the pipeline imported
    from fitprof.lightning import FitProfiler

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
            self.reps = 800 if args.workload == "big" else 0

        def training_step(self, batch: Any, idx: int) -> Any:
            x, y = batch
            h = self.body(x)
            for _ in range(self.reps):
                h = h * 0.999 + 0.001
            loss = torch.nn.functional.mse_loss(h, y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Gap(pl.Callback):
        def __init__(self) -> None:
            self.end = (0.0, 0.0)

        def on_train_batch_end(self, trainer: Any, *rest: Any) -> None:
            if trainer.current_epoch == 0:
                self.end = (time.thread_time(), time.perf_counter())

        def on_train_batch_start(self, trainer: Any, *rest: Any) -> None:
            if trainer.current_epoch == 1 and "GAP" not in spans:
                spans["GAP"] = [time.thread_time() - self.end[0], time.perf_counter() - self.end[1], 1]

    data = torch.utils.data.TensorDataset(torch.randn(STEPS * 16, 64), torch.randn(STEPS * 16, 64))
    profiler = FitProfiler(log_dir=tempfile.mkdtemp(), profile_batch=(2, STEPS), every_n_epochs=2, verbose=False)
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=[Gap(), profiler],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
    )
    trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=16))
    print(f"{args.workload}; load {os.getloadavg()[0]:.2f}")
    for name, (cpu, wall, calls) in sorted(spans.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:36s} CPU {cpu * 1e3:8.1f} ms  wall {wall * 1e3:8.1f} ms  calls {int(calls)}")


if __name__ == "__main__":
    main()

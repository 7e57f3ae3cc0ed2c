"""What the torch profiler options cost: trace size and profiled step time, each option alone, against a plain
window, side by side in one process (Lightning, a small MLP on the CPU, the default 5-step window).

    python benchmarks/torch_options.py [--repeats 3]

Prints, per option, the gzipped Kineto trace size (KB), the number of trace events and the mean profiled step
time as a ratio to the plain window's in the same repeat (the options run interleaved, so machine load hits
them alike).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch

from fitprof.lightning import FitProfiler

OPTIONS = ("plain", "record_shapes", "profile_memory", "with_stack", "with_flops")


class _MLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _one(option: str, root: Path) -> tuple[int, int, float]:
    kwargs = {} if option == "plain" else {option: True}
    fp = FitProfiler(log_dir=root / option, verbose=False, **kwargs)
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(12 * 32, 64, generator=g), torch.randint(0, 10, (12 * 32,)))
    trainer = pl.Trainer(
        callbacks=[fp],
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=root,
    )
    trainer.fit(_MLP(), torch.utils.data.DataLoader(ds, batch_size=32))
    path = fp.trace_paths[0]
    events = len(json.loads(gzip.decompress(path.read_bytes()))["traceEvents"])
    return path.stat().st_size, events, fp.reports[0].step_time_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes: dict[str, list[int]] = {o: [] for o in OPTIONS}
    counts: dict[str, list[int]] = {o: [] for o in OPTIONS}
    ratios: dict[str, list[float]] = {o: [] for o in OPTIONS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            step = {}
            for option in OPTIONS:
                size, n, ms = _one(option, Path(tmp) / f"r{r}")
                sizes[option].append(size)
                counts[option].append(n)
                step[option] = ms
            for option in OPTIONS:
                ratios[option].append(step[option] / step["plain"])
    print(f"{'option':16} {'trace KB (gz)':>14} {'events':>8} {'step time / plain':>18}")
    for option in OPTIONS:
        ratio = ratios[option]
        print(
            f"{option:16} {statistics.median(sizes[option]) / 1024:14.1f} {statistics.median(counts[option]):8.0f} "
            f"{statistics.median(ratio):10.2f} ({min(ratio):.2f}-{max(ratio):.2f})"
        )


if __name__ == "__main__":
    main()

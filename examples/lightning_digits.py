"""A small convolutional classifier on scikit-learn's handwritten digits, trained with Lightning, profiled by fitprof.

    python examples/lightning_digits.py --logdir logs/lightning [--epochs N] [--slow-input]

The data (``sklearn.datasets.load_digits``: 1,797 8x8 images, shipped with scikit-learn, no download) is fed
through a ``DataLoader`` with ``num_workers=0``. By default ``Dataset.__getitem__`` only indexes a tensor.
``--slow-input`` adds real per-sample CPU augmentation in ``__getitem__`` (zoom, random rotation and blur
with SciPy), which makes the run input-bound.

Both a ``TensorBoardLogger`` (run directory ``LOGDIR``: scalars, the ``fitprof/summary`` text, the Profile
tab) and a ``CSVLogger`` (``LOGDIR/csv/metrics.csv``) receive the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

N_TRAIN = 1536
BATCH_SIZE = 32


class Digits(Dataset):
    """8x8 digit images as ``(1, 8, 8)`` float tensors in [0, 1], with optional per-sample augmentation."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, augment: bool = False, seed: int = 0) -> None:
        self.images = (images / 16.0).astype("float32")
        self.labels = labels.astype("int64")
        self.augment = augment
        self.rng = np.random.default_rng(seed)
        self._x = torch.from_numpy(self.images).unsqueeze(1)
        self._y = torch.from_numpy(self.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.augment:
            return self._x[i], self._y[i]
        from scipy import ndimage

        big = ndimage.zoom(self.images[i], 4, order=3)  # 32x32: enough real work per sample
        big = ndimage.rotate(big, self.rng.uniform(-15, 15), reshape=False, order=3)
        big = ndimage.gaussian_filter(big, sigma=self.rng.uniform(0.2, 1.0))
        small = ndimage.zoom(big, 1 / 4, order=1).astype("float32")
        return torch.from_numpy(small).unsqueeze(0), self._y[i]


def make_loaders(slow_input: bool) -> tuple[DataLoader, DataLoader]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = digits.images, digits.target
    train = Digits(x[:N_TRAIN], y[:N_TRAIN], augment=slow_input)
    val = Digits(x[N_TRAIN:], y[N_TRAIN:])
    generator = torch.Generator().manual_seed(0)
    return (
        DataLoader(train, batch_size=BATCH_SIZE, shuffle=True, num_workers=0, generator=generator),
        DataLoader(val, batch_size=BATCH_SIZE, num_workers=0),
    )


def build_module() -> Any:
    import lightning.pytorch as pl

    class DigitsNet(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Conv2d(1, 32, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(32, 32, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(32 * 4 * 4, 64),
                nn.ReLU(),
                nn.Linear(64, 10),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            logits = self(x)
            self.log("val_loss", nn.functional.cross_entropy(logits, y))
            self.log("val_acc", (logits.argmax(1) == y).float().mean())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    return DigitsNet()


def main(argv: list[str] | None = None, *, callbacks: list[Any] | None = None) -> Any:
    """Train and print the per-epoch figures; return the ``FitProfiler`` (its ``reports`` per epoch)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logdir", required=True, help="TensorBoard run directory")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--slow-input", action="store_true", help="real per-sample CPU augmentation")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args(argv)

    import lightning.pytorch as pl
    from _table import print_reports
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from fitprof.lightning import FitProfiler
    from fitprof.profilers.quiet import quiet_profiler_lines

    # TensorBoardLogger writes through torch.utils.tensorboard, which imports TensorFlow where it is installed; its
    # C++ logs absl's "All log messages before absl::InitializeLog()" and the oneDNN line, twice, before
    # TF_CPP_MIN_LOG_LEVEL applies: held back here, as the Keras example does
    with quiet_profiler_lines():
        import torch.utils.tensorboard

    pl.seed_everything(0, verbose=False)
    # One intra-op thread: on a small (2-core, shared) machine two threads fighting over this tiny model make
    # steps ~10x slower and noisy; set it to what suits your machine.
    torch.set_num_threads(args.threads)
    train, val = make_loaders(args.slow_input)
    profiler = FitProfiler()  # log_dir: the first logger's, i.e. LOGDIR
    loggers = [
        TensorBoardLogger(args.logdir, name="", version=""),
        CSVLogger(args.logdir, name="csv", version=""),
    ]
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        logger=loggers,
        callbacks=[profiler, *(callbacks or [])],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        log_every_n_steps=10,
    )
    trainer.fit(build_module(), train, val)
    print_reports(profiler.reports, os.fspath(args.logdir))
    for epoch, seconds in sorted(profiler.analysis_seconds.items()):
        print(f"epoch {epoch}: analysis + .xplane.pb took {seconds * 1e3:.0f} ms")
    return profiler


if __name__ == "__main__":
    main()

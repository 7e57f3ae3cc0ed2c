"""The Lightning tests' shared model, data and Trainer: a linear layer over 8 features, seeded random batches of 4,
and a quiet Trainer (no logger, progress bar, model summary or checkpoints unless asked for).

Import it after ``pytest.importorskip("lightning.pytorch")``: it imports torch and Lightning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

QUIET: dict[str, Any] = {
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "enable_checkpointing": False,
}
"""Trainer arguments that keep a test's run to what it checks."""


class Boom(RuntimeError):
    """The error :class:`Tiny` raises at ``fail_at``."""


class Tiny(pl.LightningModule):
    """``Linear(8, 2)`` with cross-entropy; raises :class:`Boom` at training batch ``fail_at`` (None: never).
    Validation logs ``val_loss``; test runs validation's step; predict returns the logits."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)
        self.fail_at = fail_at

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx == self.fail_at:
            raise Boom(f"boom at {batch_idx}")
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.layer(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        return self.layer(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Mlp(pl.LightningModule):
    """``Linear(32, 64) -> ReLU -> Linear(64, 1)`` with mean squared error, SGD at 0.01: batches of ``(x, y)``
    with ``x`` of 32 features and ``y`` of one."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Planted(pl.LightningModule):
    """``Linear(16, 4)`` with mean squared error, SGD at 0.01, over batches of ``(x, y)`` from :func:`loader16`.
    Each training step first calls :meth:`plant` with its batch index, where a subclass plants its work (memory
    made, kept or freed)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 4)

    def plant(self, batch_idx: int) -> None:
        """Nothing: a plain step."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.plant(batch_idx)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader16(batches: int) -> Any:
    """``batches`` batches of 8 random samples (16 features, a target of 4) for :class:`Planted`."""
    data = torch.utils.data.TensorDataset(torch.randn(batches * 8, 16), torch.randn(batches * 8, 4))
    return torch.utils.data.DataLoader(data, batch_size=8)


class RegressionData(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``n`` samples of 32 features and one target (seed 0) for :class:`Mlp`; each ``__getitem__`` first calls
    :meth:`wait`, where a subclass plants its input delay."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.wait(i)
        return self.x[i], self.y[i]

    def wait(self, i: int) -> None:
        """Nothing: the data is in memory."""


def loader(batches: int = 16) -> Any:
    """``batches`` batches of 4 samples (8 features, a 0/1 label), the same every call (seed 0)."""
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(batches * 4, 8, generator=g), torch.randint(0, 2, (batches * 4,)))
    return torch.utils.data.DataLoader(ds, batch_size=4)


def trainer(root: Path, callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    """A one-epoch :data:`QUIET` Trainer in ``root``; ``kwargs`` override any argument."""
    return pl.Trainer(callbacks=callbacks, **{"max_epochs": 1, "default_root_dir": root, **QUIET, **kwargs})

"""On Lightning: FLOPs of a training step counted exactly against hand counts (an MLP and a small
CNN, forward and backward), and samples/s, items/s and FLOP/s read back from the CSV logger's ``metrics.csv``."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.loggers import CSVLogger  # noqa: E402

import lightning_tiny  # noqa: E402
from fitprof.lightning import FitProfiler  # noqa: E402
from flops_counts import assert_rates, mlp_train_flops  # noqa: E402

B = 8  # samples per batch
BATCHES = 5
PROFILE = (3, 4)  # FLOPs are counted on step 1, the step before the window's warm-up step (2)


class _MLP(pl.LightningModule):
    """Linear(12, 16) -> ReLU -> Linear(16, 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _CNN(_MLP):
    """Conv2d(3, 6, 3) on 10x10 -> ReLU -> Conv2d(6, 5, 3, stride=2, padding=1) -> flatten -> Linear(5*4*4, 4)."""

    def __init__(self) -> None:
        pl.LightningModule.__init__(self)
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 6, 3),
            torch.nn.ReLU(),
            torch.nn.Conv2d(6, 5, 3, stride=2, padding=1),
            torch.nn.Flatten(),
            torch.nn.Linear(5 * 4 * 4, 4),
        )


def _fit(
    tmp: Path, model: Any, shape: tuple[int, ...], *, count_items: Any = None, **trainer_args: Any
) -> tuple[FitProfiler, Path]:
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(BATCHES * B, *shape, generator=g), torch.randint(0, 4, (BATCHES * B,), generator=g)
    )
    fp = FitProfiler(profile_batch=PROFILE, verbose=False, count_items=count_items)
    logger = CSVLogger(tmp, name="csv")
    trainer = lightning_tiny.trainer(tmp, [fp], logger=logger, **trainer_args)
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=B))
    return fp, Path(logger.log_dir) / "metrics.csv"


def _logged(csv_path: Path) -> dict[str, float]:
    rows = list(csv.DictReader(csv_path.open()))
    out: dict[str, float] = {}
    for row in rows:
        out.update({k: float(v) for k, v in row.items() if k.startswith("fitprof/") and v != ""})
    return out


@pytest.mark.slow
def test_mlp_flops_match_the_hand_count_and_throughput_reads_back(tmp_path: Path) -> None:
    fp, csv_path = _fit(tmp_path, _MLP(), (12,), count_items=lambda batch: float(batch[0].numel()))
    report = fp.reports[0]
    assert report.flops_per_step == mlp_train_flops(B)
    logged = _logged(csv_path)
    assert_rates(logged, report, batch=B, flops=mlp_train_flops(B), window=PROFILE, rel=1e-6)
    summed_s = report.step_time_ms * report.steps_analyzed / 1000.0
    assert logged["fitprof/items_per_s"] == pytest.approx(B * 12 * report.steps_analyzed / summed_s, rel=1e-6)
    assert "fitprof/mfu" not in logged  # CPU: FLOP/s only, MFU NaN (never logged)
    assert math.isnan(report.mfu) and "CPU" in report.mfu_note


@pytest.mark.slow
def test_cnn_flops_match_the_hand_count(tmp_path: Path) -> None:
    fp, _ = _fit(tmp_path, _CNN(), (3, 10, 10))
    conv1 = 2 * B * 6 * 8 * 8 * 3 * 3 * 3  # 2 * B * Cout * Hout * Wout * Cin * kh * kw, 10x10 -> 8x8
    conv2 = 2 * B * 5 * 4 * 4 * 6 * 3 * 3  # stride 2, padding 1: 8x8 -> 4x4
    linear = 2 * B * 80 * 4
    forward = conv1 + conv2 + linear
    # backward: grad-weight of all three, grad-input of conv2 and linear (the first conv's input needs none)
    backward = conv1 + 2 * conv2 + 2 * linear
    assert fp.reports[0].flops_per_step == forward + backward


@pytest.mark.slow
@pytest.mark.gpu
def test_on_a_gpu_the_count_is_the_same_and_mfu_uses_the_dense_peak(tmp_path: Path) -> None:
    from fitprof.throughput import peak_flops_per_s

    fp, csv_path = _fit(tmp_path, _MLP(), (12,), accelerator="gpu", devices=1, precision="bf16-mixed")
    report = fp.reports[0]
    # bf16 autocast runs the same matrix products: the count does not depend on the device or the dtype
    assert report.flops_per_step == 2 * (2 * B * 12 * 16 + 2 * B * 16 * 4) + 2 * B * 16 * 4
    assert report.device_name == torch.cuda.get_device_name(0) and report.compute_dtype == "bfloat16"
    peak, why = peak_flops_per_s(report.device_name, "bfloat16")
    if math.isnan(peak):  # a device outside the table: FLOP/s, and the reason instead of an MFU
        assert math.isnan(report.mfu) and report.mfu_note == why
    else:
        assert report.mfu == pytest.approx(report.flops_per_s / peak, rel=1e-12)
        assert _logged(csv_path)["fitprof/mfu"] == pytest.approx(report.mfu, rel=1e-6)

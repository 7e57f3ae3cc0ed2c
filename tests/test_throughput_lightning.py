"""On Lightning: FLOPs of a training step counted exactly against hand counts (an MLP and a small
CNN, forward and backward), and samples/s, items/s and FLOP/s read back from the CSV logger's ``metrics.csv``."""

from __future__ import annotations

import csv
import dataclasses
import math
import warnings
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


# ----------------------------------------------------- batches of other shapes: the samples per step they hold
IMAGES = 8  # images a batch, each of another size


@dataclasses.dataclass
class _Held:
    """A batch held in a dataclass, as some Lightning data modules hand it over."""

    x: Any
    y: Any


class _Opaque:
    """A batch whose tensors are out of sight (plain attributes of a plain class): no count can be read."""

    def __init__(self, x: Any, y: Any) -> None:
        self.x, self.y = x, y


class _Pooled(pl.LightningModule):
    """Conv2d(3, 4, 3) -> global average pool -> Linear(4, 2), over a list of images of different sizes (as a
    collate that cannot stack them hands them over) or over a batch in any of the holders above."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(4, 2)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if isinstance(batch, (_Held, _Opaque)):
            images, y = [batch.x[i] for i in range(len(batch.x))], batch.y
        else:
            images, y = batch
        pooled = torch.stack([self.conv(img[None]).mean(dim=(0, 2, 3)) for img in images])
        return torch.nn.functional.cross_entropy(self.head(pooled), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _images(batches: int, holder: Any) -> Any:
    """``batches`` batches of :data:`IMAGES` images: 3 channels, 6-13 pixels a side (a list), or of one size (a
    tensor) handed in ``holder`` (None: ``(images, targets)``)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(batches):
        y = torch.randint(0, 2, (IMAGES,), generator=g)
        if holder is None:
            out.append(([torch.randn(3, 6 + i, 13 - i, generator=g) for i in range(IMAGES)], y))
        else:
            out.append(holder(torch.randn(IMAGES, 3, 8, 8, generator=g), y))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("holder", [None, _Held, _Opaque], ids=["variable-size-images", "dataclass", "opaque"])
def test_the_samples_of_a_list_of_images_or_a_dataclass_are_counted_and_an_unknown_count_is_told_once(
    tmp_path: Path, holder: Any
) -> None:
    """A list of 8 images of different sizes (3 channels each) beside their targets counts 8 samples a step, not
    the channels; a batch held in a dataclass is looked into, as Lightning's ``extract_batch_size`` does; a batch
    whose count cannot be read gives NaN samples/s with one warning for the fit."""
    fp = FitProfiler(profile_batch=PROFILE, verbose=False)
    trainer = lightning_tiny.trainer(tmp_path, [fp])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(_Pooled(), torch.utils.data.DataLoader(_images(BATCHES, holder), batch_size=None))
    told = [str(w.message) for w in caught if "samples per step are unknown" in str(w.message)]
    (report,) = fp.reports.values()
    if holder is _Opaque:
        assert math.isnan(report.samples_per_step) and math.isnan(report.samples_per_s)
        assert len(told) == 1, told
        assert "_Opaque" in told[0] and "dataclasses of tensors" in told[0]
    else:
        assert report.samples_per_step == IMAGES
        summed_s = report.step_time_ms * report.steps_analyzed / 1000.0
        assert report.samples_per_s == pytest.approx(IMAGES * report.steps_analyzed / summed_s)
        assert told == [] and not [w for w in caught if "ambiguous" in str(w.message) and "fitprof" in str(w.message)]

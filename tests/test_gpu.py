"""On a CUDA GPU: real device traces of host-to-device copies (pinned and pageable), kernels and their launching
operators, read by fitprof and checked against the trace's own JSON counted by ``tests/handcount.py`` and against
torch's own accounting. Marked ``gpu``: skipped without CUDA (``tests/conftest.py``); ``pytest -m gpu`` runs only
these (and the NCCL gather in ``test_distributed_lightning.py``) on a GPU machine.

What runs everywhere instead: ``test_generated_traces.py`` (GPU-shaped traces with every figure known by
construction) and the real A100 / MI250 traces of ``../shared/fixtures`` in ``test_kineto_reader.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fitprof
import handcount

pytestmark = pytest.mark.gpu

MIB = 1 << 20
ROWS = 1024  # a (1024, 1024) float32 tensor: 4 MiB
STEPS = 3


def _profiled_steps(path: Path, step: Any, steps: int = STEPS) -> Any:
    """Run ``step(n)`` ``steps`` times under ``torch.profiler`` (CPU + CUDA), each inside a ``ProfilerStep#n``
    span as fitprof's callbacks mark them, synchronising at each step's end; export the trace to ``path``."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    step(0)  # warm-up: CUDA context, cuBLAS handles, the caching allocator
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for n in range(1, steps + 1):
            with record_function(f"ProfilerStep#{n}"):
                step(n)
                torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    return prof


def test_pinned_and_pageable_copies_and_device_time(tmp_path: Path) -> None:
    """Each step copies one 4 MiB tensor from pinned memory and one from pageable memory, then multiplies."""
    import torch

    dev = torch.device("cuda")
    pinned = torch.randn(ROWS, ROWS).pin_memory()
    pageable = torch.randn(ROWS, ROWS)
    weight = torch.randn(ROWS, ROWS, device=dev)

    def step(_: int) -> None:
        a = pinned.to(dev, non_blocking=True)
        b = pageable.to(dev)
        (a @ weight + b).sum()

    path = tmp_path / "copies.pt.trace.json"
    prof = _profiled_steps(path, step)
    counts = handcount.count(path, top_k=20)
    report = fitprof.analyze(path, top_k=20)

    # The trace itself (read with the standard library): one copy of each kind per step, 4 MiB each.
    assert counts["steps"] == list(range(1, STEPS + 1))
    for kind in ("htod_pinned", "htod_pageable"):
        assert counts[kind]["count"] == STEPS, kind
        assert counts[kind]["bytes"] == STEPS * 4 * MIB, kind
    # fitprof's figures equal the count's.
    n, rel = STEPS, 1e-6
    assert report.steps_analyzed == n
    assert report.step_time_ms == pytest.approx(counts["window_us"] / n / 1e3, rel=rel)
    assert report.htod_pinned_ms_per_step == pytest.approx(counts["htod_pinned"]["dur_us"] / n / 1e3, rel=rel)
    assert report.htod_pageable_ms_per_step == pytest.approx(counts["htod_pageable"]["dur_us"] / n / 1e3, rel=rel)
    assert report.htod_bytes_per_step == 2 * 4 * MIB
    assert report.htod_pinned_ms_per_step > 0 and report.htod_pageable_ms_per_step > 0
    assert report.op_time_source == "device"
    assert [(op.name, op.self_ms_per_step) for op in report.top_ops] == [
        (name, pytest.approx(us / n / 1e3, rel=rel)) for name, us in counts["ops"]
    ]
    # The matrix product's kernels are attributed to aten::mm, as torch's own table does.
    mm = next(op for op in report.top_ops if op.name == "aten::mm")
    torch_mm_us = sum(e.self_device_time_total for e in prof.key_averages() if e.key == "aten::mm")
    assert mm.self_ms_per_step == pytest.approx(torch_mm_us / n / 1e3, rel=0.01)


@pytest.mark.slow
def test_lightning_pin_memory_gives_pinned_copies(tmp_path: Path) -> None:
    """A Lightning run on the GPU with ``DataLoader(pin_memory=True)``: fitprof's window holds the batch's copies
    from pinned memory, at least the batch's bytes each step, and its figures equal the trace's hand count."""
    import torch

    pl = pytest.importorskip("lightning.pytorch")
    from torch.utils.data import DataLoader, TensorDataset

    from fitprof.lightning import FitProfiler

    batch, features = 256, 1024
    data = TensorDataset(torch.randn(16 * batch, features), torch.randn(16 * batch, 1))

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(features, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))

        def training_step(self, b: Any, i: int) -> Any:
            x, y = b
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    profiler = FitProfiler(log_dir=tmp_path, profile_batch=(3, 5))
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_epochs=1, limit_train_batches=8, logger=False, callbacks=[profiler],
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(Model(), DataLoader(data, batch_size=batch, pin_memory=True))
    report, trace = profiler.reports[0], profiler.trace_paths[0]
    counts = handcount.count(trace, top_k=5)
    assert report.steps_analyzed == len(counts["steps"]) == 3
    assert report.htod_pinned_ms_per_step == pytest.approx(counts["htod_pinned"]["dur_us"] / 3 / 1e3, rel=1e-6)
    assert report.htod_pinned_ms_per_step > 0
    batch_bytes = batch * (features + 1) * 4
    assert counts["htod_pinned"]["bytes"] >= 3 * batch_bytes
    assert report.op_time_source == "device"

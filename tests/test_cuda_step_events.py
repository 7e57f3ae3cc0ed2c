"""Lightning's CUDA step timing, on the CPU with fake CUDA events: one event per step boundary up to the cap, none
past it (the host clock times such an epoch), and the device times used while under the cap.

The fakes stand in for ``torch.cuda.Event``: each records a planted device clock that advances 50 ms a boundary,
so a step timed by the events reads exactly 50 ms and one timed by the host clock does not.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

import fitprof.lightning._timing as fp  # noqa: E402
from fitprof.lightning import FitProfiler  # noqa: E402

DEVICE_STEP_MS = 50.0
CAP = 8


class _FakeEvents:
    """Creates the fake events and counts them: all created, and alive at the peak."""

    def __init__(self) -> None:
        self.created = 0
        self.alive = 0
        self.peak_alive = 0
        self.clock_ms = 0.0

    def __call__(self) -> Any:
        owner = self

        class Event:
            def __init__(self) -> None:
                owner.created += 1
                owner.alive += 1
                owner.peak_alive = max(owner.peak_alive, owner.alive)
                self.t = owner.clock_ms
                owner.clock_ms += DEVICE_STEP_MS

            def __del__(self) -> None:
                owner.alive -= 1

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end: Event) -> float:
                return end.t - self.t

        return Event()


class _Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, batches: int) -> tuple[FitProfiler, _FakeEvents]:
    events = _FakeEvents()
    monkeypatch.setattr(fp, "_on_cuda", lambda trainer: True)
    monkeypatch.setattr(fp, "_cuda_event", events)
    monkeypatch.setattr(fp, "_MAX_CUDA_EVENTS", CAP)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(batches * 2, 4), torch.randn(batches * 2, 1))
    profiler = FitProfiler(profile_batch=0)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        callbacks=[profiler],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(_Model(), torch.utils.data.DataLoader(data, batch_size=2))
    return profiler, events


def test_under_the_cap_the_events_time_the_steps(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    profiler, events = _fit(tmp_path, monkeypatch, batches=CAP - 2)
    assert events.created == CAP - 1  # the epoch's start and each step's end
    steps = profiler.epoch_steps[0]
    assert steps.steps_timed > 0 and steps.step_time_ms_p50 == DEVICE_STEP_MS


def test_past_the_cap_no_event_is_created_and_the_host_clock_times_the_epoch(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = 3 * CAP
    profiler, events = _fit(tmp_path, monkeypatch, batches=batches)
    assert events.created == CAP + 1, f"{events.created} events created for {batches} steps"
    assert events.peak_alive <= CAP + 1
    steps = profiler.epoch_steps[0]
    assert steps.steps_timed > 0 and math.isfinite(steps.step_time_ms_p50)
    assert steps.step_time_ms_p50 != DEVICE_STEP_MS  # the host clock's figure, not the events'

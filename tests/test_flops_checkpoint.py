"""Activation checkpointing (``torch.utils.checkpoint``) runs each checkpointed forward again in the backward. The
FLOP count of a step keeps model FLOPs (the recomputation left out, as MFU is defined: PaLM, appendix B) and says
what was recomputed, with the hardware FLOPs and HFU that include it. Counted on real torch steps, held against the
same model without checkpointing and against a hand count."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.checkpoint import checkpoint as checkpoint_by_name  # noqa: E402  (bound before any count starts)

import fitprof  # noqa: E402
from fitprof.profilers.flops_torch import TorchFlopCount  # noqa: E402
from fitprof.throughput import WorkLog, with_throughput  # noqa: E402
from shared_fixtures import LIGHTNING_CPU  # noqa: E402

B, D, H = 8, 16, 32


class Net(torch.nn.Module):
    def __init__(self, checkpoint: str) -> None:
        super().__init__()
        self.first = torch.nn.Linear(D, H)
        self.block = torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.ReLU(), torch.nn.Linear(H, H))
        self.last = torch.nn.Linear(H, 4)
        self.checkpoint = checkpoint

    def forward(self, x: Any) -> Any:
        h = self.first(x)
        if self.checkpoint == "none":
            h = self.block(h)
        elif self.checkpoint == "by-name":  # the form most code uses: the function imported by name
            h = checkpoint_by_name(self.block, h, use_reentrant=False)
        else:
            h = torch.utils.checkpoint.checkpoint(self.block, h, use_reentrant=self.checkpoint == "reentrant")
        return self.last(h)


def _count(checkpoint: str) -> TorchFlopCount:
    torch.manual_seed(0)
    net = Net(checkpoint)
    x = torch.randn(B, D)
    counter = TorchFlopCount()
    counter.start()
    net(x).sum().backward()
    counter.flops = counter.stop()  # type: ignore[attr-defined]
    return counter


@pytest.mark.parametrize("checkpoint", ["non-reentrant", "reentrant", "by-name"])
def test_model_flops_leave_the_recomputation_out(checkpoint: str) -> None:
    torch.set_num_threads(1)
    plain, checkpointed = _count("none"), _count(checkpoint)
    # Recomputed: the block's two H x H products with use_reentrant=True; without, torch stops the recomputation
    # once the backward has what it needs (the second product's output is not): the first product only.
    recomputed = 2 * (2 * B * H * H) if checkpoint == "reentrant" else 2 * B * H * H
    assert plain.recompute_flops == 0
    assert checkpointed.recompute_flops == recomputed
    assert checkpointed.flops == plain.flops  # type: ignore[attr-defined]
    assert torch.utils.checkpoint.checkpoint.__module__ == "torch.utils.checkpoint"  # unwrapped after the count


@pytest.mark.parametrize("checkpoint", ["non-reentrant", "by-name"])
def test_the_report_says_model_flops_and_gives_the_hardware_flops_and_hfu(checkpoint: str) -> None:
    counted = _count(checkpoint)
    assert counted.recompute_flops > 0  # type: ignore[attr-defined]
    log = WorkLog(None, lambda m: None)
    log.device_name, log.dtype = "NVIDIA A100-SXM4-80GB", "bfloat16"
    log.set_flops(counted.flops, float(B), recompute_flops=counted.recompute_flops)  # type: ignore[attr-defined]
    report = with_throughput(fitprof.analyze(LIGHTNING_CPU), log.work())  # a real window's step time
    assert report.flops_per_step == counted.flops  # type: ignore[attr-defined]
    hardware = counted.flops + counted.recompute_flops  # type: ignore[attr-defined]
    assert f"model FLOPs: flops_per_step and mfu leave out the {counted.recompute_flops:.4g} FLOP" in report.mfu_note
    assert f"hardware FLOPs {hardware:.4g} a step" in report.mfu_note
    hfu = report.mfu * hardware / report.flops_per_step
    assert math.isfinite(report.mfu) and f"HFU {hfu:.3f}" in report.mfu_note

"""FLOPs of the throughput tests' models counted by hand, and the rates a window's report must log from them."""

from __future__ import annotations

from typing import Any

import pytest


def mlp_train_flops(batch: int) -> int:
    """FLOPs of one training step of the ``12 -> 16 (ReLU) -> 4`` dense network on ``batch`` samples: forward, a
    multiply-add (2 FLOPs) per weight per sample in each layer; backward, the gradient of both layers' weights and
    of the second layer's input only (the first layer's input needs none)."""
    forward = 2 * batch * 12 * 16 + 2 * batch * 16 * 4
    backward = 2 * batch * 12 * 16 + (2 * batch * 16 * 4 + 2 * batch * 16 * 4)
    return forward + backward


def assert_rates(
    logged: dict[str, float], report: Any, *, batch: int, flops: int, window: tuple[int, int], rel: float
) -> None:
    """The logged ``samples_per_s``, ``flops_per_step`` and ``flops_per_s`` are the window's own: ``batch`` samples
    and ``flops`` FLOPs a step over the summed step time of the ``window``'s steps (first, last)."""
    steps = report.steps_analyzed
    assert steps == window[1] - window[0] + 1
    summed_s = report.step_time_ms * steps / 1000.0
    assert logged["fitprof/samples_per_s"] == pytest.approx(batch * steps / summed_s, rel=rel)
    assert logged["fitprof/flops_per_step"] == flops
    assert logged["fitprof/flops_per_s"] == pytest.approx(flops * steps / summed_s, rel=rel)

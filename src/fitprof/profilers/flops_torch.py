"""FLOPs of one torch training step (``torch.utils.flop_counter.FlopCounterMode``) and the device and compute dtype
its MFU is measured against.

``FlopCounterMode`` counts 2 FLOPs per multiply-add of the matrix products and convolutions dispatched while it is
active, forward and backward (``aten::mm``/``addmm``/``bmm``/``convolution``/``convolution_backward``/attention;
a backward counts only the gradients autograd computes, so no grad-input for a first layer whose input needs no
gradient), and nothing for element-wise work, reductions, the loss or the optimizer. It slows the step it counts
(Python dispatch on every op), so the callbacks count a step outside the analysed window.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode


class TorchFlopCount:
    """Count the FLOPs between :meth:`start` and :meth:`stop` (one training step). Never raises: a failure gives
    NaN and the reason in :attr:`note`."""

    def __init__(self) -> None:
        self._mode: Any = None
        self.note = ""

    @property
    def running(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        if self._mode is not None:
            return
        try:
            mode = FlopCounterMode(display=False)
            mode.__enter__()
        except Exception as err:
            self.note = f"torch's FlopCounterMode did not start ({err!r})"
            return
        self._mode = mode

    def stop(self) -> float:
        """Leave the counter; the FLOPs counted since :meth:`start` (NaN when it did not run)."""
        mode, self._mode = self._mode, None
        if mode is None:
            return math.nan
        try:
            mode.__exit__(None, None, None)
            return float(mode.get_total_flops())
        except Exception as err:
            self.note = f"torch's FlopCounterMode failed ({err!r})"
            return math.nan


def compute_dtype(dtype: str, device: torch.device) -> str:
    """The :data:`fitprof.throughput.DTYPES` name of a compute dtype on ``device``: ``float32`` becomes ``tf32`` on a
    CUDA device when ``torch.get_float32_matmul_precision()`` is not ``"highest"`` (matrix products then run on
    tensor cores in TF32)."""
    if dtype == "float32" and device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return dtype


def lightning_dtype(precision: Any) -> str:
    """The compute dtype of a Lightning ``Trainer.precision`` string (``"32-true"``, ``"16-mixed"``,
    ``"bf16-mixed"``, ``"bf16-true"``, ``"64-true"``, ...)."""
    text = str(precision)
    if text.startswith("bf16"):
        return "bfloat16"
    if text.startswith("16"):
        return "float16"
    if text.startswith("64"):
        return "float64"
    if text.startswith("32"):
        return "float32"
    return text


def device_name(device: torch.device) -> str:
    """``torch.cuda.get_device_name`` of a CUDA (or ROCm) device; "" for any other device (CPU, MPS: no peak)."""
    if device.type != "cuda":
        return ""
    try:
        return str(torch.cuda.get_device_name(device))
    except Exception:
        return ""

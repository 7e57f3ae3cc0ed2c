"""FLOPs of one torch training step (``torch.utils.flop_counter.FlopCounterMode``) and the device and compute dtype
its MFU is measured against.

``FlopCounterMode`` counts 2 FLOPs per multiply-add of the matrix products and convolutions dispatched while it is
active, forward and backward (``aten::mm``/``addmm``/``bmm``/``convolution``/``convolution_backward``/attention;
a backward counts only the gradients autograd computes, so no grad-input for a first layer whose input needs no
gradient), and nothing for element-wise work, reductions, the loss or the optimizer. It slows the step it counts
(Python dispatch on every op), so the callbacks count a step outside the analysed window.

Matrix products and convolutions are counted apart (:attr:`TorchFlopCount.conv_flops`) because on a CUDA device they
can run float32 in different precisions: cuBLAS matrix products in TF32 only when the user asks for it
(``torch.set_float32_matmul_precision("high")`` or ``torch.backends.cuda.matmul.fp32_precision = "tf32"``), cuDNN
convolutions in TF32 unless the user forbids it (``torch.backends.cudnn.allow_tf32`` is True by default). A float32
conv net held against the float32 peak would read several times its true MFU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode


class _RecomputeAwareCount(FlopCounterMode):
    """``FlopCounterMode`` that also sums apart the FLOPs of operators run inside the backward pass with grad mode
    on: the autograd engine runs the backward's own operators with grad mode off, and activation checkpointing
    turns it back on to run the checkpointed forward again (its recomputation), whatever name the checkpoint
    function was called by (``torch.utils.checkpoint.checkpoint``, imported by name or not, with or without
    ``use_reentrant``; Lightning's and FSDP's wrappers call it). A backward with ``create_graph=True`` (a gradient
    penalty) also runs with grad mode on: its FLOPs would be read as recomputation."""

    recomputed = 0.0

    def _count_flops(self, *args: Any, **kwargs: Any) -> Any:
        if torch._C._current_graph_task_id() == -1 or not torch.is_grad_enabled():
            return super()._count_flops(*args, **kwargs)  # the forward, or the backward's own operators
        counts = self.flop_counts["Global"]
        before = sum(counts.values())
        try:
            return super()._count_flops(*args, **kwargs)
        finally:
            self.recomputed += float(sum(counts.values()) - before)


_SEES_RECOMPUTE = hasattr(FlopCounterMode, "_count_flops")
"""Whether this torch's ``FlopCounterMode`` counts through the method :class:`_RecomputeAwareCount` extends."""


class TorchFlopCount:
    """Count the FLOPs between :meth:`start` and :meth:`stop` (one training step). Never raises: a failure gives
    NaN and the reason in :attr:`note`.

    Activation checkpointing (``torch.utils.checkpoint.checkpoint``) runs each checkpointed forward again in the
    backward: ``FlopCounterMode`` counts both. MFU's model FLOPs leave the recomputation out (PaLM, appendix B), so
    the operators run again inside the backward (:class:`_RecomputeAwareCount`: all of a checkpointed function
    with ``use_reentrant=True``, up to the last tensor the backward needs without) are counted apart
    (:attr:`recompute_flops`), and :meth:`stop` returns the total without them. The recomputation is seen however
    the checkpoint function was imported, since it is told apart by when it runs, not by the function's name."""

    def __init__(self) -> None:
        self._mode: Any = None
        self.note = ""
        self.conv_flops = 0.0
        """FLOPs of the convolutions (forward and backward) among those :meth:`stop` returned."""
        self.recompute_flops = 0.0
        """FLOPs activation checkpointing ran again in the backward; not in what :meth:`stop` returned."""

    @property
    def running(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        if self._mode is not None:
            return
        try:
            mode = (_RecomputeAwareCount if _SEES_RECOMPUTE else FlopCounterMode)(display=False)
            mode.__enter__()
        except Exception as err:
            self.note = f"torch's FlopCounterMode did not start ({err!r})"
            return
        self._mode = mode
        self.recompute_flops = 0.0

    def stop(self) -> float:
        """Leave the counter; the FLOPs counted since :meth:`start` (NaN when it did not run)."""
        mode, self._mode = self._mode, None
        if mode is None:
            return math.nan
        try:
            mode.__exit__(None, None, None)
            by_op = mode.get_flop_counts().get("Global", {})
            self.conv_flops = float(sum(n for op, n in by_op.items() if "convolution" in str(op)))
            total = float(mode.get_total_flops())
            self.recompute_flops = min(float(getattr(mode, "recomputed", 0.0)), total)
            return total - self.recompute_flops
        except Exception as err:
            self.note = f"torch's FlopCounterMode failed ({err!r})"
            return math.nan


def _fp32_precision(chain: tuple[tuple[str, ...], ...], legacy: Callable[[], bool]) -> str:
    """``"tf32"`` or ``"ieee"``: what float32 runs as for one op class. torch 2.9 and later give each backend and op
    an ``fp32_precision`` ("tf32", "ieee" or "none": ask the parent), read from the op up to the root (all "none":
    "ieee"). Its legacy getters (``get_float32_matmul_precision``, ``allow_tf32``) raise once the new API has been
    used, so they are read only on a torch without it."""
    import torch.backends

    found = False
    for path in chain:
        node: Any = torch.backends
        try:
            for part in path:
                node = getattr(node, part)
            value = str(node.fp32_precision)
        except Exception:
            continue
        found = True
        if value in ("tf32", "ieee"):
            return value
    if found:
        return "ieee"
    try:
        return "tf32" if legacy() else "ieee"
    except Exception:
        return "ieee"


def _tf32_capable(device: torch.device) -> bool:
    """True on an NVIDIA GPU of compute capability 8.0 or later (Ampere): TF32 does not exist on Volta or Turing,
    where torch's TF32 settings change nothing. False on ROCm, whose float32 peak is its matrix cores' (hipBLASLt's
    xf32 is not modelled)."""
    if device.type != "cuda" or getattr(torch.version, "hip", None):
        return False
    try:
        major, _minor = torch.cuda.get_device_capability(device)
    except Exception:
        return False
    return int(major) >= 8


def compute_dtype(dtype: str, device: torch.device) -> str:
    """The :data:`fitprof.throughput.DTYPES` name a matrix product of ``dtype`` runs in on ``device``: ``float32``
    becomes ``tf32`` on an NVIDIA GPU of compute capability 8.0 or later when torch lets cuBLAS use TF32
    (``torch.backends.cuda.matmul.fp32_precision``, else ``torch.get_float32_matmul_precision() != "highest"``;
    off by default)."""
    if dtype != "float32" or not _tf32_capable(device):
        return dtype
    precision = _fp32_precision(
        (("cuda", "matmul"), ("cuda",), ()), lambda: torch.get_float32_matmul_precision() != "highest"
    )
    return "tf32" if precision == "tf32" else dtype


def conv_compute_dtype(dtype: str, device: torch.device) -> str:
    """The :data:`fitprof.throughput.DTYPES` name a convolution of ``dtype`` runs in on ``device``: ``float32``
    becomes ``tf32`` on an NVIDIA GPU of compute capability 8.0 or later when torch lets cuDNN use TF32
    (``torch.backends.cudnn.conv.fp32_precision``, else ``torch.backends.cudnn.allow_tf32``; on by default)."""
    if dtype != "float32" or not _tf32_capable(device):
        return dtype
    precision = _fp32_precision((("cudnn", "conv"), ("cudnn",), ()), lambda: bool(torch.backends.cudnn.allow_tf32))
    return "tf32" if precision == "tf32" else dtype


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
    """``torch.cuda.get_device_name`` of a CUDA (or ROCm) device; "" for any other device (CPU, MPS: no peak).

    On ROCm the name is followed by the architecture and compute-unit count, ``"AMD Radeon Graphics (gfx90a, 104
    CUs)"``: ROCm 6.2 names every Instinct part "AMD Radeon Graphics", and one die of an MI250X (110 CUs) and of an
    MI250 (104 CUs) share ``gfx90a`` (:func:`fitprof.throughput.device_key` reads both).

    A device outside :data:`fitprof.throughput.PEAK_FLOPS` gets its properties appended instead
    (:func:`fitprof.throughput.device_properties_suffix`), from ``torch.cuda.get_device_properties``: the
    architecture (``sm_XY`` from ``major.minor``, or ``gcnArchName``), ``multi_processor_count`` and ``clock_rate``
    (kHz, the maximum clock), ``"NVIDIA A10G (sm_86, 80 SMs, 1710 MHz)"``, from which its peak is derived
    (:func:`fitprof.throughput.derived_peak_flops_per_s`). A torch whose properties lack ``clock_rate`` gives the
    bare name (no peak), as before."""
    from fitprof.throughput import device_key, device_properties_suffix

    if device.type != "cuda":
        return ""
    try:
        name = str(torch.cuda.get_device_name(device))
    except Exception:
        return ""
    try:
        props = torch.cuda.get_device_properties(device)
    except Exception:
        return name
    units: Any = getattr(props, "multi_processor_count", None)
    if getattr(torch.version, "hip", None):
        arch = str(getattr(props, "gcnArchName", "")).split(":")[0]
        try:
            cus = int(units)
        except Exception:
            return name
        rocm = f"{name} ({arch}, {cus} CUs)" if arch else f"{name} ({cus} CUs)"
        derived = _suffix(arch, units, props, device_properties_suffix) if arch else ""
        return rocm if device_key(rocm) is not None or not derived else name + derived
    if device_key(name) is not None:
        return name
    arch = f"sm_{getattr(props, 'major', '')}{getattr(props, 'minor', '')}"
    return name + _suffix(arch, units, props, device_properties_suffix)


def _suffix(arch: str, units: Any, props: Any, suffix: Callable[[str, int, float], str]) -> str:
    """The properties' suffix, or "" when the SM count or the clock (``clock_rate``, kHz) is missing."""
    try:
        count, clock_mhz = int(units), float(props.clock_rate) / 1e3
    except Exception:
        return ""
    if count <= 0 or not (math.isfinite(clock_mhz) and clock_mhz > 0):
        return ""
    return suffix(arch, count, round(clock_mhz))

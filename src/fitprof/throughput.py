"""Throughput, FLOP rate and MFU of one window, framework-free.

The adapters collect what only they can see (:class:`WorkLog`): the samples of each profiled step (read from the
batch with :func:`fitprof._batch.batch_size`), the user's ``count_items(batch)`` (tokens, pixels, ...), and the
FLOPs of one training step counted by the framework (torch ``FlopCounterMode``, TensorFlow graph shapes; see
:mod:`fitprof.profilers.flops_torch` and :mod:`fitprof.profilers.flops_tf`) on a step *outside* the analysed
window (counting slows a step). :func:`with_throughput` turns that and the report's step time into the report's
throughput fields:

* ``samples_per_s = samples_per_step / (step_time_ms / 1000)``, ``samples_per_step`` the mean over the profiled
  steps: samples in the analysed steps over their summed step time;
* ``items_per_s``: the same with ``count_items(batch)``;
* ``flops_per_step``: the FLOPs counted on one step (scaled linearly by the samples when that step's batch held a
  different number of samples than the window's mean); ``flops_per_s = flops_per_step / (step_time_ms / 1000)``;
* ``mfu``: the time the counted FLOPs would take at the device's dense peak over the step time (a ratio, 0-1),
  each op class at the peak of the precision it runs in (:data:`PEAK_FLOPS`): matrix products at ``dtype``,
  convolutions at ``conv_dtype`` (cuDNN runs float32 convolutions in TF32 by default, cuBLAS matrix products in
  IEEE float32), so ``mfu = (matmul_flops / peak[dtype] + conv_flops / peak[conv_dtype]) / step_s``;
  ``peak_flops_per_s`` is the peak that gives the same MFU for all the FLOPs together. NaN on a CPU, on an unknown
  device or dtype, and above 1, which no real step reaches: the peak or the count is wrong (``mfu_note`` says why
  and gives the ratio).

A device outside :data:`PEAK_FLOPS` gets a peak derived from its properties where its architecture is known
(:data:`ARCH_RATES`: SM or CU count x maximum clock x the architecture's dense FLOPs per clock per SM / CU for the
dtype, from the vendors' whitepapers; :func:`derived_peak_flops_per_s`), and ``mfu_note`` says the peak was derived.
On every device of the table the derived peak is within 5% of the datasheet's (``tests/test_derived_peaks.py``).
The properties come from ``torch.cuda.get_device_properties`` (:func:`fitprof.profilers.flops_torch.device_name`);
TensorFlow's device details give no SM count or clock, and JAX's ``device_kind`` neither, so Keras on TensorFlow or
JAX keeps the table only.

FLOPs count as torch's ``FlopCounterMode`` counts them: 2 per multiply-add of matrix products and convolutions
(forward and backward), nothing for element-wise work, reductions, the loss or the optimizer; a model's other
work makes MFU an under-estimate of the device's use, as in PaLM's definition of MFU.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fitprof._batch import batch_samples, batch_size
from fitprof.analysis import BottleneckReport

DTYPES = ("float32", "tf32", "bfloat16", "float16")
"""The compute dtypes of :data:`PEAK_FLOPS`: ``"tf32"`` is float32 on tensor cores (NVIDIA compute capability 8.0 and
later: torch's cuDNN convolutions by default, its matrix products with ``torch.set_float32_matmul_precision("high")``;
TensorFlow's default)."""


@dataclass(frozen=True)
class PeakRate:
    """Dense peak FLOP/s of one device per compute dtype (no structured sparsity), and the datasheet."""

    name: str
    flops_per_s: dict[str, float]
    source: str


_NV_V100 = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_NV_A100 = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_NV_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_NV_H200 = "https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446"
_NV_L4 = "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"
_NV_A10 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf"
_NV_T4 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"
_AMD_MI250X = "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html"
_AMD_MI250 = "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250.html"
_AMD_MI300X = (
    "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf"
)

T = 1e12


def _dense_of_sparse(float32: float, tf32: float, half: float) -> dict[str, float]:
    """Dense FLOP/s per dtype from a datasheet that gives its tensor-core TFLOPS "with sparsity" only: float32 as
    given, tf32 and the 16-bit types (bfloat16 and float16 alike) at half the sparse figure."""
    return {"float32": float32 * T, "tf32": tf32 / 2 * T, "bfloat16": half / 2 * T, "float16": half / 2 * T}


PEAK_FLOPS: dict[str, PeakRate] = {
    # Volta: "Tensor Performance" is FP16 with FP32 accumulation; no TF32, no bfloat16.
    "v100-sxm2": PeakRate("V100 SXM2", {"float32": 15.7 * T, "float16": 125 * T}, _NV_V100),
    "v100-pcie": PeakRate("V100 PCIe", {"float32": 14 * T, "float16": 112 * T}, _NV_V100),
    "v100s-pcie": PeakRate("V100S PCIe", {"float32": 16.4 * T, "float16": 130 * T}, _NV_V100),
    # Ampere: the datasheet gives "dense | sparse*"; the dense figure.
    "a100": PeakRate(
        "A100 (SXM4 and PCIe)",
        {"float32": 19.5 * T, "tf32": 156 * T, "bfloat16": 312 * T, "float16": 312 * T},
        _NV_A100,
    ),
    "a10": PeakRate("A10", {"float32": 31.2 * T, "tf32": 62.5 * T, "bfloat16": 125 * T, "float16": 125 * T}, _NV_A10),
    # Hopper: the datasheets give tensor-core figures "with sparsity" only; dense is half of them.
    "h100-sxm": PeakRate("H100 SXM", _dense_of_sparse(67, 989, 1979), _NV_H100),
    "h100-pcie": PeakRate("H100 PCIe", _dense_of_sparse(51, 756, 1513), _NV_H100),
    "h100-nvl": PeakRate("H100 NVL", _dense_of_sparse(60, 835, 1671), _NV_H100),
    "h200-sxm": PeakRate("H200 SXM", _dense_of_sparse(67, 989, 1979), _NV_H200),
    "h200-nvl": PeakRate("H200 NVL", _dense_of_sparse(60, 835, 1671), _NV_H200),
    # Ada: "with sparsity" figures only for tensor cores; dense is half of them.
    "l4": PeakRate("L4", _dense_of_sparse(30.3, 120, 242), _NV_L4),
    # Turing: "Mixed Precision (FP16/FP32)" 65 TFLOPS; no TF32, no bfloat16, no sparsity.
    "t4": PeakRate("T4", {"float32": 8.1 * T, "float16": 65 * T}, _NV_T4),
    # CDNA 2 / 3: matrix-core peaks (float32 runs on the matrix cores through rocBLAS / hipBLASLt); dense figures.
    # An MI250X or MI250 is two dies, and torch, TensorFlow and JAX each see a die as one device: half the
    # module's datasheet figure.
    "mi250x": PeakRate(
        "MI250X (one die)", {"float32": 95.7 / 2 * T, "bfloat16": 383 / 2 * T, "float16": 383 / 2 * T}, _AMD_MI250X
    ),
    "mi250": PeakRate(
        "MI250 (one die)", {"float32": 90.5 / 2 * T, "bfloat16": 362.1 / 2 * T, "float16": 362.1 / 2 * T}, _AMD_MI250
    ),
    "mi300x": PeakRate(
        "MI300X",
        {"float32": 163.4 * T, "tf32": 653.7 * T, "bfloat16": 1307.4 * T, "float16": 1307.4 * T},
        _AMD_MI300X,
    ),
}
"""Dense peak FLOP/s of common accelerators per compute dtype, from each vendor's datasheet (``source``). Dense, not
with structured sparsity: where a datasheet gives only the sparse figure (Hopper, Ada) it is halved. A dtype a
device lacks (bfloat16 on V100 and T4) is absent: its MFU is NaN."""

_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bv100s", "v100s-pcie"),
    (r"\bv100.*pcie", "v100-pcie"),
    (r"\bv100-sxm2", "v100-sxm2"),  # not SXM3 (DGX-2), whose clocks differ
    (r"\ba100", "a100"),
    (r"\ba10\b", "a10"),
    (r"\bh100.*nvl", "h100-nvl"),
    (r"\bh100.*pcie", "h100-pcie"),
    (r"\bh100", "h100-sxm"),  # "NVIDIA H100 80GB HBM3" is the SXM part
    (r"\bh200.*nvl", "h200-nvl"),
    (r"\bh200", "h200-sxm"),  # "NVIDIA H200"
    (r"\bl4\b", "l4"),
    (r"\bt4\b", "t4"),
    # ROCm names both "AMD Instinct MI250X/MI250" (ROCm 6.2: "AMD Radeon Graphics"); the compute units that
    # fitprof.profilers.flops_torch.device_name appends tell them apart: 110 a die on an MI250X, 104 on an MI250.
    (r"\b(mi250|gfx90a)\b.*\b110 cus\b", "mi250x"),
    (r"\b(mi250|gfx90a)\b.*\b104 cus\b", "mi250"),
    # Without the compute units, the MI250X's die: the larger peak, so an MI250's MFU reads 5% low, never high.
    (r"\bmi250x", "mi250x"),
    (r"\bmi300x", "mi300x"),
)


def device_key(device_name: str) -> str | None:
    """The :data:`PEAK_FLOPS` key of a device name as the framework gives it (``torch.cuda.get_device_name``,
    TensorFlow's ``device_name`` detail, JAX's ``device_kind``), case-insensitive: ``"NVIDIA H100 80GB HBM3"``
    -> ``"h100-sxm"``; None for a device not in the table (e.g. ``"NVIDIA A10G"``, whose peaks differ from A10's;
    ``"NVIDIA GH200 480GB"``)."""
    name = device_name.lower()
    for pattern, key in _DEVICE_PATTERNS:
        if re.search(pattern, name):
            return key
    return None


@dataclass(frozen=True)
class ArchRate:
    """Dense FLOPs per clock of one compute unit (NVIDIA SM, AMD CU) of an architecture, per compute dtype.

    Attributes:
        name: the architecture's name.
        flops_per_clock: dense FLOPs per clock per SM / CU, per dtype (2 per multiply-add; float32 on CUDA cores,
            the others on tensor cores; on AMD every dtype on the matrix cores).
        tensor_clock: the share of the device's maximum clock at which its datasheets rate the tensor-core dtypes
            (1: at the maximum clock).
        source: the whitepaper.
    """

    name: str
    flops_per_clock: dict[str, float]
    source: str
    tensor_clock: float = 1.0


_WP_VOLTA = "https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf"
_WP_TURING = (
    "https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/"
    "NVIDIA-Turing-Architecture-Whitepaper.pdf"
)
_WP_A100 = "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf"
_WP_GA102 = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
_WP_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_WP_HOPPER = "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
_WP_CDNA2 = (
    "https://www.amd.com/content/dam/amd/en/documents/instinct-business-docs/white-papers/amd-cdna2-white-paper.pdf"
)
_WP_CDNA3 = (
    "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/white-papers/amd-cdna-3-white-paper.pdf"
)


def _per_clock(float32: float, tf32: float | None, half: float, *, bf16: bool = True) -> dict[str, float]:
    rates = {"float32": float32, "float16": half}
    if tf32 is not None:
        rates["tf32"] = tf32
    if bf16:
        rates["bfloat16"] = half
    return rates


ARCH_RATES: dict[str, ArchRate] = {
    # Volta SM: 64 FP32 cores (128 FLOP/clock), 8 tensor cores of 64 FP16 multiply-adds (1024 FLOP/clock).
    "sm_70": ArchRate("Volta", _per_clock(128, None, 1024, bf16=False), _WP_VOLTA),
    # Turing SM: 64 FP32 cores, 8 tensor cores of 64 FP16 multiply-adds (FP32 accumulate at full rate on Tesla
    # and Quadro parts; GeForce: half, see _CONSUMER_TENSOR_SHARE).
    "sm_75": ArchRate("Turing", _per_clock(128, None, 1024, bf16=False), _WP_TURING),
    # GA100 SM: 64 FP32 cores, 4 tensor cores of 256 dense FP16 multiply-adds (2048 FLOP/clock), TF32 at half that.
    "sm_80": ArchRate("Ampere GA100", _per_clock(128, 1024, 2048), _WP_A100),
    # GA10x SM: 128 FP32 cores (256 FLOP/clock), 4 tensor cores of 128 dense FP16 multiply-adds (1024 FLOP/clock).
    "sm_86": ArchRate("Ampere GA10x", _per_clock(256, 512, 1024), _WP_GA102),
    # Ada SM: as GA10x per clock (FP8 aside, which fitprof does not rate).
    "sm_89": ArchRate("Ada Lovelace", _per_clock(256, 512, 1024), _WP_ADA),
    # Hopper SM: 128 FP32 cores (256 FLOP/clock), 4 tensor cores of 512 dense FP16 multiply-adds (4096 FLOP/clock).
    # Its datasheets rate the tensor cores below the maximum clock the device reports: the clocks their dense
    # TFLOPS imply are 1830 of 1980 MHz (SXM, 0.924), 1620 of 1755 MHz (PCIe, 0.923) and 1545 of 1785 MHz (NVL,
    # 0.866); 0.894, between the two ends, puts each within 3.4% of its datasheet.
    "sm_90": ArchRate("Hopper", _per_clock(256, 2048, 4096), _WP_HOPPER, tensor_clock=0.894),
    # CDNA 2 CU: 256 FP32 matrix FLOP/clock (packed), 1024 FP16 / bfloat16; no TF32.
    "gfx90a": ArchRate("CDNA 2", _per_clock(256, None, 1024), _WP_CDNA2),
    # CDNA 3 CU: 256 FP32 matrix FLOP/clock, 1024 TF32 (xf32), 2048 FP16 / bfloat16 (dense).
    "gfx942": ArchRate("CDNA 3", _per_clock(256, 1024, 2048), _WP_CDNA3),
}
"""Dense FLOPs per clock per compute unit of each architecture fitprof can derive a peak for, by CUDA ``sm_XY``
(compute capability X.Y) or ROCm ``gfxNNN`` name (:func:`derived_peak_flops_per_s`). An architecture not here
(Blackwell, CDNA 4, consumer Radeon, ...) has no derived peak: FLOP/s only."""

_CONSUMER_TENSOR_SHARE = 0.5
"""GeForce parts of Turing, Ampere GA10x and Ada run tensor-core FP16 and bfloat16 with FP32 accumulation (what torch
and TensorFlow use), and TF32, at half the rate of their data-center and professional siblings (the GA102 and Ada
whitepapers: RTX 3090 71 dense FP16-with-FP32-accumulate TFLOPS on 82 SMs at 1695 MHz, RTX 4090 165.2 on 128 SMs
at 2520 MHz)."""

_PROPS = re.compile(r"\((sm_\d+|gfx[0-9a-f]+), (\d+) (?:SMs|CUs), (\d+(?:\.\d+)?) MHz\)\s*$")


def device_properties_suffix(arch: str, units: int, clock_mhz: float) -> str:
    """`` (sm_86, 80 SMs, 1710 MHz)`` / `` (gfx942, 228 CUs, 2100 MHz)``: what
    :func:`fitprof.profilers.flops_torch.device_name` appends to the name of a device outside :data:`PEAK_FLOPS`,
    from which :func:`peak_flops_per_s` derives its peak."""
    unit = "CUs" if arch.startswith("gfx") else "SMs"
    return f" ({arch}, {units} {unit}, {clock_mhz:g} MHz)"


def derived_peak_flops_per_s(name: str, arch: str, units: int, clock_mhz: float, dtype: str) -> tuple[float, str]:
    """``(dense peak FLOP/s, note)`` derived from a device's properties, or ``(nan, reason)``.

    ``peak = units * clock * ARCH_RATES[arch].flops_per_clock[dtype]`` (times ``tensor_clock`` for a tensor-core
    dtype, and :data:`_CONSUMER_TENSOR_SHARE` on a GeForce part of Turing, GA10x or Ada).

    Args:
        name: the device's name (``"NVIDIA GeForce RTX 4090"``): "GeForce" in it halves the tensor-core rates.
        arch: ``"sm_XY"`` from the CUDA compute capability X.Y, or the ROCm ``gfx`` name (``"gfx90a"``).
        units: streaming multiprocessors (NVIDIA) or compute units (AMD) of the device (of one die).
        clock_mhz: the device's maximum clock (MHz), as the driver reports it.
        dtype: one of :data:`DTYPES`.

    Returns:
        The peak and a note that says it was derived and from what; NaN and the reason for an architecture not in
        :data:`ARCH_RATES`, a dtype it lacks, or properties that are not positive numbers.
    """
    rate = ARCH_RATES.get(arch)
    if rate is None:
        return math.nan, f"no peak rate known for device {name!r} (architecture {arch} not in fitprof's table)"
    per_clock = rate.flops_per_clock.get(dtype)
    if per_clock is None:
        return math.nan, f"no {dtype} peak rate for {rate.name} ({name})"
    if not (units > 0 and math.isfinite(clock_mhz) and clock_mhz > 0):
        return math.nan, f"no peak rate known for device {name!r} (no SM count or clock)"
    share = 1.0
    if dtype != "float32":
        share = rate.tensor_clock
        if arch in ("sm_75", "sm_86", "sm_89") and "geforce" in name.lower():
            share *= _CONSUMER_TENSOR_SHARE
    peak = units * clock_mhz * 1e6 * per_clock * share
    unit = "CUs" if arch.startswith("gfx") else "SMs"
    return peak, (
        f"peak derived from the device ({units} {unit} x {clock_mhz:g} MHz x {per_clock * share:g} dense {dtype} "
        f"FLOP/clock, {rate.name}), not from a datasheet"
    )


def peak_flops_per_s(device_name: str, dtype: str) -> tuple[float, str]:
    """``(dense peak FLOP/s, "")`` of ``device_name`` at ``dtype`` (one of :data:`DTYPES`), or ``(nan, reason)``
    when the device is a CPU (``""``), is not in :data:`PEAK_FLOPS`, or has no figure for the dtype (``"tf32"`` on
    a V100 or T4, whose float32 has no tensor-core mode).

    A device not in :data:`PEAK_FLOPS` whose name ends in its properties (:func:`device_properties_suffix`, as
    :func:`fitprof.profilers.flops_torch.device_name` writes them) gets the peak derived from them
    (:func:`derived_peak_flops_per_s`), with a note that says so."""
    if not device_name:
        return math.nan, "no accelerator (CPU): FLOP/s only"
    key = device_key(device_name)
    if key is None:
        props = _PROPS.search(device_name)
        if props is not None:
            name = device_name[: props.start()].strip()
            return derived_peak_flops_per_s(name, props[1], int(props[2]), float(props[3]), dtype)
        return math.nan, f"no peak rate known for device {device_name!r}"
    rate = PEAK_FLOPS[key].flops_per_s.get(dtype)
    if rate is None:
        return math.nan, f"no {dtype} peak rate for {PEAK_FLOPS[key].name}"
    return rate, ""


@dataclass(frozen=True)
class StepWork:
    """What one window's steps processed, collected by the adapter (see :class:`WorkLog`).

    Attributes:
        samples_per_step: mean samples per profiled step (NaN: unknown).
        items_per_step: mean ``count_items(batch)`` per profiled step (NaN: no function, or it failed).
        flops_per_step: FLOPs of one training step (NaN: not counted), convolutions included.
        conv_flops_per_step: the convolutions' part of ``flops_per_step`` (forward and backward; 0: none).
        recompute_flops_per_step: FLOPs that activation checkpointing ran a second time in the backward (0:
            none); not in ``flops_per_step``, which are model FLOPs as MFU defines them (PaLM, appendix B).
        flops_samples: samples of the batch whose step was counted (NaN: unknown).
        device_name: the accelerator's name ("" on a CPU).
        dtype: the compute dtype of matrix products, one of :data:`DTYPES` (or another name, which has no peak).
        conv_dtype: the compute dtype of convolutions ("": ``dtype``).
        flops_note: why ``flops_per_step`` is NaN ("" when counted).
        samples_total: samples in all the window's steps, where they are known only as a total (Keras); divided
            by the report's ``steps_analyzed`` when ``samples_per_step`` is NaN.
        items_per_sample: items per sample of one seen batch (Keras on torch); times the samples per step when
            ``items_per_step`` is NaN.
    """

    samples_per_step: float = math.nan
    items_per_step: float = math.nan
    flops_per_step: float = math.nan
    flops_samples: float = math.nan
    device_name: str = ""
    dtype: str = ""
    conv_flops_per_step: float = 0.0
    recompute_flops_per_step: float = 0.0
    conv_dtype: str = ""
    flops_note: str = ""
    samples_total: float = math.nan
    items_per_sample: float = math.nan


def _per_s(per_step: float, step_time_ms: float) -> float:
    if not (math.isfinite(per_step) and math.isfinite(step_time_ms) and step_time_ms > 0):
        return math.nan
    return per_step / (step_time_ms / 1000.0)


def with_throughput(report: BottleneckReport, work: StepWork) -> BottleneckReport:
    """``report`` with its throughput fields filled from ``work`` and its step time (see the module docstring).

    Returns a new report (the input is frozen and left as it is).
    """
    samples = work.samples_per_step
    if not math.isfinite(samples) and report.steps_analyzed > 0:
        samples = work.samples_total / report.steps_analyzed
    items = work.items_per_step
    if not math.isfinite(items):
        items = work.items_per_sample * samples
    flops = work.flops_per_step
    conv = work.conv_flops_per_step if math.isfinite(work.conv_flops_per_step) else 0.0
    if (
        math.isfinite(flops)
        and math.isfinite(work.flops_samples)
        and math.isfinite(samples)
        and work.flops_samples > 0
        and work.flops_samples != samples
    ):
        flops = flops * samples / work.flops_samples
        conv = conv * samples / work.flops_samples
    flops_per_s = _per_s(flops, report.step_time_ms)
    peak, mfu, dtype, note = _mfu(work, flops, conv, flops_per_s, report.step_time_ms)
    if not math.isfinite(flops_per_s):
        note = work.flops_note or "no FLOP count or step time"
    elif work.recompute_flops_per_step > 0:
        note = "; ".join(filter(None, [note, _recompute_note(work, flops, flops_per_s, mfu)]))
    return dataclasses.replace(
        report,
        samples_per_step=samples,
        samples_per_s=_per_s(samples, report.step_time_ms),
        items_per_step=items,
        items_per_s=_per_s(items, report.step_time_ms),
        flops_per_step=flops,
        flops_per_s=flops_per_s,
        peak_flops_per_s=peak,
        mfu=mfu,
        device_name=work.device_name,
        compute_dtype=dtype,
        mfu_note=note,
    )


def _recompute_note(work: StepWork, flops: float, flops_per_s: float, mfu: float) -> str:
    """What activation checkpointing recomputed, and the hardware FLOPs and HFU that include it: the report's
    ``flops_per_step`` and ``mfu`` are model FLOPs and MFU, without the recomputation."""
    scale = flops / work.flops_per_step if work.flops_per_step > 0 else 1.0
    again = work.recompute_flops_per_step * scale
    hardware = flops + again
    hfu = f", HFU {mfu * hardware / flops:.3f}" if math.isfinite(mfu) and flops > 0 else ""
    return (
        f"model FLOPs: flops_per_step and mfu leave out the {again:.4g} FLOP a step that activation checkpointing "
        f"recomputes in the backward; hardware FLOPs {hardware:.4g} a step ({flops_per_s * hardware / flops:.4g} "
        f"FLOP/s{hfu})"
    )


def _mfu(
    work: StepWork, flops: float, conv: float, flops_per_s: float, step_ms: float
) -> tuple[float, float, str, str]:
    """``(effective peak FLOP/s, mfu, dtype text, note)``: each op class at the peak of its own precision."""
    conv_dtype = work.conv_dtype or work.dtype
    conv = min(max(conv, 0.0), flops) if math.isfinite(flops) else 0.0
    dtype_text = work.dtype if conv == 0.0 or conv_dtype == work.dtype else f"{work.dtype} matmul, {conv_dtype} conv"
    peak, note = peak_flops_per_s(work.device_name, work.dtype)
    if conv > 0.0 and conv_dtype != work.dtype:
        conv_peak, conv_note = peak_flops_per_s(work.device_name, conv_dtype)
        mm = flops - conv
        if math.isfinite(conv_peak) and (math.isfinite(peak) or mm == 0.0):
            ideal_s = conv / conv_peak + (mm / peak if mm > 0.0 else 0.0)
            peak = flops / ideal_s if ideal_s > 0 else math.nan
        else:
            peak, note = math.nan, note or conv_note
    if not (math.isfinite(peak) and math.isfinite(flops_per_s)):
        return peak, math.nan, dtype_text, note
    mfu = flops_per_s / peak
    if mfu > 1.0:
        return (
            peak,
            math.nan,
            dtype_text,
            f"{flops_per_s / 1e12:.4g} TFLOP/s in {step_ms:.4g} ms steps is {mfu:.2f}x the dense {dtype_text} peak "
            f"of {work.device_name} ({peak / 1e12:.4g} TFLOP/s): the step ran in a faster precision than "
            "fitprof assumed, or the FLOP count is too high",
        )
    return peak, mfu, dtype_text, note


CountItems = Callable[[Any], float]
"""A user function: the items (tokens, pixels, ...) in one batch."""


def samples_unknown(why: str, fix: str) -> str:
    """The one warning of a fit whose samples per step are unknown (Keras and Lightning alike): ``why`` says what
    the data gave, ``fix`` what gives the count."""
    return (
        f"fitprof: the samples per step are unknown here: {why}. fitprof/samples_per_s and the FLOP figures are NaN; "
        f"{fix}."
    )


BATCH_FIX = (
    "hand the step a tensor, or tuples, lists, dicts or dataclasses of tensors whose first dimension is the batch "
    "(a list of variable-size samples beside a tensor of their targets is counted by its length)"
)
"""How a Lightning batch (or a Keras torch-backend one) gives fitprof its sample count."""


class WorkLog:
    """The samples and items of one window's steps and the FLOPs counted for it; the adapters feed it.

    Args:
        count_items: the user's ``count_items(batch)`` (None: no items figure).
        warn: called once per window with a message when ``count_items`` raises or returns no finite number.
        counter: the FLOP counter (below).
        warn_samples: called with a message (:func:`samples_unknown`, or the ambiguity of
            :func:`fitprof._batch.batch_samples`) when a profiled step's batch gives no sample count or an uncertain
            one; the caller warns once a fit. None: not told.
    """

    def __init__(
        self,
        count_items: CountItems | None,
        warn: Callable[[str], None],
        counter: Any = None,
        warn_samples: Callable[[str], None] | None = None,
    ) -> None:
        self.count_items = count_items
        self.warn = warn
        self.warn_samples = warn_samples
        self.counter = counter
        """Counts one step's FLOPs (``start()``, ``stop() -> float``, ``running``, ``note``), e.g.
        :class:`fitprof.profilers.flops_torch.TorchFlopCount`; None: FLOPs are not counted here."""
        self._counted_batch: Any = None
        self.counting = False
        """:meth:`count_flops` started the counter and :meth:`stop_count` has not ended it yet (read every step,
        where ``stop_count`` has nothing to do on all but one)."""
        self.device_name = ""
        """The accelerator's name ("" on a CPU); set by the adapter once per fit."""
        self.dtype = ""
        """The compute dtype of matrix products (:data:`DTYPES`); set by the adapter once per fit."""
        self.conv_dtype = ""
        """The compute dtype of convolutions ("": ``dtype``); set by the adapter once per fit."""
        self.reset()

    def reset(self) -> None:
        """Forget the last window's samples, items and FLOPs (call at the start of each profiled epoch)."""
        self._samples: list[float] = []
        self._items: list[float] = []
        self._items_failed = False
        self._samples_total = math.nan
        self._items_per_sample = math.nan
        self.flops_per_step = math.nan
        self.flops_samples = math.nan
        self.conv_flops_per_step = 0.0
        self.recompute_flops_per_step = 0.0
        self.flops_note = "FLOPs not counted: no step of this epoch ran just before or just after the window"

    def add_step(self, batch: Any) -> None:
        """Record one profiled step's batch: its samples (:func:`fitprof._batch.batch_samples`: where the count is
        unknown or ambiguous, ``warn_samples`` is told) and items. Never raises."""
        n, note = batch_samples(batch)
        if note and self.warn_samples is not None:
            self.warn_samples(samples_unknown(note, BATCH_FIX) if n is None else f"fitprof: {note}; {BATCH_FIX}.")
        self._samples.append(math.nan if n is None else float(n))
        items = self._call_items(batch)
        if math.isfinite(items):
            self._items.append(items)

    def _call_items(self, batch: Any) -> float:
        if self.count_items is None or self._items_failed:
            return math.nan
        try:
            items = float(self.count_items(batch))
            if not math.isfinite(items):
                raise ValueError(f"it returned {items!r}")
        except Exception as err:
            self._items_failed = True
            self.warn(f"fitprof: count_items failed on a batch ({err!r}); fitprof/items_per_s is NaN for the window.")
            return math.nan
        return items

    def add_items(self, batch: Any, *, per_sample_of: float) -> None:
        """Record the items per sample of one batch of ``per_sample_of`` samples (a step outside the window, where
        the window's own batches are not seen)."""
        self._items_per_sample = self._call_items(batch) / per_sample_of

    def set_window_samples(self, total: float) -> None:
        """Record the samples of all the window's steps together (where they are known only as a total)."""
        self._samples_total = total

    def set_flops(
        self, flops: float, samples: float, note: str = "", *, conv_flops: float = 0.0, recompute_flops: float = 0.0
    ) -> None:
        """The FLOPs of one training step whose batch held ``samples`` (NaN flops: ``note`` says why), of which
        ``conv_flops`` were convolutions; ``recompute_flops`` more ran again in the backward (activation
        checkpointing), not part of ``flops`` (model FLOPs)."""
        self.flops_per_step = flops
        self.flops_samples = samples
        self.conv_flops_per_step = conv_flops
        self.recompute_flops_per_step = recompute_flops
        self.flops_note = note

    # The engine's Work protocol (fitprof.fit.result.Work): the engine says when, this log counts.
    def epoch_start(self) -> None:
        self.reset()

    def window_opened(self) -> None:
        pass

    def window_step(self, batch: Any) -> None:
        self.add_step(batch)

    def window_closed(self) -> None:
        pass

    def count_flops(self, step: int, batch: Any) -> None:
        """Start counting the FLOPs of the step that begins now (its ``batch``); :meth:`stop_count` ends it."""
        if self.counter is not None:
            self._counted_batch = batch
            self.counting = True
            self.counter.start()

    def stop_count(self) -> None:
        """The counted step ended: record its FLOPs and samples (a no-op when nothing is being counted)."""
        if not self.counting:
            return
        self.counting = False
        if self.counter is None or not self.counter.running:
            return
        flops = self.counter.stop()
        n = batch_size(self._counted_batch)
        self._counted_batch = None
        self.set_flops(
            flops,
            math.nan if n is None else float(n),
            self.counter.note,
            conv_flops=getattr(self.counter, "conv_flops", 0.0),
            recompute_flops=getattr(self.counter, "recompute_flops", 0.0),
        )

    def work(self) -> StepWork:
        """The window's :class:`StepWork`."""
        samples = math.nan if not self._samples else sum(self._samples) / len(self._samples)
        items = math.nan if self._items_failed or not self._items else sum(self._items) / len(self._items)
        return StepWork(
            samples_per_step=samples,
            items_per_step=items,
            flops_per_step=self.flops_per_step,
            flops_samples=self.flops_samples,
            device_name=self.device_name,
            dtype=self.dtype,
            conv_flops_per_step=self.conv_flops_per_step,
            recompute_flops_per_step=self.recompute_flops_per_step,
            conv_dtype=self.conv_dtype,
            flops_note=self.flops_note,
            samples_total=self._samples_total,
            items_per_sample=math.nan if self._items_failed else self._items_per_sample,
        )

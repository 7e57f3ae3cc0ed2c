"""Peaks derived from a device's properties (:func:`fitprof.throughput.derived_peak_flops_per_s`) for devices outside
the datasheet table: on every device of the table the derivation lands within 5% of the datasheet, fed the
device's real SM / CU count and maximum clock; the device name that torch's properties give carries them to the
MFU, whose note says the peak was derived; an unknown architecture keeps FLOP/s only."""

from __future__ import annotations

import math
import types

import pytest

from fitprof.analysis import BottleneckReport
from fitprof.throughput import (
    ARCH_RATES,
    PEAK_FLOPS,
    StepWork,
    derived_peak_flops_per_s,
    device_key,
    peak_flops_per_s,
    with_throughput,
)

# Each table row's architecture, SM (CU) count and maximum clock (MHz), as the driver reports them.
TABLE_DEVICES: dict[str, tuple[str, int, float]] = {
    # Volta whitepaper, table 1: 80 SMs; boost 1530 MHz (SXM2), 1380 MHz (PCIe); V100S datasheet: 1597 MHz.
    "v100-sxm2": ("sm_70", 80, 1530),
    "v100-pcie": ("sm_70", 80, 1380),
    "v100s-pcie": ("sm_70", 80, 1597),
    # A100 whitepaper, table 3: 108 SMs, boost 1410 MHz (SXM4 and PCIe alike).
    "a100": ("sm_80", 108, 1410),
    # GA102 whitepaper and the A10 datasheet: 9216 CUDA cores (72 SMs of 128), boost 1695 MHz.
    "a10": ("sm_86", 72, 1695),
    # Hopper whitepaper and datasheets: H100 SXM5 132 SMs, 1980 MHz; H100 PCIe 114 SMs, 1755 MHz; H100 NVL
    # 132 SMs, 1785 MHz; H200 the same GH100 as H100 SXM5 (SXM) and NVL.
    "h100-sxm": ("sm_90", 132, 1980),
    "h100-pcie": ("sm_90", 114, 1755),
    "h100-nvl": ("sm_90", 132, 1785),
    "h200-sxm": ("sm_90", 132, 1980),
    "h200-nvl": ("sm_90", 132, 1785),
    # L4 datasheet: 7424 CUDA cores (58 SMs of 128), boost 2040 MHz.
    "l4": ("sm_89", 58, 2040),
    # Turing whitepaper, appendix: T4 40 SMs, boost 1590 MHz.
    "t4": ("sm_75", 40, 1590),
    # CDNA 2 white paper: MI250X 220 CUs, MI250 208 CUs (two dies: 110 and 104 a die), 1700 MHz.
    "mi250x": ("gfx90a", 110, 1700),
    "mi250": ("gfx90a", 104, 1700),
    # MI300X data sheet: 304 CUs, 2100 MHz.
    "mi300x": ("gfx942", 304, 2100),
}


def test_every_table_device_has_its_properties_here() -> None:
    assert set(TABLE_DEVICES) == set(PEAK_FLOPS)
    assert {arch for arch, _, _ in TABLE_DEVICES.values()} == set(ARCH_RATES)


@pytest.mark.parametrize("key", sorted(PEAK_FLOPS))
def test_the_derived_peak_is_within_5_percent_of_the_datasheet(key: str) -> None:
    arch, units, clock = TABLE_DEVICES[key]
    table = PEAK_FLOPS[key].flops_per_s
    derived = {dtype: derived_peak_flops_per_s(key, arch, units, clock, dtype) for dtype in table}
    for dtype, (peak, note) in derived.items():
        assert peak == pytest.approx(table[dtype], rel=0.05), (dtype, peak / table[dtype] - 1)
        assert note.startswith("peak derived from the device")
    # A dtype the datasheet does not rate (bfloat16 and TF32 on Volta and Turing) is not derived either.
    for dtype in {"float32", "tf32", "bfloat16", "float16"} - set(table):
        assert math.isnan(derived_peak_flops_per_s(key, arch, units, clock, dtype)[0])


@pytest.mark.parametrize(
    ("name", "dtype", "datasheet"),
    [
        # Outside the table, each against its own datasheet.
        # L40S datasheet: 142 SMs, boost 2520 MHz; FP32 91.6 TFLOPS.
        ("NVIDIA L40S (sm_89, 142 SMs, 2520 MHz)", "float32", 91.6e12),
        # MI300A data sheet: 228 CUs, 2100 MHz; FP16 980.6 dense TFLOPS.
        ("AMD Instinct MI300A (gfx942, 228 CUs, 2100 MHz)", "bfloat16", 980.6e12),
        # Ada whitepaper, appendix: RTX 4090 128 SMs, boost 2520 MHz; FP16 tensor with FP32 accumulate 165.2 dense
        # TFLOPS (half its FP16-accumulate rate); FP32 82.6.
        ("NVIDIA GeForce RTX 4090 (sm_89, 128 SMs, 2520 MHz)", "bfloat16", 165.2e12),
        ("NVIDIA GeForce RTX 4090 (sm_89, 128 SMs, 2520 MHz)", "float32", 82.6e12),
        # GA102 whitepaper, appendix: RTX 3090 82 SMs, boost 1695 MHz; FP16 with FP32 accumulate 71 dense TFLOPS.
        ("NVIDIA GeForce RTX 3090 (sm_86, 82 SMs, 1695 MHz)", "float16", 71e12),
    ],
)
def test_devices_outside_the_table_get_their_datasheets_peak(name: str, dtype: str, datasheet: float) -> None:
    assert device_key(name) is None
    peak, note = peak_flops_per_s(name, dtype)
    assert peak == pytest.approx(datasheet, rel=0.05)
    assert note.startswith("peak derived from the device (")


def _report() -> BottleneckReport:
    """A window of 100 ms steps on a GPU (only its step time matters to MFU)."""
    return BottleneckReport(
        steps_analyzed=4, step_time_ms=100.0, input_ms_per_step=0.0, input_percent=0.0, htod_ms_per_step=0.0,
        htod_percent=0.0, htod_bytes_per_step=0.0, htod_gb_per_s=0.0, htod_pinned_ms_per_step=0.0,
        htod_pageable_ms_per_step=0.0, dtoh_ms_per_step=0.0, collective_ms_per_step=0.0, collective_percent=0.0,
        top_ops=[], op_time_source="device", verdict="compute-bound", advice=[], framework="pytorch",
    )  # fmt: skip


def test_the_mfu_of_a_derived_peak_says_so() -> None:
    report = _report()
    name = "NVIDIA A10G (sm_86, 80 SMs, 1710 MHz)"
    out = with_throughput(report, StepWork(flops_per_step=4e12, device_name=name, dtype="bfloat16"))
    peak = 80 * 1710e6 * 1024  # GA10x: 1024 dense bfloat16 FLOP a clock an SM
    assert out.peak_flops_per_s == pytest.approx(peak, rel=1e-12)
    assert out.mfu == pytest.approx(4e12 / 0.1 / peak, rel=1e-12)
    assert out.mfu_note.startswith("peak derived from the device (80 SMs x 1710 MHz x 1024 dense bfloat16")
    assert "peak derived from the device" in out.throughput_line()
    # A table device: the datasheet's peak, no note.
    table = with_throughput(report, StepWork(flops_per_step=4e12, device_name="NVIDIA A10", dtype="bfloat16"))
    assert table.mfu == pytest.approx(4e12 / 0.1 / 125e12) and table.mfu_note == ""


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA B200 (sm_100, 148 SMs, 1965 MHz)",  # an architecture fitprof has no rates for
        "AMD Instinct MI355X (gfx950, 256 CUs, 2400 MHz)",
        "NVIDIA A10G",  # no properties: a torch without clock_rate
        "NVIDIA A10G (sm_86, 0 SMs, 1710 MHz)",
    ],
)
def test_an_unknown_architecture_keeps_flops_only(name: str) -> None:
    report = _report()
    out = with_throughput(report, StepWork(flops_per_step=4e12, device_name=name, dtype="bfloat16"))
    assert out.flops_per_s == pytest.approx(4e13) and math.isnan(out.mfu)
    assert out.mfu_note.startswith("no peak rate known for device")


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, name: str, props: object, hip: str | None = None) -> object:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    return torch.device("cuda")


def test_torch_device_properties_reach_the_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from fitprof.profilers.flops_torch import device_name

    # torch 2.13's _CudaDeviceProperties: major, minor, multi_processor_count, clock_rate (kHz), gcnArchName.
    props = types.SimpleNamespace(major=8, minor=6, multi_processor_count=80, clock_rate=1_710_000, gcnArchName="")
    device = _fake_cuda(monkeypatch, "NVIDIA A10G", props)
    assert device_name(device) == "NVIDIA A10G (sm_86, 80 SMs, 1710 MHz)"  # type: ignore[arg-type]
    # A table device keeps its bare name (and its datasheet peak).
    device = _fake_cuda(monkeypatch, "NVIDIA H100 80GB HBM3", props)
    assert device_name(device) == "NVIDIA H100 80GB HBM3"  # type: ignore[arg-type]
    # A torch whose properties have no clock: the bare name, FLOP/s only.
    bare = types.SimpleNamespace(major=8, minor=6, multi_processor_count=80)
    device = _fake_cuda(monkeypatch, "NVIDIA A10G", bare)
    assert device_name(device) == "NVIDIA A10G"  # type: ignore[arg-type]


def test_rocm_properties_reach_the_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from fitprof.profilers.flops_torch import device_name

    mi300a = types.SimpleNamespace(
        gcnArchName="gfx942:sramecc+:xnack-", multi_processor_count=228, clock_rate=2_100_000
    )
    device = _fake_cuda(monkeypatch, "AMD Instinct MI300A", mi300a, hip="6.2.41133")
    name = device_name(device)  # type: ignore[arg-type]
    assert name == "AMD Instinct MI300A (gfx942, 228 CUs, 2100 MHz)"
    assert peak_flops_per_s(name, "bfloat16")[0] == pytest.approx(228 * 2100e6 * 2048)
    # A die of the table (MI250: gfx90a, 104 CUs) keeps the name the table reads.
    mi250 = types.SimpleNamespace(gcnArchName="gfx90a:sramecc+:xnack-", multi_processor_count=104, clock_rate=1_700_000)
    device = _fake_cuda(monkeypatch, "AMD Radeon Graphics", mi250, hip="6.2.41133")
    assert device_name(device) == "AMD Radeon Graphics (gfx90a, 104 CUs)"  # type: ignore[arg-type]

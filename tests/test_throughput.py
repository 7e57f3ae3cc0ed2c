"""Framework-free: the dense peak table and its device names, the throughput / FLOP rate / MFU
arithmetic on a real report, report files with and without the new fields, and the ``count_items`` checks."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from fitprof import analyze
from fitprof.fit import config as _config
from fitprof.report_files import read_report_file, report_from_dict, write_report_file
from fitprof.throughput import PEAK_FLOPS, StepWork, WorkLog, device_key, peak_flops_per_s, with_throughput

DATA = Path(__file__).parent / "data"
TRACE = DATA / "lightning_cpu.pt.trace.json.gz"


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Tesla V100-SXM2-16GB", "v100-sxm2"),
        ("Tesla V100-PCIE-32GB", "v100-pcie"),
        ("Tesla V100S-PCIE-32GB", "v100s-pcie"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA A10G", None),  # AWS's A10G has other peaks than the A10
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", None),
        ("Tesla T4", "t4"),
        ("AMD Instinct MI250X/MI250", "mi250x"),
        ("AMD Instinct MI300X", "mi300x"),
        ("NVIDIA GeForce RTX 4090", None),
        ("NVIDIA GH200 480GB", None),
        ("Tesla V100-SXM3-32GB", None),  # Grace Hopper: not in the table
    ],
)
def test_device_names_pick_their_row(name: str, key: str | None) -> None:
    assert device_key(name) == key


def test_peaks_are_dense_and_a_missing_dtype_or_device_has_a_reason() -> None:
    # Hopper's datasheet gives 1,979 TFLOPS bf16 "with sparsity": the dense figure is half of it.
    assert peak_flops_per_s("NVIDIA H100 80GB HBM3", "bfloat16") == (1979e12 / 2, "")
    assert peak_flops_per_s("NVIDIA A100-SXM4-80GB", "tf32") == (156e12, "")
    for device, dtype, reason in (
        ("Tesla T4", "bfloat16", "no bfloat16 peak rate for T4"),
        ("NVIDIA A10G", "float32", "no peak rate known for device 'NVIDIA A10G'"),
        ("", "float32", "no accelerator (CPU): FLOP/s only"),
    ):
        value, why = peak_flops_per_s(device, dtype)
        assert math.isnan(value) and why == reason
    for rate in PEAK_FLOPS.values():  # every row names its datasheet, every figure is a positive rate
        assert rate.source.startswith("https://")
        assert all(0 < v < 3e15 for v in rate.flops_per_s.values())


def test_throughput_flop_rate_and_mfu_from_a_real_report() -> None:
    report = analyze(TRACE)
    assert report.steps_analyzed > 0 and math.isnan(report.samples_per_s)  # a bare trace carries none
    work = StepWork(
        samples_per_step=32.0,
        items_per_step=4096.0,
        flops_per_step=3e9,
        flops_samples=32.0,
        device_name="NVIDIA A100-SXM4-80GB",
        dtype="bfloat16",
    )
    out = with_throughput(report, work)
    summed_s = report.step_time_ms * report.steps_analyzed / 1000.0
    assert out.samples_per_s == pytest.approx(32 * report.steps_analyzed / summed_s, rel=1e-12)
    assert out.items_per_s == pytest.approx(4096 * report.steps_analyzed / summed_s, rel=1e-12)
    assert out.flops_per_s == pytest.approx(3e9 * report.steps_analyzed / summed_s, rel=1e-12)
    assert out.mfu == pytest.approx(out.flops_per_s / 312e12, rel=1e-12)
    scalars = out.scalars()
    assert scalars["fitprof/samples_per_s"] == out.samples_per_s and scalars["fitprof/mfu"] == out.mfu
    assert "MFU" in out.summary_markdown()
    # The counted step held 16 samples, the window's steps 32: FLOPs scale with the samples.
    half = with_throughput(report, dataclasses.replace(work, flops_per_step=1.5e9, flops_samples=16.0))
    assert half.flops_per_step == 3e9
    # A total over the window (Keras) is spread over the analysed steps.
    total = with_throughput(report, StepWork(samples_total=32.0 * report.steps_analyzed))
    assert total.samples_per_step == 32.0 and math.isnan(total.mfu) and math.isnan(total.flops_per_s)


def test_report_files_carry_the_new_fields_and_old_files_read_as_nan(tmp_path: Path) -> None:
    report = with_throughput(
        analyze(TRACE), StepWork(samples_per_step=8.0, flops_per_step=1e6, device_name="NVIDIA L4", dtype="float16")
    )
    path = write_report_file(tmp_path, session="s", epoch=0, report=report, trace=TRACE)
    back = read_report_file(path).report
    assert back.samples_per_s == report.samples_per_s and back.mfu == report.mfu
    assert back.device_name == "NVIDIA L4" and back.compute_dtype == "float16"
    old = {k: v for k, v in json.loads(path.read_text())["report"].items() if k in _OLD_FIELDS}
    legacy = report_from_dict(old, "old.json")
    assert math.isnan(legacy.samples_per_s) and math.isnan(legacy.flops_per_s) and math.isnan(legacy.mfu)
    assert legacy.mfu_note == ""


def test_fitprof_report_csv_has_the_throughput_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    import pandas as pd

    from fitprof.cli import main

    report = with_throughput(
        analyze(TRACE), StepWork(samples_per_step=8.0, flops_per_step=1e6, device_name="NVIDIA L4", dtype="float16")
    )
    write_report_file(tmp_path, session="s", epoch=0, report=report, trace=TRACE)
    capsys.readouterr()
    assert main(["report", str(tmp_path), "--format", "csv"]) == 0
    row = pd.read_csv(io.StringIO(capsys.readouterr().out)).iloc[0]
    assert row["samples_per_s"] == pytest.approx(report.samples_per_s, rel=1e-9)
    assert row["flops_per_s"] == pytest.approx(report.flops_per_s, rel=1e-9)
    assert row["mfu"] == pytest.approx(report.flops_per_s / 121e12, rel=1e-9)  # L4 fp16 dense: 242 / 2 TFLOP/s
    assert math.isnan(row["items_per_s"])


_OLD_FIELDS = {
    f.name
    for f in dataclasses.fields(type(analyze(TRACE)))
    if f.name
    not in {
        "samples_per_step",
        "samples_per_s",
        "items_per_step",
        "items_per_s",
        "flops_per_step",
        "flops_per_s",
        "peak_flops_per_s",
        "mfu",
        "device_name",
        "compute_dtype",
        "mfu_note",
    }
}


def test_count_items_is_checked_and_a_failing_one_warns_once() -> None:
    with pytest.raises(TypeError, match="count_items must be None or a function of one batch"):
        _config.check_count_items(3)
    assert _config.check_count_items(None) is None
    messages: list[str] = []
    log = WorkLog(lambda batch: 1 / 0, messages.append)
    log.add_step(([1.0] * 4,))
    log.add_step(([1.0] * 4,))
    work = log.work()
    assert len(messages) == 1 and "count_items failed" in messages[0]
    assert math.isnan(work.items_per_step)

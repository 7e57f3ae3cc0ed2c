"""The device clock of each window, checked by fitprof itself (:mod:`fitprof.analysis.clock`): planted Kineto traces
(``tests/gputrace.py``) whose kernel records carry a wrong clock give the one warning and NaN device figures; the
same traces unskewed, and the real A100 and MI250 traces, do not."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

import fitprof
from fitprof import metrics
from fitprof._warn import WarnOnce
from fitprof.analysis import across_windows
from fitprof.analysis.clock import CLOCK_TOLERANCE_US, LATE_TOLERANCE_US, OFFSET_GROWTH_MIN_US
from fitprof.fit.pipeline import EpochLog, WindowPipeline
from gputrace import kineto_trace, write_kineto
from shared_fixtures import SHARED_KINETO, shared_kineto

DEVICE_FIELDS = (
    "htod_ms_per_step",
    "htod_pinned_ms_per_step",
    "htod_pageable_ms_per_step",
    "dtoh_ms_per_step",
    "collective_ms_per_step",
    "device_busy_percent",
    "htod_exposed_percent",
    "collective_exposed_percent",
    "speedup_if_no_htod",
)


def _device_events(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The planted device work (kernels, copies; pid 0 is the device), not the device mirror of the steps."""
    return [e for e in doc["traceEvents"] if e.get("pid") == 0 and e.get("cat") in ("kernel", "gpu_memcpy")]


def _shifted(doc: dict[str, Any], by_us: float, *, every: bool = True, name: str = "") -> dict[str, Any]:
    """``doc`` with device records moved by ``by_us``: every one (the whole device clock off: the host then waits
    for the device at the end, as the profiler's stop synchronizes, and a ``cudaDeviceSynchronize`` spans the wait),
    or those named ``name`` (one record's clock off, the host's events as they were)."""
    doc = copy.deepcopy(doc)
    for e in _device_events(doc):
        if every or e["name"] == name:
            e["ts"] += by_us
    if every:
        host = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("pid") == 4242]
        start = max(e["ts"] + e["dur"] for e in host)
        last = max(e["ts"] + e["dur"] for e in _device_events(doc))
        doc["traceEvents"].append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaDeviceSynchronize",
                "pid": 4242,
                "tid": 4242,
                "ts": start,
                "dur": max(last - start, 0) + 5,
                "args": {},
            }
        )
    return doc


def _analyze(tmp_path: Path, name: str, doc: dict[str, Any]) -> fitprof.BottleneckReport:
    return fitprof.analyze(write_kineto(tmp_path / f"{name}.pt.trace.json", doc))


def test_a_true_clock_keeps_every_device_figure(tmp_path: Path) -> None:
    doc, truth = kineto_trace(steps=5, seed=3)
    report = _analyze(tmp_path, "ok", doc)
    assert report.device_clock_ok and report.device_clock_note == ""
    assert report.htod_pinned_ms_per_step == pytest.approx(truth.htod_pinned_ms_per_step, rel=1e-12)
    assert report.collective_ms_per_step == pytest.approx(truth.collective_ms_per_step, rel=1e-12)
    # The planted launches start their device work 10 us later at the least (the pinned copy of each step).
    assert report.device_offset_us == 10.0


@pytest.mark.parametrize(
    ("kernel", "by_us", "said"),
    [
        ("ampere_sgemm_64x32_nn", -5_000.0, "4 start before their launch (by up to 4.94 ms)"),
        # launched 60 us before it starts: moved to twice the tolerance before its launch
        ("ampere_sgemm_64x32_nn", -(60 + 2 * CLOCK_TOLERANCE_US), "start before their launch"),
        ("void multi_tensor_apply_kernel<FusedAdamW>(float*)", 2 * LATE_TOLERANCE_US, "4 start after the trace's last"),
    ],
)
def test_kernels_timed_outside_their_steps_make_the_device_figures_nan(
    tmp_path: Path, kernel: str, by_us: float, said: str
) -> None:
    doc, _truth = kineto_trace(steps=4, seed=1)
    report = _analyze(tmp_path, "skewed", _shifted(doc, by_us, every=False, name=kernel))
    assert not report.device_clock_ok
    assert said in report.device_clock_note and report.warnings[-1] == report.device_clock_note
    for name in DEVICE_FIELDS:
        assert math.isnan(getattr(report, name)), name
    assert report.top_ops == [] and math.isnan(report.op_percent_total)  # they were device times
    # The host's figures stand: the step time is the planted one, the input wait too.
    assert report.step_time_ms == _analyze(tmp_path, "plain", doc).step_time_ms
    assert report.device_clock_note in report.headline()
    assert "device figures left out (device clock)" in report.summary_markdown() and "nan" not in report.headline()


def test_a_kernel_within_the_tolerance_is_not_flagged(tmp_path: Path) -> None:
    doc, _truth = kineto_trace(steps=4, seed=1)
    # The backward's first GEMM starts 60 us after its launch: moved 100 us earlier, 40 us before it.
    report = _analyze(tmp_path, "near", _shifted(doc, -100.0, every=False, name="ampere_sgemm_64x32_nn"))
    assert report.device_clock_ok, report.device_clock_note
    assert report.device_offset_us == pytest.approx(-40.0)


def _pipeline_windows(tmp_path: Path, docs: list[dict[str, Any]]) -> tuple[list[Any], list[str], list[EpochLog]]:
    """Each doc analysed as one window of one fit by the callbacks' pipeline; its reports, warnings, logs."""
    said: list[str] = []
    logged: list[EpochLog] = []
    pipe = WindowPipeline(top_k=3, max_trace_mb=None, keep_last_windows=None, warn=WarnOnce(emit=said.append))
    reports = []
    for epoch, doc in enumerate(docs):
        trace = write_kineto(tmp_path / f"epoch{epoch}.pt.trace.json", doc)
        report = pipe.analyze(epoch, trace, log_dir=tmp_path, session=None, rank=0, world_size=1)
        _scalars, log = pipe.gather(epoch, report, rank=0, world_size=1, gather=None, epoch_steps=None)
        if log is not None:
            logged.append(log)
        reports.append(report)
    return reports, said, logged


def test_a_clock_offset_that_grows_from_window_to_window_is_caught(tmp_path: Path) -> None:
    doc, truth = kineto_trace(steps=4, seed=2)
    step_us = truth.step_time_ms * 1e3
    grown = max(OFFSET_GROWTH_MIN_US, 0.5 * step_us) + 500.0  # past what the check allows
    # The first windows true, then the whole device clock later and later.
    docs = [doc, doc, _shifted(doc, grown / 4), _shifted(doc, grown), _shifted(doc, 2 * grown)]
    reports, said, logged = _pipeline_windows(tmp_path, docs)
    assert [r.device_clock_ok for r in reports] == [True, True, True, False, False]
    offsets = [r.device_offset_us for r in reports]
    assert offsets[3] - offsets[0] == pytest.approx(grown)
    assert "has drifted" in reports[3].device_clock_note
    assert len(said) == 1 and said[0].startswith("fitprof: epoch 3: the device clock of this window has drifted")
    for entry, report in zip(logged, reports, strict=True):
        htod = entry.scalars.get(metrics.HTOD_MS_PER_STEP.key, math.nan)
        assert math.isfinite(htod) == report.device_clock_ok
    # Each window alone is sound: only the fit's first window shows the drift.
    assert _analyze(tmp_path, "alone", docs[4]).device_clock_ok


def test_across_windows_leaves_a_first_window_with_a_wrong_clock_out(tmp_path: Path) -> None:
    doc, _truth = kineto_trace(steps=4, seed=1)
    bad = _analyze(tmp_path, "bad", _shifted(doc, -5_000.0, every=False, name="ampere_sgemm_64x32_nn"))
    later = _analyze(tmp_path, "later", doc)
    assert not bad.device_clock_ok and later.device_clock_ok
    assert across_windows(later, bad) is later  # nothing to compare with
    assert across_windows(later, None) is later


def test_a_wrong_clock_is_one_warning_per_fit_through_the_pipeline(tmp_path: Path) -> None:
    doc, _truth = kineto_trace(steps=4, seed=1)
    bad = _shifted(doc, -5_000.0, every=False, name="ampere_sgemm_64x32_nn")
    reports, said, _logged = _pipeline_windows(tmp_path, [doc, bad, bad])
    assert [r.device_clock_ok for r in reports] == [True, False, False]
    assert said == [f"fitprof: epoch 1: {reports[1].device_clock_note}"]


@pytest.mark.parametrize("name", [n for n in SHARED_KINETO if not n.startswith("cpu_")])
def test_the_real_gpu_traces_pass_the_clock_check(name: str) -> None:
    report = fitprof.analyze(shared_kineto(name))
    assert report.device_clock_ok, report.device_clock_note
    assert all("device clock" not in w for w in report.warnings)
    assert math.isfinite(report.htod_ms_per_step)

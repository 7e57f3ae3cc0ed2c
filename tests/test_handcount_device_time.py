"""The hand count's step time on a GPU (``tests/handcount.py``, the standard library only) against fitprof's, on
planted Kineto traces whose expected step times are worked out by hand from docs/metrics.md ("Step time on a
GPU"): device-bound and host-bound steps, ops of one step overlapping the next step's on another stream, a memset
(no step work), a kernel launched inside fitprof's own span (in no step), steps written out of order, a wrong
device clock (host spans kept) and a trace without step markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fitprof
import handcount
from planted import kx, launched, write_kineto


def _mixed(early_ms: float = 0.0) -> list[dict[str, Any]]:
    """Three 2 ms host steps, step 2 first in the file. Step 1 launches kernels running [0.5, 3.5] and (another
    stream) [1.0, 5.0], cut at step 2's first op (3.0): busy [0.5, 3.0], 2.5 ms, 0.5 over its host span; and a
    memset [0.4, 9.0], which is no step's work. Step 2: a kernel [3.0, 4.0] (1 ms, under its span) and, launched
    inside fitprof's own span [2.5, 2.7], a kernel [4.0, 7.0] that belongs to no step. Step 3: a kernel
    [7.0, 10.0], 1 ms over. ``early_ms``: step 3's kernel starts that long before its launch instead."""
    ev = [
        kx("user_annotation", "ProfilerStep#2", 2.0, 2.0),
        kx("user_annotation", "ProfilerStep#1", 0.0, 2.0),
        kx("user_annotation", "ProfilerStep#3", 4.0, 2.0),
        kx("user_annotation", "fitprof/overhead", 2.5, 0.2),
    ]
    ev += launched("kernel", "k1", 0.5, 3.0, at_ms=0.1, corr=1, tid=7)
    ev += launched("kernel", "k2", 1.0, 4.0, at_ms=0.2, corr=2, tid=8)
    ev += launched("gpu_memset", "Memset (Device)", 0.4, 8.6, at_ms=0.3, corr=3, tid=9)
    ev += launched("kernel", "k3", 3.0, 1.0, at_ms=2.1, corr=4, tid=7)
    ev += launched("kernel", "k_own", 4.0, 3.0, at_ms=2.6, corr=5, tid=10)
    start = 4.1 - early_ms if early_ms else 7.0
    ev += launched("kernel", "k4", start, 3.0, at_ms=4.1, corr=6, tid=7)
    ev.append(kx("cuda_runtime", "cudaDeviceSynchronize", 6.0, 4.1))
    return ev


def _both(path: Path) -> tuple[Any, dict[str, Any]]:
    return fitprof.analyze(path), handcount.count(path)


def test_device_time_by_hand_equals_fitprofs_and_the_worked_example(tmp_path: Path) -> None:
    report, counts = _both(write_kineto(tmp_path / "mixed.pt.trace.json.gz", _mixed()))
    assert counts["device_clock_ok"] and report.device_clock_ok
    assert counts["host_window_us"] == pytest.approx(5800.0)  # 6 ms of steps less fitprof's 0.2 ms
    assert counts["device_excess_us"] == pytest.approx(1500.0)  # step 1: 0.5 ms, step 3: 1.0 ms
    assert counts["window_us"] / 3 / 1e3 == pytest.approx(7.3 / 3, rel=1e-12)
    assert report.step_time_ms == pytest.approx(counts["window_us"] / 3 / 1e3, rel=1e-12)


def test_a_wrong_device_clock_keeps_the_host_spans_in_both(tmp_path: Path) -> None:
    report, counts = _both(write_kineto(tmp_path / "early.pt.trace.json.gz", _mixed(early_ms=1.0)))
    assert not counts["device_clock_ok"] and not report.device_clock_ok
    assert counts["device_excess_us"] == 0.0 and counts["window_us"] == pytest.approx(5800.0)
    assert report.step_time_ms == pytest.approx(counts["window_us"] / 3 / 1e3, rel=1e-12)


@pytest.mark.parametrize(("kernel_ms", "step_ms"), [(4.75, 19.0), (0.5, 3.0)])
def test_device_bound_and_host_bound_steps(tmp_path: Path, kernel_ms: float, step_ms: float) -> None:
    """8 contiguous 3 ms host steps, 4 kernels each run back to back on one stream: 19 ms of device work a step
    (device-bound) or 2 ms (host-bound, the host span stays)."""
    ev: list[dict[str, Any]] = []
    free, corr = 0.0, 0
    for k in range(8):
        ev.append(kx("user_annotation", f"ProfilerStep#{k + 1}", 3.0 * k, 3.0))
        for j in range(4):
            at = 3.0 * k + 0.2 + 0.2 * j
            start = max(at + 0.3, free)
            free, corr = start + kernel_ms, corr + 1
            ev += launched("kernel", "gemm", start, kernel_ms, at_ms=at, corr=corr, tid=8)
    report, counts = _both(write_kineto(tmp_path / "steps.pt.trace.json.gz", ev))
    assert counts["window_us"] / 8 / 1e3 == pytest.approx(step_ms, rel=1e-9)
    assert report.step_time_ms == pytest.approx(counts["window_us"] / 8 / 1e3, rel=1e-12)


def test_without_step_markers_the_window_is_one_step(tmp_path: Path) -> None:
    """No ``ProfilerStep``: the host span of the trace (0-2 ms, the operator and its 1 ms launch call) is the one
    step; its kernel runs 5 ms, so the window lasts 5 ms."""
    ev = [kx("cpu_op", "aten::mm", 0.0, 2.0), *launched("kernel", "gemm", 0.5, 5.0, at_ms=0.1, corr=1, tid=8)]
    report, counts = _both(write_kineto(tmp_path / "nosteps.pt.trace.json.gz", ev))
    assert counts["window_us"] == pytest.approx(5000.0)
    assert report.step_time_ms == pytest.approx(counts["window_us"] / 1e3, rel=1e-12)


@pytest.mark.parametrize("seed", [3, 5])
def test_generated_pageable_heavy_windows_agree(tmp_path: Path, seed: int) -> None:
    """The generator's pageable-heavy windows of these seeds hold a step whose copies keep the device busy longer
    than its host span: the hand count finds that excess and the same step time as fitprof."""
    import gputrace

    doc, _ = gputrace.kineto_trace(seed=seed, pageable_us=(4_000, 6_000), nccl_us=(50, 100), validation_step=None)
    report, counts = _both(gputrace.write_kineto(tmp_path / "t.pt.trace.json", doc))
    assert counts["device_clock_ok"] and counts["device_excess_us"] > 0
    assert report.step_time_ms == pytest.approx(counts["window_us"] / len(counts["steps"]) / 1e3, rel=1e-12)

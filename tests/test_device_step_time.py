"""Step time when the host runs ahead of the device (docs/metrics.md, "Step time on a GPU"): planted Kineto traces
whose host spans and device work are known by construction. Expected values are written by hand from the
documented rule: a step lasts the longer of its host span and the device time of the work it launched (the time
in which at least one of its ops ran, cut at the next step's first device op).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import fitprof
from fitprof.analysis.device_time import device_excess_us
from fitprof.throughput import StepWork, with_throughput
from planted import kx, launched, write_kineto

STEPS = 8
HOST_MS = 3.0
"""Each step's host span: the loop enqueues its kernels and moves on (no synchronisation in the step)."""


def _window(kernel_ms: float) -> list[dict[str, object]]:
    """``STEPS`` contiguous 3 ms host steps, each launching 4 kernels of ``kernel_ms`` at 0.2-0.8 ms into it, run
    back to back on one stream from 0.5 ms on (each kernel starts at its launch plus 0.3 ms, or when the one before
    it ends if that is later), and a ``cudaDeviceSynchronize`` after the last step that waits for the device."""
    events: list[dict[str, object]] = []
    free = 0.0  # when the stream is next idle (ms)
    corr = 0
    for k in range(STEPS):
        t0 = k * HOST_MS
        events.append(kx("user_annotation", f"ProfilerStep#{k + 1}", t0, HOST_MS))
        events.append(kx("cpu_op", "aten::mm", t0 + 0.1, 0.8))
        for j in range(4):
            at = t0 + 0.2 + 0.2 * j
            start = max(at + 0.3, free)
            free = start + kernel_ms
            corr += 1
            events += launched("kernel", "void gemm()", start, kernel_ms, at_ms=at, corr=corr, tid=8)
    end_host = STEPS * HOST_MS
    events.append(kx("cuda_runtime", "cudaDeviceSynchronize", end_host, max(free - end_host, 0.0) + 0.1))
    return events


def test_device_bound_steps_last_as_long_as_their_device_work(tmp_path: Path) -> None:
    """Kernels of 4.75 ms: 19 ms of device work per 3 ms host step; the device runs them back to back from 0.5 ms,
    so each step's device span is 19 ms and the step time is 19 ms, not the host's 3 ms."""
    r = fitprof.analyze(write_kineto(tmp_path / "gpu.pt.trace.json.gz", _window(4.75)))
    assert r.steps_analyzed == STEPS
    assert r.device_clock_ok
    assert r.step_time_ms == pytest.approx(19.0, rel=1e-9)
    # The device never idles from the first kernel on: busy the whole (device-paced) step time.
    assert r.device_busy_percent == pytest.approx(100.0, rel=1e-9)
    # MFU from the device's step time: 12.0946 TFLOP a step in 19 ms on an H200 (989.5 TFLOP/s bfloat16 dense).
    work = StepWork(flops_per_step=12.0946e12, device_name="NVIDIA H200", dtype="bfloat16")
    t = with_throughput(r, work)
    assert t.flops_per_s == pytest.approx(12.0946e12 / 0.019, rel=1e-9)
    assert t.mfu == pytest.approx(12.0946e12 / 0.019 / 989.5e12, rel=1e-3)
    assert math.isfinite(t.mfu) and t.mfu < 1.0


def test_host_bound_steps_keep_their_host_span(tmp_path: Path) -> None:
    """Kernels of 0.5 ms: 2 ms of device work per 3 ms host step, done before the next step launches anything:
    the host is the bottleneck and the step time stays the host span, 3 ms."""
    r = fitprof.analyze(write_kineto(tmp_path / "cpu_bound.pt.trace.json.gz", _window(0.5)))
    assert r.steps_analyzed == STEPS
    assert r.step_time_ms == pytest.approx(HOST_MS, rel=1e-12)


def test_device_excess_cuts_each_step_at_the_next_steps_first_op() -> None:
    """Two 10 us host steps. Step 1's ops run [5, 30] and [20, 50] (the second on another stream, overlapping step
    2's first op at 25): cut at 25, it kept the device busy [5, 25], 20 us, 10 over its host span. Step 2's op runs [25, 32]:
    7 us, under its host span. An op launched before any step belongs to none."""
    excess = device_excess_us(
        step_start=np.array([10.0, 0.0]),
        step_end=np.array([20.0, 10.0]),
        dev_start=np.array([5.0, 20.0, 25.0, 1.0]),
        dev_end=np.array([30.0, 50.0, 32.0, 900.0]),
        dev_launch=np.array([1.0, 2.0, 11.0, -5.0]),
    )
    assert excess == 10.0


def test_device_idle_gaps_do_not_lengthen_a_step() -> None:
    """One 10 us host step whose ops run [0, 1] and [8, 12]: the last ends after the step (launch lag), but the
    device was busy 5 us of it, under the host span: the step keeps its host span."""
    one = np.array([0.0])
    excess = device_excess_us(one, one + 10.0, np.array([0.0, 8.0]), np.array([1.0, 12.0]), np.array([0.0, 7.0]))
    assert excess == 0.0

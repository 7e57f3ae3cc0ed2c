"""The verdict at and just below each threshold, and each exposed-time figure on a planted trace whose hidden and
exposed parts are known by construction. Every expected value here is written by hand from the documented rules
(``fitprof.analysis``'s docstrings, docs/metrics.md), never taken from the code under test.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import fitprof
from fitprof.analysis import (
    COMMUNICATION_BOUND_PERCENT,
    COMPUTE_BOUND_MAX_PERCENT,
    COMPUTE_COVERS_PERCENT,
    HTOD_BOUND_PERCENT,
    INPUT_BOUND_PERCENT,
    verdict_for,
)
from planted import NCCL, NEXT, PINNED, kx, launched, write_kineto

NAN = math.nan


def test_the_thresholds_are_the_documented_ones() -> None:
    """docs/metrics.md and the verdict module: input 20%, HtoD 15%, collectives 20%, compute covers 50%, the 10% floors."""
    assert (INPUT_BOUND_PERCENT, HTOD_BOUND_PERCENT, COMMUNICATION_BOUND_PERCENT) == (20, 15, 20)
    assert (COMPUTE_COVERS_PERCENT, COMPUTE_BOUND_MAX_PERCENT) == (50, 10)


@pytest.mark.parametrize(
    ("inp", "htod", "coll", "busy", "device", "verdict"),
    [
        # input-bound at 20% and above (and at least the HtoD and collective shares)
        (20.0, 0.0, 0.0, 90.0, False, "input-bound"),
        (19.99, 0.0, 0.0, 90.0, False, "balanced"),
        (20.0, 20.0, 0.0, 90.0, False, "input-bound"),  # a tie with HtoD goes to input
        (20.0, 0.0, 20.0, 90.0, False, "input-bound"),  # and with collectives
        (20.0, 20.01, 0.0, 90.0, False, "host-to-device-bound"),
        # host-to-device-bound at 15% and above (and at least the collective share)
        (0.0, 15.0, 0.0, 90.0, True, "host-to-device-bound"),
        (0.0, 14.99, 0.0, 90.0, True, "balanced"),
        (19.99, 15.0, 0.0, 90.0, True, "host-to-device-bound"),  # input below its threshold does not win
        (0.0, 20.0, 20.0, 90.0, True, "host-to-device-bound"),
        (0.0, 19.99, 20.0, 90.0, True, "communication-bound"),
        # communication-bound at 20% and above
        (0.0, 0.0, 20.0, 90.0, True, "communication-bound"),
        (0.0, 0.0, 19.99, 90.0, True, "compute-bound"),
        (5.0, 5.0, 19.99, 30.0, True, "host-bound"),
        # input and HtoD both under the 10% floor: what covers the step decides, at 50%
        (0.0, 0.0, 0.0, 50.0, False, "compute-bound"),
        (0.0, 0.0, 0.0, 49.99, False, "overhead-bound"),
        (0.0, 0.0, 0.0, 50.0, True, "compute-bound"),
        (0.0, 0.0, 0.0, 49.99, True, "host-bound"),
        (0.0, 0.0, 0.0, NAN, False, "compute-bound"),  # an unknown cover never turns compute-bound into another
        # the 10% floors: at 10% input or HtoD the step is no longer judged by its cover
        (10.0, 0.0, 0.0, 90.0, False, "balanced"),
        (9.99, 0.0, 0.0, 90.0, False, "compute-bound"),
        (0.0, 10.0, 0.0, 90.0, True, "balanced"),
        (0.0, 9.99, 0.0, 90.0, True, "compute-bound"),
        (10.0, 0.0, 0.0, 30.0, True, "balanced"),
        (9.99, 9.99, 0.0, 30.0, True, "host-bound"),
    ],
)
def test_verdict_at_and_just_below_each_threshold(
    inp: float, htod: float, coll: float, busy: float, device: bool, verdict: str
) -> None:
    assert verdict_for(inp, htod, 3, coll, busy, device=device) == verdict


def test_no_steps_whatever_the_figures() -> None:
    assert verdict_for(90.0, 90.0, 0, 90.0, 90.0) == "no-steps"


# ---------------------------------------------------------------------------------------- planted traces
def _two_steps_with_copies(copy_ms: float) -> list[dict[str, object]]:
    """Two 100 ms GPU steps; in each, one pinned HtoD copy of ``copy_ms`` and a 60 ms kernel after it, an
    ``aten::mm`` covering the host for 80 ms: HtoD share ``copy_ms`` percent, no input, no collective."""
    events: list[dict[str, object]] = []
    for k, t0 in enumerate((0.0, 100.0)):
        events.append(kx("user_annotation", f"ProfilerStep#{k + 1}", t0, 100))
        events.append(kx("cpu_op", "aten::mm", t0 + 1, 80))
        events += launched("gpu_memcpy", PINNED, t0 + 5, copy_ms, at_ms=t0 + 2, corr=10 * k + 1, bytes=1 << 20)
        events += launched("kernel", "void gemm()", t0 + 30, 60, at_ms=t0 + 3, corr=10 * k + 2, tid=8)
    return events


@pytest.mark.parametrize(("copy_ms", "verdict"), [(15.0, "host-to-device-bound"), (14.9, "balanced")])
def test_planted_trace_at_and_just_below_15_percent_htod(tmp_path: Path, copy_ms: float, verdict: str) -> None:
    r = fitprof.analyze(write_kineto(tmp_path / "htod.pt.trace.json.gz", _two_steps_with_copies(copy_ms)))
    assert r.steps_analyzed == 2
    assert r.step_time_ms == pytest.approx(100.0)
    assert r.htod_ms_per_step == pytest.approx(copy_ms)
    assert r.htod_percent == pytest.approx(copy_ms)
    assert r.input_percent == 0.0 and r.collective_percent == 0.0
    assert r.verdict == verdict


def test_htod_exposed_is_the_copy_time_no_kernel_covers(tmp_path: Path) -> None:
    """One 100 ms step. Copies [10, 30] and [50, 60] (30 ms); a compute kernel at [20, 35] hides 10 ms of the
    first, a collective kernel at [55, 58] 3 ms of the second; a device-to-host copy at [52, 54] hides nothing.
    Exposed: 30 - 13 = 17 ms."""
    events = [
        kx("user_annotation", "ProfilerStep#1", 0, 100),
        *launched("gpu_memcpy", PINNED, 10, 20, at_ms=2, corr=1, bytes=1 << 20),
        *launched("gpu_memcpy", PINNED, 50, 10, at_ms=3, corr=2, bytes=1 << 20),
        *launched("kernel", "void gemm()", 20, 15, at_ms=4, corr=3, tid=8),
        *launched("kernel", NCCL, 55, 3, at_ms=5, corr=4, tid=9),
        *launched("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 52, 2, at_ms=6, corr=5, bytes=1 << 10),
    ]
    r = fitprof.analyze(write_kineto(tmp_path / "htod.pt.trace.json.gz", events))
    assert r.step_time_ms == pytest.approx(100.0)
    assert r.htod_ms_per_step == pytest.approx(30.0)
    assert r.htod_exposed_ms_per_step == pytest.approx(17.0)
    assert r.step_time_if_no_htod_ms == pytest.approx(83.0)
    assert r.speedup_if_no_htod == pytest.approx(100 / 83)
    assert r.verdict == "host-to-device-bound"


def test_device_collective_exposed_is_the_time_no_compute_kernel_covers(tmp_path: Path) -> None:
    """One 100 ms step. An all-reduce kernel at [40, 80] (40 ms); compute kernels at [30, 50] and [70, 75] hide
    10 + 5 ms; a copy at [60, 65] hides nothing (only compute hides communication). Exposed: 25 ms."""
    events = [
        kx("user_annotation", "ProfilerStep#1", 0, 100),
        *launched("kernel", NCCL, 40, 40, at_ms=2, corr=1, tid=9),
        *launched("kernel", "void gemm()", 30, 20, at_ms=3, corr=2, tid=8),
        *launched("kernel", "void sgd()", 70, 5, at_ms=4, corr=3, tid=8),
        *launched("gpu_memcpy", PINNED, 60, 5, at_ms=5, corr=4, bytes=1 << 20),
    ]
    r = fitprof.analyze(write_kineto(tmp_path / "coll.pt.trace.json.gz", events))
    assert r.collective_ms_per_step == pytest.approx(40.0)
    assert r.collective_percent == pytest.approx(40.0)
    assert r.collective_exposed_ms_per_step == pytest.approx(25.0)
    assert r.step_time_if_no_collectives_ms == pytest.approx(75.0)
    assert r.verdict == "communication-bound"


def test_host_collective_exposed_is_the_time_no_other_thread_computes(tmp_path: Path) -> None:
    """One 100 ms CPU step (gloo). ``c10d::allreduce_`` on thread 3 at [20, 60] (40 ms), inside an autograd op on
    its own thread (hides nothing); ``aten::mm`` on the loop thread at [30, 40] hides 10 ms, ``aten::add`` on
    thread 5 at [58, 70] hides 2 ms, ``aten::pin_memory`` on thread 4 at [45, 55] hides nothing (input work).
    Exposed: 40 - 12 = 28 ms."""
    events = [
        kx("user_annotation", "ProfilerStep#1", 0, 100),
        kx("cpu_op", "autograd::engine::evaluate_function", 15, 50, tid=3),
        kx("cpu_op", "c10d::allreduce_", 20, 40, tid=3),
        kx("cpu_op", "aten::mm", 30, 10),
        kx("cpu_op", "aten::pin_memory", 45, 10, tid=4),
        kx("cpu_op", "aten::add", 58, 12, tid=5),
    ]
    r = fitprof.analyze(write_kineto(tmp_path / "gloo.pt.trace.json.gz", events))
    assert r.collective_ms_per_step == pytest.approx(40.0)
    assert r.collective_exposed_ms_per_step == pytest.approx(28.0)
    assert r.step_time_if_no_collectives_ms == pytest.approx(72.0)
    assert r.verdict == "communication-bound"


def test_overlapping_input_spans_are_merged_and_exposed_where_nothing_hides_them(tmp_path: Path) -> None:
    """One 100 ms GPU step. Input spans [0, 30] on the loop thread and [20, 40] on thread 2 overlap: 40 ms of
    input wait, not 50. A kernel at [5, 15] hides 10 ms, ``aten::mul`` on thread 6 at [35, 38] 3 ms;
    ``aten::stack`` nested in the loop thread's wait and ``aten::pin_memory`` on thread 3 hide nothing.
    Exposed: 40 - 13 = 27 ms."""
    events = [
        kx("user_annotation", "ProfilerStep#1", 0, 100),
        kx("user_annotation", NEXT, 0, 30),
        kx("user_annotation", NEXT, 20, 20, tid=2),
        kx("cpu_op", "aten::stack", 22, 4),
        kx("cpu_op", "aten::pin_memory", 30, 5, tid=3),
        kx("cpu_op", "aten::mul", 35, 3, tid=6),
        *launched("kernel", "void gemm()", 5, 10, at_ms=1, corr=1, tid=8),
    ]
    r = fitprof.analyze(write_kineto(tmp_path / "input.pt.trace.json.gz", events))
    assert r.input_ms_per_step == pytest.approx(40.0)
    assert r.input_percent == pytest.approx(40.0)
    assert r.input_exposed_ms_per_step == pytest.approx(27.0)
    assert r.step_time_if_no_input_ms == pytest.approx(73.0)
    assert r.verdict == "input-bound"

"""A Kineto trace read directly and through the ``.xplane.pb`` fitprof converts it to gives one table and one report,
bit for bit: every event's start and duration, and every figure (exposed times included, which subtract
overlapping intervals and so feel every rounding).

Kineto writes absolute microsecond timestamps (~1.7e15 us, integer on the A100 traces) or microseconds from its
``baseTimeNanoseconds`` with nanosecond decimals (the MI250 and CPU traces). float64 holds 0.25 us steps at 1.7e15:
the converter rounded ``ts * 1000`` in float64 (256 ns steps) and the converted reader ``(base + offset) / 1e6``, so
the two reads of the A100 DDP trace differed by 2.2e-5 in exposed HtoD time.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

import fitprof
from fitprof.traces import read_trace
from fitprof.traces.xspace_write import write_xspace

FIXTURES = (
    "a100_ddp8_rank3_dataloader.json.gz",
    "a100_sampled_rank0.json.gz",
    "a100_alexnet_pageable_htod.json.gz",
    "mi250_rocm_minitoy_train.json.gz",
    "cpu_only_rank34.pt.trace.json.gz",
)


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _assert_one_table_one_report(trace: Path, tmp_path: Path) -> None:
    xplane = write_xspace(trace, tmp_path, "s", host="h")
    order = ["ts_us", "dur_us", "name", "tid"]
    direct = read_trace(trace).sort_values(order, kind="stable").reset_index(drop=True)
    converted = read_trace(xplane).sort_values(order, kind="stable").reset_index(drop=True)
    assert len(direct) == len(converted)
    for column in ("ts_us", "dur_us", "launch_us"):
        assert np.array_equal(direct[column].to_numpy(), converted[column].to_numpy(), equal_nan=True), column
    a, b = fitprof.analyze(trace).to_dict(), fitprof.analyze(xplane).to_dict()
    different = {k: (a[k], b[k]) for k in a if k != "source" and not _same(a[k], b[k])}
    assert not different


@pytest.mark.parametrize("name", FIXTURES)
def test_real_traces_read_two_ways_agree_exactly(kineto_fixtures: Path, tmp_path: Path, name: str) -> None:
    _assert_one_table_one_report(kineto_fixtures / name, tmp_path)


def test_absolute_timestamps_with_nanosecond_decimals(tmp_path: Path) -> None:
    """Absolute microseconds with nanosecond decimals (the V100 DDP trace's form): a kernel and an all-reduce
    overlapping by 0.137 us within 0.25 us steps of float64."""
    t0 = 1_661_203_462_598_738.0
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": t0, "dur": 100.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t0 + 1.123,
         "dur": 2.0, "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "sm80_gemm", "pid": 0, "tid": 7, "ts": t0 + 10.456, "dur": 50.321,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t0 + 3.789,
         "dur": 2.0, "args": {"correlation": 8}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 20, "ts": t0 + 60.64,
         "dur": 30.017, "args": {"correlation": 8}},
    ]  # fmt: skip
    path = tmp_path / "abs.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    _assert_one_table_one_report(path, tmp_path)

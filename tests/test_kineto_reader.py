"""The Kineto reader on real traces, checked against figures counted with the standard library alone.

Two sets of real traces: the ones this project ships in ``tests/data/`` (recorded on CPU with fitprof's own
callbacks by ``tests/data/record.py``: a Lightning window, two gloo DDP ranks), always present; and the real GPU
traces of ``../shared/fixtures/kineto/`` (A100, MI250, a CPU-only gloo rank), an extra layer that skips when the
folder is not beside the checkout (and fails under ``FITPROF_REQUIRE_FIXTURES=1``, see ``tests/conftest.py``).

The expected figures come from ``tests/handcount.py``, which reads each trace's JSON with ``json`` + ``gzip`` and
follows the definitions of :func:`fitprof.analysis.analyze_table` event by event, sharing no code with fitprof:
the steps are the host ``ProfilerStep#N`` spans (without any, the host span of the trace is one window and
``steps_analyzed`` is 0); a device event belongs to the step in which the host runtime call with its correlation
id started; input time is the ``enumerate(DataLoader)#...__next__`` time inside steps; collective time is the
union of NCCL kernels launched in the steps (host collectives in the steps when there are no device ones); top
operators are device time grouped by the innermost ``cpu_op`` around the launching runtime call, host self time
on a CPU-only trace. Times are microseconds as in the trace; figures are compared with a relative tolerance of
1e-6. A few of the hand counts are also written out below as plain numbers, and checked against the counts
that ``../shared/fixtures/README.md`` publishes, so the counting script itself is pinned down.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import fitprof
import handcount
from fitprof.traces import (
    Kind,
    TraceError,
    read_trace,
)
from fitprof.traces.kineto import read_kineto
from shared_fixtures import DATA, SHARED_KINETO, SHIPPED_KINETO, kineto_trace, shared_kineto

REL = 1e-6
SHIPPED = [p.name for p in SHIPPED_KINETO]
ALL = SHIPPED + list(SHARED_KINETO)
DEVICE = ["a100_alexnet_pageable_htod.json.gz", "a100_sampled_rank0.json.gz", "a100_ddp8_rank3_dataloader.json.gz",
          "mi250_rocm_minitoy_train.json.gz"]  # fmt: skip


def trace_path(name: str) -> Path:
    """A shipped trace (``tests/data``), or a shared one (skips without ``../shared``)."""
    return DATA / name if name in SHIPPED else shared_kineto(name)


@functools.cache
def counts_of(name: str) -> dict[str, Any]:
    """``tests/handcount.py``'s figures of the trace, once per session."""
    return handcount.count(trace_path(name))


@functools.cache
def table_of(name: str) -> pd.DataFrame:
    """The trace's event table, read once per session (the tests only read it)."""
    return read_kineto(trace_path(name))


@functools.cache
def report_of(name: str) -> fitprof.BottleneckReport:
    """``fitprof.analyze`` of the trace (the public path: file name -> reader -> analysis), once per session."""
    return fitprof.analyze(trace_path(name))


def approx(value: float) -> Any:
    return pytest.approx(value, rel=REL, abs=1e-12, nan_ok=True)


# --------------------------------------------------------------------------------------------- imports


@pytest.mark.slow
def test_import_leaves_torch_out() -> None:
    code = (
        "import sys, fitprof.traces.kineto\n"
        "bad = [m for m in ('torch', 'tensorflow') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------- real traces: table


@pytest.mark.parametrize("name", ALL)
def test_event_table_matches_hand_counts(name: str) -> None:
    exp = counts_of(name)
    path = trace_path(name)
    table = table_of(name)

    assert list(table.columns) == list(fitprof.traces.COLUMNS)
    assert table["ts_us"].is_monotonic_increasing
    assert table.attrs == {
        "format": "kineto",
        "framework": "pytorch",
        "path": str(path),
        "host": "",  # Kineto writes no host name, and these files are not named after one
        "rank": exp["rank"],
        "world_size": exp["world_size"],
        "profile_memory": False,  # recorded without torch's profile_memory: no [memory] events
    }
    assert table["kind"].value_counts().to_dict() == exp["kinds"]
    assert "PyTorch Profiler (0)" not in set(table["name"])  # the profiler's own span is skipped

    steps = table[table["kind"] == Kind.STEP]
    assert sorted(steps["step_num"].astype(int)) == exp["steps"]
    assert list(steps["name"]) == [f"ProfilerStep#{n:.0f}" for n in steps["step_num"]]
    assert not steps["on_device"].any()

    copies = table[table["kind"] == Kind.MEMCPY]
    assert copies["on_device"].all()
    for copy_kind, want in exp["all_copies"].items():
        sel = copies[copies["copy_kind"] == copy_kind]
        assert len(sel) == want["count"], copy_kind
        assert sel["dur_us"].sum() == approx(want["dur_us"]), copy_kind
        got_bytes = sel["bytes"].sum(skipna=False) if len(sel) else 0.0
        assert got_bytes == approx(want["bytes"]), copy_kind  # NaN when a copy does not say

    device_coll = table[(table["kind"] == Kind.COLLECTIVE) & table["on_device"]]
    assert len(device_coll) == exp["all_collective_kernels"]
    assert device_coll["name"].str.contains("nccl", case=False).all()
    kernels = table[table["kind"] == Kind.KERNEL]
    assert kernels["on_device"].all()
    assert not kernels["name"].str.contains("nccl|rccl", case=False).any()
    host_kinds = [Kind.OP, Kind.STEP, Kind.INPUT, Kind.NOT_TRAINING]
    assert not table.loc[table["kind"].isin(host_kinds), "on_device"].any()


@pytest.mark.parametrize("name", DEVICE)
def test_device_events_are_linked_to_their_launch(name: str) -> None:
    table = table_of(name)
    work = table[table["kind"].isin([Kind.KERNEL, Kind.MEMCPY, Kind.COLLECTIVE]) & table["on_device"]]
    assert work["launch_us"].notna().all()  # every kernel and copy of these traces has its runtime call
    assert (work["launch_us"] <= work["ts_us"]).all()  # launched before it ran
    host = table[~table["on_device"]]
    assert host["launch_us"].isna().all()
    assert (host["op"] == "").all()
    # ops are names of host operators, never of annotations or steps
    ops = set(work["op"]) - {""}
    assert ops <= set(table.loc[table["kind"].isin([Kind.OP, Kind.COLLECTIVE]) & ~table["on_device"], "name"])


def test_rocm_trace_details() -> None:
    table = table_of("mi250_rocm_minitoy_train.json.gz")
    mirror = table[table["name"] == "ProfilerStep#1"]
    assert sorted(mirror["kind"]) == [Kind.ANNOTATION, Kind.STEP]
    assert mirror.loc[mirror["kind"] == Kind.ANNOTATION, "on_device"].all()
    copies = table[table["kind"] == Kind.MEMCPY]
    assert list(copies["name"]) == ["Memcpy HtoD (Host -> Device)"] * 2
    assert list(copies["copy_kind"]) == ["htod", "htod"]
    assert copies["bytes"].isna().all()
    assert list(copies["op"]) == ["aten::copy_", "aten::copy_"]
    report = report_of("mi250_rocm_minitoy_train.json.gz")
    assert math.isnan(report.htod_bytes_per_step)  # the trace does not say how many bytes: unknown, not 0
    assert math.isnan(report.htod_gb_per_s)


# --------------------------------------------------------------------------------- real traces: report


@pytest.mark.parametrize("name", ALL)
def test_report_matches_hand_counts(name: str) -> None:
    exp = counts_of(name)
    report = report_of(name)
    n = max(len(exp["steps"]), 1)
    window = exp["window_us"]

    assert report.steps_analyzed == len(exp["steps"])
    assert report.step_time_ms == approx(window / n / 1e3)
    assert report.input_ms_per_step == approx(exp["input_us"] / n / 1e3)
    assert report.input_percent == approx(100 * exp["input_us"] / window)

    htod = [exp["htod_pinned"], exp["htod_pageable"], exp["htod"]]
    htod_us = sum(c["dur_us"] for c in htod)
    assert report.htod_ms_per_step == approx(htod_us / n / 1e3)
    assert report.htod_percent == approx(100 * htod_us / window)
    known = [c for c in htod if c["count"] and not math.isnan(c["bytes"])]
    if any(c["count"] for c in htod) and not known:
        assert math.isnan(report.htod_bytes_per_step) and math.isnan(report.htod_gb_per_s)
    else:
        htod_bytes = sum(c["bytes"] for c in known)
        assert report.htod_bytes_per_step == approx(htod_bytes / n)
        known_us = sum(c["dur_us"] for c in known)
        assert report.htod_gb_per_s == approx(htod_bytes / known_us / 1e3 if known_us else 0.0)
    assert report.htod_pinned_ms_per_step == approx(exp["htod_pinned"]["dur_us"] / n / 1e3)
    assert report.htod_pageable_ms_per_step == approx(exp["htod_pageable"]["dur_us"] / n / 1e3)
    assert report.dtoh_ms_per_step == approx(exp["dtoh"]["dur_us"] / n / 1e3)
    assert report.collective_ms_per_step == approx(exp["collective_us"] / n / 1e3)
    assert report.collective_percent == approx(100 * exp["collective_us"] / window)

    assert report.op_time_source == exp["op_source"]
    assert [op.name for op in report.top_ops] == [name for name, _ in exp["ops"]]
    for op, (_, us) in zip(report.top_ops, exp["ops"], strict=True):
        assert op.self_ms_per_step == approx(us / n / 1e3), op.name
        assert op.percent == approx(100 * us / window), op.name


def test_shared_hand_counts_in_plain_numbers() -> None:
    """The counting script against numbers written out (the published ones from ``../shared/fixtures/README.md``
    and a few more counted once and kept), and fitprof's headline figures on them."""
    alexnet = counts_of("a100_alexnet_pageable_htod.json.gz")
    assert (alexnet["steps"], alexnet["kinds"]["kernel"]) == ([], 79)
    assert alexnet["htod_pageable"] == {"count": 16, "dur_us": 55_503, "bytes": 244_403_360}
    sampled = counts_of("a100_sampled_rank0.json.gz")
    assert sampled["steps"] == [551, 552]
    assert [sampled[k]["count"] for k in ("htod_pageable", "htod_pinned", "dtoh")] == [16, 8, 8]
    assert sampled["dtod_count"] == 8
    assert sampled["kinds"]["kernel"] + sampled["kinds"]["collective"] - 38 == 1_154 - 10  # 28 host collectives
    ddp = counts_of("a100_ddp8_rank3_dataloader.json.gz")
    assert ddp["steps"] == list(range(1009, 1015))
    assert ddp["kinds"]["input"] == 6
    assert [ddp[k]["count"] for k in ("htod_pinned", "dtoh")] == [150, 60]
    assert ddp["dtod_count"] == 18
    assert (ddp["rank"], ddp["world_size"]) == (3, 8)
    assert ddp["input_us"] == 420  # 71 + 67 + 73 + 70 + 68 + 71, one fetch at the start of each step
    assert ddp["collective_kernels"] == 60  # 42 ncclKernel_SendRecv + 18 ncclKernel_AllReduce
    mi250 = counts_of("mi250_rocm_minitoy_train.json.gz")
    assert mi250["steps"] == [1, 2]  # the third ProfilerStep#1 is a gpu_user_annotation mirror, not a step
    assert mi250["htod"]["count"] == 2 and math.isnan(mi250["htod"]["bytes"])
    cpu = counts_of("cpu_only_rank34.pt.trace.json.gz")
    assert cpu["steps"] == [551] and cpu["op_source"] == "host"
    # Two gloo:all_reduce spans (on two gloo threads) start in the step: their union, not their sum
    # (173,209.713 + 170,471.258 us, 164% of the step).
    assert cpu["ops"] == [("gloo:all_reduce", approx(178_777.427))]

    assert report_of("a100_ddp8_rank3_dataloader.json.gz").step_time_ms == approx(77.490833333)
    assert report_of("a100_ddp8_rank3_dataloader.json.gz").htod_pinned_ms_per_step == approx(8.442666667)
    assert report_of("a100_ddp8_rank3_dataloader.json.gz").collective_percent == approx(35.172977449)
    assert report_of("a100_alexnet_pageable_htod.json.gz").steps_analyzed == 0
    assert report_of("a100_alexnet_pageable_htod.json.gz").warnings
    assert report_of("a100_alexnet_pageable_htod.json.gz").htod_gb_per_s == approx(4.403426121)
    cpu_report = report_of("cpu_only_rank34.pt.trace.json.gz")
    assert cpu_report.collective_percent == approx(85.087877752)
    assert cpu_report.verdict == "communication-bound" and "bucket_cap_mb" in cpu_report.advice[0]


def test_shipped_traces_in_plain_numbers() -> None:
    """What ``tests/data/record.py`` recorded (see ``tests/data/README.md``): a 3-step window (steps 6-8) with one
    DataLoader fetch per step, on one process and on two gloo ranks, rank 1 the planted straggler."""
    lightning = counts_of("lightning_cpu.pt.trace.json.gz")
    assert lightning["steps"] == [6, 7, 8]
    assert lightning["kinds"]["input"] == 3
    assert (lightning["rank"], lightning["op_source"]) == (None, "host")
    for rank in (0, 1):
        ddp = counts_of(f"ddp_gloo_rank{rank}.pt.trace.json.gz")
        assert ddp["steps"] == [6, 7, 8]
        assert (ddp["rank"], ddp["world_size"]) == (rank, 2)
        assert ddp["collective_us"] > 0 and ddp["collective_kernels"] == 0  # gloo: host collectives only
    slow, fast = report_of("ddp_gloo_rank1.pt.trace.json.gz"), report_of("ddp_gloo_rank0.pt.trace.json.gz")
    assert slow.input_percent > fast.input_percent + 20
    assert fast.collective_percent > slow.collective_percent


@pytest.mark.parametrize("name", ALL)
def test_annotations_and_steps_are_never_operators(name: str) -> None:
    table = table_of(name)
    not_ops = set(table.loc[table["kind"].isin([Kind.ANNOTATION, Kind.STEP, Kind.INPUT, Kind.NOT_TRAINING]), "name"])
    report = fitprof.analyze_table(table, top_k=50)
    names = {op.name for op in report.top_ops}
    assert not names & not_ops
    assert not any(name.startswith(("ProfilerStep", "enumerate(DataLoader)", "## ")) for name in names)


@pytest.mark.parametrize("name", ["lightning_cpu.pt.trace.json.gz", "cpu_only_rank34.pt.trace.json.gz"])
def test_read_trace_dispatches_here(name: str) -> None:
    path = trace_path(name)
    pd.testing.assert_frame_equal(read_trace(path), read_kineto(path))


# ------------------------------------------------------------------------------------- synthetic traces


def _x(cat: str, name: str, ts: float, dur: float, pid: Any = 7, tid: Any = 7, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _write(path: Path, doc: Any) -> Path:
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


SYNTHETIC = [
    {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x", "ts": 0, "dur": 999},
    {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python"}},
    {"ph": "i", "name": "Record Window End", "pid": "", "tid": "", "ts": 5},
    _x("user_annotation", "ProfilerStep#3", 100.5, 100.0),
    _x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 101, 10.25),
    _x("user_annotation", "fitprof/validation", 190, 10),
    _x("user_annotation", "## forward ##", 112, 60),
    _x("user_annotation", "nccl:all_reduce", 160, 2),
    _x("cpu_op", "aten::linear", 112, 30),
    _x("cpu_op", "aten::addmm", 113, 5),
    _x("cuda_runtime", "cudaLaunchKernel", 115, 3, correlation=1),
    _x("cuda_runtime", "cudaMemcpyAsync", 120, 3, correlation=2),
    _x("cuda_runtime", "cudaLaunchKernel", 150, 1, correlation=3),  # outside every op
    _x("cpu_op", "c10d::allreduce_", 158, 6),
    _x("cpu_op", "record_param_comms", 159, 4),
    _x("cuda_driver", "cuLaunchKernel", 161, 1, correlation=4),
    _x("kernel", "void gemm()", 130, 40, pid=0, tid=7, correlation=1),
    _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 125, 4, pid=0, tid=7, correlation=2, bytes=4096),
    _x("kernel", "void relu()", 171, 2, pid=0, tid=7, correlation=3),
    _x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", 172, 8, pid=0, tid=8, correlation=4),
    _x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 181, 1, pid=0, tid=7, correlation=99, bytes=8),
    _x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 182, 1, pid=0, tid=7, bytes=16),
    _x("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 183, 1, pid=0, tid=7),
    _x("gpu_memcpy", "Memcpy HtoD (Host -> Device)", 184, 1, pid=0, tid=7, kind="HtoD"),
    _x("gpu_memcpy", "Memcpy", 185, 1, pid=0, tid=7, kind="DtoH"),
    _x("gpu_memset", "Memset (Device)", 186, 1, pid=0, tid=7, bytes=8),
    _x("gpu_user_annotation", "ProfilerStep#3", 130, 50, pid=0, tid=7),
    _x("python_function", "train.py(12): step", 100, 120),
    {"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": 130, "cat": "ac2g", "name": "ac2g"},
]


@pytest.mark.parametrize("suffix", [".pt.trace.json", ".pt.trace.json.gz"])
@pytest.mark.parametrize("bare_list", [False, True])
def test_synthetic_trace_classification(tmp_path: Path, suffix: str, bare_list: bool) -> None:
    doc: Any = SYNTHETIC if bare_list else {"traceEvents": SYNTHETIC, "distributedInfo": {"rank": 1}}
    table = read_kineto(_write(tmp_path / f"t{suffix}", doc))
    assert table.attrs["rank"] == (None if bare_list else 1)
    assert table.attrs["world_size"] is None
    assert len(table) == len(SYNTHETIC) - 4  # the Trace span, the metadata, the instant and the flow event
    rows = {(r.name, r.ts_us): r for r in table.itertuples()}

    def row(name: str, ts: float) -> Any:
        return rows[(name, ts)]

    step = row("ProfilerStep#3", 100.5)
    assert (step.kind, step.step_num, step.on_device) == (Kind.STEP, 3.0, False)
    assert step.self_us == 100.0  # only operators lose the time of operators nested in them (make_table)
    assert row("aten::linear", 112).self_us == 30 - 5  # less aten::addmm
    assert row("c10d::allreduce_", 158).self_us == 6 - 4  # less record_param_comms
    mirror = row("ProfilerStep#3", 130)
    assert (mirror.kind, mirror.on_device) == (Kind.ANNOTATION, True)
    assert math.isnan(mirror.step_num)
    assert row("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 101).kind == Kind.INPUT
    assert row("fitprof/validation", 190).kind == Kind.NOT_TRAINING
    assert row("## forward ##", 112).kind == Kind.ANNOTATION
    assert row("nccl:all_reduce", 160).kind == Kind.COLLECTIVE
    assert row("c10d::allreduce_", 158).kind == Kind.COLLECTIVE
    assert row("record_param_comms", 159).kind == Kind.COLLECTIVE
    assert row("aten::addmm", 113).kind == Kind.OP
    assert row("cudaLaunchKernel", 115).kind == Kind.OTHER
    assert row("train.py(12): step", 100).kind == Kind.OTHER
    assert row("train.py(12): step", 100).pid == "7" and row("train.py(12): step", 100).tid == "7"

    gemm = row("void gemm()", 130)
    assert (gemm.kind, gemm.on_device, gemm.op, gemm.launch_us, gemm.pid) == (
        Kind.KERNEL,
        True,
        "aten::addmm",
        115,
        "0",
    )
    htod = row("Memcpy HtoD (Pinned -> Device)", 125)
    assert (htod.kind, htod.copy_kind, htod.bytes, htod.op, htod.launch_us) == (
        Kind.MEMCPY,
        "htod_pinned",
        4096,
        "aten::linear",  # cudaMemcpyAsync at 120-123 lies in aten::linear (112-142), after aten::addmm (113-118)
        120,
    )
    relu = row("void relu()", 171)
    assert (relu.op, relu.launch_us) == ("", 150)  # launched outside any operator
    nccl = row("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", 172)
    assert (nccl.kind, nccl.on_device, nccl.op, nccl.launch_us) == (Kind.COLLECTIVE, True, "record_param_comms", 161)
    orphan = row("Memcpy DtoH (Device -> Pageable)", 181)
    assert (orphan.copy_kind, orphan.op, orphan.bytes) == ("dtoh", "", 8)
    assert math.isnan(orphan.launch_us)  # no runtime event with correlation 99
    assert row("Memcpy HtoD (Pageable -> Device)", 182).copy_kind == "htod_pageable"
    dtod = row("Memcpy DtoD (Device -> Device)", 183)
    assert dtod.copy_kind == "dtod" and math.isnan(dtod.bytes)
    assert row("Memcpy HtoD (Host -> Device)", 184).copy_kind == "htod"
    assert row("Memcpy", 185).copy_kind == "dtoh"  # from args.kind
    memset = row("Memset (Device)", 186)
    assert (memset.kind, memset.on_device, memset.copy_kind) == (Kind.OTHER, True, "")
    assert math.isnan(memset.bytes)


def test_synthetic_trace_report(tmp_path: Path) -> None:
    report = fitprof.analyze(_write(tmp_path / "t.pt.trace.json", {"traceEvents": SYNTHETIC}))
    # The step 100.5-200.5 less the validation 190-200: 90 us; the fetch 101-111.25: 10.25 us. Device events
    # count by launch time, or by their own start without a launch record (181-186): all in the step.
    # HtoD: pinned 4 us (4096 B) + pageable 1 us (16 B) + ROCm-style 1 us (bytes unknown) = 6 us, 4112 B known
    # over 5 us. DtoH: the orphan (181) and the args.kind one (185), 1 us each. Collective: the NCCL kernel, 8 us.
    assert report.steps_analyzed == 1
    assert report.step_time_ms == approx(0.090)
    assert report.input_percent == approx(100 * 10.25 / 90)
    assert report.htod_ms_per_step == approx(0.006)
    assert report.htod_percent == approx(100 * 6 / 90)
    assert report.htod_pinned_ms_per_step == approx(0.004)
    assert report.htod_pageable_ms_per_step == approx(0.001)
    assert report.htod_bytes_per_step == approx(4096 + 16)
    assert report.htod_gb_per_s == approx((4096 + 16) / 5 / 1e3)
    assert report.dtoh_ms_per_step == approx(0.002)
    assert report.collective_ms_per_step == approx(0.008)
    assert report.collective_percent == approx(100 * 8 / 90)
    assert report.op_time_source == "device"
    top = [(op.name, op.self_ms_per_step) for op in report.top_ops[:4]]
    assert top == [
        ("aten::addmm", approx(0.040)),  # void gemm(), launched inside aten::addmm
        ("record_param_comms", approx(0.008)),  # the NCCL kernel
        ("aten::linear", approx(0.004)),  # the pinned copy
        ("void relu()", approx(0.002)),  # launched outside any operator: its own name
    ]


def test_empty_trace_gives_an_empty_table(tmp_path: Path) -> None:
    table = read_kineto(_write(tmp_path / "empty.json", {"traceEvents": []}))
    assert table.empty
    assert list(table.columns) == list(fitprof.traces.COLUMNS)
    assert table.attrs["format"] == "kineto"


def test_float_and_string_pids(tmp_path: Path) -> None:
    events = [
        _x("cpu_op", "aten::linear", 1.5, 10.25, pid="host", tid=3.0),
        _x("cpu_op", "aten::mul", 2.125, 1.0625, pid="host", tid=3.0),
    ]
    table = read_kineto(_write(tmp_path / "f.json", events))
    assert list(table["pid"]) == ["host", "host"]
    assert list(table["tid"]) == ["3.0", "3.0"]
    assert list(table["self_us"]) == [10.25 - 1.0625, 1.0625]


# -------------------------------------------------------------------------------------------- bad input

BAD_FILES: dict[str, tuple[str, bytes, str]] = {
    # case: (file name, content, what the message must say)
    "truncated gzip": ("cut.pt.trace.json.gz", gzip.compress(b'{"traceEvents": []}' * 50)[:30], "gzip"),
    "corrupt gzip": ("bad.json.gz", b"\x1f\x8b\x08\x00" + b"\x00garbage" * 10, "gzip"),
    "invalid json": ("bad.pt.trace.json", b'{"traceEvents": [{"ph": "X",', "JSON"),
    "invalid json in gzip": ("bad2.json.gz", gzip.compress(b"not json at all"), "JSON"),
    "not utf-8": ("latin.json", b'{"traceEvents": [{"name": "\xff\xfe"}]}', "JSON"),
    "object without traceEvents": ("other.json", b'{"name": "a config file"}', "traceEvents"),
    "traceEvents not a list": ("te.json", b'{"traceEvents": {"ph": "X"}}', "traceEvents"),
    "events not objects": ("nums.json", b"[1, 2, 3]", "event 0"),
    "a JSON string": ("str.json", b'"hello"', "not a Chrome trace"),
    "event without ts": ("nots.json", b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a"}]}', "ts"),
    "event with text ts": ("textts.json", b'[{"ph": "X", "name": "a", "ts": "soon", "dur": 1}]', "ts"),
    "empty file": ("empty.pt.trace.json", b"", "JSON"),
    "event with object ts": ("objts.json", b'[{"ph": "X", "name": "a", "ts": {"t": 1}, "dur": 1}]', "ts"),
    "event with list name": ("listname.json", b'[{"ph": "X", "name": ["a"], "ts": 1, "dur": 1}]', "name"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_input_raises_trace_error_naming_the_file(tmp_path: Path, case: str) -> None:
    name, content, what = BAD_FILES[case]
    path = tmp_path / name
    path.write_bytes(content)
    for read in (read_kineto, fitprof.analyze):
        with pytest.raises(TraceError) as info:
            read(path)
        message = str(info.value)
        assert name in message and what in message, message
        assert info.value.__cause__ is None  # one clear error, no raw JSONDecodeError / EOFError chained
        assert type(info.value) is TraceError


def test_missing_file_and_directory(tmp_path: Path) -> None:
    for path, what in [(tmp_path / "nope.pt.trace.json.gz", "no such file"), (tmp_path, "cannot read")]:
        with pytest.raises(TraceError, match=what) as info:
            read_kineto(path)
        assert path.name in str(info.value)
    with pytest.raises(TraceError, match=r"nope\.pt\.trace\.json"):
        fitprof.analyze(tmp_path / "nope.pt.trace.json")


def test_a_handed_over_text_is_read_once_and_only_for_its_unchanged_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window's writer hands the reader the trace's plain text (``_limits.hand_over``): the next read of that
    very file takes it instead of inflating, with the same table; a later read, or a read of a file changed since,
    inflates the file."""
    import os

    from fitprof.traces import _limits

    source = SHIPPED_KINETO[0]
    text = gzip.decompress(source.read_bytes())
    path = tmp_path / source.name
    path.write_bytes(gzip.compress(text, compresslevel=1))
    expected = read_kineto(source)
    inflated: list[Path] = []
    real = _limits._inflate

    def spy(fh: Any, where: Path, *args: Any, **kwargs: Any) -> bytearray:
        inflated.append(where)
        return real(fh, where, *args, **kwargs)

    monkeypatch.setattr(_limits, "_inflate", spy)
    _limits.hand_over(path, bytearray(text))
    pd.testing.assert_frame_equal(read_kineto(path), expected)
    assert inflated == []
    pd.testing.assert_frame_equal(read_kineto(path), expected)  # once only
    assert inflated == [path]

    _limits.hand_over(path, bytearray(b'{"traceEvents": []}'))  # then the file changes: its text is not used
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    pd.testing.assert_frame_equal(read_kineto(path), expected)
    assert inflated == [path, path]
    _limits.hand_over(path, bytearray(b'{"traceEvents": []}'))  # another file's text is dropped, never reused
    read_kineto(source)
    pd.testing.assert_frame_equal(read_kineto(path), expected)
    assert _limits._handed is None


def test_a_handed_over_map_of_the_plain_file_reads_as_the_file_and_leaves_it_unchanged(tmp_path: Path) -> None:
    """A window's writer hands over a copy-on-write map of its plain trace (``_limits.map_copy``), not a copy:
    the event reader (whose chunked decode writes brackets into the text it is given), the reader of names torch
    left unescaped and the ``[memory]`` reader all read it as they read the file itself, the plain file keeps its
    bytes, and the map stays readable once that file is deleted."""
    import mmap

    from fitprof.traces import _limits
    from fitprof.traces.kineto_memory import read_memory_events

    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 10, "dur": 5, "args": {}},
        {"ph": "X", "cat": "user_annotation", "name": 'load "x"', "pid": 1, "tid": 2, "ts": 1, "dur": 20},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 2, "ts": 11, "s": "t",
         "args": {"Bytes": 4096, "Total Allocated": 4096, "Total Reserved": 8192, "Device Type": 0, "Device Id": -1}},
    ]  # fmt: skip
    # the C++ writer's layout, one field a line, the quotes of the annotation's name left unescaped (invalid JSON)
    text = json.dumps({"traceEvents": events}, indent=1).replace('load \\"x\\"', 'load "x"').encode()
    plain, gz = tmp_path / "t.pt.trace.json", tmp_path / "t.pt.trace.json.gz"
    plain.write_bytes(text)
    gz.write_bytes(gzip.compress(text, compresslevel=1))
    expected, expected_memory = read_kineto(gz), read_memory_events(gz)
    assert list(expected["name"]) == ['load "x"', "aten::mm"] and len(expected_memory) == 1

    text_map = _limits.map_copy(plain)
    assert isinstance(text_map, mmap.mmap)
    _limits.hand_over(gz, text_map)
    plain.unlink()  # the window's writer deletes its plain file at once
    pd.testing.assert_frame_equal(read_kineto(gz), expected)
    assert _limits._handed is None  # the map was taken, not the file inflated
    _limits.hand_over(gz, _limits.map_copy(_write_bytes(tmp_path / "again.json", text)))
    pd.testing.assert_frame_equal(read_memory_events(gz), expected_memory)
    assert _limits._handed is None
    assert (tmp_path / "again.json").read_bytes() == text

    big = json.dumps({"traceEvents": [events[0]] * 100_000}).encode()  # several chunks: brackets are written in
    _limits.hand_over(gz, _limits.map_copy(_write_bytes(tmp_path / "big.json", big)))
    gz.write_bytes(gzip.compress(big, compresslevel=1))  # the handed text is for the file as it was: not used
    assert len(read_kineto(gz)) == 100_000
    _limits.hand_over(gz, _limits.map_copy(tmp_path / "big.json"))
    assert len(read_kineto(gz)) == 100_000 and _limits._handed is None
    assert (tmp_path / "big.json").read_bytes() == big


def test_a_trace_written_in_the_background_is_read_from_its_text_while_written_and_else_once_whole(
    tmp_path: Path,
) -> None:
    """The window's trace is compressed in a thread of its own (``_limits.write_in_background``) while the epoch's
    analysis reads the handed-over text: every read while the write runs takes the text without waiting (an
    analysis reads a trace with memory events twice); once written, the text serves one more read of the unchanged
    file, and the owner's ``wait_written`` forgets it. Without a text, a read waits until the file is whole, and so
    does a copy to a remote log dir (``Mirror.sync``)."""
    import os
    import threading

    from fitprof import _fs
    from fitprof.traces import _limits

    source = SHIPPED_KINETO[0]
    text = gzip.decompress(source.read_bytes())
    expected = read_kineto(source)
    mirror = _fs.Mirror(f"file://{tmp_path / 'remote'}", warn=lambda key, message: None)
    path = mirror.local / source.name
    release, order = threading.Event(), []

    def write() -> None:
        release.wait(30)
        order.append("written")
        path.write_bytes(gzip.compress(text, compresslevel=1))

    _limits.write_in_background(path, write)
    _limits.hand_over(path, bytearray(text))
    for _ in range(2):
        pd.testing.assert_frame_equal(read_kineto(path), expected)  # the write is still held
    assert order == [] and not path.exists()
    release.set()
    _limits.wait_all_written()  # joins only: the written file's text is kept for one read
    assert order == ["written"] and _limits._handed is not None and _limits._handed[0] == os.path.abspath(path)
    assert _limits.wait_written(path) is None and _limits._handed is None

    release.clear()
    order.clear()
    _limits.write_in_background(path, write)
    threading.Timer(0.3, lambda: (order.append("released"), release.set())).start()
    pd.testing.assert_frame_equal(read_kineto(path), expected)  # no text: waited for the whole file, inflated it
    assert order == ["released", "written"]
    assert _limits.wait_written(path) is None

    release.clear()
    order.clear()
    _limits.write_in_background(path, write)
    threading.Timer(0.3, lambda: (order.append("released"), release.set())).start()
    assert mirror.sync()
    assert order == ["released", "written"]
    assert (tmp_path / "remote" / source.name).read_bytes() == path.read_bytes()
    assert _limits.wait_written(path) is None
    mirror.close()


def test_a_failed_background_write_is_told_once_to_its_owner_and_its_text_still_reads(tmp_path: Path) -> None:
    """A full disk under the compressing thread: the handed-over text serves every read until the owner's
    ``wait_written``, which returns the error once (the mirror's wait and the reads leave it there); a read
    without a text names the failure, and after the owner's wait the file is simply not there."""
    from fitprof.traces import _limits

    source = SHIPPED_KINETO[0]
    text = gzip.decompress(source.read_bytes())
    expected = read_kineto(source)

    def fail() -> None:
        raise OSError(28, "No space left on device")

    gone = tmp_path / "gone.pt.trace.json.gz"
    _limits.write_in_background(gone, fail)
    _limits.wait_all_written()  # failed before the hand-over: the text is kept all the same
    _limits.hand_over(gone, bytearray(text))
    for _ in range(2):
        pd.testing.assert_frame_equal(read_kineto(gone), expected)
    error = _limits.wait_written(gone)
    assert isinstance(error, OSError) and error.errno == 28
    assert _limits.wait_written(gone) is None
    with pytest.raises(TraceError, match="no such file"):
        read_kineto(gone)

    import threading

    held, both = threading.Event(), threading.Barrier(2)
    told: list[BaseException | None] = []

    def held_then_fail() -> None:
        held.wait(30)
        fail()

    def waiter() -> None:
        both.wait(30)
        told.append(_limits.wait_written(held_path))

    held_path = tmp_path / "held.pt.trace.json.gz"
    _limits.write_in_background(held_path, held_then_fail)
    waiters = [threading.Thread(target=waiter) for _ in range(2)]
    for thread in waiters:
        thread.start()
    threading.Timer(0.3, held.set).start()  # both waiters are waiting by then
    for thread in waiters:
        thread.join(30)
    assert sorted(map(repr, told)) == ["None", "OSError(28, 'No space left on device')"]  # told to one of them

    bare = tmp_path / "bare.pt.trace.json.gz"
    _limits.write_in_background(bare, fail)
    for _ in range(2):
        with pytest.raises(TraceError, match=r"could not be written \(OSError\(28, 'No space left on device'\)\)"):
            read_kineto(bare)
    error = _limits.wait_written(bare)
    assert isinstance(error, OSError) and error.errno == 28


def test_a_text_handed_over_during_a_write_is_not_read_for_the_file_changed_after_it(tmp_path: Path) -> None:
    """Once the background write has ended, its text is that of a written file: a file changed since (another
    write, a user's copy) is read as it is now."""
    from fitprof.traces import _limits

    path = tmp_path / "t.pt.trace.json.gz"
    old = json.dumps({"traceEvents": []}).encode()
    new = json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]})
    _limits.write_in_background(path, lambda: path.write_bytes(gzip.compress(old)))
    _limits.hand_over(path, bytearray(old))
    _limits.wait_all_written()
    path.write_bytes(gzip.compress(new.encode()))
    assert list(read_kineto(path)["name"]) == ["aten::mm"]
    assert _limits.wait_written(path) is None


def test_a_background_write_whose_thread_cannot_start_raises_and_leaves_nothing_to_wait_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No thread left (a process at its limit): the export's caller gets the error at once, and no later read
    or wait of the file waits for a write that never ran."""
    import threading

    from fitprof.traces import _limits

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    path = tmp_path / "t.pt.trace.json.gz"
    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        _limits.write_in_background(path, lambda: None)
    monkeypatch.undo()
    assert _limits.wait_written(path) is None
    _limits.wait_all_written()
    with pytest.raises(TraceError, match="no such file"):
        read_kineto(path)


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", [p.name for p in SHIPPED_KINETO] + list(SHARED_KINETO))
def test_self_times_from_the_readers_thread_codes_are_those_of_the_string_columns(name: str) -> None:
    """The reader hands its own thread codes to the self-time pass (``table_from_columns(..., threads)``): the
    same self times, bit for bit, as coding the table's ``pid`` and ``tid`` strings."""
    from fitprof.traces import _table

    table = read_kineto(kineto_trace(name))
    assert table["self_us"].to_numpy().tobytes() == _table._self_times(table).tobytes()


def test_thread_codes_follow_the_strings_not_the_raw_ids(tmp_path: Path) -> None:
    """A trace that writes one thread's id as a number in some events and as a string in others (``5`` and
    ``"5"``, which the table writes alike): its operators nest as one thread's, as the table's strings say."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 5, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": "1", "tid": "5", "ts": 10, "dur": 30},
        {"ph": "X", "cat": "cpu_op", "name": "other", "pid": 1, "tid": 6, "ts": 20, "dur": 50},
    ]
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    table = read_kineto(path)
    assert dict(zip(table["name"], table["self_us"], strict=True)) == {"outer": 70.0, "inner": 30.0, "other": 50.0}

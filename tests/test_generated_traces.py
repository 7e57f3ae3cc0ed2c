"""fitprof's figures on GPU-shaped traces whose every figure is known by construction (``tests/gputrace.py``).

The generator shares no code with fitprof: it writes the Kineto JSON and the XSpace protobuf bytes itself and
sums each figure while planting the events. So these tests cover, on every machine and without a GPU, what only
GPU traces hold: pinned and pageable HtoD copies with their bytes, DtoH, NCCL kernels, device time attributed to
the launching operator (Kineto: through correlation ids; XSpace: the ``tf_op`` stat), work launched in a step
that runs after it, validation inside a step, and (XSpace) the device plane's ``MemcpyH2D`` events.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import fitprof
import gputrace
import handcount
from fitprof.cli import main

REL = 1e-9


def approx(value: float) -> Any:
    return pytest.approx(value, rel=REL, abs=1e-12)


def check(report: fitprof.BottleneckReport, truth: gputrace.Truth) -> None:
    """Every figure of ``report`` against the generator's."""
    assert report.steps_analyzed == truth.steps
    assert report.step_time_ms == approx(truth.step_time_ms)
    assert report.input_ms_per_step == approx(truth.input_ms_per_step)
    assert report.input_percent == approx(truth.percent(truth.input_ms_per_step))
    assert report.htod_pinned_ms_per_step == approx(truth.htod_pinned_ms_per_step)
    assert report.htod_pageable_ms_per_step == approx(truth.htod_pageable_ms_per_step)
    assert report.htod_ms_per_step == approx(truth.htod_ms_per_step)
    assert report.htod_percent == approx(truth.percent(truth.htod_ms_per_step))
    assert report.htod_bytes_per_step == approx(truth.htod_bytes_per_step)
    htod_us = truth.htod_ms_per_step * 1e3
    assert report.htod_gb_per_s == approx(truth.htod_bytes_per_step / htod_us / 1e3)  # bytes per ns = GB/s
    assert report.dtoh_ms_per_step == approx(truth.dtoh_ms_per_step)
    assert report.collective_ms_per_step == approx(truth.collective_ms_per_step)
    assert report.collective_percent == approx(truth.percent(truth.collective_ms_per_step))
    assert report.op_time_source == "device"
    ranked = sorted(truth.device_ms_per_step.items(), key=lambda kv: -kv[1])
    assert [(op.name, op.self_ms_per_step) for op in report.top_ops] == [(n, approx(ms)) for n, ms in ranked[:20]]
    for op in report.top_ops:
        assert op.percent == approx(truth.percent(op.self_ms_per_step))


# ------------------------------------------------------------------------------------------------- Kineto


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("suffix", [".pt.trace.json", ".pt.trace.json.gz"])
def test_kineto_gpu_trace(tmp_path: Path, seed: int, suffix: str) -> None:
    doc, truth = gputrace.kineto_trace(seed=seed, steps=3 + seed)
    path = gputrace.write_kineto(tmp_path / f"rank0{suffix}", doc)
    report = fitprof.analyze(path, top_k=20)
    check(report, truth)
    assert (report.rank, report.world_size) == (truth.rank, truth.world_size) == (0, 8)
    table = fitprof.read_trace(path)
    assert sorted(table.loc[table["kind"] == "step", "step_num"].astype(int)) == truth.step_nums


def test_kineto_generator_agrees_with_the_hand_count(tmp_path: Path) -> None:
    """Two independent accounts of the same trace: the generator's sums and ``tests/handcount.py``'s walk of the
    JSON. Their agreement checks the generator and the hand count, neither of which is fitprof."""
    doc, truth = gputrace.kineto_trace(seed=5, steps=5)
    counts = handcount.count(gputrace.write_kineto(tmp_path / "t.pt.trace.json", doc), top_k=20)
    n = truth.steps
    assert counts["steps"] == truth.step_nums
    assert counts["window_us"] / n / 1e3 == approx(truth.step_time_ms)
    assert counts["input_us"] / n / 1e3 == approx(truth.input_ms_per_step)
    assert counts["htod_pinned"]["dur_us"] / n / 1e3 == approx(truth.htod_pinned_ms_per_step)
    assert counts["htod_pageable"]["dur_us"] / n / 1e3 == approx(truth.htod_pageable_ms_per_step)
    both = counts["htod_pinned"]["bytes"] + counts["htod_pageable"]["bytes"]
    assert both / n == approx(truth.htod_bytes_per_step)
    assert counts["collective_us"] / n / 1e3 == approx(truth.collective_ms_per_step)
    assert {k: v / n / 1e3 for k, v in counts["ops"]} == {k: approx(v) for k, v in truth.device_ms_per_step.items()}


def test_kineto_pageable_heavy_trace_is_host_to_device_bound(tmp_path: Path) -> None:
    # idle room after each step's work so that its 4-6 ms pageable copy ends inside the step: the step stays
    # host-paced, and the generator's truth (host spans) is its step time
    doc, truth = gputrace.kineto_trace(
        seed=3, pageable_us=(4_000, 6_000), nccl_us=(50, 100), validation_step=None, slack_us=(7_000, 8_000)
    )
    report = fitprof.analyze(gputrace.write_kineto(tmp_path / "t.pt.trace.json", doc), top_k=20)
    check(report, truth)
    assert truth.percent(truth.htod_ms_per_step) >= 15  # the construction worked
    assert report.verdict == "host-to-device-bound"
    assert "pin_memory=True" in report.advice[0]  # most of the copy time is pageable


def test_kineto_nccl_heavy_trace_is_communication_bound(tmp_path: Path) -> None:
    doc, truth = gputrace.kineto_trace(seed=4, nccl_us=(5_000, 8_000))
    report = fitprof.analyze(gputrace.write_kineto(tmp_path / "t.pt.trace.json", doc), top_k=20)
    check(report, truth)
    assert truth.percent(truth.collective_ms_per_step) >= 20 > truth.percent(truth.input_ms_per_step)
    assert report.verdict == "communication-bound"
    assert report.top_ops[0].name == "record_param_comms"


def test_cli_analyze_generated_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fitprof analyze`` over two generated ranks of one world: the same figures, and the spread line."""
    paths, truths = [], []
    for rank in (0, 1):
        doc, truth = gputrace.kineto_trace(seed=10 + rank, rank=rank, world_size=2)
        paths.append(gputrace.write_kineto(tmp_path / f"rank{rank}.pt.trace.json.gz", doc))
        truths.append(truth)
    assert main(["analyze", *map(os.fspath, paths), "--format", "json", "--top-k", "20"]) == 0
    records = json.loads(capsys.readouterr().out)
    traces = [r for r in records if r["record"] == "trace"]
    assert [r["rank"] for r in traces] == [0, 1]
    for rec, truth in zip(traces, truths, strict=True):
        assert rec["step_time_ms"] == approx(truth.step_time_ms)
        assert rec["htod_ms_per_step"] == approx(truth.htod_ms_per_step)
        assert rec["collective_percent"] == approx(truth.percent(truth.collective_ms_per_step))
    (spread,) = [r for r in records if r["record"] == "spread"]
    steps = [t.step_time_ms for t in truths]
    assert spread["step_time_ms_spread"] == approx(max(steps) - min(steps))
    assert spread["slowest_rank"] == steps.index(max(steps))


# ------------------------------------------------------------------------------------------------- XSpace


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_xspace_gpu_trace(tmp_path: Path, seed: int, capsys: pytest.CaptureFixture[str]) -> None:
    """The XSpace device-plane path: ``MemcpyH2D`` copies pinned and pageable (``memcpy_details``), NCCL kernels,
    device time by ``tf_op``; the derived ``TensorFlow Ops`` line is not counted twice."""
    data, truth = gputrace.xspace_trace(seed=seed, steps=3 + seed)
    path = tmp_path / "plugins" / "profile" / "s1" / "gpuhost.xplane.pb"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    report = fitprof.analyze(path, top_k=20)
    check(report, truth)
    table = fitprof.read_trace(path)
    assert sorted(table.loc[table["kind"] == "step", "step_num"].astype(int)) == truth.step_nums
    device = table[table["on_device"]]
    assert set(device["tid"]) == {"Stream #13(MemcpyH2D)", "Stream #7(Compute)", "Stream #20(Nccl)", "Stream #21(Nccl)"}

    # the same through `fitprof analyze` on the session folder
    assert main(["analyze", os.fspath(path.parent), "--format", "json"]) == 0
    (rec,) = json.loads(capsys.readouterr().out)
    assert (rec["framework"], rec["steps_analyzed"]) == ("tensorflow", truth.steps)
    assert rec["htod_pinned_ms_per_step"] == approx(truth.htod_pinned_ms_per_step)
    assert rec["collective_ms_per_step"] == approx(truth.collective_ms_per_step)


def test_xspace_generator_bytes_parse_with_tensorflows_own_classes() -> None:
    """The hand-written wire format is what tsl's ``xplane.proto`` reads (where TensorFlow is installed)."""
    xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
    data, truth = gputrace.xspace_trace(seed=0, steps=3)
    space = xplane_pb2.XSpace.FromString(data)
    assert [p.name for p in space.planes] == ["/host:CPU", "/device:GPU:0", "Task Environment"]
    assert list(space.hostnames) == ["gpuhost"]
    cpu, gpu, _ = space.planes
    stat_names = {k: v.name for k, v in cpu.stat_metadata.items()}
    event_names = {k: v.name for k, v in cpu.event_metadata.items()}
    markers = [e for line in cpu.lines for e in line.events if event_names[e.metadata_id] == "train"]
    assert [{stat_names[s.metadata_id]: s.int64_value for s in e.stats} for e in markers] == [
        {"step_num": n, "_r": 1} for n in truth.step_nums
    ]
    gpu_events = {k: v.name for k, v in gpu.event_metadata.items()}
    h2d = [e for line in gpu.lines if line.name.startswith("Stream") for e in line.events
           if gpu_events[e.metadata_id] == "MemcpyH2D"]  # fmt: skip
    assert len(h2d) == 2 * truth.steps + 2  # two per step, one before and one after the steps


def test_xspace_generator_agrees_with_the_hand_count(tmp_path: Path) -> None:
    """The generator's sums against ``tests/handcount.py``'s byte-level read of the same XSpace."""
    data, truth = gputrace.xspace_trace(seed=7, steps=5)
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(data)
    counts = handcount.count_xspace(path)
    assert counts["steps"] == truth.step_nums
    assert counts["window_us"] / truth.steps / 1e3 == approx(truth.step_time_ms)
    assert counts["input_us"] / truth.steps / 1e3 == approx(truth.input_ms_per_step)
    assert counts["ops"] == {"sequential/dense/MatMul", "sequential/dense/Relu"}
    assert counts["device_events"] == 2 + 8 * truth.steps + 1  # warm-up, 8 per step, one after

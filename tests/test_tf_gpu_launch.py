"""TensorFlow / JAX on a GPU: device events of an XSpace count in the step that launched them, linked by the
``correlation_id`` their host API call on ``/host:CUPTI`` carries (as the GPU tracer writes them), not by where
their device start falls. A GPU running behind the host otherwise moves copies and kernels into the next step, or
out of the window.

The XSpace is planted with ``tests/gputrace.py``'s protobuf writer (no fitprof code): three 10 ms steps; the last
step launches a 2 ms HtoD copy and a 4 ms kernel that run after the window's end; a warm-up kernel launched before
the first step runs inside it; every step launches one kernel that runs 8-14 ms after its start.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fitprof
from fitprof.traces import read_trace
from gputrace import XSPACE_HOSTNAMES, XSPACE_PLANES, PlaneBuilder, _str, field_bytes, memcpy_details

MS = 1_000_000_000  # picoseconds
STEP = 10 * MS
STEPS = 3


def _xspace(tmp_path: Path, *, link: bool = True) -> Path:
    cpu, cupti = PlaneBuilder(1, "/host:CPU"), PlaneBuilder(2, "/host:CUPTI")
    gpu, env = PlaneBuilder(3, "/device:GPU:0"), PlaneBuilder(4, "Task Environment")
    base_ns = 5_000_000
    python = cpu.line(1, "python3", base_ns)
    compute_line = cpu.line(2, "tf_Compute", base_ns)
    api = cupti.line(7, "1234", base_ns)
    h2d = gpu.line(13, "Stream #13(MemcpyH2D)", base_ns)
    stream = gpu.line(7, "Stream #7(Compute)", base_ns)
    corr = [100]

    def launch(at: int, line: list[bytes], name: str, start: int, dur: int, **stats: int | str) -> None:
        corr[0] += 1
        ids = {"correlation_id": corr[0]} if link else {}
        cupti.event(api, "cuLaunchKernel" if "Memcpy" not in name else "cuMemcpyHtoDAsync_v2", at, MS // 100, **ids)
        gpu.event(line, name, start, dur, **ids, **stats)

    t0 = 2 * MS
    launch(MS, stream, "warmup_kernel", t0 + MS, 3 * MS, tf_op="warmup:MatMul")  # launched before step 1
    for n in range(STEPS):
        t = t0 + n * STEP
        cpu.event(python, "train", t, STEP, step_num=n + 1, _r=1)
        cpu.event(compute_line, "model/dense/MatMul:MatMul", t + MS // 10, MS)
        launch(t + MS // 5, stream, "sgemm_kernel", t + 8 * MS, 6 * MS, tf_op="model/dense/MatMul:MatMul")
    last = t0 + (STEPS - 1) * STEP
    launch(
        last + MS // 2,
        h2d,
        "MemcpyH2D",
        last + 14 * MS,
        2 * MS,
        memcpy_details=memcpy_details("pinned", "device", 1 << 20),
    )
    launch(last + MS // 2, stream, "late_kernel", last + 16 * MS, 4 * MS, tf_op="model/dense/BiasAdd:BiasAdd")
    space = b"".join(field_bytes(XSPACE_PLANES, p.encode()) for p in (cpu, cupti, gpu, env))
    path = tmp_path / ("linked.xplane.pb" if link else "unlinked.xplane.pb")
    path.write_bytes(space + _str(XSPACE_HOSTNAMES, "gpuhost"))
    return path


def test_device_events_carry_the_start_of_the_call_that_launched_them(tmp_path: Path) -> None:
    table = read_trace(_xspace(tmp_path))
    device = table[table["on_device"]].sort_values("ts_us")
    calls = table[table["pid"] == "/host:CUPTI"].sort_values("ts_us")
    assert len(device) == len(calls) == STEPS + 3
    # Launched in order, each device event's launch is its call's start (here calls and activities pair in order).
    assert np.array_equal(np.sort(device["launch_us"].to_numpy()), calls["ts_us"].to_numpy())
    assert (device["launch_us"] < device["ts_us"]).all()


def test_a_lagging_gpu_counts_its_work_in_the_launching_step(tmp_path: Path) -> None:
    report = fitprof.analyze(_xspace(tmp_path))
    # Steps 1-2 keep their 10 ms host spans (6 ms of device work each). The last step launched 12 ms of device
    # work (its 6 ms GEMM, the 2 ms copy, the 4 ms late kernel, one after another): the device outlasts its host
    # span, so it lasts 12 ms (docs/metrics.md, "Step time on a GPU").
    assert report.steps_analyzed == STEPS and report.step_time_ms == pytest.approx((10.0 + 10.0 + 12.0) / STEPS)
    # The last step's copy runs after the window's end: still its step's copy.
    assert report.htod_ms_per_step == pytest.approx(2.0 / STEPS)
    # Device time by launching op: three 6 ms GEMMs and the late 4 ms kernel, not the warm-up kernel.
    ops = {op.name: op.self_ms_per_step for op in report.top_ops}
    assert ops["model/dense/MatMul"] == pytest.approx(6.0)
    assert ops["model/dense/BiasAdd"] == pytest.approx(4.0 / STEPS)
    assert "warmup" not in ops


def test_without_links_the_device_start_decides_as_before(tmp_path: Path) -> None:
    """An XSpace whose events carry no correlation ids: nothing to link, each device event counts where it
    started (the copy and the late kernel after the window count nowhere, the warm-up kernel in step 1)."""
    table = read_trace(_xspace(tmp_path, link=False))
    assert table.loc[table["on_device"], "launch_us"].isna().all()
    report = fitprof.analyze(_xspace(tmp_path, link=False))
    assert report.htod_ms_per_step == 0.0
    assert "warmup" in {op.name for op in report.top_ops}

"""Verdicts judged on the exposed share of collectives and host-to-device copies, both shares reported.

DDP overlaps its gradient all-reduce with the backward pass by design, and a copy running beside a kernel costs
the step nothing: only the part no compute ran beside (the exposed part) can make a step slow. Checked on

* the real A100 DDP trace (``../shared/fixtures/kineto``): collectives 35.2% of the step, exposed 18.9% by a hand
  count written here from the raw JSON (NCCL kernels launched in the steps, less the time a compute kernel ran);
  HtoD exposed 2.67 of 8.44 ms per step;
* planted Kineto traces whose shares are known by construction, one of them shaped like the V100 DDP trace of the
  issue (device busy 96%, collectives 33.8% of the step, 9.9% exposed): compute-bound, not communication-bound.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import fitprof
import handcount
from fitprof import metrics

STEP_US = 10_000


def _planted(
    tmp_path: Path,
    *,
    compute: Sequence[tuple[int, int]],
    nccl: Sequence[tuple[int, int]] = (),
    copies: Sequence[tuple[int, int]] = (),
    steps: int = 3,
) -> Path:
    """A Kineto trace of ``steps`` steps of :data:`STEP_US`, each launching at its start the kernels
    ``(start, end)`` (us from the step's start) on the compute stream, NCCL kernels on another and pinned HtoD
    copies on a third."""
    host, dev = 100, 0
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": dev, "tid": 0, "args": {"name": "CUDA GPU 0"}},
    ]
    corr = [0]

    def launch(at: float, cat: str, name: str, start: float, end: float, stream: int, **args: Any) -> None:
        corr[0] += 1
        runtime = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
        events.append({"ph": "X", "cat": "cuda_runtime", "name": runtime, "pid": host, "tid": host, "ts": at,
                       "dur": 2, "args": {"correlation": corr[0]}})  # fmt: skip
        events.append({"ph": "X", "cat": cat, "name": name, "pid": dev, "tid": stream, "ts": start,
                       "dur": end - start, "args": {"correlation": corr[0], **args}})  # fmt: skip

    for n in range(steps):
        t0 = 1_000_000 + n * STEP_US
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n + 1}", "pid": host,
                       "tid": host, "ts": t0, "dur": STEP_US, "args": {}})  # fmt: skip
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": host, "tid": host, "ts": t0 + 1,
                       "dur": 50, "args": {}})  # fmt: skip
        for i, (a, b) in enumerate(compute):
            launch(t0 + 2 + i, "kernel", "sm80_xmma_gemm_f32f32", t0 + a, t0 + b, 7)
        for i, (a, b) in enumerate(nccl):
            launch(t0 + 20 + i, "kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0 + a, t0 + b, 20)
        for i, (a, b) in enumerate(copies):
            launch(t0 + 40 + i, "gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", t0 + a, t0 + b, 13, bytes=1 << 20)
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
           "traceEvents": events}  # fmt: skip
    path = tmp_path / "planted.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def test_v100_shaped_ddp_is_compute_bound_with_both_collective_shares(tmp_path: Path) -> None:
    # Busy 96%: compute 0-8610 us, the all-reduce 6220-9600 us (33.8% of the step), 990 us of it alone (9.9%).
    report = fitprof.analyze(_planted(tmp_path, compute=[(0, 8610)], nccl=[(6220, 9600)]))
    assert report.device_busy_percent == pytest.approx(96.0)
    assert report.collective_percent == pytest.approx(33.8)
    assert report.collective_exposed_percent == pytest.approx(9.9)
    assert report.verdict == "compute-bound"
    assert "collectives 33.8% of step time, 9.9% not hidden behind compute" in report.headline()
    scalars = report.scalars()
    assert scalars[metrics.COLLECTIVE_EXPOSED_PERCENT.key] == pytest.approx(9.9)
    assert scalars[metrics.COLLECTIVE_PERCENT.key] == pytest.approx(33.8)


def test_exposed_collectives_still_make_a_step_communication_bound(tmp_path: Path) -> None:
    # The all-reduce after the backward pass, overlapping nothing: 30% of the step, all of it exposed.
    report = fitprof.analyze(_planted(tmp_path, compute=[(0, 6000)], nccl=[(6000, 9000)]))
    assert report.collective_percent == pytest.approx(30.0) == report.collective_exposed_percent
    assert report.verdict == "communication-bound"
    assert "collective communication took 30.0% of step time." in report.headline()
    # Half hidden: 30% of the step, 15% exposed: no longer the bottleneck.
    half = fitprof.analyze(_planted(tmp_path, compute=[(0, 7500)], nccl=[(6000, 9000)]))
    assert (half.collective_percent, half.collective_exposed_percent) == (pytest.approx(30.0), pytest.approx(15.0))
    assert half.verdict != "communication-bound"


def test_htod_verdict_rests_on_the_exposed_copies(tmp_path: Path) -> None:
    # 20% of the step in copies, all beside a kernel: nothing to gain from overlapping them.
    hidden = fitprof.analyze(_planted(tmp_path, compute=[(0, 9000)], copies=[(1000, 3000)]))
    assert (hidden.htod_percent, hidden.htod_exposed_percent) == (pytest.approx(20.0), 0.0)
    assert hidden.verdict == "compute-bound"
    assert "host-to-device copies 20.0% of step time, 0.0% not hidden behind compute" in hidden.headline()
    assert hidden.scalars()[metrics.HTOD_EXPOSED_PERCENT.key] == 0.0
    # The same copies before the kernels start: all exposed.
    exposed = fitprof.analyze(_planted(tmp_path, compute=[(2000, 9000)], copies=[(0, 2000)]))
    assert exposed.htod_exposed_percent == pytest.approx(20.0)
    assert exposed.verdict == "host-to-device-bound"


def _exposed_by_hand(path: Path) -> tuple[float, float, float]:
    """(step time, exposed NCCL time, exposed HtoD time), us summed over the steps, from the raw JSON: device events
    launched in the steps (by their runtime call's correlation), NCCL kernels' union less compute kernels' union,
    HtoD copies' union less every kernel's."""
    _meta, events = handcount.load_events(path)
    steps = handcount.union((e["ts"], e["ts"] + e["dur"]) for e in events if handcount.STEP.fullmatch(e["name"]))
    launched = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in handcount.RUNTIME_CATS and e.get("args", {}).get("correlation")
    }
    mine = [
        e
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy")
        and handcount.inside(launched.get(e.get("args", {}).get("correlation"), e["ts"]), steps)
    ]
    span = [(e["ts"], e["ts"] + e["dur"]) for e in mine]
    nccl = handcount.union(s for s, e in zip(span, mine, strict=True) if "nccl" in e["name"].lower())
    kernels = [s for s, e in zip(span, mine, strict=True) if e["cat"] == "kernel"]
    compute = handcount.union(
        s for s, e in zip(span, mine, strict=True) if e["cat"] == "kernel" and "nccl" not in e["name"].lower()
    )
    htod = handcount.union(s for s, e in zip(span, mine, strict=True) if "HtoD" in e["name"])
    nccl_exposed = handcount.length(handcount.subtract(nccl, compute))
    htod_exposed = handcount.length(handcount.subtract(htod, handcount.union(kernels)))
    return handcount.length(steps), nccl_exposed, htod_exposed


def test_a100_ddp_fixture_is_judged_on_what_overlap_leaves(kineto_fixtures: Path) -> None:
    path = kineto_fixtures / "a100_ddp8_rank3_dataloader.json.gz"
    report = fitprof.analyze(path)
    window_us, nccl_us, htod_us = _exposed_by_hand(path)
    n = report.steps_analyzed
    assert report.step_time_ms == pytest.approx(window_us / n / 1e3, rel=1e-9)
    assert report.collective_exposed_ms_per_step == pytest.approx(nccl_us / n / 1e3, rel=1e-6)
    assert report.collective_exposed_percent == pytest.approx(100 * nccl_us / window_us, rel=1e-6)
    assert report.htod_exposed_ms_per_step == pytest.approx(htod_us / n / 1e3, rel=1e-6)
    assert report.htod_exposed_percent == pytest.approx(100 * htod_us / window_us, rel=1e-6)
    # The figures in plain numbers: 35.2% of the step is collectives, 18.9% exposed; HtoD 8.44 ms, 2.67 exposed.
    assert report.collective_percent == pytest.approx(35.172977449)
    assert report.collective_exposed_percent == pytest.approx(18.91, abs=0.01)
    assert report.htod_pinned_ms_per_step == pytest.approx(8.442666667)
    assert report.htod_exposed_ms_per_step == pytest.approx(2.668, abs=0.001)
    assert report.verdict == "compute-bound"
    assert "collectives 35.2% of step time, 18.9% not hidden behind compute" in report.headline()
    summary = report.summary_markdown()
    assert "collectives 35.2% of step time, 18.9% not hidden behind compute" in summary
    assert "(10.9% of step time, 3.4% not hidden behind compute)" in summary

"""Helpers for the tests that read one PyTorch window two ways (its Kineto trace and the ``.xplane.pb`` fitprof
converted from it) and through xprof's own pages.

``gpu_shaped_trace`` builds a small Kineto trace with the shape of a real CUDA one (host ``cpu_op``\\ s launching
device work through ``cuda_runtime`` calls with a ``correlation`` id, copies and kernels on a stream row): every
span is serial, so each figure has one right value, which the docstring gives.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from fitprof import BottleneckReport

GPU_STEPS = 5
GPU_STEP_US = 10_000.0
"""Per step of :func:`gpu_shaped_trace` (microseconds): DataLoader 2,500; HtoD copy 1,000 (4 MiB, pinned);
``aten::addmm`` kernel 4,000; ``aten::relu`` kernel 500; NCCL all-reduce kernel 1,000 (launched by
``record_param_comms``); Kineto's device-side ``ProfilerStep#N`` annotation over the device work. So: step 10 ms,
input 25%, HtoD 10%, collectives 10%, device compute (kernels that are not copies or collectives) 4.5 ms, verdict
input-bound."""
GPU_HOST = "gpuhost"
GPU_TRACE_NAME = f"{GPU_HOST}_rank1.2026_01_01_00_00_00_epoch0.pt.trace.json"
"""fitprof's own trace name (host ``gpuhost``, global rank 1)."""


def gpu_shaped_trace() -> dict[str, Any]:
    """A Kineto trace of :data:`GPU_STEPS` steps, rank 1 of 2 (see :data:`GPU_STEP_US` for what each holds)."""
    host, thread, device, stream = 4242, 4242, 0, 7
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": host, "tid": thread, "args": {"name": "thread 4242 (python)"}},
        {"ph": "M", "name": "thread_name", "pid": device, "tid": stream, "args": {"name": "stream 7"}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x", "ts": 0, "dur": 1e6},
    ]
    corr = 1000

    def host_event(cat: str, name: str, ts: float, dur: float, **args: Any) -> None:
        events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": host, "tid": thread, "ts": ts, "dur": dur, "args": args}
        )

    def launch(
        op: str, ts: float, device_cat: str, device_name: str, dev_ts: float, dev_dur: float, **args: Any
    ) -> None:
        nonlocal corr
        corr += 1
        host_event("cpu_op", op, ts, 100.0)
        runtime = "cudaMemcpyAsync" if device_cat == "gpu_memcpy" else "cudaLaunchKernel"
        host_event("cuda_runtime", runtime, ts + 10.0, 40.0, correlation=corr)
        events.append(
            {
                "ph": "X",
                "cat": device_cat,
                "name": device_name,
                "pid": device,
                "tid": stream,
                "ts": dev_ts,
                "dur": dev_dur,
                "args": {"correlation": corr, "device": device, "stream": stream, **args},
            }
        )

    for n in range(1, GPU_STEPS + 1):
        t0 = 1_000.0 + n * GPU_STEP_US
        host_event("user_annotation", f"ProfilerStep#{n}", t0, GPU_STEP_US)
        host_event("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0 + 100, 2_500.0)
        launch(
            "aten::copy_",
            t0 + 2_700,
            "gpu_memcpy",
            "Memcpy HtoD (Pinned -> Device)",
            t0 + 2_800,
            1_000.0,
            bytes=4 * 2**20,
        )
        launch("aten::addmm", t0 + 3_900, "kernel", "ampere_sgemm_128x64_tn", t0 + 4_000, 4_000.0)
        launch(
            "aten::relu", t0 + 8_050, "kernel", "void at::native::vectorized_elementwise_kernel<4>", t0 + 8_200, 500.0
        )
        launch(
            "record_param_comms", t0 + 8_750, "kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0 + 8_900, 1_000.0
        )
        # Kineto's device-side mirror of the step (as on the MI250 fixture): an annotation, never a step.
        events.append(
            {
                "ph": "X",
                "cat": "gpu_user_annotation",
                "name": f"ProfilerStep#{n}",
                "pid": device,
                "tid": stream,
                "ts": t0 + 2_800,
                "dur": 7_100.0,
                "args": {"External id": n},
            }
        )
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2},
        "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-40GB"}],
        "traceEvents": events,
    }


def assert_same_report(kineto: BottleneckReport, xspace: BottleneckReport) -> None:
    """Every figure of the report from the ``.xplane.pb`` equals the one from the Kineto trace: counts, labels and
    identity exactly; times to 1e-6 relative (the XSpace stores times in whole picoseconds); input share within
    0.5 pp; the top operators in the same order with self times within 2%."""
    assert xspace.steps_analyzed == kineto.steps_analyzed
    for key in (
        "step_time_ms",
        "htod_ms_per_step",
        "htod_percent",
        "htod_pinned_ms_per_step",
        "htod_pageable_ms_per_step",
        "dtoh_ms_per_step",
        "collective_ms_per_step",
        "collective_percent",
        "htod_exposed_percent",
        "collective_exposed_percent",
    ):
        assert _close(getattr(xspace, key), getattr(kineto, key), rel=1e-6), key
    for key in ("htod_bytes_per_step", "htod_gb_per_s"):
        assert _close(getattr(xspace, key), getattr(kineto, key), rel=1e-6), key
    if math.isnan(kineto.input_percent):
        assert math.isnan(xspace.input_percent)
    else:
        assert abs(xspace.input_percent - kineto.input_percent) <= 0.5
    assert [o.name for o in xspace.top_ops] == [o.name for o in kineto.top_ops]
    for a, b in zip(xspace.top_ops, kineto.top_ops, strict=True):
        assert a.self_ms_per_step == pytest.approx(b.self_ms_per_step, rel=0.02), a.name
    assert xspace.op_time_source == kineto.op_time_source
    assert xspace.verdict == kineto.verdict
    assert (xspace.framework, xspace.host, xspace.rank, xspace.world_size) == (
        kineto.framework,
        kineto.host,
        kineto.rank,
        kineto.world_size,
    )
    assert xspace.framework == "pytorch"


def _close(a: float, b: float, *, rel: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


# ------------------------------------------------------------------------------------------- xprof's pages
def _table(doc: Any, index: int) -> dict[str, Any]:
    tables = [t for t in doc if isinstance(t, dict)] if isinstance(doc, list) else [doc]
    return tables[index]


def _rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    ids = [c.get("id") for c in table.get("cols", [])]
    return [
        dict(zip(ids, [c.get("v") if isinstance(c, dict) else c for c in r["c"]], strict=False)) for r in table["rows"]
    ]


def table_rows(doc: Any, index: int) -> list[dict[str, Any]]:
    """Rows of table ``index`` of an xprof tool's JSON (Google Charts tables), as ``{column id: value}``."""
    return _rows(_table(doc, index))


def input_pipeline_figures(doc: Any) -> dict[str, Any]:
    """What xprof's input-pipeline page shows: per-step rows (table 1) and their means.

    ``input_percent`` is total input time (``infeedTimeMs``: xprof's "Input", i.e. time waiting for input plus
    host-to-device copies) over total step time, in percent.
    """
    table = _table(doc, 1)
    rows = _rows(table)
    step = sum(float(r["stepTimeMs"]) for r in rows)
    return {
        "steps": len(rows),
        "step_time_ms": step / len(rows),
        "input_percent": 100.0 * sum(float(r["infeedTimeMs"]) for r in rows) / step,
        "input_ms": sum(float(r["infeedTimeMs"]) for r in rows) / len(rows),
        "device_compute_ms": sum(float(r["deviceComputeTimeMs"]) for r in rows) / len(rows),
        "device_collectives_ms": sum(float(r["deviceCollectivesTimeMs"]) for r in rows) / len(rows),
        "summary": table.get("p", {}),
    }


def overview_figures(doc: Any) -> dict[str, float]:
    """The overview page's step-time summary (its table 1 properties, rounded by xprof to 0.1 ms)."""
    p = _table(doc, 1)["p"]
    step = float(p["steptime_ms_average"])
    return {"step_time_ms": step, "input_percent": 100.0 * float(p["infeed_time_ms_avg"]) / step}


def op_stats(doc: Any) -> dict[tuple[str, str], float]:
    """xprof's framework op statistics: ``{(host_or_device, operation): total self time in microseconds}``."""
    return {(str(r["host_or_device"]), str(r["operation"])): float(r["total_self_time"]) for r in _rows(_table(doc, 0))}

"""Planted events for the analysis tests: rows of an event table and Kineto trace events, written by hand so that
every figure the analysis gives is known by construction.

* :func:`row`: one row of the neutral event table (:func:`fitprof.traces.make_table`), times in microseconds;
* :func:`kx` and :func:`write_kineto`: a Kineto (PyTorch profiler) trace file, times written in milliseconds,
  read back through fitprof's own reader, so the reader's classification is part of what is tested;
* :func:`xus` and :func:`write_run_trace`: the same in microseconds, as one rank's plain JSON trace file.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

MS = 1000.0
"""Microseconds per millisecond: planted Kineto times are written in ms, the trace holds us."""
NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
"""The DataLoader fetch PyTorch's profiler records on the loop thread: an input span."""
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"
"""A device collective kernel."""
PINNED = "Memcpy HtoD (Pinned -> Device)"
"""A host-to-device copy from pinned memory."""


def row(name: str, kind: str, ts_us: float, dur_us: float, **kw: object) -> dict[str, object]:
    """One event-table row on host thread ``pid="1", tid="1"`` unless ``pid``/``tid`` say otherwise; other columns
    (``on_device``, ``launch_us``, ``copy_kind``, ``bytes``, ``step_num``) pass through."""
    return {
        "name": name,
        "kind": kind,
        "ts_us": ts_us,
        "dur_us": dur_us,
        "pid": kw.pop("pid", "1"),
        "tid": kw.pop("tid", "1"),
        **kw,
    }


def kx(cat: str, name: str, ts_ms: float, dur_ms: float, tid: int = 1, pid: int = 7, **args: Any) -> dict[str, Any]:
    """One complete (``ph: X``) Kineto event; host events on ``pid`` 7, device events pass ``pid=0``; ``args``
    become the event's ``args`` (``correlation``, ``bytes``)."""
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts_ms * MS,
        "dur": dur_ms * MS,
        "args": args,
    }


def launched(
    cat: str, name: str, ts_ms: float, dur_ms: float, *, at_ms: float, corr: int, tid: int = 7, **args: Any
) -> list[dict[str, Any]]:
    """A device event and the runtime call on the loop thread that launched it at ``at_ms`` (1 ms long):
    ``cudaMemcpyAsync`` for a copy, ``cudaLaunchKernel`` otherwise. The analysis files device work under the step
    of its launch."""
    runtime = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
    return [
        kx("cuda_runtime", runtime, at_ms, 1, correlation=corr),
        kx(cat, name, ts_ms, dur_ms, pid=0, tid=tid, correlation=corr, **args),
    ]


def write_kineto(path: Path, events: list[dict[str, Any]]) -> Path:
    """``events`` as a gzipped Kineto trace at ``path`` (name it ``*.pt.trace.json.gz``); returns ``path``."""
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return path


def xus(cat: str, name: str, ts_us: float, dur_us: float) -> dict[str, Any]:
    """One complete (``ph: X``) Kineto event on ``pid`` 1, ``tid`` 1, times in microseconds."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts_us, "dur": dur_us}


def write_run_trace(
    path: Path, events: list[dict[str, Any]], *, rank: int | None = None, world_size: int | None = None
) -> Path:
    """``events`` as a plain JSON Kineto trace at ``path`` (its folders made), with a gloo ``distributedInfo`` of
    ``rank`` and ``world_size`` when ``rank`` is given; returns ``path``."""
    doc: dict[str, Any] = {"schemaVersion": 1, "traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": world_size}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path

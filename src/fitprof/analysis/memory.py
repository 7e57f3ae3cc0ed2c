"""Allocation churn of one profiled window: allocations and bytes allocated per step, the operators that allocate
most, from the trace's memory events (torch ``profile_memory=True``; :mod:`fitprof.traces.kineto_memory`).

Pure and framework-free, like the rest of the analysis: the steps are the event table's ``Kind.STEP`` spans less its
``Kind.NOT_TRAINING`` spans (validation, fitprof's own time), as :func:`fitprof.analysis.analyze_table` counts them,
so "per step" divides by the same steps. An allocation belongs to the innermost host operator (``Kind.OP``) that
encloses it on its thread (``aten::empty`` inside ``aten::randn`` counts for ``aten::empty``), else to
:data:`OUTSIDE_OPS`.

Heavy churn: the steps allocate at least :data:`HEAVY_CHURN_RATIO` times the most the window's allocations held at once
(``alloc_mb_per_step >= HEAVY_CHURN_RATIO * allocated_peak_mb``): the step keeps asking the allocator for its own
working set again and again (temporaries, per-step buffers), and each request costs time (fresh pages on the host,
a device allocator's search and, when it runs out, its cache flush).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fitprof.analysis.intervals import inside, union
from fitprof.analysis.report import AllocStat, BottleneckReport
from fitprof.traces._table import Kind

MB = 1e6
"""Bytes in one MB of the figures."""
HEAVY_CHURN_RATIO = 4.0
"""Bytes allocated per step over the allocator's peak in the steps from which the churn is heavy."""
OUTSIDE_OPS = "(outside operators)"
"""The name allocations made outside every host operator are counted under."""
DEVICE_TYPES = {0: "cpu", 1: "cuda"}
"""c10 ``DeviceType`` values named in the figures (others: ``device type <n>``)."""


@dataclass(frozen=True)
class MemoryChurn:
    """The allocation churn of one window (see the module docstring).

    Attributes:
        device: where the counted allocations were made (``cuda`` when the trace has device allocations, else
            ``cpu``).
        allocs_per_step: allocations (``Bytes > 0``) in the analysed steps, divided by their number.
        alloc_mb_per_step: the bytes they asked for, divided by the number of steps (MB).
        allocated_peak_mb: the most the window's allocations held at once (MB): the largest rise of the running
            sum of the ``Bytes`` of the counted events (allocations and frees in the steps, on that device).
        top_alloc_ops: the operators that allocated most bytes, largest first.
    """

    device: str
    allocs_per_step: float
    alloc_mb_per_step: float
    allocated_peak_mb: float
    top_alloc_ops: list[AllocStat] = field(default_factory=list)

    @property
    def heavy(self) -> bool:
        """Whether the steps allocate at least :data:`HEAVY_CHURN_RATIO` times the allocator's peak."""
        return self.allocated_peak_mb > 0 and self.alloc_mb_per_step >= HEAVY_CHURN_RATIO * self.allocated_peak_mb


def memory_churn(table: pd.DataFrame, memory: pd.DataFrame, *, top_k: int = 5) -> MemoryChurn | None:
    """The churn of a window from its event table and its memory events.

    Args:
        table: the window's event table (:func:`fitprof.traces.read_trace`).
        memory: its memory events (:func:`fitprof.traces.kineto_memory.read_memory_events`).
        top_k: how many operators to rank by bytes allocated (>= 1).

    Returns:
        The churn, or None when the trace holds no memory events or no step time.

    Raises:
        ValueError: if ``top_k`` < 1.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
    if memory.empty:
        return None
    ts = table["ts_us"].to_numpy(dtype=float)
    end = ts + table["dur_us"].to_numpy(dtype=float)
    kind = table["kind"].to_numpy()
    is_step = kind == Kind.STEP
    n_steps = int(is_step.sum())
    if n_steps:
        steps = union(ts[is_step], end[is_step])
    else:
        host = ~table["on_device"].to_numpy(dtype=bool)
        if not host.any():
            return None
        steps = (np.array([ts[host].min()]), np.array([end[host].max()]))
    not_training = kind == Kind.NOT_TRAINING
    excluded = union(ts[not_training], end[not_training])

    dev_type = memory["device_type"].to_numpy()
    accel = dev_type > 0
    on = accel if accel.any() else dev_type == 0
    code = int(dev_type[on][0]) if on.any() else 0
    device = DEVICE_TYPES.get(code, f"device type {code}")
    m_ts = memory["ts_us"].to_numpy(dtype=float)
    counted = on & inside(m_ts, steps) & ~inside(m_ts, excluded)
    nbytes = memory["bytes"].to_numpy(dtype=float)
    alloc = counted & (nbytes > 0)
    n_div = max(n_steps, 1)
    total = float(nbytes[alloc].sum())
    # What the steps' allocations held at once: the running sum of their Bytes in time order, its
    # largest rise (a free of a block older than the trace lowers the sum; what follows rises from there). The
    # allocator's own "Total Allocated" is not used: on the CPU it counts only what it saw while some profiler ran
    # (frees unseen by an earlier window leave it too high for good).
    dev_rows = np.flatnonzero(counted)  # in the steps, validation and fitprof's own spans left out
    order = dev_rows[np.argsort(m_ts[dev_rows], kind="stable")]
    running = np.cumsum(np.where(np.isnan(nbytes[order]), 0.0, nbytes[order]))
    lowest_before = np.minimum.accumulate(np.concatenate([[0.0], running]))[:-1]
    held = max(float((running - lowest_before).max()), 0.0) if len(running) else math.nan

    ops = kind == Kind.OP
    owner = _innermost(
        ts[ops],
        end[ops],
        _thread_keys(table["pid"].to_numpy()[ops], table["tid"].to_numpy()[ops]),
        m_ts[alloc],
        _thread_keys(memory["pid"].to_numpy()[alloc], memory["tid"].to_numpy()[alloc]),
    )
    names = np.where(owner >= 0, table["name"].to_numpy()[ops][np.maximum(owner, 0)] if ops.any() else "", OUTSIDE_OPS)
    by_op = pd.DataFrame({"name": names, "bytes": nbytes[alloc]}).groupby("name")["bytes"].agg(["sum", "count"])
    ranked = by_op.sort_values("sum", ascending=False, kind="stable").head(top_k)
    return MemoryChurn(
        device=device,
        allocs_per_step=float(alloc.sum()) / n_div,
        alloc_mb_per_step=total / n_div / MB,
        allocated_peak_mb=held / MB,
        top_alloc_ops=[
            AllocStat(
                str(name),
                float(row["count"]) / n_div,
                float(row["sum"]) / n_div / MB,
                100.0 * float(row["sum"]) / total,
            )
            for name, row in ranked.iterrows()
        ],
    )


def churn_advice(churn: MemoryChurn) -> list[str]:
    """Advice for heavy churn ([] otherwise)."""
    if not churn.heavy:
        return []
    top = churn.top_alloc_ops[0].name if churn.top_alloc_ops else "the top allocator"
    return [
        f"The steps allocate {churn.alloc_mb_per_step / churn.allocated_peak_mb:.1f}x the memory they hold "
        f"({churn.alloc_mb_per_step:.0f} MB a step; most by `{top}`): reuse buffers (in-place ops, `out=`), "
        "keep `optimizer.zero_grad(set_to_none=True)`, and create per-step tensors once outside the loop.",
    ]


def with_churn(report: BottleneckReport, churn: MemoryChurn | None) -> BottleneckReport:
    """``report`` with the churn's figures, and its advice after the report's own; ``report`` itself when
    ``churn`` is None (no memory events)."""
    if churn is None:
        return report
    return dataclasses.replace(
        report,
        memory_device=churn.device,
        allocs_per_step=churn.allocs_per_step,
        alloc_mb_per_step=churn.alloc_mb_per_step,
        allocated_peak_mb=churn.allocated_peak_mb,
        heavy_churn=churn.heavy,
        top_alloc_ops=list(churn.top_alloc_ops),
        advice=[*report.advice, *churn_advice(churn)],
    )


def _thread_keys(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    return np.array([f"{p}\x00{t}" for p, t in zip(pid, tid, strict=True)], dtype=object)


def _innermost(
    o_ts: np.ndarray, o_end: np.ndarray, o_thread: np.ndarray, q_ts: np.ndarray, q_thread: np.ndarray
) -> np.ndarray:
    """Index (into the operators) of the innermost operator on the query's thread whose span holds the query time
    (start <= t <= end; of nested ones the one that starts last), -1 for none."""
    out = np.full(len(q_ts), -1, dtype=np.int64)
    if not len(o_ts) or not len(q_ts):
        return out
    for thread in np.unique(q_thread):
        oi = np.flatnonzero(o_thread == thread)
        qi = np.flatnonzero(q_thread == thread)
        if not len(oi):
            continue
        order = oi[np.lexsort((-(o_end[oi] - o_ts[oi]), o_ts[oi]))]  # by start, the longer first: parents first
        starts, ends = o_ts[order], o_end[order]
        parent = np.full(len(order), -1, dtype=np.int64)
        stack: list[int] = []
        for i in range(len(order)):  # the operators nest on one thread: a stack of the open ones
            while stack and ends[stack[-1]] < starts[i]:
                stack.pop()
            parent[i] = stack[-1] if stack else -1
            stack.append(i)
        k = np.searchsorted(starts, q_ts[qi], side="right") - 1
        pending = k >= 0
        pending[pending] = ends[k[pending]] < q_ts[qi][pending]
        while pending.any():
            k[pending] = parent[k[pending]]
            pending &= k >= 0
            pending[pending] = ends[k[pending]] < q_ts[qi][pending]
        found = k >= 0
        out[qi[found]] = order[k[found]]
    return out

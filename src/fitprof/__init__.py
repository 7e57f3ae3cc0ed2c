"""fitprof: drop-in profiling callbacks for Keras and Lightning, with one framework-free analysis core.

Importing this package never imports TensorFlow, Keras, torch or Lightning. The callbacks live in
``fitprof.keras`` and ``fitprof.lightning``.
"""

from __future__ import annotations

import os

from fitprof._profile_jobs import wait_for_profiles
from fitprof._session import split_rank
from fitprof._warn import FitProfilerWarning
from fitprof.analysis import BottleneckReport, OpStat, analyze_table
from fitprof.analysis.memory import memory_churn, with_churn
from fitprof.traces import TraceError, read_trace, read_trace_plain
from fitprof.traces.kineto_memory import read_memory_events

__version__ = "0.1.0"


def analyze(
    path: str | os.PathLike[str],
    *,
    top_k: int = 5,
    host: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    max_trace_mb: float | None = None,
    max_events: int | None = None,
) -> BottleneckReport:
    """Read one trace file and compute its bottleneck report.

    Args:
        path: an ``.xplane.pb`` (XSpace) or a Kineto ``.pt.trace.json[.gz]`` file.
        top_k: how many operators to rank by self time.
        host, rank, world_size: where the trace was recorded, when the caller knows (the callbacks do); None:
            from the trace, as below.
        max_trace_mb: the bound on the file's size in MB, inflated for a gzip file (default 512).
        max_events: the bound on the trace's events (default 10,000,000). Both bounds are checked before the
            memory is spent (see :func:`fitprof.traces.read_trace`); raise them for a genuine bigger trace.

    Returns:
        The report: ``framework`` ``"pytorch"`` for a Kineto trace and for the ``.xplane.pb`` fitprof converted
        from one, else ``"tensorflow"``; ``rank`` / ``world_size`` from the trace's ``distributedInfo`` (Kineto, and
        the ``.xplane.pb`` converted from it); ``host`` from the file name (an XSpace's ``_rank<N>`` suffix gives the
        rank) or, for a converted ``.xplane.pb``, the host its Kineto trace names: both files of one window give the
        same report. A Kineto trace recorded with torch's ``profile_memory`` also gives the window's allocation
        churn (``allocs_per_step``, ``alloc_mb_per_step``, ``top_alloc_ops``: :mod:`fitprof.analysis.memory`).

    Raises:
        TraceError: if the file is not a readable trace, or passes a bound.
        ValueError: if ``top_k`` < 1 or a bound is not a positive number.
    """
    # Plain columns, not a DataFrame: building the frame costs more than a small window's whole analysis.
    table = read_trace_plain(path, max_trace_mb=max_trace_mb, max_events=max_events)
    named_host, named_rank = split_rank(str(table.attrs.get("host") or ""))
    if rank is None:
        rank = table.attrs.get("rank", named_rank)
    if world_size is None:
        world_size = table.attrs.get("world_size")
    report = analyze_table(
        table,
        top_k=top_k,
        source=os.fspath(path),
        host=named_host if host is None else host,
        rank=None if rank is None else int(rank),
        world_size=None if world_size is None else int(world_size),
    )
    if table.attrs.get("profile_memory"):  # the file is read again for its [memory] events, only when it has them
        memory = read_memory_events(path, max_trace_mb=max_trace_mb, max_events=max_events)
        report = with_churn(report, memory_churn(table.to_frame(), memory, top_k=top_k))
    return report


__all__ = [
    "BottleneckReport",
    "FitProfilerWarning",
    "OpStat",
    "TraceError",
    "__version__",
    "analyze",
    "analyze_table",
    "read_trace",
    "wait_for_profiles",
]

"""fitprof: drop-in profiling callbacks for Keras and Lightning, with one framework-free analysis core.

Importing this package never imports TensorFlow, Keras, torch or Lightning. The callbacks live in
``fitprof.keras`` and ``fitprof.lightning``.
"""

from __future__ import annotations

import os

from fitprof._session import split_rank
from fitprof.analysis import BottleneckReport, OpStat, analyze_table
from fitprof.traces import TraceError, read_trace

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
        The report: ``framework`` from the format (XSpace: ``"tensorflow"``, Kineto: ``"pytorch"``);
        ``rank`` / ``world_size`` from the trace's ``distributedInfo`` (Kineto); for an XSpace ``host`` from the
        file name and ``rank`` from its ``_rank<N>`` suffix (how fitprof names a multi-rank run's files).

    Raises:
        TraceError: if the file is not a readable trace, or passes a bound.
        ValueError: if ``top_k`` < 1 or a bound is not a positive number.
    """
    table = read_trace(path, max_trace_mb=max_trace_mb, max_events=max_events)
    named_host, named_rank = split_rank(str(table.attrs.get("host") or ""))
    if rank is None:
        rank = table.attrs.get("rank", named_rank)
    if world_size is None:
        world_size = table.attrs.get("world_size")
    return analyze_table(
        table,
        top_k=top_k,
        source=os.fspath(path),
        host=named_host if host is None else host,
        rank=None if rank is None else int(rank),
        world_size=None if world_size is None else int(world_size),
    )


__all__ = [
    "BottleneckReport",
    "OpStat",
    "TraceError",
    "__version__",
    "analyze",
    "analyze_table",
    "read_trace",
]

"""fitprof: drop-in profiling callbacks for Keras and Lightning, with one framework-free analysis core.

Importing this package never imports TensorFlow, Keras, torch or Lightning. The callbacks live in
``fitprof.keras`` and ``fitprof.lightning``.
"""

from __future__ import annotations

import os

from fitprof.analysis import BottleneckReport, OpStat, analyze_table
from fitprof.traces import TraceError, read_trace, trace_format

__version__ = "0.1.0"


def analyze(
    path: str | os.PathLike[str],
    *,
    top_k: int = 5,
    max_trace_mb: float | None = None,
    max_events: int | None = None,
) -> BottleneckReport:
    """Read one trace file and compute its bottleneck report.

    Args:
        path: an ``.xplane.pb`` (XSpace) or a Kineto ``.pt.trace.json[.gz]`` file.
        top_k: how many operators to rank by self time.
        max_trace_mb: the bound on the file's size in MB, inflated for a gzip file (default 512).
        max_events: the bound on the trace's events (default 10,000,000). Both bounds are checked before the
            memory is spent (see :func:`fitprof.traces.read_trace`); raise them for a genuine bigger trace.

    Returns:
        The report, with ``rank`` / ``world_size`` from the trace's ``distributedInfo`` (Kineto) when present
        and ``host`` from the file name (XSpace).

    Raises:
        TraceError: if the file is not a readable trace, or passes a bound.
        ValueError: if ``top_k`` < 1 or a bound is not a positive number.
    """
    framework = "tensorflow" if trace_format(path) == "xspace" else "pytorch"
    table = read_trace(path, max_trace_mb=max_trace_mb, max_events=max_events)
    report = analyze_table(table, top_k=top_k, framework=framework, source=os.fspath(path))
    report.host = str(table.attrs.get("host") or "")
    for key in ("rank", "world_size"):
        value = table.attrs.get(key)
        if value is not None:
            setattr(report, key, int(value))
    return report


__all__ = [
    "BottleneckReport",
    "OpStat",
    "TraceError",
    "__version__",
    "analyze",
    "analyze_table",
    "read_trace",
]

"""fitprof: drop-in profiling callbacks for Keras and Lightning, with one framework-free analysis core.

Importing this package never imports TensorFlow, Keras, torch or Lightning. The callbacks live in
``fitprof.keras`` and ``fitprof.lightning``.
"""

from __future__ import annotations

import os

from fitprof.analysis import BottleneckReport, OpStat, analyze_table
from fitprof.traces import TraceError, read_trace, trace_format

__version__ = "0.1.0"


def analyze(path: str | os.PathLike[str], *, top_k: int = 5) -> BottleneckReport:
    """Read one trace file and compute its bottleneck report.

    Args:
        path: an ``.xplane.pb`` (XSpace) or a Kineto ``.pt.trace.json[.gz]`` file.
        top_k: how many operators to rank by self time.

    Returns:
        The report, with ``rank`` / ``world_size`` from the trace's ``distributedInfo`` (Kineto) when present
        and ``host`` from the file name. ``framework`` is ``"pytorch"`` for a Kineto trace and for the
        ``.xplane.pb`` fitprof converted from one (which also carries the trace's host, rank and world size, so
        both files give the same report), else ``"tensorflow"``.

    Raises:
        TraceError: if the file is not a readable trace.
        ValueError: if ``top_k`` < 1.
    """
    table = read_trace(path)
    framework = str(table.attrs.get("framework") or ("tensorflow" if trace_format(path) == "xspace" else "pytorch"))
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

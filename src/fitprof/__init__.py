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

    Raises:
        TraceError: if the file is not a readable trace.
        ValueError: if ``top_k`` < 1.
    """
    framework = "tensorflow" if trace_format(path) == "xspace" else "pytorch"
    return analyze_table(read_trace(path), top_k=top_k, framework=framework, source=os.fspath(path))


__all__ = [
    "BottleneckReport",
    "OpStat",
    "TraceError",
    "__version__",
    "analyze",
    "analyze_table",
    "read_trace",
]

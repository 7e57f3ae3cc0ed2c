"""The per-window report file, ``<session>/fitprof_report.json``, that ``fitprof report`` reads.

Each callback writes one beside the window's ``.xplane.pb`` (xprof ignores other files in a session folder).
It holds the epoch, the framework, the rank, the trace the figures came from and the full
:class:`~fitprof.analysis.BottleneckReport` as a dict, so ``fitprof report`` prints exactly what was logged.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from fitprof.analysis import BottleneckReport

REPORT_FILE = "fitprof_report.json"
SCHEMA = 1


def _clean(value: Any) -> Any:
    """NaN/inf -> None, so the file is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_report_file(
    session_dir: str | os.PathLike[str],
    *,
    epoch: int,
    report: BottleneckReport,
    trace: str | os.PathLike[str],
    rank: int = 0,
    name: str = REPORT_FILE,
) -> Path:
    """Write the report of one window; returns its path.

    Raises:
        OSError: if the file cannot be written.
    """
    path = Path(session_dir) / name
    record = {
        "schema": SCHEMA,
        "epoch": int(epoch),
        "rank": int(rank),
        "framework": report.framework,
        "trace": os.path.relpath(trace, session_dir),
        "report": _clean(report.to_dict()),
    }
    path.write_text(json.dumps(record, indent=1), encoding="utf-8")
    return path

"""The per-window report file, ``<run>/plugins/fitprof/<session>.rank<r>.json``, that ``fitprof report`` reads.

Each callback writes one per window and rank. It holds the epoch, the framework, the rank, the session, the
trace the figures came from (relative to the run directory) and the full
:class:`~fitprof.analysis.BottleneckReport` as a dict, so ``fitprof report`` prints exactly what was logged.
It lives outside ``plugins/profile/`` so that removing an old window's profile (``keep_last_windows``) never
leaves an empty session in the Profile tab, and the report of every window stays.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from fitprof.analysis import BottleneckReport

REPORTS_DIR = ("plugins", "fitprof")
"""Where report files live inside a run directory."""
SCHEMA = 1


def clean_json(value: Any) -> Any:
    """NaN/inf -> None, so the file is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


def report_path(run_dir: str | os.PathLike[str], session: str, rank: int = 0) -> Path:
    """``<run_dir>/plugins/fitprof/<session>.rank<rank>.json``."""
    return Path(run_dir).joinpath(*REPORTS_DIR, f"{session}.rank{int(rank)}.json")


def write_report_file(
    run_dir: str | os.PathLike[str],
    *,
    session: str,
    epoch: int,
    report: BottleneckReport,
    trace: str | os.PathLike[str],
    rank: int = 0,
) -> Path:
    """Write the report of one window and rank; returns its path (see :func:`report_path`).

    Raises:
        OSError: if the file cannot be written.
    """
    path = report_path(run_dir, session, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "schema": SCHEMA,
        "epoch": int(epoch),
        "rank": int(rank),
        "session": session,
        "framework": report.framework,
        "trace": Path(os.path.relpath(trace, run_dir)).as_posix(),
        "report": clean_json(report.to_dict()),
    }
    path.write_text(json.dumps(record, indent=1), encoding="utf-8")
    return path

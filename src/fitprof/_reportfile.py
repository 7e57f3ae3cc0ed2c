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
MAX_REPORT_BYTES = 4_000_000
"""Bound on a report file's size when it is read: one window's figures take a few KB."""


class ReportFileError(ValueError):
    """A report file that cannot be trusted or read: too big, not JSON, or pointing outside the log folder."""


def check_session(session: object) -> str:
    """``session`` if it is a plain folder name (what a session is), else :class:`ValueError`.

    A plain name has no ``/`` or ``\\``, is not ``.`` or ``..`` and is not empty, so that
    ``plugins/profile/<session>`` and ``plugins/fitprof/<session>.rank<r>.json`` stay inside the run folder.
    """
    if (
        not isinstance(session, str)
        or session in ("", ".", "..")
        or any(c in session for c in "/\\\0")
        or session != session.strip()
        or os.path.isabs(session)
    ):
        raise ValueError(
            f"session {session!r} is not a plain folder name (allowed: a non-empty name without '/', '\\', NUL, "
            "leading or trailing spaces, other than '.' and '..')"
        )
    return session


def read_report_doc(path: str | os.PathLike[str], logdir: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object of a report file found below ``logdir``, read with bounds.

    The file must lie inside ``logdir`` once links are followed, be at most :data:`MAX_REPORT_BYTES`, and be a
    JSON object; its ``session``, when present, must be a plain name (:func:`check_session`).

    Raises:
        ReportFileError: naming the file and what is wrong.
    """
    p = Path(path)
    root = Path(logdir).resolve()
    real = p.resolve()
    if not real.is_relative_to(root):
        raise ReportFileError(f"{p}: a link to {real}, outside the log folder {root}; not read")
    try:
        with open(real, "rb") as fh:
            data = fh.read(MAX_REPORT_BYTES + 1)
    except OSError as err:
        raise ReportFileError(f"{p}: cannot read the file ({err.strerror or err})") from None
    if len(data) > MAX_REPORT_BYTES:
        raise ReportFileError(
            f"{p}: not a fitprof report (bigger than {MAX_REPORT_BYTES / 1e6:g} MB; a report file holds one "
            "window's figures, a few KB)"
        )
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ReportFileError(f"{p}: not a fitprof report (not UTF-8 text)") from None
    except json.JSONDecodeError as err:
        raise ReportFileError(f"{p}: not a fitprof report (not valid JSON: {err})") from None
    except RecursionError:
        raise ReportFileError(f"{p}: not a fitprof report (JSON nested deeper than the parser's limit)") from None
    if not isinstance(doc, dict):
        raise ReportFileError(f"{p}: not a fitprof report (not a JSON object)")
    if "session" in doc:
        try:
            check_session(doc["session"])
        except ValueError as err:
            raise ReportFileError(f"{p}: not a fitprof report ({err})") from None
    return doc


def trace_inside(run_dir: Path, trace: object, logdir: str | os.PathLike[str]) -> str | None:
    """A report's ``trace`` (relative to its run folder) as a path, if it stays inside ``logdir``; else ``None``.

    The path is only computed, never opened. An absolute path, or one whose ``..`` leave ``logdir``, gives ``None``
    (a window whose trace went to a temporary folder records such a path; so may a tampered file).
    """
    if not isinstance(trace, str) or not trace or "\0" in trace or os.path.isabs(trace):
        return None
    joined = os.path.normpath(run_dir / trace)
    root = os.path.normpath(os.path.abspath(logdir))
    if os.path.commonpath([os.path.abspath(joined), root]) != root:
        return None
    return joined


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
    """``<run_dir>/plugins/fitprof/<session>.rank<rank>.json``.

    Raises:
        ValueError: if ``session`` is not a plain folder name (:func:`check_session`).
    """
    return Path(run_dir).joinpath(*REPORTS_DIR, f"{check_session(session)}.rank{int(rank)}.json")


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
        ValueError: if ``session`` is not a plain folder name (:func:`check_session`).
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

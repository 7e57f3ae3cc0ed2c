"""Trace readers: a profiler's output file -> one neutral event table (see :mod:`fitprof.traces._table`).

``read_trace(path)`` picks the reader by file name:

* ``*.xplane.pb``: XSpace (TensorFlow, JAX, anything xprof reads), :func:`fitprof.traces.xspace.read_xspace`;
* ``*.json`` / ``*.json.gz`` (``.pt.trace.json[.gz]``): Kineto Chrome trace,
  :func:`fitprof.traces.kineto.read_kineto`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from fitprof.traces._table import (
    COLUMNS,
    KINDS,
    Kind,
    PlainTable,
    TraceError,
    make_table,
)


def trace_format(path: str | os.PathLike[str]) -> str:
    """``"xspace"`` or ``"kineto"`` from the file name.

    Raises:
        TraceError: if the name ends in neither ``.xplane.pb`` nor ``.json`` / ``.json.gz``.
    """
    name = Path(path).name
    if name.endswith(".xplane.pb"):
        return "xspace"
    if name.endswith((".json", ".json.gz")):
        return "kineto"
    raise TraceError(f"{path}: not a trace file name (allowed: *.xplane.pb, *.pt.trace.json, *.json.gz)")


def read_trace(
    path: str | os.PathLike[str], *, max_trace_mb: float | None = None, max_events: int | None = None
) -> pd.DataFrame:
    """Read one trace file into an event table.

    Args:
        path: an ``.xplane.pb`` or a Kineto ``.pt.trace.json[.gz]`` file.
        max_trace_mb: the bound on the file's size in MB, inflated for a gzip file (default 512).
        max_events: the bound on its events (default 10,000,000; for a Kineto trace, counted as it is read).
            Both are checked before the memory is spent; see :mod:`fitprof.traces._limits`.

    Raises:
        TraceError: if the file is missing, unreadable, not a trace of the format its name says, or passes a bound
            (the message names the bound and how to raise it).
        ValueError: if a bound is not a positive number.
    """
    return read_trace_plain(path, max_trace_mb=max_trace_mb, max_events=max_events).to_frame()


def read_trace_plain(
    path: str | os.PathLike[str], *, max_trace_mb: float | None = None, max_events: int | None = None
) -> PlainTable:
    """:func:`read_trace` as plain numpy columns (:class:`PlainTable`: ``table[column]`` an array, ``attrs``, and
    ``to_frame()`` for the DataFrame): the same values, without building a DataFrame. What
    :func:`fitprof.analyze` reads a file with. Raises as :func:`read_trace`."""
    fmt = trace_format(path)
    if fmt == "xspace":
        from fitprof.traces.xspace import read_xspace_plain

        return read_xspace_plain(path, max_trace_mb=max_trace_mb, max_events=max_events)
    from fitprof.traces.kineto import read_kineto_plain

    return read_kineto_plain(path, max_trace_mb=max_trace_mb, max_events=max_events)


__all__ = [
    "COLUMNS",
    "KINDS",
    "Kind",
    "PlainTable",
    "TraceError",
    "make_table",
    "read_trace",
    "read_trace_plain",
    "trace_format",
]

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


def read_trace(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read one trace file into an event table.

    Raises:
        TraceError: if the file is missing, unreadable or not a trace of the format its name says.
    """
    fmt = trace_format(path)
    if fmt == "xspace":
        from fitprof.traces.xspace import read_xspace

        return read_xspace(path)
    from fitprof.traces.kineto import read_kineto

    return read_kineto(path)


__all__ = [
    "COLUMNS",
    "KINDS",
    "Kind",
    "TraceError",
    "make_table",
    "read_trace",
    "trace_format",
]

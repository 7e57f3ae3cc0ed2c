"""The neutral event table that every reader produces and the analysis consumes.

One row per timed event (Chrome-trace "complete" events, XPlane events). Columns, with their units:

========== ======== ==========================================================================================
column     dtype    meaning
========== ======== ==========================================================================================
name       str      event name as the profiler wrote it (op name, kernel name, ``ProfilerStep#12``, ...)
kind       str      a :class:`Kind` value (plain ``str``): what the analysis treats the event as
ts_us      float64  start time, microseconds, on the trace's own clock (host and device events share it)
dur_us     float64  duration, microseconds
self_us    float64  for host operators (``Kind.OP``, ``Kind.COLLECTIVE``, ``Kind.INPUT``): ``dur_us`` minus the
                    operators nested directly inside it on the same ``pid``/``tid`` (as torch's self CPU time
                    and xprof's self time count it); ``dur_us`` for every other event
on_device  bool     True for events executed on an accelerator (kernels, device copies)
pid        str      process (Kineto) or plane (XSpace) the event belongs to
tid        str      thread (Kineto), line (XSpace) or device stream
op         str      for device events, the host operator that launched it (via the correlation id), else ""
launch_us  float64  for device events, the start of the host call that launched it (NaN when unknown);
                    the analysis assigns a device event to the step in which it was launched
copy_kind  str      for memory copies: ``htod_pinned``, ``htod_pageable``, ``htod`` (memory kind unknown,
                    e.g. ROCm's ``Host -> Device``), ``dtoh``, ``dtod``; "" for every other event
bytes      float64  bytes moved by a copy (NaN when the trace does not say)
step_num   float64  the step number of a ``Kind.STEP`` event (NaN otherwise or when unknown)
========== ======== ==========================================================================================
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd


class TraceError(ValueError):
    """A file that is not a readable trace (missing, truncated, corrupt, or of another format)."""


class Kind(str, enum.Enum):
    """What the analysis treats an event as: the ``kind`` column's values.

    A ``str`` enum: each member equals (and hashes like) its value, so ``table["kind"] == Kind.STEP`` and
    ``table["kind"].isin([Kind.OP, ...])`` work on the plain-string column.
    """

    STEP = "step"
    """A training-step marker: Kineto ``ProfilerStep#N``, an XSpace event carrying ``_r=1`` / ``step_num``."""
    INPUT = "input"
    """Time the training loop blocked on its input: DataLoader ``__next__``, TF ``IteratorGetNext``."""
    OP = "op"
    """A framework operator executed on the host (Kineto ``cpu_op``, a TF op on a ``tf_Compute`` line)."""
    KERNEL = "kernel"
    """A device kernel."""
    MEMCPY = "memcpy"
    """A device memory copy (``copy_kind`` says which direction)."""
    COLLECTIVE = "collective"
    """Collective communication (NCCL / RCCL kernels, gloo ops, TF collective ops)."""
    ANNOTATION = "annotation"
    """A user annotation (``record_function``, ``tf.profiler.experimental.Trace``) that is not a step."""
    NOT_TRAINING = "not_training"
    """A span inside a profiled window whose time is not training, removed from step time and from every share
    of it: an annotation fitprof puts around such work: :data:`VALIDATION_ANNOTATION` (validation run inside the
    window) and :data:`OVERHEAD_ANNOTATION` (fitprof's own hook bodies, reported apart as
    ``fitprof/self_ms_per_step``)."""
    OTHER = "other"
    """Anything else: runtime calls, Python functions, memsets, ..."""

    def __str__(self) -> str:
        return self.value


VALIDATION_ANNOTATION = "fitprof/validation"
"""Name of the annotation the callbacks put around validation run inside a profiled window (``Kind.NOT_TRAINING``)."""

OVERHEAD_ANNOTATION = "fitprof/overhead"
"""Name of the annotation the callbacks put around their own work inside a profiled window (hook bodies, step-marker
transitions): ``Kind.NOT_TRAINING``, so fitprof's own time is never step time;
its total inside the analysed steps is reported as ``fitprof/self_ms_per_step``."""

NOT_TRAINING_ANNOTATIONS = frozenset({VALIDATION_ANNOTATION, OVERHEAD_ANNOTATION})
"""The annotation names the readers classify as ``Kind.NOT_TRAINING``."""

KINDS = tuple(Kind)
"""Every kind, in declaration order."""

COLUMNS: dict[str, str] = {
    "name": "object",
    "kind": "object",
    "ts_us": "float64",
    "dur_us": "float64",
    "self_us": "float64",
    "on_device": "bool",
    "pid": "object",
    "tid": "object",
    "op": "object",
    "launch_us": "float64",
    "copy_kind": "object",
    "bytes": "float64",
    "step_num": "float64",
}

_DEFAULTS: dict[str, Any] = {
    "op": "",
    "launch_us": np.nan,
    "copy_kind": "",
    "bytes": np.nan,
    "step_num": np.nan,
    "on_device": False,
}


def make_table(rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """Build an event table from row dicts (or a partial frame) and compute ``self_us``.

    Missing optional columns get their defaults; ``self_us`` is always recomputed.

    Args:
        rows: mappings with at least ``name``, ``kind``, ``ts_us``, ``dur_us``, ``pid``, ``tid``.

    Returns:
        A DataFrame with exactly :data:`COLUMNS`, sorted by ``ts_us``.
    """
    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    for col, default in _DEFAULTS.items():
        if col not in df.columns:
            df[col] = default
    for col in ("name", "kind", "pid", "tid"):
        if col not in df.columns:
            df[col] = pd.Series(dtype="object")
    for col in ("ts_us", "dur_us"):
        if col not in df.columns:
            df[col] = pd.Series(dtype="float64")
    df["pid"] = df["pid"].astype(str)
    df["tid"] = df["tid"].astype(str)
    df["self_us"] = 0.0
    df = df[list(COLUMNS)].astype(COLUMNS)
    df = df.sort_values(["ts_us", "dur_us"], ascending=[True, False], kind="stable").reset_index(drop=True)
    df["self_us"] = _self_times(df)
    return df


def table_from_columns(columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """The table :func:`make_table` builds from these columns, built with one copy of each column.

    For a reader holding millions of events: ``columns`` has every column of :data:`COLUMNS` but ``self_us``, as
    numpy arrays of their dtypes (``str`` columns: object arrays of ``str``), in file order. Its arrays are taken
    out of the dict one at a time as each is sorted, so the unsorted copy goes as the sorted one is made.
    """
    order = np.lexsort((-columns["dur_us"], columns["ts_us"]))  # by start, the longest first, then file order
    data: dict[str, pd.Series] = {}
    for name, dtype in COLUMNS.items():
        if name == "self_us":
            data[name] = pd.Series(np.zeros(len(order)), copy=False)
            continue
        values = columns.pop(name)
        data[name] = pd.Series(np.asarray(values, dtype=dtype)[order], dtype=dtype, copy=False)
        del values
    df = pd.DataFrame(data, copy=False)
    del data
    df["self_us"] = _self_times(df)
    return df


_SELF_TIME_KINDS = (Kind.OP, Kind.COLLECTIVE, Kind.INPUT)


def _self_times(df: pd.DataFrame) -> np.ndarray:
    """Self time of host operators: duration minus the direct children's, per ``pid``/``tid``.

    Only operator-like events take part (annotations, runtime calls and executor bookkeeping neither get nor
    lose time): an operator's children are the operators nested in it by time on the same thread/line (a
    child starts at or after its parent); partial overlaps are clipped to the parent. ``df`` must be sorted by
    start, longest first. Every other event keeps ``dur_us``.
    """
    dur = df["dur_us"].to_numpy(dtype=float, copy=True)
    if df.empty:
        return dur
    rows = np.flatnonzero(
        df["kind"].isin(_SELF_TIME_KINDS).to_numpy(dtype=bool) & ~df["on_device"].to_numpy(dtype=bool)
    )
    # Plain Python floats in the loop (numpy scalar indexing costs ~10x more), for the operators only; the same
    # IEEE-754 arithmetic in the same order, so the results are bit-identical to a numpy loop.
    ts_ops = df["ts_us"].to_numpy(dtype=float)[rows]
    ts, end = ts_ops.tolist(), (ts_ops + dur[rows]).tolist()
    del ts_ops
    out = dur[rows].tolist()
    threads = df[["pid", "tid"]].take(rows)
    for _, idx in threads.groupby(["pid", "tid"], sort=False).indices.items():
        stack: list[int] = []
        for i in idx.tolist():  # in table order, i.e. sorted by start then longest first
            t = ts[i]
            while stack and end[stack[-1]] <= t:
                stack.pop()
            if stack:
                parent = stack[-1]
                out[parent] -= min(end[i], end[parent]) - t
            stack.append(i)
    dur[rows] = out
    return np.maximum(dur, 0.0)

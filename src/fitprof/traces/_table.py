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
import itertools
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
    window), :data:`OVERHEAD_ANNOTATION` (fitprof's own hook bodies, reported apart as
    ``fitprof/self_ms_per_step``) and :data:`CHECKPOINT_ANNOTATION` (a checkpoint save, reported apart as
    ``fitprof/checkpoint_ms_per_step``)."""
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

CHECKPOINT_ANNOTATION = "fitprof/checkpoint"
"""Name of the annotation the callbacks put around a checkpoint save inside a profiled window (``Kind.NOT_TRAINING``):
out of step time, its total inside the analysed steps reported as ``fitprof/checkpoint_ms_per_step``."""

NOT_TRAINING_ANNOTATIONS = frozenset({VALIDATION_ANNOTATION, OVERHEAD_ANNOTATION, CHECKPOINT_ANNOTATION})
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


def table_from_columns(columns: dict[str, np.ndarray], threads: np.ndarray | None = None) -> pd.DataFrame:
    """The table :func:`make_table` builds from these columns, built with one copy of each column.

    For a reader holding millions of events: ``columns`` has every column of :data:`COLUMNS` but ``self_us``, as
    numpy arrays of their dtypes (``str`` columns: object arrays of ``str``), in file order. Its arrays are taken
    out of the dict one at a time as each is sorted, so the unsorted copy goes as the sorted one is made.
    ``threads``: one integer per row, in file order, equal exactly where both ``pid`` and ``tid`` are (a reader
    that holds them coded); it spares :func:`_self_times` coding the two string columns.
    """
    return plain_from_columns(columns, threads).to_frame()


class PlainTable:
    """The event table as plain numpy columns: what :func:`make_table` holds, without a DataFrame.

    ``table[name]`` is the column's array (:data:`COLUMNS`' dtypes; ``str`` columns are object arrays of ``str``),
    in the table's order (by start, the longest first); ``attrs`` the reader's attributes, as a DataFrame's.
    A pandas frame of a small window costs more to build than reading the window does (some 2 ms for two frames
    and fifteen series of a 30-event trace), so the analysis from a file to its report carries this instead and
    :meth:`to_frame` builds the DataFrame only for a caller that wants one.
    """

    __slots__ = ("_columns", "attrs")

    def __init__(self, columns: Mapping[str, np.ndarray], attrs: Mapping[str, Any] | None = None) -> None:
        self._columns = dict(columns)
        self.attrs: dict[str, Any] = dict(attrs or {})

    @classmethod
    def of(cls, table: pd.DataFrame | PlainTable) -> PlainTable:
        """``table`` itself, or a frame's columns (``to_numpy()`` of each of :data:`COLUMNS` it has) and a copy of its
        attrs."""
        if isinstance(table, PlainTable):
            return table
        return cls({name: table[name].to_numpy() for name in COLUMNS if name in table.columns}, table.attrs)

    def __getitem__(self, name: str) -> np.ndarray:
        return self._columns[name]

    def __len__(self) -> int:
        return len(self._columns["ts_us"])

    @property
    def empty(self) -> bool:
        """No rows."""
        return len(self) == 0

    def to_frame(self) -> pd.DataFrame:
        """The DataFrame of these columns (no copy of the arrays), with a copy of ``attrs``."""
        data = {
            name: pd.Series(np.asarray(self._columns[name], dtype=dtype), dtype=dtype, copy=False)
            for name, dtype in COLUMNS.items()
        }
        df = pd.DataFrame(data, copy=False)
        df.attrs = dict(self.attrs)
        return df


def plain_from_columns(columns: dict[str, np.ndarray], threads: np.ndarray | None = None) -> PlainTable:
    """:func:`table_from_columns` as plain columns (:class:`PlainTable`): the same arrays, no DataFrame built.

    ``columns`` and ``threads`` as for :func:`table_from_columns` (its arrays are taken out of the dict one at a
    time, so the unsorted copy goes as the sorted one is made).
    """
    order = _start_order(columns["ts_us"], columns["dur_us"])  # by start, the longest first, then file order
    data: dict[str, np.ndarray] = {}
    for name, dtype in COLUMNS.items():
        if name == "self_us":
            continue
        values = columns.pop(name)
        data[name] = np.asarray(values, dtype=dtype)[order]
        del values
    data["self_us"] = _self_times(data, None if threads is None else threads[order])
    return PlainTable({name: data[name] for name in COLUMNS})


def _start_order(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """``np.lexsort((-dur, ts))``: the rows by start, the longest first, then in their order, computed as one stable
    sort by start and a second sort of only the rows that share a start with another (a trace's events rarely do).

    Equal because a stable sort by start already holds each run of equal starts in row order; sorting those rows
    by (run, -dur), stably, is lexsort's order within each run, and runs of one row have nothing to reorder. NaN
    (which ``==`` never calls equal, while the sort does) goes to ``np.lexsort`` itself.
    """
    if np.isnan(ts).any() or np.isnan(dur).any():
        return np.lexsort((-dur, ts))
    order = np.argsort(ts, kind="stable")
    ts_sorted = ts[order]
    tie = ts_sorted[1:] == ts_sorted[:-1]  # row k + 1 starts where row k does
    del ts_sorted
    if tie.any():  # temporaries of the size of the rows sharing a start, not of the table (a peak of memory)
        shared = np.zeros(len(order), dtype=bool)
        shared[1:] |= tie
        shared[:-1] |= tie
        rows = np.flatnonzero(shared)
        del shared
        new_run = np.ones(len(rows), dtype=bool)  # a row begins a run unless it ties with the row before it
        later = rows > 0
        new_run[later] = ~tie[rows[later] - 1]
        run = np.cumsum(new_run)  # which run of equal starts each row is in
        sub = order[rows]
        order[rows] = sub[np.lexsort((-dur[sub], run))]
    return order


_SELF_TIME_KINDS = (Kind.OP, Kind.COLLECTIVE, Kind.INPUT)


def _self_times(df: pd.DataFrame | Mapping[str, np.ndarray], threads: np.ndarray | None = None) -> np.ndarray:
    """Self time of host operators: duration minus the direct children's, per ``pid``/``tid``.

    Only operator-like events take part (annotations, runtime calls and executor bookkeeping neither get nor
    lose time): an operator's children are the operators nested in it by time on the same thread/line (a
    child starts at or after its parent); partial overlaps are clipped to the parent. ``df`` must be sorted by
    start, longest first. Every other event keeps ``dur_us``.

    The definition is a stack walk over each thread's operators in table order (:func:`_self_times_stack`, which
    still computes a table holding NaN times): pop the operators that ended at or before this one's start, the
    one left on top is its parent, which loses ``min(end, parent's end) - start``; push it. That parent is the
    latest earlier operator of the thread that ends after this one's start (every operator above it was popped at
    an earlier start, so ended by then; it was not), which :func:`_parents` finds without a loop per event. Each
    parent then loses its children's times one after the other in table order (:func:`_subtract_in_order`), the
    same float operations in the same order as the walk: bit-identical.

    ``threads``: an integer per row (table order), equal exactly where ``pid`` and ``tid`` both are, used instead
    of coding those columns (which integer a thread gets changes no result: each thread's operators keep their
    order).
    """
    dur = np.array(df["dur_us"], dtype=float)  # a copy
    if len(dur) == 0:
        return dur
    kind = np.asarray(df["kind"])
    # Each row's kind compared with each operator kind (str equality, as ``isin`` tests it), no frame built.
    rows = np.flatnonzero(
        np.logical_or.reduce([kind == k.value for k in _SELF_TIME_KINDS]) & ~np.asarray(df["on_device"], dtype=bool)
    )
    if threads is not None:
        thread = threads[rows].astype(np.int64)
    else:
        # One integer per (pid, tid), as groupby(["pid", "tid"]) groups them (a missing pid or tid: no group).
        pid_code, _ = pd.factorize(np.asarray(df["pid"])[rows])
        tid_code, tids = pd.factorize(np.asarray(df["tid"])[rows])
        grouped = (pid_code >= 0) & (tid_code >= 0)
        rows = rows[grouped]
        thread = pid_code[grouped].astype(np.int64) * (len(tids) + 1) + tid_code[grouped]
    by_thread = np.argsort(thread, kind="stable")  # each thread's operators together, in table order
    rows, thread = rows[by_thread], thread[by_thread]
    ts = np.asarray(df["ts_us"], dtype=float)[rows]
    end = ts + dur[rows]
    if np.isnan(ts).any() or np.isnan(end).any():  # NaN compares false both ways: only the walk defines it
        dur[rows] = _self_times_stack(ts, end, dur[rows], thread)
        return np.maximum(dur, 0.0)
    first = np.ones(len(rows), dtype=bool)
    first[1:] = thread[1:] != thread[:-1]
    parent = _parents(ts, end, first)
    if parent is None:  # nesting too deep for pointer jumping to pay: the walk itself
        dur[rows] = _self_times_stack(ts, end, dur[rows], thread)
        return np.maximum(dur, 0.0)
    child = np.flatnonzero(parent >= 0)
    p = parent[child]
    # Python's min(end[i], end[parent]): the first operand unless the second is smaller (a signed zero included).
    lost = np.where(end[p] < end[child], end[p], end[child]) - ts[child]
    dur[rows] = _subtract_in_order(dur[rows], p, lost)
    return np.maximum(dur, 0.0)


def _parents(ts: np.ndarray, end: np.ndarray, first: np.ndarray) -> np.ndarray | None:
    """For each operator, the index of the latest earlier one of its thread with ``end > ts`` (its parent), or -1.

    ``ts`` / ``end``: the operators grouped by thread, each thread's in table order (so ``ts`` does not decrease
    within a thread), no NaN; ``first``: True at each thread's first operator. Pointer jumping: ``cand[i]`` starts
    at ``i - 1`` and keeps the invariant that every operator strictly between ``cand[i]`` and ``i`` ends at or
    before ``ts[i]``. While ``cand[i]`` itself ends by ``ts[i]``, it jumps to ``cand[cand[i]]``: the operators
    between those end by ``ts[cand[i]] <= ts[i]``, so the invariant holds; when ``cand[i]`` ends after ``ts[i]``
    it is the parent. A run of siblings is walked by doubling jumps (about log2 of its length in rounds); an
    operator with no parent at all is settled before the first round. Measured: 9 rounds for the 40,572 operators
    of the A100 DDP fixture (a100_ddp8_rank3_dataloader), 1 for the 98,049 of the generated 200k-event trace.
    """
    n = len(ts)
    cand = np.arange(-1, n - 1, dtype=np.int64)
    cand[first] = -1
    # An operator with no earlier one of its thread ending after its start (the running maximum of the ends before
    # it, at most its start) has no parent: settled at once, so the top-level operators, often most of a thread,
    # do not walk back over each other to the thread's start.
    bounds = np.concatenate([np.flatnonzero(first), [n]]).tolist()
    latest_end = np.full(n, -np.inf)  # a thread's first operator: cand is -1 already
    for lo, hi in itertools.pairwise(bounds):
        latest_end[lo + 1 : hi] = np.maximum.accumulate(end[lo : hi - 1])
    cand[~first & (latest_end <= ts)] = -1
    active = np.flatnonzero(cand >= 0)
    rounds = 0
    while len(active):
        rounds += 1
        if rounds > 64:
            return None
        c = cand[active]
        active = active[end[c] <= ts[active]]
        cand[active] = cand[cand[active]]
        active = active[cand[active] >= 0]
    return cand


def _subtract_in_order(out: np.ndarray, parent: np.ndarray, lost: np.ndarray) -> np.ndarray:
    """``out[parent[k]] -= lost[k]`` for every ``k`` in order, as the loop would, without a loop per element.

    Each parent's subtractions stay in their order and are applied one after the other: the parents are grouped
    by their number of children (rounded up to a power of two, so the padding is at most the children again),
    each group is a matrix whose row is the parent's value followed by its children's times (padded with 0.0,
    and ``x - 0.0`` is ``x`` bit for bit), and ``np.subtract.accumulate`` along the rows subtracts sequentially
    (an accumulation has no other order, unlike ``np.sum``'s pairwise summation).
    """
    out = out.copy()
    if len(parent) == 0:
        return out
    order = np.argsort(parent, kind="stable")  # by parent, each parent's children in their order
    parent, lost = parent[order], lost[order]
    starts = np.flatnonzero(np.concatenate([[True], parent[1:] != parent[:-1]]))
    counts = np.diff(np.concatenate([starts, [len(parent)]]))
    rank = np.arange(len(parent)) - np.repeat(starts, counts)
    width = 1 << np.ceil(np.log2(counts)).astype(np.int64)  # counts >= 1
    group_width = np.repeat(width, counts)
    for w in np.unique(width).tolist():
        groups = np.flatnonzero(width == w)
        m = np.zeros((len(groups), w + 1))
        m[:, 0] = out[parent[starts[groups]]]
        row = np.repeat(np.arange(len(groups)), counts[groups])
        m[row, rank[group_width == w] + 1] = lost[group_width == w]
        out[parent[starts[groups]]] = np.subtract.accumulate(m, axis=1)[:, -1]
    return out


def _self_times_stack(ts: np.ndarray, end: np.ndarray, dur: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """:func:`_self_times`'s walk itself, one operator at a time (for times holding NaN, whose comparisons the
    vectorised form cannot reproduce). Operators grouped by thread, each thread's in table order."""
    ts_l, end_l, out = ts.tolist(), end.tolist(), dur.tolist()
    thread_l = thread.tolist()
    stack: list[int] = []
    for i, t in enumerate(ts_l):
        if i and thread_l[i] != thread_l[i - 1]:
            stack = []
        while stack and end_l[stack[-1]] <= t:
            stack.pop()
        if stack:
            parent = stack[-1]
            out[parent] -= min(end_l[i], end_l[parent]) - t
        stack.append(i)
    return np.array(out, dtype=float)

"""The Kineto rules the readers share: a Kineto trace's complete events, as columns (:class:`Columns`), into
the table's columns (:func:`frame_columns`). The Kineto reader (:mod:`fitprof.traces.kineto`) fills the columns
from the trace's JSON, the XSpace reader (:mod:`fitprof.traces.xspace`) from an XSpace fitprof converted from a
Kineto trace, and the converter (:mod:`fitprof.traces.xspace_write`) reads its events through the Kineto reader:
one set of rules, so a window gives the same table whichever file it is read from.

How each event is classified (``kind`` column), by its category (``cat``) and name:

=============================== ==============================================================================
``cat``                         ``kind``
=============================== ==============================================================================
``user_annotation``             ``ProfilerStep#N`` -> ``step`` (``step_num = N``);
                                ``enumerate(DataLoader)#...__next__`` -> ``input``;
                                ``fitprof/validation`` -> ``excluded``;
                                the process group's own spans (``nccl:all_reduce``, ``gloo:all_reduce``, ...) ->
                                ``collective``; anything else -> ``annotation``
``gpu_user_annotation``         ``annotation`` on the device (a device-side mirror: never a step)
``cpu_op``                      ``op``; collectives (``c10d::*``, ``record_param_comms``, ``nccl:*``, ``gloo:*``) ->
                                ``collective``; a ``ProfilerStep#N`` (older exports) -> ``step``
``kernel``                      ``kernel`` on the device; NCCL / RCCL kernels -> ``collective`` on the device
``gpu_memcpy``                  ``memcpy`` on the device, ``copy_kind`` from the name (``Pinned``/``Pageable`` ->
                                ``htod_pinned``/``htod_pageable``, ROCm's ``Host -> Device`` -> ``htod``) or
                                ``args.kind``; ``bytes`` from ``args.bytes`` (NaN when absent, as on ROCm)
``gpu_memset``, ``cuda_sync``   ``other`` on the device
anything else                   ``other`` on the host (``cuda_runtime``, ``cuda_driver``, ``python_function``, ...)
none (legacy layout)            read as ``cpu_op`` (so ``ProfilerStep#N`` is a step, the DataLoader span input,
                                every other name an operator); on a ``"CUDA functions"`` row (any
                                ``"<device> functions"`` but ``"CPU functions"``) as ``kernel`` / ``gpu_memcpy``,
                                linked to their operator by the layout's ``cpu_to_cuda`` flow arrows
=============================== ==============================================================================

The legacy autograd-profiler export (``torch.autograd.profiler.profile(use_kineto=False)``, torch before Kineto)
is a bare list of events with ``"pid": "CPU functions"`` and no ``cat``: its operators and ``record_function``
spans are one kind of event there, so both count as operators, as that profiler's own tables count them.

Device events are linked to the host runtime call that launched them (``cuda_runtime`` / ``cuda_driver``, same
``args.correlation``): ``launch_us`` is that call's start and ``op`` the innermost ``cpu_op`` on the call's
thread that encloses it ("" when none does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from fitprof.traces._table import NOT_TRAINING_ANNOTATIONS, Kind

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"})
"""Categories Kineto records on a device row (``pid`` = device, ``tid`` = stream)."""
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
"""Host calls that launch device work; their ``args.correlation`` matches the device event's."""
_COLLECTIVE_PREFIXES = ("nccl:", "gloo:", "mpi:", "ucc:", "rccl:", "xccl:")
"""Names of the spans the process groups record around each collective (``nccl:all_reduce``, ...)."""
_COLLECTIVE_OP_PREFIXES = ("c10d::", "c10d_functional::", "_c10d_functional::", *_COLLECTIVE_PREFIXES)
_STEP_RE = re.compile(r"ProfilerStep[#*](\d*)")
_MEMCPY_RE = re.compile(r"Memcpy (\w+)(?: \((\w+) -> (\w+)\))?")
_COPY_DIRECTION = {"htod": "htod", "dtoh": "dtoh", "dtod": "dtod", "ptop": "dtod"}
_ARGS_KIND = {"htod": "htod", "dtoh": "dtoh", "dtod": "dtod", "ptop": "dtod", "1": "htod", "2": "dtoh", "3": "dtod"}
"""``args.kind`` of a copy: ROCm writes ``HtoD`` etc.; HIP's ``hipMemcpyKind`` numbers also appear."""


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (the parsed JSON holds no cycles), restoring its state after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclasses.dataclass
class Columns:
    """The complete events (``"ph": "X"``, not ``"cat": "Trace"``) as columns, in file order.

    ``*_code`` index the matching unique values (``cats``, ``names``, ...: ``str``, "" for a missing one, in the
    order of first appearance, as :func:`pandas.factorize` gives them; int32, or int64 past 2**31 events: callers
    widen them before multiplying); ``correlation`` and ``nbytes`` are
    ``args.correlation`` / ``args.bytes`` as numbers (NaN where missing or not numeric); ``kind_arg`` holds
    ``args.kind`` by row where present.
    """

    ts: np.ndarray
    dur: np.ndarray
    cat_code: np.ndarray
    cats: np.ndarray
    name_code: np.ndarray
    names: np.ndarray
    pid_code: np.ndarray
    pids: np.ndarray
    tid_code: np.ndarray
    tids: np.ndarray
    correlation: np.ndarray
    nbytes: np.ndarray
    kind_arg: dict[int, Any]
    flows: list[tuple[str, str, float, str, Any]] = dataclasses.field(default_factory=list)
    """The legacy layout's launch arrows (``"ph": "s"`` / ``"f"``, ``cat`` ``cpu_to_*``): ``(ph, name, ts, tid,
    id)``."""


def frame(cols: Columns, path: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per complete event, every table column except ``self_us``."""
    columns = frame_columns(cols, path)
    return pd.DataFrame(columns) if columns else pd.DataFrame()  # make_table adds the columns of an empty one


def frame_columns(cols: Columns, path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The columns of :func:`frame` as arrays, in file order ({} when there are no complete events).

    Memory: besides ``cols`` and the twelve output arrays, at most a few temporaries of 8 bytes an event at a
    time (no object array of categories, no thread code of every event).
    """
    n = len(cols.ts)
    if not n:
        return {}
    ts, dur = cols.ts, cols.dur
    cat_code, cats = cols.cat_code, cols.cats
    name_code, names = cols.name_code, cols.names
    pid_code, pids = cols.pid_code, cols.pids
    tid_code, tids = cols.tid_code, cols.tids
    name = None
    legacy = "" in cats  # events without a category: the legacy autograd-profiler layout
    if legacy:
        name = names[name_code]
        cat_code, cats = _legacy_categories(cat_code, cats, pid_code, pids, name)

    # Classify each distinct (category, name) pair once, then spread the answers over the events. The launch
    # links (the largest temporaries) come first, before the object columns exist, to keep the peak down.
    classes, inverse = _pair_classes(cat_code, cats, name_code, names)
    on_device = np.array([c[1] for c in classes], dtype=bool)[inverse]

    def in_cats(wanted: Sequence[str]) -> np.ndarray:
        """Whether each event's category is one of ``wanted`` (from the codes, no string per event)."""
        codes = [i for i, c in enumerate(cats.tolist()) if c in wanted]
        return np.isin(cat_code, codes) if codes else np.zeros(n, dtype=bool)

    threads = Threads(pid_code, tid_code, len(tids))
    launch_us, op = _link_launches(
        cols.correlation,
        ts,
        dur,
        in_cats(_RUNTIME_CATS),
        (name_code, names),
        threads,
        on_device,
        lambda: in_cats(("cpu_op",)),
    )
    kind = np.array([c[0] for c in classes], dtype=object)[inverse]
    copy_kind = np.array([c[2] for c in classes], dtype=object)[inverse]
    step_num = np.array([c[3] for c in classes], dtype=np.float64)[inverse]
    copies = np.flatnonzero(np.array([c[0] == Kind.MEMCPY for c in classes], dtype=bool)[inverse])
    del inverse

    nbytes = np.full(n, np.nan)
    if len(copies):
        nbytes[copies] = cols.nbytes[copies]
        unknown = copies[copy_kind[copies] == ""]
        for i in unknown.tolist():  # no direction in the name
            copy_kind[i] = _ARGS_KIND.get(str(cols.kind_arg.get(i)).lower(), "")
    del copies

    if name is None:
        name = names[name_code]
    tid = tids[tid_code]
    if legacy and on_device.any():
        _link_legacy_flows(cols.flows, ts, name, tid, on_device, launch_us, op)
    return {
        "name": name,
        "kind": kind,
        "ts_us": ts,
        "dur_us": dur,
        "on_device": on_device,
        "pid": pids[pid_code],
        "tid": tid,
        "op": op,
        "launch_us": launch_us,
        "copy_kind": copy_kind,
        "bytes": nbytes,
        "step_num": step_num,
    }


_DENSE_PAIRS = 1 << 22
"""Above this many (category, name) combinations the distinct pairs are found by :func:`numpy.unique`, below it
with a table of one byte a combination (no hashing or sorting of every event)."""


def _pair_classes(
    cat_code: np.ndarray, cats: np.ndarray, name_code: np.ndarray, names: np.ndarray
) -> tuple[list[tuple[str, bool, str, float]], np.ndarray]:
    """:func:`_classify` of each distinct (category, name) pair of the events, and each event's index into that
    list (int32 when it fits). The order of the pairs does not matter: the caller only spreads their classes."""
    width = len(names)
    pair = cat_code.astype(np.int64) * width + name_code
    size = len(cats) * width
    if size <= max(_DENSE_PAIRS, len(pair)):
        present = np.zeros(size, dtype=bool)
        present[pair] = True
        uniq = np.flatnonzero(present)
        del present
        slot = np.zeros(size, dtype=np.int32 if len(uniq) < 2**31 else np.int64)
        slot[uniq] = np.arange(len(uniq))
        inverse = slot[pair]
        del slot
    else:
        uniq, inverse = np.unique(pair, return_inverse=True)
    del pair
    classes = [_classify(cats[p // width], names[p % width]) for p in uniq.tolist()]
    return classes, inverse


class Threads:
    """The thread of an event (its ``pid`` / ``tid`` pair) as one int64 code, computed for the rows asked only."""

    def __init__(self, pid_code: np.ndarray, tid_code: np.ndarray, n_tids: int) -> None:
        self.pid_code, self.tid_code, self.n_tids = pid_code, tid_code, n_tids

    def of(self, rows: np.ndarray) -> np.ndarray:
        return self.pid_code[rows].astype(np.int64) * self.n_tids + self.tid_code[rows]


_LEGACY_HOST_PID = "CPU functions"
"""``pid`` of every host event in the legacy autograd-profiler export (``EventList.export_chrome_trace``);
its kernels sit on ``"CUDA functions"`` (``"<device> functions"`` for other devices)."""


def _legacy_categories(
    cat_code: np.ndarray, cats: np.ndarray, pid_code: np.ndarray, pids: np.ndarray, name: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Categories for the events that have none, as Kineto would have written them.

    The legacy autograd profiler (``torch.autograd.profiler.profile(use_kineto=False)``, every torch before
    Kineto) writes a bare list of ``{"name", "ph": "X", "ts", "dur", "tid", "pid": "CPU functions"}`` events,
    operators and ``record_function`` spans alike, and its kernels under ``"pid": "CUDA functions"``. An event
    without ``cat`` is read as a ``cpu_op`` (so ``ProfilerStep#N``, the DataLoader span and collectives keep
    their kinds, and every other name is an operator), except on a ``"<device> functions"`` row other than
    ``"CPU functions"``: a ``kernel``, or a ``gpu_memcpy`` when named ``Memcpy ...``.
    """
    missing = cats[cat_code] == ""
    pid = pids[pid_code]
    device = missing & np.array(
        [isinstance(p, str) and p.endswith(" functions") and p != _LEGACY_HOST_PID for p in pid.tolist()], dtype=bool
    )
    effective = cats[cat_code].astype(object)
    effective[missing] = "cpu_op"
    if device.any():
        copies = np.char.startswith(name[device].astype(str), "Memcpy")
        effective[device] = np.where(copies, "gpu_memcpy", "kernel")
    codes, uniques = pd.factorize(pd.Series(effective, dtype=object), use_na_sentinel=False)
    return np.asarray(codes, dtype=np.int64), np.asarray(uniques, dtype=object)


def _link_legacy_flows(
    flows: list[tuple[str, str, float, str, Any]],
    ts: np.ndarray,
    name: np.ndarray,
    tid: np.ndarray,
    on_device: np.ndarray,
    launch_us: np.ndarray,
    op: np.ndarray,
) -> None:
    """Link the legacy layout's kernels to their operators through its flow arrows, in place.

    That writer draws each launch as a ``"ph": "s"`` event at the operator's start (named after the operator)
    and a ``"ph": "f"`` event at the kernel's start (named after the kernel, same ``id``, ``cat``
    ``cpu_to_cuda``): ``op`` becomes the operator's name and ``launch_us`` its start.
    """
    starts = {fid: (fname, t) for ph, fname, t, _, fid in flows if ph == "s"}
    ends = {(fname, t, ftid): fid for ph, fname, t, ftid, fid in flows if ph == "f"}
    if not starts or not ends:
        return
    for i in np.flatnonzero(on_device).tolist():
        start = starts.get(ends.get((name[i], float(ts[i]), tid[i])))
        if start is not None:
            op[i], launch_us[i] = start


def _classify(cat: str, name: str) -> tuple[str, bool, str, float]:
    """``(kind, on_device, copy_kind, step_num)`` of an event from its category and name."""
    if cat in ("user_annotation", "cpu_op"):
        step = _STEP_RE.fullmatch(name)
        if step:
            return Kind.STEP, False, "", float(step.group(1)) if step.group(1) else np.nan
    if cat == "user_annotation":
        if name.startswith("enumerate(DataLoader)#") and "__next__" in name:
            return Kind.INPUT, False, "", np.nan
        if name in NOT_TRAINING_ANNOTATIONS:
            return Kind.NOT_TRAINING, False, "", np.nan
        if name.startswith(_COLLECTIVE_PREFIXES):
            return Kind.COLLECTIVE, False, "", np.nan
        return Kind.ANNOTATION, False, "", np.nan
    if cat == "cpu_op":
        if name.startswith(_COLLECTIVE_OP_PREFIXES) or name == "record_param_comms":
            return Kind.COLLECTIVE, False, "", np.nan
        return Kind.OP, False, "", np.nan
    if cat == "kernel":
        low = name.lower()
        return (Kind.COLLECTIVE if "nccl" in low or "rccl" in low else Kind.KERNEL), True, "", np.nan
    if cat == "gpu_memcpy":
        return Kind.MEMCPY, True, _copy_kind(name), np.nan
    if cat == "gpu_user_annotation":
        return Kind.ANNOTATION, True, "", np.nan
    return Kind.OTHER, cat in DEVICE_CATEGORIES, "", np.nan


def _copy_kind(name: str) -> str:
    """``htod_pinned`` / ``htod_pageable`` / ``htod`` / ``dtoh`` / ``dtod`` from a Kineto copy name, else ""."""
    m = _MEMCPY_RE.match(name)
    if not m:
        return ""
    direction = _COPY_DIRECTION.get(m.group(1).lower(), "")
    if direction == "htod":
        source = (m.group(2) or "").lower()
        return {"pinned": "htod_pinned", "pageable": "htod_pageable"}.get(source, "htod")
    return direction


def _link_launches(
    correlation: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    is_runtime: np.ndarray,
    name: tuple[np.ndarray, np.ndarray],
    threads: Threads,
    on_device: np.ndarray,
    is_op: Callable[[], np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """``launch_us`` and ``op`` of every event (filled for device events whose launch call is in the trace).

    ``is_runtime``: the launch calls (``cuda_runtime`` / ``cuda_driver``); ``name``: the events' name codes and
    the names they index; ``is_op()``: the ``cpu_op`` events, asked only when some device event is linked.
    """
    n = len(ts)
    launch_us = np.full(n, np.nan)
    op = np.full(n, "", dtype=object)
    runtime = np.flatnonzero(is_runtime)
    device = np.flatnonzero(on_device)
    if not len(runtime) or not len(device):
        return launch_us, op

    rt_corr = pd.Index(correlation[runtime], dtype=np.float64)
    keep = ~rt_corr.isna() & ~rt_corr.duplicated()
    runtime, rt_corr = runtime[keep], rt_corr[keep]
    hit = rt_corr.get_indexer(pd.Index(correlation[device], dtype=np.float64))
    linked = hit >= 0
    device, launcher = device[linked], runtime[hit[linked]]
    if not len(device):
        return launch_us, op
    launch_us[device] = ts[launcher]
    queries, inverse = np.unique(launcher, return_inverse=True)
    found = enclosing_ops(ts, dur, np.flatnonzero(is_op()), threads, queries)[inverse]
    names = np.full(len(found), "", dtype=object)
    has = found >= 0
    name_code, unique_names = name
    names[has] = unique_names[name_code[found[has]]]
    op[device] = names
    return launch_us, op


def enclosing_ops(
    ts: np.ndarray, dur: np.ndarray, ops: np.ndarray, threads: Threads, queries: np.ndarray
) -> np.ndarray:
    """Row of the innermost ``cpu_op`` (``ops``: their rows, ascending) that encloses each query event on its
    thread, -1 for none.

    "Encloses" means starts at or before the query and ends at or after it; of several, the one that starts
    last, the shortest on a tie, and on an exact tie (``aten::item`` and its ``aten::_local_scalar_dense``, both
    rounded to the same microseconds) the later in the file: Kineto writes a caller before its callee.

    The operators of all threads are sorted once (by thread, then start, longest first, then file order); the
    query's candidate is the last operator of its thread to start at or before it, and from there it climbs
    :func:`parents` (within the thread) to the first that ends at or after the query's end: every operator
    skipped on the way ends before the one it was skipped for, so before the query's end.
    """
    out = np.full(len(queries), -1, dtype=np.int64)
    if not len(ops) or not len(queries):
        return out
    o_thread = threads.of(ops)
    order = np.lexsort((-dur[ops], ts[ops], o_thread))  # stable: file order last
    rows, o_thread = ops[order], o_thread[order]
    del order
    o_ts, o_end = ts[rows], ts[rows] + dur[rows]
    parent = parents(o_end, o_thread)
    q_thread, q_ts, q_end = threads.of(queries), ts[queries], ts[queries] + dur[queries]
    # The candidate is the last op of the query's thread to start at or before it (-1: none).
    k = np.full(len(queries), -1, dtype=np.int64)
    lo = np.searchsorted(o_thread, q_thread, side="left")
    hi = np.searchsorted(o_thread, q_thread, side="right")
    has = np.flatnonzero(hi > lo)
    by_thread = has[np.argsort(q_thread[has], kind="stable")]
    for q in np.split(by_thread, np.flatnonzero(np.diff(q_thread[by_thread])) + 1):
        if not len(q):
            continue
        first, last = lo[q[0]], hi[q[0]]
        kq = first + np.searchsorted(o_ts[first:last], q_ts[q], side="right") - 1
        k[q] = np.where(kq >= first, kq, -1)
    # Climb to the first that encloses it.
    pending = k >= 0
    pending[pending] = o_end[k[pending]] < q_end[pending]
    while pending.any():
        k[pending] = parent[k[pending]]
        pending &= k >= 0
        pending[pending] = o_end[k[pending]] < q_end[pending]
    found = k >= 0
    out[found] = rows[k[found]]
    return out


_PARENT_ROUNDS = 64
"""Rounds of pointer jumping in :func:`parents` before the rest is finished one interval at a time."""


def parents(end: np.ndarray, thread: np.ndarray | None = None) -> np.ndarray:
    """Index of each interval's innermost enclosing interval on its thread (-1 for none); intervals sorted by
    thread (``thread``: a code per interval, ``None``: one thread), then start, longest first, so an enclosing
    interval always comes earlier.

    This is the stack loop (for each interval: pop the stack while its top ends before this one ends; the top
    left is the parent; push this one) without a Python step per interval. The loop's parent of ``i`` is the
    nearest ``j < i`` on its thread with ``end[j] >= end[i]``: every interval between them ends before ``end[i]``
    (so ``i`` popped whatever of them was left), and ``j`` itself was never popped, as nothing between ends after
    it. That nearest ``j`` is found by pointer jumping: each interval's candidate starts as the one before it and,
    while the candidate ends before it does, becomes the candidate's own candidate. That skips only intervals
    that end before the candidate, hence before ``i``, so the first candidate that ends at or after ``end[i]`` is
    the nearest one. All unresolved intervals jump at once (numpy), and the jumps compound; after
    ``_PARENT_ROUNDS`` rounds (a pathological nesting) the few left are walked one by one, in order, over the
    parents already final.
    """
    n = len(end)
    same = (lambda a, b: thread[a] == thread[b]) if thread is not None else (lambda a, b: np.ones(len(a), bool))
    parent = np.arange(-1, n - 1, dtype=np.int64)
    todo = np.arange(1, n, dtype=np.int64)
    if thread is not None and len(todo):
        first = ~same(todo - 1, todo)
        parent[todo[first]] = -1
        todo = todo[~first]
    for _ in range(_PARENT_ROUNDS):
        if not len(todo):
            return parent
        cand = parent[todo]
        done = cand < 0
        live = ~done
        done[live] = ~same(cand[live], todo[live])
        parent[todo[done & live]] = -1  # the candidate is on another (earlier) thread: none on this one
        live &= ~done
        live[live] = end[cand[live]] < end[todo[live]]
        todo = todo[live]
        parent[todo] = parent[parent[todo]]
    if not len(todo):
        return parent
    ends, parents = end.tolist(), parent.tolist()
    threads = thread.tolist() if thread is not None else [0] * n
    for i in todo.tolist():  # in order, so every parent it walks over is final
        j = parents[i]
        while j >= 0 and threads[j] == threads[i] and ends[j] < ends[i]:
            j = parents[j]
        parents[i] = j if j >= 0 and threads[j] == threads[i] else -1
    return np.array(parents, dtype=np.int64)

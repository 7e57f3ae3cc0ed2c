"""PyTorch profiler (Kineto) Chrome traces -> the neutral event table (see :mod:`fitprof.traces._table`).

Reads ``*.pt.trace.json`` and ``*.json.gz`` files as written by ``torch.profiler`` / Kineto (``export_chrome_trace``,
``tensorboard_trace_handler``) without importing torch. The top level is either a dict holding ``traceEvents`` or
a bare list of events. Only complete events (``"ph": "X"``) are read; the profiler's own ``"cat": "Trace"`` span,
flow events and metadata events are dropped. ``ts`` and ``dur`` are microseconds.

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
=============================== ==============================================================================

Device events are linked to the host runtime call that launched them (``cuda_runtime`` / ``cuda_driver``, same
``args.correlation``): ``launch_us`` is that call's start and ``op`` the innermost ``cpu_op`` on the call's
thread that encloses it ("" when none does).
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import operator
import os
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fitprof.traces._table import VALIDATION_ANNOTATION, Kind, TraceError, make_table

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


def read_kineto(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a Kineto Chrome trace (``.pt.trace.json``, optionally gzipped) into an event table.

    Args:
        path: the trace file. Gzip is recognised by its magic bytes, whatever the file is called.

    Returns:
        The event table (:func:`fitprof.traces._table.make_table`), sorted by ``ts_us``. ``attrs`` holds
        ``format`` (``"kineto"``), ``framework`` (``"pytorch"``), ``path``, ``host`` (:func:`trace_host`) and
        ``rank`` / ``world_size`` from the trace's ``distributedInfo`` (``None`` when the trace does not say).

    Raises:
        TraceError: if the file is missing or unreadable, is a truncated or corrupt gzip, is not valid JSON, or is
            JSON but not a trace (no ``traceEvents`` list of event objects, or a complete event without a
            numeric ``ts``). The message names the file.
    """
    with _gc_paused():  # parsing creates millions of small objects; collecting them meanwhile doubles the time
        meta, events = _load(Path(path))
        frame = event_frame(events, path)
        del events
    table = make_table(frame)
    dist = meta.get("distributedInfo")
    dist = dist if isinstance(dist, Mapping) else {}
    table.attrs = {
        "format": "kineto",
        "framework": "pytorch",
        "path": os.fspath(path),
        "host": trace_host(path),
        "rank": _int_or_none(dist.get("rank")),
        "world_size": _int_or_none(dist.get("world_size")),
    }
    return table


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (the parsed JSON holds no cycles), restoring its state after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _load(path: Path) -> tuple[Mapping[str, Any], list[dict[str, Any]]]:
    """The trace's top-level metadata and its event list, or :class:`TraceError`."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except OSError as err:
        raise TraceError(f"{path}: cannot read the file ({err.strerror or err})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise TraceError(f"{path}: truncated or corrupt gzip ({err})") from None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise TraceError(f"{path}: not valid JSON ({err})") from None
    if isinstance(doc, dict):
        if "traceEvents" not in doc:
            raise TraceError(f"{path}: not a Chrome trace (the JSON object has no 'traceEvents')")
        meta, events = doc, doc["traceEvents"]
    elif isinstance(doc, list):
        meta, events = {}, doc
    else:
        raise TraceError(
            f"{path}: not a Chrome trace (the JSON is a {type(doc).__name__}, not an object with 'traceEvents' "
            "or a list of events)"
        )
    if not isinstance(events, list):
        raise TraceError(f"{path}: not a Chrome trace ('traceEvents' is a {type(events).__name__}, not a list)")
    bad = None
    if not set(map(type, events)) <= {dict}:  # fast path: every event a plain dict (json.loads makes them)
        bad = next((i for i, e in enumerate(events) if not isinstance(e, dict)), None)
    if bad is not None:
        raise TraceError(f"{path}: not a Chrome trace (event {bad} is a {type(events[bad]).__name__}, not an object)")
    return meta, events


def _numbers(values: list[Any], what: str, path: str | os.PathLike[str]) -> np.ndarray:
    """``values`` as float64; a missing or non-numeric entry raises :class:`TraceError`."""
    try:
        out = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        out = np.array([_float_or_nan(v) for v in values], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(out))
    if len(bad):
        raise TraceError(
            f"{os.fspath(path)}: not a Chrome trace (complete event {bad[0]} has {what} {values[bad[0]]!r})"
        )
    return out


def _float_or_nan(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return np.nan


def _field(xs: Sequence[dict[str, Any]], key: str, default: Any) -> list[Any]:
    """``key`` of every event (``default`` where missing); the fast path assumes it is always there."""
    try:
        return list(map(operator.itemgetter(key), xs))
    except KeyError:
        return [e.get(key, default) for e in xs]


def _arg(xs: Sequence[dict[str, Any]], rows: np.ndarray, key: str) -> list[Any]:
    """``args[key]`` of the events at ``rows`` (None where missing)."""
    out = []
    for i in rows.tolist():
        args = xs[i].get("args")
        out.append(args.get(key) if isinstance(args, dict) else None)
    return out


def _strings(values: list[Any], what: str, path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Factorise ``values``: integer codes and the unique values as ``str`` ("" for missing ones).

    Raises:
        TraceError: if a value is a list or an object (not a name or a number).
    """
    try:
        codes, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=False)
    except TypeError:  # unhashable: a list or dict where a name belongs
        bad = next(i for i, v in enumerate(values) if isinstance(v, (list, dict)))
        raise TraceError(
            f"{os.fspath(path)}: not a Chrome trace (complete event {bad} has {what} {values[bad]!r})"
        ) from None
    names = np.array(["" if u is None else str(u) for u in uniques], dtype=object)
    return np.asarray(codes, dtype=np.int64), names


def complete_events(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events the table is made of: complete events (``"ph": "X"``) except the profiler's own ``Trace`` span,
    in file order. Row ``i`` of :func:`event_frame` is event ``i`` of this list."""
    return [e for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"]


def event_frame(events: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per complete event (:func:`complete_events`, in that order), every table column except ``self_us``.

    Used by this reader, by the XSpace reader on an XSpace fitprof converted from a Kineto trace (the events
    rebuilt from its planes) and by the converter (to record each device event's launching operator), so that a
    window gives the same table whichever file it is read from.

    Raises:
        TraceError: if an event has a missing or non-numeric ``ts`` / ``dur`` or a list or object as a name.
    """
    xs = complete_events(events)
    n = len(xs)
    if not n:
        return pd.DataFrame()  # make_table adds the columns
    ts = _numbers(_field(xs, "ts", None), "ts", path)
    dur = _numbers(_field(xs, "dur", 0.0), "dur", path)
    cat_code, cats = _strings(_field(xs, "cat", ""), "cat", path)
    name_code, names = _strings(_field(xs, "name", ""), "name", path)
    name = names[name_code]
    pid_code, pids = _strings(_field(xs, "pid", ""), "pid", path)
    tid_code, tids = _strings(_field(xs, "tid", ""), "tid", path)
    thread = pid_code * len(tids) + tid_code

    # Classify each distinct (category, name) pair once, then spread the answers over the events.
    pair, inverse = np.unique(cat_code * len(names) + name_code, return_inverse=True)
    classes = [classify(cats[p // len(names)], names[p % len(names)]) for p in pair.tolist()]
    kind = np.array([c[0] for c in classes], dtype=object)[inverse]
    on_device = np.array([c[1] for c in classes], dtype=bool)[inverse]
    copy_kind = np.array([c[2] for c in classes], dtype=object)[inverse]
    step_num = np.array([c[3] for c in classes], dtype=np.float64)[inverse]
    cat = cats[cat_code]

    nbytes = np.full(n, np.nan)
    copies = np.flatnonzero(kind == Kind.MEMCPY)
    if len(copies):
        nbytes[copies] = pd.to_numeric(pd.Series(_arg(xs, copies, "bytes"), dtype=object), errors="coerce").to_numpy(
            dtype=np.float64
        )
        unknown = copies[copy_kind[copies] == ""]
        for i, kind_arg in zip(unknown, _arg(xs, unknown, "kind"), strict=True):  # no direction in the name
            copy_kind[i] = _ARGS_KIND.get(str(kind_arg).lower(), "")

    launch_us, op = _link_launches(xs, ts, dur, cat, name, thread, on_device)
    return pd.DataFrame(
        {
            "name": name,
            "kind": kind,
            "ts_us": ts,
            "dur_us": dur,
            "on_device": on_device,
            "pid": pids[pid_code],
            "tid": tids[tid_code],
            "op": op,
            "launch_us": launch_us,
            "copy_kind": copy_kind,
            "bytes": nbytes,
            "step_num": step_num,
        }
    )


_FITPROF_TRACE_NAME = re.compile(r"^(?P<host>.+?)_rank\d+\..+\.pt\.trace\.json(\.gz)?$")
"""fitprof's own trace file name, ``<host>_rank<global rank>.<session>.pt.trace.json.gz``."""
_TORCH_TRACE_NAME = re.compile(r"^(?P<host>.+)_\d+\.\d+\.pt\.trace\.json(\.gz)?$")
"""``torch.profiler.tensorboard_trace_handler``'s file name, ``<host>_<pid>.<time in ms>.pt.trace.json``."""


def trace_host(path: str | os.PathLike[str]) -> str:
    """The host a Kineto trace was recorded on, from its file name; "" when the name does not say.

    Kineto writes no host name into the trace, so the name is read from the two file-name patterns that carry
    one: fitprof's ``<host>_rank<r>.<session>.pt.trace.json.gz`` and ``torch.profiler.tensorboard_trace_handler``'s
    ``<host>_<pid>.<time in ms>.pt.trace.json[.gz]``.
    """
    name = Path(path).name
    for pattern in (_FITPROF_TRACE_NAME, _TORCH_TRACE_NAME):
        m = pattern.match(name)
        if m:
            return m.group("host")
    return ""


def classify(cat: str, name: str) -> tuple[str, bool, str, float]:
    """``(kind, on_device, copy_kind, step_num)`` of an event from its category and name."""
    if cat in ("user_annotation", "cpu_op"):
        step = _STEP_RE.fullmatch(name)
        if step:
            return Kind.STEP, False, "", float(step.group(1)) if step.group(1) else np.nan
    if cat == "user_annotation":
        if name.startswith("enumerate(DataLoader)#") and "__next__" in name:
            return Kind.INPUT, False, "", np.nan
        if name == VALIDATION_ANNOTATION:
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
    xs: Sequence[dict[str, Any]],
    ts: np.ndarray,
    dur: np.ndarray,
    cat: np.ndarray,
    name: np.ndarray,
    thread: np.ndarray,
    on_device: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``launch_us`` and ``op`` of every event (filled for device events whose launch call is in the trace)."""
    n = len(ts)
    launch_us = np.full(n, np.nan)
    op = np.full(n, "", dtype=object)
    runtime = np.flatnonzero(np.isin(cat, _RUNTIME_CATS))
    device = np.flatnonzero(on_device)
    if not len(runtime) or not len(device):
        return launch_us, op

    def correlation(rows: np.ndarray) -> pd.Index:
        values = pd.Series(_arg(xs, rows, "correlation"), dtype=object)
        return pd.Index(pd.to_numeric(values, errors="coerce"), dtype=np.float64)

    rt_corr = correlation(runtime)
    keep = ~rt_corr.isna() & ~rt_corr.duplicated()
    runtime, rt_corr = runtime[keep], rt_corr[keep]
    hit = rt_corr.get_indexer(correlation(device))
    linked = hit >= 0
    device, launcher = device[linked], runtime[hit[linked]]
    if not len(device):
        return launch_us, op
    launch_us[device] = ts[launcher]
    op_of_launch = _enclosing_ops(ts, dur, cat, name, thread, np.unique(launcher))
    op[device] = pd.Series(op_of_launch).reindex(launcher).fillna("").to_numpy(dtype=object)
    return launch_us, op


def _enclosing_ops(
    ts: np.ndarray,
    dur: np.ndarray,
    cat: np.ndarray,
    name: np.ndarray,
    thread: np.ndarray,
    queries: np.ndarray,
) -> dict[int, str]:
    """Name of the innermost ``cpu_op`` that encloses each query event on its thread (``thread``: a code per
    ``pid``/``tid`` pair).

    "Encloses" means starts at or before the query and ends at or after it; of several, the one that starts
    last, the shortest on a tie, and on an exact tie (``aten::item`` and its ``aten::_local_scalar_dense``, both
    rounded to the same microseconds) the later in the file: Kineto writes a caller before its callee.
    Returns ``{row: name}`` for the queries that have one.
    """
    end = ts + dur
    ops = np.flatnonzero(cat == "cpu_op")
    if not len(ops):
        return {}
    out: dict[int, str] = {}
    op_groups = pd.Series(ops).groupby(thread[ops]).indices
    query_groups = pd.Series(queries).groupby(thread[queries]).indices
    for code, q_pos in query_groups.items():
        if code not in op_groups:
            continue
        rows = ops[op_groups[code]]
        rows = rows[np.lexsort((-dur[rows], ts[rows]))]  # by start, the longest first, then file order
        o_ts, o_end = ts[rows], end[rows]
        parent = _parents(o_end)
        q = queries[q_pos]
        # The candidate is the last op to start at or before the query; climb to the first that encloses it.
        k = np.searchsorted(o_ts, ts[q], side="right") - 1
        q_end = end[q]
        pending = k >= 0
        pending[pending] = o_end[k[pending]] < q_end[pending]
        while pending.any():
            k[pending] = parent[k[pending]]
            pending &= k >= 0
            pending[pending] = o_end[k[pending]] < q_end[pending]
        found = k >= 0
        out.update(zip(q[found].tolist(), name[rows[k[found]]].tolist(), strict=True))
    return out


def _parents(end: np.ndarray) -> np.ndarray:
    """Index of each interval's innermost enclosing interval (-1 for none); intervals sorted by start, longest
    first, so an enclosing interval always comes earlier."""
    parent = np.full(len(end), -1, dtype=np.int64)
    stack: list[int] = []
    ends = end.tolist()
    for i, e in enumerate(ends):
        while stack and ends[stack[-1]] < e:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent

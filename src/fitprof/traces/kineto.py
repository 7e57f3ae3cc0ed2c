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
import itertools
import json
import math
import operator
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from fitprof.traces._limits import Limits, count_objects, read_bounded
from fitprof.traces._repair import repair_names, repaired_names_warning
from fitprof.traces._table import NOT_TRAINING_ANNOTATIONS, Kind, TraceError, make_table, table_from_columns

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


def read_kineto(
    path: str | os.PathLike[str], *, max_trace_mb: float | None = None, max_events: int | None = None
) -> pd.DataFrame:
    """Read a Kineto Chrome trace (``.pt.trace.json``, optionally gzipped) into an event table.

    Args:
        path: the trace file. Gzip is recognised by its magic bytes, whatever the file is called.
        max_trace_mb: the bound on the file's size, inflated, in MB (default 512; see
            :mod:`fitprof.traces._limits`). A gzip file is inflated in a stream that stops at the bound.
        max_events: the bound on the JSON objects in the trace (each event and each ``args``; default
            10,000,000), counted before it is parsed.

    Returns:
        The event table (:func:`fitprof.traces._table.make_table`), sorted by ``ts_us``. ``attrs`` holds
        ``format`` (``"kineto"``), ``framework`` (``"pytorch"``), ``path``, ``host`` (:func:`trace_host`) and
        ``rank`` / ``world_size`` from the trace's ``distributedInfo`` (``None`` when the trace does not say),
        ``profile_memory`` (the trace says it was recorded with torch's ``profile_memory``: it holds ``[memory]``
        events, :mod:`fitprof.traces.kineto_memory`);
        ``warnings`` (a list of str, which the analysis copies into the report) when names that torch's writer left
        unescaped had to be repaired to read the file.

    Raises:
        TraceError: if the file is missing or unreadable, is a truncated or corrupt gzip, is not valid JSON, or is
            JSON but not a trace (no ``traceEvents`` list of event objects, or a complete event without a
            numeric ``ts``), or passes a bound (the message names the bound and how to raise it). The message
            names the file.
        ValueError: if a bound is not a positive number.
    """
    limits = Limits.of(max_trace_mb, max_events)
    with _gc_paused():  # parsing creates millions of small objects; collecting them meanwhile doubles the time
        repaired: list[str] = []
        meta, events = _load(Path(path), limits, repaired)
        columns = _frame_columns(events, path)
        del events
        table = table_from_columns(columns) if columns else make_table(pd.DataFrame())
        del columns
    dist = meta.get("distributedInfo")
    dist = dist if isinstance(dist, Mapping) else {}
    table.attrs = {
        "format": "kineto",
        "framework": "pytorch",
        "path": os.fspath(path),
        "host": trace_host(path),
        "rank": _int_or_none(dist.get("rank")),
        "world_size": _int_or_none(dist.get("world_size")),
        "profile_memory": bool(meta.get("profile_memory")),
    }
    if repaired:
        table.attrs["warnings"] = [repaired_names_warning(repaired)]
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


class _Args(msgspec.Struct, gc=False, frozen=True):
    """The ``args`` keys the table uses; every other key is skipped by the decoder without being built.

    A missing ``correlation`` or ``bytes`` decodes as NaN, the value the columns give a missing one anyway (a
    written ``null`` stays ``None`` and becomes NaN there too), so a batch of them converts to float64 without a
    test per event.
    """

    correlation: int | float | str | None = math.nan
    nbytes: int | float | str | None = msgspec.field(default=math.nan, name="bytes")
    kind: int | float | str | None = None


_NO_ARGS = _Args()
"""The ``args`` of an event that has none (one shared, frozen instance)."""


class _Event(msgspec.Struct, gc=False):
    """The fields of a Chrome trace event the table uses (the others are skipped while decoding)."""

    ph: str | None = None
    cat: str | int | float | None = ""
    name: str | int | float | None = ""
    pid: str | int | float | None = ""
    tid: str | int | float | None = ""
    ts: int | float | str | None = None
    dur: int | float | str | None = 0.0
    args: _Args | None = _NO_ARGS
    id: int | float | str | None = None


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[msgspec.Raw]
    distributedInfo: msgspec.Raw = msgspec.Raw(b"null")
    profile_memory: msgspec.Raw = msgspec.Raw(b"null")


class _Probe(msgspec.Struct, gc=False):
    """Any JSON object (its fields are skipped): an event, before its fields are read."""


class _ProbeTrace(msgspec.Struct, gc=False):
    traceEvents: list[_Probe]


_PROBE = msgspec.json.Decoder(_ProbeTrace | list[_Probe])
"""First pass: the document's shape, every event an object (a value that is not stops it at once); 24 bytes an
event, and events are at most the objects counted before."""
_DECODER = msgspec.json.Decoder(_Trace | list[msgspec.Raw])
"""Second pass: each event kept as a raw slice of the text (56 bytes an event)."""
_BATCH_DECODER = msgspec.json.Decoder(list[_Event])
"""Second pass, a batch of events at a time: only the fields the table uses."""
_BATCH = 1 << 16
_AT_EVENT = re.compile(r" - at `\$(?:\.traceEvents)?\[(\d+)\]\.?(.*)`$")
_MAX_INFO_BYTES = 1 << 16
"""``distributedInfo`` longer than this is ignored (a real one is ~200 bytes: backend, rank, world size)."""


@dataclasses.dataclass
class _Columns:
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


class _Interner:
    """Codes for the values of one column across batches, in the order of first appearance."""

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}

    def codes(self, values: list[Any]) -> np.ndarray:
        """The code of each value (int64): equal values (``==``, as a dict's keys) share the code of the first.

        One C-level pass: ``first.setdefault(v, i)`` gives each value the position of the first equal one in the
        batch; only those few first values are looked up in ``ids``. The values the decoder gives (``str``,
        ``int``, ``float`` but never NaN, ``None``) are equal exactly when :func:`pandas.factorize`, which this
        replaces, puts them together, so the codes and the kept values (the first of each) are the same. One
        exception is kept as it was: ``pandas.factorize`` returns a ``null`` (``None``) as a NaN of its own, so
        ``None`` gets a new NaN key in each batch (its own code per batch, the string ``"nan"``).
        """
        n = len(values)
        first: dict[Any, int] = {}
        at = np.fromiter(map(first.setdefault, values, itertools.count()), dtype=np.int64, count=n)
        ids = self.ids
        lut = np.empty(n, dtype=np.int64)
        lut[np.fromiter(first.values(), dtype=np.int64, count=len(first))] = [
            ids.setdefault(float("nan") if u is None else u, len(ids)) for u in first
        ]
        return lut[at]

    def strings(self) -> np.ndarray:
        return np.array(["" if u is None else str(u) for u in self.ids], dtype=object)


def _load(path: Path, limits: Limits, repaired: list[str] | None = None) -> tuple[Mapping[str, Any], _Columns]:
    """The trace's ``distributedInfo`` and its complete events as columns, or :class:`TraceError`.

    A file that is invalid JSON only because of event names its writer left unescaped (torch's writers,
    pytorch/pytorch#146900) is read after :func:`fitprof.traces._repair.repair_names`; the names repaired are
    added to ``repaired``.

    The bounds of :mod:`fitprof.traces._limits` are checked first: the (inflated) size while the file is read,
    the number of JSON objects before it is parsed. Memory: the text, 56 bytes an event for the first pass, then
    the columns (about 70 bytes an event), which grow as the raw events are let go batch by batch.
    """
    data = read_bounded(path, limits, TraceError)
    objects = count_objects(data, path, limits, TraceError)
    fast = _load_in_chunks(data, path, objects)
    if fast is not None:
        return fast
    try:
        try:
            _PROBE.decode(data)  # the raw pass alone would hold 56 bytes for each value of a list of numbers
        except msgspec.DecodeError:
            text, names = repair_names(data.decode("utf-8", "surrogateescape"))
            if not names:
                raise
            data = bytearray(text.encode("utf-8", "surrogateescape"))
            _PROBE.decode(data)
            if repaired is not None:
                repaired += names
        doc = _DECODER.decode(data)
    except msgspec.ValidationError as err:
        raise TraceError(f"{path}: not a Chrome trace ({_where(err)})") from None
    except msgspec.DecodeError as err:
        raise TraceError(f"{path}: not valid JSON ({err})") from None
    except RecursionError:
        raise _too_deep(path) from None
    del data  # the raw events keep the text alive until the last batch is decoded
    meta: dict[str, Any] = {}
    if isinstance(doc, list):
        raws = doc
    else:
        raws = doc.traceEvents
        _read_distributed_info(doc.distributedInfo, meta)
        meta["profile_memory"] = _flag(doc.profile_memory)
    del doc
    return meta, _columns(raws, path)


_CHUNK_BYTES = 1 << 22
"""Bytes of event text decoded at a time by :func:`_load_in_chunks` (about 13k events of a real trace)."""
_TRIES = 8
"""Cut points tried for one chunk before :func:`_load_in_chunks` gives the file to the three-pass reader."""
_END_TRIES = 16
_END_BYTES = 1 << 20
"""The array's end is looked for among the last ``_END_TRIES`` ``]`` of the document's last ``_END_BYTES``."""
_EVENTS_KEY = b'"traceEvents"'
_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_LEADING_SPACE = re.compile(rb"[ \t\n\r]*")
_CUT = re.compile(rb"\}[ \t\n\r]*,")
"""Where one event may end and the next begin: ``}`` and ``,`` with only JSON whitespace between them."""


class _Frame(msgspec.Struct, gc=False):
    """The document around the events (``traceEvents`` replaced by ``[]``)."""

    traceEvents: msgspec.Raw
    distributedInfo: msgspec.Raw = msgspec.Raw(b"null")
    profile_memory: msgspec.Raw = msgspec.Raw(b"null")


_FRAME_DECODER = msgspec.json.Decoder(_Frame | list[msgspec.Raw])


def _load_in_chunks(data: bytearray, path: Path, objects: int) -> tuple[dict[str, Any], _Columns] | None:
    """The trace's ``distributedInfo`` and columns in one pass over the text, or ``None`` when this fast path
    cannot prove its reading right (the caller then reads the file with the three passes of :func:`_load`, which
    give the errors and the repaired names).

    The ``traceEvents`` array is decoded ``_CHUNK_BYTES`` of text at a time, straight into :class:`_Event` structs
    and columns: no pass that only validates, no raw slice per event, and the text is the one large thing held.
    A chunk ends at a ``}``, JSON whitespace and ``,``. Such a cut is proven to lie between two events of the array
    when ``[`` + the text from the chunk's start to the ``}`` + ``]`` decodes: a cut inside a string leaves that
    string unterminated, and a cut inside a nested value leaves a bracket unclosed, so either fails to decode
    (then the next cut is tried, ``_TRIES`` at most). The array's end comes from :func:`_array_end`: the document
    with ``[]`` in place of the array decodes (the few bytes around the events are decoded that way, which also
    checks them) and its one ``"traceEvents"`` key is the one the array belongs to. A JSON value's extent is fixed
    by its text, so when ``[`` + the chunks + ``]`` decode as that key's value, the whole text is valid JSON and
    the events are those the three-pass reader decodes, in the same order.
    """
    n = len(data)
    lead = _LEADING_SPACE.match(data)
    first = lead.end() if lead else 0
    if first < n and data[first] == ord("["):  # a bare list of events (the legacy layout)
        start = first
    else:
        key = data.find(_EVENTS_KEY)
        m = _ARRAY_START.match(data, key) if key >= 0 else None
        if m is None:
            return None
        start = m.end() - 1
    stop, doc = _array_end(data, start, start == first)
    if doc is None:
        return None
    meta: dict[str, Any] = {}
    if isinstance(doc, _Frame):
        _read_distributed_info(doc.distributedInfo, meta)
        meta["profile_memory"] = _flag(doc.profile_memory)
    builder = _ColumnBuilder(path, objects)  # every event is one of the JSON objects counted
    view = memoryview(data)
    pos = start + 1
    while pos < stop:
        cut_from, end, after = pos + _CHUNK_BYTES, stop, stop
        for _ in range(_TRIES):
            cut = _CUT.search(data, cut_from, stop) if cut_from < stop else None
            end, after = (cut.start() + 1, cut.end()) if cut else (stop, stop)
            try:
                events = _decode_between(data, view, pos, end)
            except msgspec.ValidationError:
                return None
            except (msgspec.DecodeError, RecursionError):
                if cut is None:
                    return None
                cut_from = after
                continue
            break
        else:
            return None
        if not events and pos > start + 1:  # a ',' right before the closing bracket
            return None
        try:
            builder.add(events)
        except TraceError:
            return None  # the three-pass reader numbers the event in its message
        del events
        pos = after
    return meta, builder.finish()


def _decode_between(data: bytearray, view: memoryview, pos: int, end: int) -> list[_Event]:
    """The events of ``[`` + ``data[pos:end]`` + ``]``, decoded in place: the byte before ``pos`` (the array's
    ``[`` or the ``,`` of a cut) and the one at ``end`` (JSON whitespace, the ``,`` of a cut or the array's ``]``)
    are set to the brackets for the decode and put back after it, so no copy of the chunk is made. The structs
    hold no reference to the text (every field is copied out of it)."""
    opener, closer = data[pos - 1], data[end]
    data[pos - 1], data[end] = 0x5B, 0x5D  # "[", "]"
    try:
        return _BATCH_DECODER.decode(view[pos - 1 : end + 1])
    finally:
        data[pos - 1], data[end] = opener, closer


def _flag(raw: msgspec.Raw) -> bool:
    """A top-level flag of the trace (``"profile_memory": 1``): true for a true number or ``true``."""
    return bytes(raw).strip() not in (b"null", b"0", b"false", b"0.0", b"")


def _read_distributed_info(raw: msgspec.Raw, meta: dict[str, Any]) -> None:
    """``meta["distributedInfo"]``: the trace's ``distributedInfo`` object, when it is one of at most
    ``_MAX_INFO_BYTES`` (anything else is left out: the rank then comes from the file name, or is unknown)."""
    if len(raw) <= _MAX_INFO_BYTES:
        with contextlib.suppress(ValueError, RecursionError):
            info = json.loads(bytes(raw))
            if isinstance(info, dict):
                meta["distributedInfo"] = info


def _array_end(data: bytearray, start: int, bare: bool) -> tuple[int, _Frame | list[Any] | None]:
    """The position of the ``]`` that closes the event array opened at ``start``, and the document decoded
    with ``[]`` in place of the array (``None`` when not found).

    Candidates are the last ``_END_TRIES`` ``]`` of the document's last ``_END_BYTES``; the first one, from the
    front, for which the document with ``[]`` in place of the array decodes, holds ``"traceEvents"`` exactly once
    (``bare``: the bare list, not at all) and no ``\\u`` escape (a key spelled with one could be a second
    ``traceEvents``). The caller proves it by decoding the array up to it.
    """
    n, found = len(data), []
    stop = n
    view = memoryview(data)
    for _ in range(_END_TRIES):
        stop = data.rfind(b"]", max(start + 1, n - _END_BYTES), stop)
        if stop < 0:
            break
        outside = b"".join((view[:start], b"[]", view[stop + 1 :]))
        if outside.count(_EVENTS_KEY) != (0 if bare else 1) or b"\\u" in outside:
            continue
        try:
            doc = _FRAME_DECODER.decode(outside)
        except (msgspec.DecodeError, RecursionError):
            continue
        if doc == [] if bare else isinstance(doc, _Frame) and bytes(doc.traceEvents) == b"[]":
            found.append((stop, doc))
    return found[-1] if found else (-1, None)


def _too_deep(path: Path) -> TraceError:
    return TraceError(
        f"{path}: not a Chrome trace (JSON nested deeper than the parser's limit of about "
        f"{sys.getrecursionlimit():,} levels; a Chrome trace nests 4)"
    )


def _columns(raws: list[Any], path: Path) -> _Columns:
    """Decode the raw events a batch at a time into columns; each batch's raw events are let go once joined."""

    def payload(start: int) -> bytes:
        stop = min(start + _BATCH, len(raws))
        joined = b"[" + b",".join(raws[start:stop]) + b"]"
        raws[start:stop] = [None] * (stop - start)
        return joined

    return _decode_batches(payload, len(raws), path)


def _decode_batches(payload: Callable[[int], bytes], n: int, path: Path) -> _Columns:
    """The columns of ``n`` events, ``payload(start)`` the JSON array of events ``start`` to ``start + _BATCH - 1``
    (fewer in the last batch); each array is let go once decoded."""
    builder = _ColumnBuilder(path, n)
    for start in range(0, n, _BATCH):
        text = payload(start)
        events = _decode_batch(text, path, start, min(start + _BATCH, n))
        del text
        builder.add(events)
    return builder.finish()


def _decode_batch(payload: bytes, path: Path, start: int, stop: int) -> list[_Event]:
    """The events ``start`` to ``stop - 1`` of the trace, from their JSON array ``payload``, or :class:`TraceError`
    naming the event (an invalid value) or the batch (invalid JSON)."""
    try:
        return _BATCH_DECODER.decode(payload)
    except msgspec.ValidationError as err:
        raise TraceError(f"{path}: not a Chrome trace ({_where(err, start)})") from None
    except msgspec.DecodeError as err:
        raise TraceError(f"{path}: not valid JSON (in events {start}-{stop - 1}: {err})") from None
    except RecursionError:
        raise _too_deep(path) from None


class _ColumnBuilder:
    """The columns of :class:`_Columns`, filled a batch of decoded events at a time (names, threads and flow
    arrows that span batches come out as in one batch).

    ``capacity`` is an upper bound on the complete events (the ``{`` counted in the text, or the events): each
    column is allocated once at that length and filled in place. Its pages that are never written are never
    resident, so the bound costs address space, not memory; no batch list is joined (joining would hold the
    columns twice).
    """

    _FLOAT_KEYS = ("ts", "dur", "corr", "bytes")

    def __init__(self, path: Path, capacity: int) -> None:
        self.path = path
        self.interners = {k: _Interner() for k in ("cat", "name", "pid", "tid")}
        self.cols: dict[str, np.ndarray] = {k: np.empty(capacity, dtype=np.float64) for k in self._FLOAT_KEYS}
        code = np.int32 if capacity < 2**31 else np.int64  # a code is below the number of events
        self.cols.update((k, np.empty(capacity, dtype=code)) for k in self.interners)
        self.kind_arg: dict[int, Any] = {}
        self.flows: list[tuple[str, str, float, str, Any]] = []
        self.done = 0  # complete events so far

    def add(self, events: list[_Event]) -> None:
        """Append the complete events of ``events`` (and keep the legacy layout's flow arrows).

        No Python code runs per event: each field becomes a list with ``map`` of an attribute getter (a C loop; a
        tuple of every event's fields first, ``msgspec.structs.astuple``, measured 3-4% slower in place); the
        complete events are picked with ``itertools.compress``.

        Raises:
            TraceError: if a complete event's ``ts`` / ``dur`` is missing or not a number.
        """
        cols, path, done = self.cols, self.path, self.done
        rows = events
        cats = list(map(_CAT, rows))
        phs = list(map(_PH, rows))
        traces = _positions(cats, "Trace")  # the profiler's own span, once a trace
        if phs.count("X") == len(phs) and not traces:
            keep = None  # all complete (a generated trace, most batches of a real one)
        else:
            keep = list(map(operator.eq, phs, itertools.repeat("X")))  # ``p == "X"`` for each
            for i in traces:
                keep[i] = False
        del phs
        if keep is not None:
            # Flow arrows are not complete events: look for them only when some are left, and only in a batch
            # that has a ``cpu_to_*`` category at all (the legacy layout; Kineto's own arrows are ``ac2g``).
            if any(isinstance(c, str) and c.startswith("cpu_to_") for c in set(cats)):
                self.flows += (
                    (e.ph, str(e.name), _float_or_nan(e.ts), str(e.tid), e.id)
                    for e in events
                    if e.ph in ("s", "f") and isinstance(e.cat, str) and e.cat.startswith("cpu_to_")
                )
            rows, cats = list(itertools.compress(rows, keep)), list(itertools.compress(cats, keep))
        del keep
        n = len(rows)
        if not n:
            return
        end = done + n
        if end > len(cols["ts"]):  # cannot happen: every complete event is a counted object
            raise TraceError(f"{path}: more complete events than JSON objects counted")
        cols["ts"][done:end] = _numbers_of(rows, _TS, "ts", path, done)
        cols["dur"][done:end] = _numbers_of(rows, _DUR, "dur", path, done)
        interners = self.interners
        cols["cat"][done:end] = interners["cat"].codes(cats)
        del cats
        for key, get in (("name", _NAME), ("pid", _PID), ("tid", _TID)):
            cols[key][done:end] = interners[key].codes(list(map(get, rows)))
        args = list(map(_ARGS, rows))
        del rows
        if None in args:  # ``"args": null`` written out: read as no args
            args = [_NO_ARGS if a is None else a for a in args]
        cols["corr"][done:end] = _numeric(list(map(_CORRELATION, args)))
        cols["bytes"][done:end] = _numeric(list(map(_NBYTES, args)))
        kinds = list(map(_KIND, args))
        if kinds.count(None) < n:
            self.kind_arg.update((done + i, k) for i, k in enumerate(kinds) if k is not None)
        self.done = end

    def finish(self) -> _Columns:
        cols, interners, n = self.cols, self.interners, self.done
        return _Columns(
            ts=cols["ts"][:n],
            dur=cols["dur"][:n],
            cat_code=cols["cat"][:n],
            cats=interners["cat"].strings(),
            name_code=cols["name"][:n],
            names=interners["name"].strings(),
            pid_code=cols["pid"][:n],
            pids=interners["pid"].strings(),
            tid_code=cols["tid"][:n],
            tids=interners["tid"].strings(),
            correlation=cols["corr"][:n],
            nbytes=cols["bytes"][:n],
            kind_arg=self.kind_arg,
            flows=self.flows,
        )


def _numeric(values: list[Any]) -> np.ndarray:
    """Numbers as float64, NaN for a missing or non-numeric value (``pandas.to_numeric(errors="coerce")``).

    When numpy reads every value as a number (``int`` within 64 bits, ``float``: its dtype comes out integer or
    float), the values are converted by numpy: each Python ``int`` or ``float`` is rounded to the nearest float64
    by both, so the result is the same bit for bit; anything else (strings, ``None``, integers past 64 bits) goes
    through pandas as before.
    """
    try:
        fast = np.array(values)
    except (TypeError, ValueError, OverflowError):
        fast = None
    if fast is not None and fast.dtype.kind in "iuf":
        return fast.astype(np.float64)
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)


def _where(err: msgspec.ValidationError, first: int = 0) -> str:
    """msgspec's message with its JSON path told as "event N" (how the rest of this module names events);
    ``first``: the index of the batch's first event in the trace."""
    text = str(err)
    m = _AT_EVENT.search(text)
    if m:
        field = f" {m.group(2)}" if m.group(2) else ""
        return f"event {first + int(m.group(1))}{field}: {text[: m.start()]}"
    if "missing required field `traceEvents`" in text:
        return "the JSON object has no 'traceEvents'"
    return text.replace("`$`", "the document").replace("`$.traceEvents`", "'traceEvents'")


def _numbers(values: list[Any], what: str, path: str | os.PathLike[str], first: int = 0) -> np.ndarray:
    """``values`` as float64; a missing or non-numeric entry raises :class:`TraceError` (``first``: the index of
    the first value's complete event in the trace, for the message)."""
    try:
        out = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):  # a string, or an int past float64's range (msgspec keeps it)
        out = np.array([_float_or_nan(v) for v in values], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(out))
    if len(bad):
        raise TraceError(
            f"{os.fspath(path)}: not a Chrome trace (complete event {first + bad[0]} has {what} {values[bad[0]]!r})"
        )
    return out


def _numbers_of(
    rows: list[_Event], get: Callable[[_Event], Any], what: str, path: str | os.PathLike[str], first: int
) -> np.ndarray:
    """:func:`_numbers` of ``get`` of each row, without a list of the values when every one is a finite number:
    :func:`numpy.fromiter` converts each value with the same float64 conversion as :func:`numpy.asarray` with a
    dtype (numbers rounded to the nearest, numeric strings parsed, ``None`` read as NaN); anything else, or a
    value that is not finite, goes through :func:`_numbers`, which raises with the value in the message."""
    try:
        out = np.fromiter(map(get, rows), dtype=np.float64, count=len(rows))
    except (TypeError, ValueError, OverflowError):
        return _numbers(list(map(get, rows)), what, path, first)
    if not np.isfinite(out).all():
        return _numbers(list(map(get, rows)), what, path, first)
    return out


def _positions(values: list[Any], value: Any) -> list[int]:
    """The indices of the items equal to ``value`` (``list.index`` from each one found: a C scan, no Python per
    item)."""
    at: list[int] = []
    with contextlib.suppress(ValueError):
        while True:
            at.append(values.index(value, at[-1] + 1 if at else 0))
    return at


def _float_or_nan(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float64's range
        return np.nan


_PH, _CAT, _NAME, _PID, _TID, _TS, _DUR, _ARGS = map(
    operator.attrgetter, ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")
)
_CORRELATION, _NBYTES, _KIND = map(operator.attrgetter, ("correlation", "nbytes", "kind"))


def complete_events(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The events the table is made of: complete events (``"ph": "X"``) except the profiler's own ``Trace`` span,
    in file order. Row ``i`` of :func:`event_frame` is event ``i`` of this list."""
    return [e for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"]


def event_frame(events: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per complete event of an in-memory event list (:func:`complete_events`, in that order), every table
    column except ``self_us``: the same decoding and classification as :func:`read_kineto` (each event goes through
    the reader's decoder).

    Used by the XSpace reader on an XSpace fitprof converted from a Kineto trace (the events rebuilt from its
    planes) and by the converter (to record each device event's launching operator), so that a window gives the
    same table whichever file it is read from.

    Each batch of ``_BATCH`` events is encoded to one JSON array in one call: the same bytes as its events'
    encodings joined by ``,`` in brackets, as the reader's batches are. Every batch is encoded before the first is
    decoded, so an event that cannot be encoded is reported before any invalid value, as when each event was
    encoded on its own.

    Raises:
        TraceError: if an event has a missing or non-numeric ``ts`` / ``dur`` or a list or object as a name,
            cannot be encoded as JSON (a lone surrogate in a string, a value that is no JSON type), or nests deeper
            than the encoder's or the decoder's limit.
    """
    if type(events) not in (list, tuple):  # msgspec encodes lists and tuples, not any sequence
        events = list(events)
    n = len(events)
    try:
        payloads = [msgspec.json.encode(events[start : start + _BATCH]) for start in range(0, n, _BATCH)]
    except (TypeError, msgspec.EncodeError, UnicodeEncodeError) as err:  # the last: a lone surrogate
        raise TraceError(f"{os.fspath(path)}: not a Chrome trace ({err})") from None
    except RecursionError:
        raise _too_deep(Path(path)) from None

    def payload(start: int) -> bytes:
        text, payloads[start // _BATCH] = payloads[start // _BATCH], b""
        return text

    return _frame(_decode_batches(payload, n, Path(path)), path)


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


def _frame(cols: _Columns, path: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per complete event, every table column except ``self_us``."""
    columns = _frame_columns(cols, path)
    return pd.DataFrame(columns) if columns else pd.DataFrame()  # make_table adds the columns of an empty one


def _frame_columns(cols: _Columns, path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The columns of :func:`_frame` as arrays, in file order ({} when there are no complete events).

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

    threads = _Threads(pid_code, tid_code, len(tids))
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


class _Threads:
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
    threads: _Threads,
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
    found = _enclosing_ops(ts, dur, np.flatnonzero(is_op()), threads, queries)[inverse]
    names = np.full(len(found), "", dtype=object)
    has = found >= 0
    name_code, unique_names = name
    names[has] = unique_names[name_code[found[has]]]
    op[device] = names
    return launch_us, op


def _enclosing_ops(
    ts: np.ndarray, dur: np.ndarray, ops: np.ndarray, threads: _Threads, queries: np.ndarray
) -> np.ndarray:
    """Row of the innermost ``cpu_op`` (``ops``: their rows, ascending) that encloses each query event on its
    thread, -1 for none.

    "Encloses" means starts at or before the query and ends at or after it; of several, the one that starts
    last, the shortest on a tie, and on an exact tie (``aten::item`` and its ``aten::_local_scalar_dense``, both
    rounded to the same microseconds) the later in the file: Kineto writes a caller before its callee.

    The operators of all threads are sorted once (by thread, then start, longest first, then file order); the
    query's candidate is the last operator of its thread to start at or before it, and from there it climbs
    :func:`_parents` (within the thread) to the first that ends at or after the query's end: every operator
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
    parent = _parents(o_end, o_thread)
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
"""Rounds of pointer jumping in :func:`_parents` before the rest is finished one interval at a time."""


def _parents(end: np.ndarray, thread: np.ndarray | None = None) -> np.ndarray:
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

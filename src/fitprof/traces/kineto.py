"""PyTorch profiler (Kineto) Chrome traces -> the neutral event table (see :mod:`fitprof.traces._table`).

Reads ``*.pt.trace.json`` and ``*.json.gz`` files as written by ``torch.profiler`` / Kineto (``export_chrome_trace``,
``tensorboard_trace_handler``) without importing torch. The top level is either a dict holding ``traceEvents`` or
a bare list of events. Only complete events (``"ph": "X"``) are read; the profiler's own ``"cat": "Trace"`` span,
flow events and metadata events are dropped. ``ts`` and ``dur`` are microseconds.

Each event is classified by the rules of :mod:`fitprof.traces._kineto_rules` (its docstring has the table), which
the XSpace reader applies to a converted torch window too.
"""

from __future__ import annotations

import contextlib
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

from fitprof.traces._kineto_rules import Columns, frame, frame_columns, gc_paused
from fitprof.traces._limits import EventCounter, Limits, Text, count_objects, read_bounded
from fitprof.traces._repair import repair_names, repaired_names_warning
from fitprof.traces._table import PlainTable, TraceError, make_table, plain_from_columns


def read_kineto(
    path: str | os.PathLike[str], *, max_trace_mb: float | None = None, max_events: int | None = None
) -> pd.DataFrame:
    """Read a Kineto Chrome trace (``.pt.trace.json``, optionally gzipped) into an event table.

    Args:
        path: the trace file. Gzip is recognised by its magic bytes, whatever the file is called.
        max_trace_mb: the bound on the file's size, inflated, in MB (default 512; see
            :mod:`fitprof.traces._limits`). A gzip file is inflated in a stream that stops at the bound.
        max_events: the bound on the trace's events (default 10,000,000), counted as the file is read: a trace
            over it is refused as soon as the count passes it, before it is parsed.

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
    return read_kineto_plain(path, max_trace_mb=max_trace_mb, max_events=max_events).to_frame()


def read_kineto_plain(
    path: str | os.PathLike[str], *, max_trace_mb: float | None = None, max_events: int | None = None
) -> PlainTable:
    """:func:`read_kineto` as plain columns (:class:`~fitprof.traces._table.PlainTable`): the same arrays and
    ``attrs``, no DataFrame built. Raises as :func:`read_kineto`."""
    limits = Limits.of(max_trace_mb, max_events)
    with gc_paused():  # parsing creates millions of small objects; collecting them meanwhile doubles the time
        repaired: list[str] = []
        meta, events = _load(Path(path), limits, repaired)
        columns = frame_columns(events, path)
        threads = _threads(events) if columns else None
        del events
        table = plain_from_columns(columns, threads) if columns else PlainTable.of(make_table(pd.DataFrame()))
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


def _threads(cols: Columns) -> np.ndarray:
    """One integer per complete event, equal exactly where the table's ``pid`` and ``tid`` strings both are: the
    few distinct strings are coded (two values the decoder kept apart, ``5`` and ``"5"``, read ``"5"`` alike), then
    each event's codes are looked up in them, instead of coding a string column of every event."""
    pid_of, _ = pd.factorize(cols.pids)
    tid_of, tids = pd.factorize(cols.tids)
    return pid_of[cols.pid_code].astype(np.int64) * (len(tids) + 1) + tid_of[cols.tid_code]


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


class _Interner:
    """Codes for the values of one column across batches, in the order of first appearance."""

    def __init__(self, *, runs: bool = False) -> None:
        self.ids: dict[Any, int] = {}
        self.runs = runs  # the values mostly come in runs of equal integers (process, thread ids): _run_codes

    def codes(self, values: list[Any]) -> np.ndarray:
        """The code of each value (int64): equal values (``==``, as a dict's keys) share the code of the first.

        One C-level pass: ``first.setdefault(v, i)`` gives each value the position of the first equal one in the
        batch; only those few first values are looked up in ``ids``. The values the decoder gives (``str``,
        ``int``, ``float`` but never NaN, ``None``) are equal exactly when :func:`pandas.factorize` puts them
        together, so the codes and the kept values (the first of each) are the ones it gives. One exception
        follows it too: ``pandas.factorize`` returns a ``null`` (``None``) as a NaN of its own, so
        ``None`` gets a new NaN key in each batch (its own code per batch, the string ``"nan"``).
        """
        n = len(values)
        if self.runs:
            ints = np.array(values) if n else None
            if ints is not None and ints.dtype == np.int64:
                return self._run_codes(ints)
        first: dict[Any, int] = {}
        at = np.fromiter(map(first.setdefault, values, itertools.count()), dtype=np.int64, count=n)
        ids = self.ids
        lut = np.empty(n, dtype=np.int64)
        lut[np.fromiter(first.values(), dtype=np.int64, count=len(first))] = [
            ids.setdefault(float("nan") if u is None else u, len(ids)) for u in first
        ]
        return lut[at]

    def _run_codes(self, ints: np.ndarray) -> np.ndarray:
        """:meth:`codes` of values that are all Python ``int`` (``ints``: them as int64, which numpy makes only
        of ints that fit): each run of equal values is coded once. Process and thread ids come in long runs (a
        thread's events one after another), so the values looked up are a few hundred a batch, not one an event;
        ``tolist`` gives back ints equal to the values, so the codes are those of the lookup of every value."""
        n = len(ints)
        new_run = np.empty(n, dtype=bool)
        new_run[0] = True
        np.not_equal(ints[1:], ints[:-1], out=new_run[1:])
        starts = np.flatnonzero(new_run)
        ids = self.ids
        run_codes = np.array([ids.setdefault(u, len(ids)) for u in ints[starts].tolist()], dtype=np.int64)
        return np.repeat(run_codes, np.diff(starts, append=n))

    def strings(self) -> np.ndarray:
        return np.array(["" if u is None else str(u) for u in self.ids], dtype=object)


def _load(path: Path, limits: Limits, repaired: list[str] | None = None) -> tuple[Mapping[str, Any], Columns]:
    """The trace's ``distributedInfo`` and its complete events as columns, or :class:`TraceError`.

    A file that is invalid JSON only because of event names its writer left unescaped (torch's writers,
    pytorch/pytorch#146900) is read after :func:`fitprof.traces._repair.repair_names`; the names repaired are
    added to ``repaired``.

    The bounds of :mod:`fitprof.traces._limits` are checked first: the (inflated) size and the events
    (:class:`~fitprof.traces._limits.EventCounter`) while the file is read; before the three-pass reader, which
    holds every element of the array at once, its JSON objects too. Memory: the text, 56 bytes an event for the
    first pass, then the columns (about 70 bytes an event), which grow as the raw events are let go batch by batch.
    """
    events = EventCounter(path, limits, TraceError)
    data = read_bounded(path, limits, TraceError, count=events)
    # The one-pass path saves memory on a big text; on a small one its fixed cost (finding the array's end, 0.1-1.3
    # ms) outweighs the passes it saves: a 25 KB trace read in 0.5 ms by the three passes against 2.2 ms.
    fast = _load_in_chunks(data, path, events.n) if len(data) > _SMALL_TEXT else None
    if fast is not None:
        return fast
    if len(data) > _SMALL_TEXT:  # this reader holds every array element at once; a small text's are few
        count_objects(data, path, limits, TraceError)
    with _decode_errors(path):
        try:
            _PROBE.decode(data)  # the raw pass alone would hold 56 bytes for each value of a list of numbers
        except msgspec.DecodeError:
            text, names = repair_names(str(data, "utf-8", "surrogateescape"))  # a map has no decode()
            if not names:
                raise
            data = bytearray(text.encode("utf-8", "surrogateescape"))
            _PROBE.decode(data)
            if repaired is not None:
                repaired += names
        doc = _DECODER.decode(data)
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


_SMALL_TEXT = 1 << 17
"""Bytes of text up to which :func:`_load` reads with its three passes, not :func:`_load_in_chunks` (measured: the
three passes faster on traces of 25 and 67 KB, the one pass on those of 185 KB and more)."""
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


_CHUNK_OBJECTS = 1 << 16
"""The JSON objects one chunk of :func:`_load_in_chunks` may hold, about: each decodes to a struct of about 100 bytes
whether or not it is an event, and only events are counted against the events bound."""


def _chunk_bytes(data: Text, pos: int, stop: int) -> int:
    """The bytes of the next chunk from ``pos``: ``_CHUNK_BYTES``, less where they hold more than ``_CHUNK_OBJECTS``
    JSON objects (``{``), so that a text of objects that are not events (``{},`` repeated: 1.4 million structs in
    4 MB) costs no more a chunk than real events do (a real trace's 4 MB hold about 25k objects). A map handed over
    by fitprof's own export is not counted: it holds real events."""
    span = _CHUNK_BYTES
    if isinstance(data, bytearray):
        objects = data.count(b"{", pos, min(pos + span, stop))
        if objects > _CHUNK_OBJECTS:
            span = max(span * _CHUNK_OBJECTS // objects, 1)
    return span


class _Frame(msgspec.Struct, gc=False):
    """The document around the events (``traceEvents`` replaced by ``[]``)."""

    traceEvents: msgspec.Raw
    distributedInfo: msgspec.Raw = msgspec.Raw(b"null")
    profile_memory: msgspec.Raw = msgspec.Raw(b"null")


_FRAME_DECODER = msgspec.json.Decoder(_Frame | list[msgspec.Raw])


def _load_in_chunks(data: Text, path: Path, counted: int) -> tuple[dict[str, Any], Columns] | None:
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
    builder = _ColumnBuilder(path, counted)  # past the events counted: a TraceError, and the three-pass reader
    view = memoryview(data)
    pos = start + 1
    while pos < stop:
        cut_from, end, after = pos + _chunk_bytes(data, pos, stop), stop, stop
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


def _decode_between(data: Text, view: memoryview, pos: int, end: int) -> list[_Event]:
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


def _array_end(data: Text, start: int, bare: bool) -> tuple[int, _Frame | list[Any] | None]:
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


def _columns(raws: list[Any], path: Path) -> Columns:
    """Decode the raw events a batch at a time into columns; each batch's raw events are let go once joined."""

    def payload(start: int) -> bytes:
        stop = min(start + _BATCH, len(raws))
        joined = b"[" + b",".join(raws[start:stop]) + b"]"
        raws[start:stop] = [None] * (stop - start)
        return joined

    return _decode_batches(payload, len(raws), path)


def _decode_batches(payload: Callable[[int], bytes], n: int, path: Path) -> Columns:
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
    with _decode_errors(path, start, f"in events {start}-{stop - 1}: "):
        return _BATCH_DECODER.decode(payload)


class _ColumnBuilder:
    """The columns of :class:`Columns`, filled a batch of decoded events at a time (names, threads and flow
    arrows that span batches come out as in one batch).

    ``capacity`` is an upper bound on the complete events (the events counted in the text, or the array's length): each
    column is allocated once at that length and filled in place. Its pages that are never written are never
    resident, so the bound costs address space, not memory; no batch list is joined (joining would hold the
    columns twice).
    """

    _FLOAT_KEYS = ("ts", "dur", "corr", "bytes")

    def __init__(self, path: Path, capacity: int) -> None:
        self.path = path
        self.interners = {k: _Interner(runs=k in ("pid", "tid")) for k in ("cat", "name", "pid", "tid")}
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
        complete = list(map(operator.eq, map(_PH, rows), itertools.repeat("X")))  # ``ph == "X"`` for each
        traces = _positions(cats, "Trace")  # the profiler's own span, once a trace
        for i in traces:
            complete[i] = False
        # None: all complete (a generated trace, most batches of a real one)
        keep = complete if False in complete else None
        del complete
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
        if end > len(cols["ts"]):  # an event key spelled with a \u escape was not counted: the caller reads anew
            raise TraceError(f"{path}: more complete events than counted")
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

    def finish(self) -> Columns:
        cols, interners, n = self.cols, self.interners, self.done
        return Columns(
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
    through pandas.
    """
    try:
        fast = np.array(values)
    except (TypeError, ValueError, OverflowError):
        fast = None
    if fast is not None and fast.dtype.kind in "iuf":
        return fast.astype(np.float64)
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)


@contextlib.contextmanager
def _decode_errors(path: Path, first: int = 0, where: str = "") -> Iterator[None]:
    """Turn msgspec's errors inside the block into one :class:`TraceError` naming ``path``: an invalid value by its
    event (``first``: the index of the block's first event in the trace), invalid JSON with ``where`` before
    msgspec's message, too deep a nesting as such."""
    try:
        yield
    except msgspec.ValidationError as err:
        raise TraceError(f"{path}: not a Chrome trace ({_where(err, first)})") from None
    except msgspec.DecodeError as err:
        raise TraceError(f"{path}: not valid JSON ({where}{err})") from None
    except RecursionError:
        raise _too_deep(path) from None


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
    decoded, so an event that cannot be encoded is reported before any invalid value, whichever batch each is in.

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

    return frame(_decode_batches(payload, n, Path(path)), path)


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

"""The events of an XSpace's lines as columns: each event's metadata id, offset and duration, and the stats of
the events that need them, split from protobuf's wire format with numpy (:func:`decode_events`), or read event
by event from protobuf's messages (:func:`message_events`) for a file the wire decoder does not read.

The XSpace reader (:mod:`fitprof.traces.xspace`) builds its tables from these columns, TensorFlow's and JAX's
by their rules and a converted torch window by the Kineto rules; protobuf parses the file with each event left as
its bytes (:func:`~fitprof.traces._xplane_schema.xplane_raw_classes`), and only the lines and stats a reader uses
are decoded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from fitprof.traces import _xplane_schema as xs
from fitprof.traces._table import TraceError

VALUE_FIELDS = {
    "double_value": 2,
    "uint64_value": 3,
    "int64_value": 4,
    "str_value": 5,
    "bytes_value": 6,
    "ref_value": 7,
}
"""``XStat``'s value fields and their field numbers: a stat's ``kind`` below (0: no value)."""
DOUBLE, UINT64, INT64, STR, BYTES_VALUE, REF = 2, 3, 4, 5, 6, 7


@dataclasses.dataclass
class Events:
    """The events of the lines a reader uses, as columns: each line's events in file order, lines in the order
    given; and the stats of the events of the lines read with stats, in file order.

    ``stat_kind`` is the field number of the stat's value (:data:`VALUE_FIELDS`; 0 when it has none);
    ``values(idx)`` gives the values of the stats ``idx`` as protobuf gives them (``float``, ``int``, ``str``,
    ``bytes``, ``None``; a ``ref_value`` as its ``int``).
    """

    line: np.ndarray
    metadata_id: np.ndarray
    offset_ps: np.ndarray
    duration_ps: np.ndarray
    stat_event: np.ndarray
    stat_id: np.ndarray
    stat_kind: np.ndarray
    values: Callable[[np.ndarray], np.ndarray]


_T = TypeVar("_T")


def with_events(
    data: bytearray,
    path: Path,
    space: Any,
    lines: list[tuple[int, int]],
    stats: Sequence[bool],
    build: Callable[[Events], _T],
) -> _T:
    """``build`` of the events of ``lines`` (``(plane index, line index)`` of ``space``, read with the raw classes),
    with their stats where ``stats`` says so, decoded from their bytes with numpy (:func:`decode_events`).

    A file that path does not read (not valid protobuf there, a string ``build`` reads that is not UTF-8, or a
    group) is parsed whole by protobuf, which raises its own error, or else read event by event
    (:func:`message_events`). The events of lines not in ``lines``, and the stats not read, are not checked.
    """
    events = decode_events([space.planes[i].lines[j].events for i, j in lines], stats)
    if events is not None:
        try:
            return build(events)
        except _NotUtf8:
            pass
    full = parse(data, path, xs.xplane_classes()["XSpace"])
    return build(message_events([full.planes[i].lines[j] for i, j in lines], stats))


_BATCH_BYTES = 1 << 19
"""Bytes of events :func:`decode_events` splits into fields in one call of
:func:`~fitprof.traces._xplane_schema.decode_fields`: that call holds about 50 bytes a field (its rounds, then
the :class:`~fitprof.traces._xplane_schema.Fields`) and a field takes at least 2 bytes; a batch, its
temporaries included, took at most 35 MB under ``tracemalloc`` (messages of one 2-byte field each; 11 MB for
events of twenty), whatever the file. What is kept of a batch is a few columns per event and per stat. As fast
as 1 MiB and faster than one batch for all (the arrays stay in cache): 27 ms against 34 ms on a 2.7 MB
TensorFlow GPU XSpace, 158 ms against 232 ms on a 9 MB converted one (2026-11-30)."""


_ROUNDS_PER_BATCH = 64
"""The numpy rounds of :func:`~fitprof.traces._xplane_schema.decode_fields` a batch may take on average over a file
(beyond one call's :data:`~fitprof.traces._xplane_schema.MAX_ROUNDS`): a round costs the same whatever the batch
holds, so a file whose every batch holds an event of a thousand fields would take a thousand rounds a batch
(1.55 s for 10 MB against 0.04 s for protobuf's parse); real events have a few fields and a few dozen stats."""


_JOIN_EVENTS = 1 << 16
"""Events :func:`decode_events` takes out of protobuf's container (a bytes object each) at a time."""


def decode_events(raw: list[Any], with_stats: Sequence[bool], batch_bytes: int = _BATCH_BYTES) -> Events | None:
    """:class:`Events` from each line's serialized events (``repeated bytes`` of the raw classes), all lines at
    once: one buffer, then :func:`fitprof.traces._xplane_schema.decode_fields` over its events ``batch_bytes`` of
    events at a time (at least one event a batch), and over the stats of each batch's events of the lines read
    with stats. ``None`` when the wire decoder gives up or a string value read is not UTF-8 (protobuf refuses
    both).

    Memory: the buffer (a copy of the events' bytes), 32 bytes a decoded event and 25 a stat kept, and one batch's
    fields at a time (:data:`_BATCH_BYTES`): the fields of all events at once came to 58-78 bytes a field, 886 MB
    for a crafted 24 MB file of 500k events with 20 unknown fields each.
    """
    counts = [len(r) for r in raw]
    # Each event read from protobuf's container is a new bytes object (about 40 bytes more than the event): made
    # and joined _JOIN_EVENTS at a time, not all at once.
    parts: list[bytes] = []
    size_parts: list[np.ndarray] = []
    for r in raw:
        for i in range(0, len(r), _JOIN_EVENTS):
            some = r[i : i + _JOIN_EVENTS]
            size_parts.append(np.fromiter(map(len, some), dtype=np.int64, count=len(some)))
            parts.append(b"".join(some))
            del some
    parts.append(bytes(xs.WIRE_PAD))
    blob = b"".join(parts)
    del parts
    sizes = np.concatenate(size_parts) if size_parts else np.zeros(0, dtype=np.int64)
    del size_parts
    buf = np.frombuffer(blob, dtype=np.uint8)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    del sizes
    n = len(starts)
    line = np.repeat(np.arange(len(raw), dtype=np.int64), counts)
    want = np.asarray(with_stats, dtype=bool)[line] if n else np.zeros(0, dtype=bool)
    mid, off, dur = (np.zeros(n, dtype=np.int64) for _ in range(3))
    # A stat's event and value start as int32 where they fit, its value field as int8: 25 bytes a stat kept.
    types = (np.int32 if n < 2**31 else np.int64, np.int32 if len(buf) < 2**31 else np.int64)
    kept: list[list[np.ndarray]] = []  # per batch: the stats' event, id, value field, value bits, start
    lo = 0
    rounds = [xs.MAX_ROUNDS]  # rounds left to the whole file: one call's worth, plus _ROUNDS_PER_BATCH a batch
    while lo < n:
        hi = max(int(np.searchsorted(ends, starts[lo] + batch_bytes, side="right")), lo + 1)
        rounds[0] += _ROUNDS_PER_BATCH
        got = _decode_batch(buf, starts[lo:hi], ends[lo:hi], want[lo:hi], types, rounds)
        if got is None:
            return None
        (mid[lo:hi], off[lo:hi], dur[lo:hi]), stats = got
        stats[0] += lo
        kept.append(stats)
        lo = hi
    if not kept:  # no events
        kept.append([np.zeros(0, dtype=t) for t in (types[0], np.int64, np.int8, np.uint64, types[1])])
    stat_event, stat_id, kind, bits, at = (np.concatenate(cols) for cols in zip(*kept, strict=True))
    del kept

    def values(idx: np.ndarray) -> np.ndarray:
        out = np.full(len(idx), None, dtype=object)
        k, b = kind[idx], bits[idx]
        for code, conv in ((DOUBLE, np.float64), (INT64, np.int64)):
            sel = k == code
            if sel.any():
                out[sel] = b[sel].view(conv).tolist()
        sel = (k == UINT64) | (k == REF)
        if sel.any():
            out[sel] = b[sel].tolist()
        for code in (STR, BYTES_VALUE):
            sel = np.flatnonzero(k == code)
            if len(sel):
                out[sel] = texts(blob, buf, at[idx[sel]], b[sel].astype(np.int64), code == STR)
        return out

    return Events(line, mid, off, dur, stat_event, stat_id, kind, values)


def _decode_batch(
    buf: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    want: np.ndarray,
    types: tuple[type, type],
    rounds: list[int],
) -> tuple[tuple[np.ndarray, ...], list[np.ndarray]] | None:
    """One batch of :func:`decode_events`: the events ``buf[starts[i]:ends[i]]``' ``(metadata_id, offset_ps,
    duration_ps)`` and, of the events ``want`` says, their stats' ``[event (in the batch), metadata id, value field
    number, value bits, value start]`` (the event and the start as ``types``); ``None`` when the wire decoder gives
    up, or when the rounds it needs pass ``rounds[0]`` (the file's rounds left; taken from it)."""
    n = len(starts)
    f = xs.decode_fields(buf, starts, ends, min(xs.MAX_ROUNDS, rounds[0]))
    if f is None:
        return None
    rounds[0] -= f.rounds
    # proto3: the last value of each field wins; offset_ps and num_occurrences are one oneof (the last one set).
    mid = _pick(f.value, f.last(n, 1, xs.WIRE_VARINT)).view(np.int64)
    dur = _pick(f.value, f.last(n, 3, xs.WIRE_VARINT)).view(np.int64)
    data = f.last_of(n, ((f.number == 2) | (f.number == 5)) & (f.wire == xs.WIRE_VARINT))
    off = np.where(_pick(f.number, data) == 2, _pick(f.value, data), 0).astype(np.uint64).view(np.int64)
    stat = np.flatnonzero((f.number == 4) & (f.wire == xs.WIRE_LEN) & want[f.msg])
    start = f.at[stat]
    stat_event: np.ndarray = f.msg[stat].astype(types[0])
    g = xs.decode_fields(buf, start, start + f.value[stat].astype(np.int64), min(xs.MAX_ROUNDS, rounds[0]))
    del f
    if g is None:
        return None
    rounds[0] -= g.rounds
    m = len(stat)
    value_field = np.zeros(len(g.number), dtype=bool)
    for number, wire in ((2, xs.WIRE_I64), (3, xs.WIRE_VARINT), (4, xs.WIRE_VARINT), (5, xs.WIRE_LEN),
                         (6, xs.WIRE_LEN), (7, xs.WIRE_VARINT)):  # fmt: skip
        value_field |= (g.number == number) & (g.wire == wire)
    v = g.last_of(m, value_field)  # XStat's value is a oneof: the last value field set
    stat_id = _pick(g.value, g.last(m, 1, xs.WIRE_VARINT)).view(np.int64)
    kind, bits = _pick(g.number, v).astype(np.int8), _pick(g.value, v)
    at: np.ndarray = _pick(g.at, v).astype(types[1])
    return (mid, off, dur), [stat_event, stat_id, kind, bits, at]


class _NotUtf8(Exception):
    """A string value that protobuf would refuse."""


_SHORT = 64
"""Strings up to this many bytes are coded by :func:`_short_codes`, longer ones as Python objects."""
_BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)
"""``_BYTE_MASKS[k]`` keeps the low ``k`` bytes of a little-endian word."""


def texts(blob: bytes, buf: np.ndarray, at: np.ndarray, size: np.ndarray, decode: bool) -> np.ndarray:
    """The byte strings ``blob[at:at + size]`` (``buf``: ``blob`` as uint8, with
    :data:`~fitprof.traces._xplane_schema.WIRE_PAD` bytes after the last message), as ``str`` when ``decode``:
    each distinct one built once and shared by the values equal to it.

    Strings of at most 64 bytes (categories, op names) are told apart without a Python object each
    (:func:`_short_codes`); longer ones are sliced and coded with ``pandas.factorize``. The two sets are coded
    apart (a string is in one or the other by its length), so a long string costs nothing to the short ones.

    Raises:
        _NotUtf8: if one is not UTF-8 (protobuf refuses a ``string`` field that is not).
    """
    n = len(at)
    codes = np.empty(n, dtype=np.int64)
    pieces: list[bytes] = []
    short = size <= _SHORT
    for sel, longer in ((np.flatnonzero(short), False), (np.flatnonzero(~short), True)):
        if not len(sel):
            continue
        a, s = at[sel].astype(np.int64), size[sel]
        if longer:
            sliced = np.empty(len(sel), dtype=object)
            sliced[:] = [blob[x : x + k] for x, k in zip(a.tolist(), s.tolist(), strict=True)]
            c, found = pd.factorize(sliced)
            found = list(found)
        else:
            c = _short_codes(buf, a, s)
            # Codes come in order of first appearance: a value's first is where the running maximum grows.
            seen = np.maximum.accumulate(c)
            first = np.flatnonzero(np.concatenate(([True], seen[1:] > seen[:-1])))
            found = [blob[x : x + k] for x, k in zip(a[first].tolist(), s[first].tolist(), strict=True)]
        codes[sel] = np.asarray(c, dtype=np.int64) + len(pieces)
        pieces += found
    uniques = np.empty(len(pieces), dtype=object)
    try:
        uniques[:] = [u.decode("utf-8") for u in pieces] if decode else pieces
    except UnicodeDecodeError:
        raise _NotUtf8 from None
    return uniques[codes]


def _short_codes(buf: np.ndarray, at: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Codes of the byte strings ``buf[at:at + size]`` (each at most :data:`_SHORT` bytes, inside a message of
    ``buf``), in order of first appearance: equal codes are equal strings.

    Their length, then each 8-byte word of them (a view of ``buf`` with a stride of one byte, the bytes past a
    string's end masked off) are coded a column at a time (``pandas.factorize``), up to the longest one's last
    word: a few arrays of one value per string, whatever the lengths (a window of each string padded to the
    longest one cost about 10 bytes (an int64 index, the byte, a mask) per byte of that length, for every string).
    """
    words = np.ndarray(shape=(len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))
    last_word = len(buf) - 8
    codes = np.asarray(pd.factorize(size)[0], dtype=np.int64)
    for w in range(-(-int(size.max()) // 8)):
        valid = np.clip(size - 8 * w, 0, 8)
        # A word with bytes of the string lies within buf (the padding follows the last message); one without is
        # masked to 0, wherever it is read.
        pos = np.minimum(at + 8 * w, last_word)
        word = words[pos] & _BYTE_MASKS[valid]
        coded = np.asarray(pd.factorize(word)[0], dtype=np.int64)
        codes = np.asarray(pd.factorize(codes * (int(coded.max()) + 1) + coded)[0], dtype=np.int64)
    return codes


def _pick(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``values[idx]``, 0 where ``idx`` is -1 (a field not set: proto3's default)."""
    out = values[np.maximum(idx, 0)] if len(values) else np.zeros(len(idx), dtype=values.dtype)
    out[idx < 0] = 0
    return out


def message_events(lines: list[Any], with_stats: Sequence[bool]) -> Events:
    """:class:`Events` read event by event from protobuf's messages (the full classes): the reader of a file
    :func:`decode_events` does not read, and the reference its tests compare it with."""
    line: list[int] = []
    mid: list[int] = []
    off: list[int] = []
    dur: list[int] = []
    stat_event: list[int] = []
    stat_id: list[int] = []
    stat_kind: list[int] = []
    stat_values: list[Any] = []
    for i, (ln, want) in enumerate(zip(lines, with_stats, strict=True)):
        for ev in ln.events:
            if want:
                for st in ev.stats:
                    which = st.WhichOneof("value")
                    stat_event.append(len(mid))
                    stat_id.append(st.metadata_id)
                    stat_kind.append(VALUE_FIELDS[which] if which else 0)
                    stat_values.append(getattr(st, which) if which else None)
            line.append(i)
            mid.append(ev.metadata_id)
            off.append(ev.offset_ps)
            dur.append(ev.duration_ps)

    def values(idx: np.ndarray) -> np.ndarray:
        out = np.empty(len(idx), dtype=object)
        out[:] = [stat_values[i] for i in idx.tolist()]
        return out

    def ints(xs_: list[int]) -> np.ndarray:
        return np.array(xs_, dtype=np.int64)

    return Events(ints(line), ints(mid), ints(off), ints(dur), ints(stat_event), ints(stat_id), ints(stat_kind),
                   values)  # fmt: skip


def last_stats(events: Events, among: np.ndarray, ids: dict[int, int], last: np.ndarray) -> np.ndarray:
    """For each stat name, the last stat of each event with that name, into ``last`` (shape (names, events),
    stat index or -1), from the stats ``among`` (a mask: one plane's, whose metadata ids ``ids`` maps to name
    indices; other stats are not looked at). Returns the stats picked."""
    if not ids or not among.any():
        return np.zeros(0, dtype=np.int64)
    keys = np.fromiter(ids.keys(), dtype=np.int64, count=len(ids))
    names = np.fromiter(ids.values(), dtype=np.int64, count=len(ids))
    order = np.argsort(keys)
    keys, names = keys[order], names[order]
    pos = np.searchsorted(keys, events.stat_id).clip(0, len(keys) - 1)
    stat = np.flatnonzero(among & (keys[pos] == events.stat_id))
    pos = pos[stat]
    which = names[pos]
    # The last of each (name, event): stats are in event order, so a stable sort by name keeps each event's in order.
    by = np.argsort(which, kind="stable")
    stat, which = stat[by], which[by]
    ev = events.stat_event[stat]
    end = np.ones(len(stat), dtype=bool)
    end[:-1] = (which[1:] != which[:-1]) | (ev[1:] != ev[:-1])
    last[which[end], ev[end]] = stat[end]
    return stat[end]


def parse(data: bytearray, path: Path, cls: Any) -> Any:
    """``data`` parsed as the protobuf message class ``cls``, or :class:`TraceError` with protobuf's error as the
    full (not the raw) classes give it."""
    try:
        return cls.FromString(data)  # a bytearray is read in place, not copied
    except Exception as err:  # DecodeError and friends: not this message type
        if cls is not xs.xplane_classes()["XSpace"]:  # raises with the full classes' error
            parse(data, path, xs.xplane_classes()["XSpace"])
        raise TraceError(f"{path}: not an XSpace protobuf ({type(err).__name__}: {err})") from None

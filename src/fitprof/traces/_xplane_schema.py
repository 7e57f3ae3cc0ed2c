"""The XSpace schema shared by the ``.xplane.pb`` reader (:mod:`fitprof.traces.xspace`) and the Kineto -> XSpace
writer (:mod:`fitprof.traces.xspace_write`): the protobuf message classes and the names of the planes, lines and
stats either side relies on.

The message classes are built at runtime from a ``FileDescriptorProto`` replicating tsl's
``tsl/profiler/protobuf/xplane.proto`` (same field numbers, so the bytes are identical), under the package
``fitprof.xplane`` so that they never clash with TensorFlow's ``tensorflow.profiler`` classes in one process. No
TensorFlow or xprof is needed. The reader parses with a second set (:func:`xplane_raw_classes`, package
``fitprof.xplane_raw``) that leaves each event as its bytes, and splits the events it uses into fields with
:func:`decode_fields` (numpy over the wire format, all messages at once).

Names xprof 2.24 gives a meaning to (``tsl/profiler/utils/xplane_schema.h``), and what fitprof's writer puts in
them:

* planes ``/host:CPU`` (host threads, one line each), ``/device:GPU:<N>`` (one line per stream, named
  ``Stream #<id>``) and ``Task Environment`` (``profile_start_time`` / ``profile_stop_time``, ns since the epoch);
* event stats ``step_num`` + ``_r`` (``_r=1``: a root event, i.e. a step marker), ``group_id`` (the step an
  event belongs to; xprof assigns it, fitprof writes it only on the ``Host steps`` line), ``correlation_id`` (links a
  device event to the host call that launched it), ``tf_op`` (the framework op an event belongs to: what
  xprof's op statistics group by), ``_ipl_stage_name`` (an input-pipeline stage: xprof counts time in it as
  "Input" on the input-pipeline and overview pages), ``memcpy_details``.

Names only fitprof reads (the writer records them so that the reader rebuilds the Kineto trace's event table
exactly):

* event stats ``category`` (Kineto's ``cat``) and ``correlation`` (Kineto's name for ``correlation_id``, on the
  device events xprof must not count: syncs, memsets, device-side annotations);
* ``Task Environment`` stats ``fitprof_source`` (``"kineto"``: this XSpace was converted by fitprof from a
  PyTorch trace), ``fitprof_framework``, ``fitprof_host``, ``fitprof_rank``, ``fitprof_world_size``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

HOST_PLANE = "/host:CPU"
"""The host plane of a single-host XSpace (TensorFlow's name; xprof reads host threads from it)."""
DEVICE_PLANE_PREFIX = "/device:GPU:"
"""Prefix of a GPU's plane; the device index follows."""
TASK_ENV_PLANE = "Task Environment"
"""The plane holding run-wide stats (profile start / stop times)."""
STREAM_LINE_PREFIX = "Stream #"
"""Prefix of a device stream's line (the stream id follows), as TensorFlow's GPU tracer names them."""
HOST_STEPS_LINE = "Host steps"
"""A device plane's line that repeats the host's step markers with xprof's ``group_id`` (written by fitprof's
converter so that xprof's device steps span the host steps; fitprof's reader skips it)."""

# Event stats xprof reads.
STAT_STEP_NUM = "step_num"
STAT_GROUP_ID = "group_id"
STAT_ROOT = "_r"
STAT_CORRELATION_ID = "correlation_id"
STAT_TF_OP = "tf_op"
STAT_INPUT_STAGE = "_ipl_stage_name"
STAT_MEMCPY_DETAILS = "memcpy_details"
STAT_PROFILE_START = "profile_start_time"
STAT_PROFILE_STOP = "profile_stop_time"
# A device plane's capabilities (TensorFlow's GPU tracer writes them; xprof reads them into DeviceCapabilities).
STAT_DEVICE_VENDOR = "device_vendor"
VENDOR_NVIDIA = "Nvidia"
VENDOR_AMD = "AMD"
STAT_COMPUTE_CAP_MAJOR = "compute_cap_major"
STAT_COMPUTE_CAP_MINOR = "compute_cap_minor"
STAT_CORE_COUNT = "core_count"
STAT_MEMORY_SIZE = "memory_size"
STAT_DEVICE_NAME = "gpu_device_name"

# Stats only fitprof reads.
STAT_CATEGORY = "category"
STAT_KINETO_CORRELATION = "correlation"
"""Kineto's own name for the correlation id, kept on device events xprof must not count (syncs, memsets)."""
STAT_SOURCE = "fitprof_source"
STAT_FRAMEWORK = "fitprof_framework"
STAT_HOST = "fitprof_host"
STAT_KINETO_BASE_NS = "fitprof_kineto_base_ns"
"""The Kineto trace's ``baseTimeNanoseconds`` (its ``ts`` count from it), so that the converted reader gives the
times the trace's JSON holds."""
STAT_RANK = "fitprof_rank"
STAT_WORLD_SIZE = "fitprof_world_size"
SOURCE_KINETO = "kineto"
"""Value of :data:`STAT_SOURCE` in an XSpace fitprof converted from a Kineto trace."""

_PACKAGE = "fitprof.xplane"
_FILE = "fitprof/xplane.proto"

# (name, number, label, type, type_name, oneof_index) per message; replicates tsl's xplane.proto.
_OPT, _REP = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_T = descriptor_pb2.FieldDescriptorProto
_MESSAGES: dict[str, list[tuple[str, int, int, int, str, int | None]]] = {
    "XSpace": [
        ("planes", 1, _REP, _T.TYPE_MESSAGE, "XPlane", None),
        ("errors", 2, _REP, _T.TYPE_STRING, "", None),
        ("warnings", 3, _REP, _T.TYPE_STRING, "", None),
        ("hostnames", 4, _REP, _T.TYPE_STRING, "", None),
    ],
    "XPlane": [
        ("id", 1, _OPT, _T.TYPE_INT64, "", None),
        ("name", 2, _OPT, _T.TYPE_STRING, "", None),
        ("lines", 3, _REP, _T.TYPE_MESSAGE, "XLine", None),
        ("event_metadata", 4, _REP, _T.TYPE_MESSAGE, "XPlane.EventMetadataEntry", None),
        ("stat_metadata", 5, _REP, _T.TYPE_MESSAGE, "XPlane.StatMetadataEntry", None),
        ("stats", 6, _REP, _T.TYPE_MESSAGE, "XStat", None),
    ],
    "XLine": [
        ("id", 1, _OPT, _T.TYPE_INT64, "", None),
        ("display_id", 10, _OPT, _T.TYPE_INT64, "", None),
        ("name", 2, _OPT, _T.TYPE_STRING, "", None),
        ("display_name", 11, _OPT, _T.TYPE_STRING, "", None),
        ("timestamp_ns", 3, _OPT, _T.TYPE_INT64, "", None),
        ("duration_ps", 9, _OPT, _T.TYPE_INT64, "", None),
        ("events", 4, _REP, _T.TYPE_MESSAGE, "XEvent", None),
    ],
    "XEvent": [
        ("metadata_id", 1, _OPT, _T.TYPE_INT64, "", None),
        ("offset_ps", 2, _OPT, _T.TYPE_INT64, "", 0),
        ("num_occurrences", 5, _OPT, _T.TYPE_INT64, "", 0),
        ("duration_ps", 3, _OPT, _T.TYPE_INT64, "", None),
        ("stats", 4, _REP, _T.TYPE_MESSAGE, "XStat", None),
    ],
    "XStat": [
        ("metadata_id", 1, _OPT, _T.TYPE_INT64, "", None),
        ("double_value", 2, _OPT, _T.TYPE_DOUBLE, "", 0),
        ("uint64_value", 3, _OPT, _T.TYPE_UINT64, "", 0),
        ("int64_value", 4, _OPT, _T.TYPE_INT64, "", 0),
        ("str_value", 5, _OPT, _T.TYPE_STRING, "", 0),
        ("bytes_value", 6, _OPT, _T.TYPE_BYTES, "", 0),
        ("ref_value", 7, _OPT, _T.TYPE_UINT64, "", 0),
    ],
    "XEventMetadata": [
        ("id", 1, _OPT, _T.TYPE_INT64, "", None),
        ("name", 2, _OPT, _T.TYPE_STRING, "", None),
        ("display_name", 4, _OPT, _T.TYPE_STRING, "", None),
        ("metadata", 3, _OPT, _T.TYPE_BYTES, "", None),
        ("stats", 5, _REP, _T.TYPE_MESSAGE, "XStat", None),
        ("child_id", 6, _REP, _T.TYPE_INT64, "", None),
    ],
    "XStatMetadata": [
        ("id", 1, _OPT, _T.TYPE_INT64, "", None),
        ("name", 2, _OPT, _T.TYPE_STRING, "", None),
        ("description", 3, _OPT, _T.TYPE_STRING, "", None),
    ],
}
_ONEOFS = {"XEvent": "data", "XStat": "value"}
_MAP_ENTRIES = {"EventMetadataEntry": "XEventMetadata", "StatMetadataEntry": "XStatMetadata"}

_CLASSES: dict[str, Any] = {}


def _file_descriptor(
    package: str = _PACKAGE, file: str = _FILE, raw_events: bool = False
) -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name=file, package=package, syntax="proto3")
    for msg_name, fields in _MESSAGES.items():
        msg = fdp.message_type.add(name=msg_name)
        if msg_name in _ONEOFS:
            msg.oneof_decl.add(name=_ONEOFS[msg_name])
        for name, number, label, ftype, type_name, oneof in fields:
            if raw_events and (msg_name, name) == ("XLine", "events"):
                ftype, type_name = _T.TYPE_BYTES, ""  # same wire type (length-delimited): each event's bytes
            f = msg.field.add(name=name, number=number, label=label, type=ftype)
            if type_name:
                f.type_name = f".{package}.{type_name}"
            if oneof is not None:
                f.oneof_index = oneof
        if msg_name == "XPlane":
            for entry, value_type in _MAP_ENTRIES.items():
                nested = msg.nested_type.add(name=entry)
                nested.options.map_entry = True
                nested.field.add(name="key", number=1, label=_OPT, type=_T.TYPE_INT64)
                nested.field.add(
                    name="value", number=2, label=_OPT, type=_T.TYPE_MESSAGE, type_name=f".{package}.{value_type}"
                )
    return fdp


def xplane_classes() -> dict[str, Any]:
    """The XSpace message classes (``XSpace``, ``XPlane``, ``XLine``, ``XEvent``, ``XStat``, ...), built once.

    They are wire-compatible with ``tensorflow.tsl.profiler.protobuf.xplane_pb2`` (same field numbers) but
    live in the protobuf package ``fitprof.xplane``.
    """
    if not _CLASSES:
        pool = descriptor_pool.DescriptorPool()
        fd = pool.Add(_file_descriptor())
        fd = pool.FindFileByName(_FILE) if fd is None else fd
        for name in _MESSAGES:
            desc = pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")
            _CLASSES[name] = message_factory.GetMessageClass(desc)
    return _CLASSES


_RAW_PACKAGE = "fitprof.xplane_raw"
_RAW_FILE = "fitprof/xplane_raw.proto"
_RAW_CLASSES: dict[str, Any] = {}


def xplane_raw_classes() -> dict[str, Any]:
    """The classes of :func:`xplane_classes` for reading, except that ``XLine.events`` is ``repeated bytes``: each
    event stays its serialized ``XEvent`` (the same bytes on the wire), built as a Python object only when read.

    Parsing a file with them checks everything but the events' insides and costs a tenth of a full parse (3.5 ms
    against 37 ms for a 9 MB XSpace of 196k events, 2026-11-30); the reader then decodes the events of the lines it
    uses with :func:`decode_fields`, and only those.
    """
    if not _RAW_CLASSES:
        pool = descriptor_pool.DescriptorPool()
        pool.Add(_file_descriptor(_RAW_PACKAGE, _RAW_FILE, raw_events=True))
        for name in _MESSAGES:
            desc = pool.FindMessageTypeByName(f"{_RAW_PACKAGE}.{name}")
            _RAW_CLASSES[name] = message_factory.GetMessageClass(desc)
    return _RAW_CLASSES


def stat_value(stat: Any, stat_names: dict[int, str]) -> Any:
    """An ``XStat``'s value as Python: ``int`` / ``float`` / ``str``; a ``ref_value`` resolved to the referenced
    stat metadata's name; ``None`` for bytes and unset values."""
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return stat_names.get(stat.ref_value, "")
    if kind is None or kind == "bytes_value":
        return None
    return getattr(stat, kind)


# ------------------------------------------------------------------------------------------ wire decoding
WIRE_VARINT, WIRE_I64, WIRE_LEN, WIRE_I32 = 0, 1, 2, 5
"""The protobuf wire types :func:`decode_fields` reads; groups (3, 4) and 6, 7 make it give up."""
_MAX_FIELD_NUMBER = (1 << 29) - 1
MAX_ROUNDS = 1024
"""The most numpy rounds (fields of the longest message) :func:`decode_fields` takes before it gives up: at about
70 us a round, more would cost more than protobuf's own parse of the same bytes."""
WIRE_PAD = 10
"""Zero bytes :func:`decode_fields` needs after the last message (the longest varint), so that reading a varint
that runs past a message's end never reads past the array: the overrun is then caught against the end."""


@dataclasses.dataclass
class Fields:
    """Every field of a batch of messages, in wire order within each message (messages in index order).

    ``value`` is the varint (wire type 0) or the little-endian bits (1: 64, 5: 32) as ``uint64``, or the length of
    a length-delimited value (2), whose bytes start at ``at``.
    """

    msg: np.ndarray
    """int64: the message's index (into the ``starts`` given)."""
    number: np.ndarray
    """int32: the field number."""
    wire: np.ndarray
    """int8: the wire type."""
    value: np.ndarray
    """uint64."""
    at: np.ndarray
    """int64: where the value starts in the buffer (after the tag, and the length of a length-delimited one)."""
    rounds: int = 0
    """The numpy rounds the split took: the fields of the longest message."""

    def last(self, n: int, number: int, wire: int) -> np.ndarray:
        """Index (into these fields) of the last field ``number`` of each of ``n`` messages read as the schema
        declares it (wire type ``wire``; another wire type is an unknown field, as protobuf reads it), -1 for
        none: proto3 keeps the last value of a repeated scalar."""
        return self.last_of(n, (self.number == number) & (self.wire == wire))

    def last_of(self, n: int, selected: np.ndarray) -> np.ndarray:
        """Index of the last selected field of each of ``n`` messages, -1 for none."""
        idx = np.flatnonzero(selected)
        out = np.full(n, -1, dtype=np.int64)
        if len(idx):
            msg = self.msg[idx]
            keep = np.ones(len(idx), dtype=bool)
            keep[:-1] = msg[1:] != msg[:-1]  # the last of each message's run (fields are grouped by message)
            out[msg[keep]] = idx[keep]
        return out


_HIGH_BITS = np.uint64(0x8080808080808080)
_LOW_7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_ONE = np.uint64(1)


def _varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The varints starting at ``pos``: ``(value, size in bytes)``; ``None`` when one is longer than 10 bytes.

    One-byte varints (tags, small ids) are read as they are. Otherwise the 8 bytes at each position are read as
    one little-endian word (a view of ``buf`` with a stride of 1 byte), and the varint taken out of it with
    integer operations: the first byte without the continuation bit ends it (the lowest set bit of the
    inverted high bits), the bytes past it are masked off, and the 7-bit groups are packed together in three
    steps (pairs, quads, all eight). Varints of 9 or 10 bytes (a negative int64) are read byte by byte
    (:func:`_long_varints`). 18 ms against 88 ms byte by byte for 400k varints of 3 to 10 bytes (2026-11-30).
    """
    first = buf[pos]
    if not (first >= 0x80).any():  # tags and small numbers: one byte each
        return first.astype(np.uint64), np.ones(len(pos), dtype=np.int64)
    words = np.ndarray(shape=(len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))[pos]
    ends = ~words & _HIGH_BITS
    end = ends & (~ends + _ONE)  # the high bit of the varint's last byte
    value = words & ((end << _ONE) - _ONE) & _LOW_7
    value = (value & np.uint64(0x007F007F007F007F)) | ((value & np.uint64(0x7F007F007F007F00)) >> _ONE)
    value = (value & np.uint64(0x00003FFF00003FFF)) | ((value & np.uint64(0x3FFF00003FFF0000)) >> np.uint64(2))
    value = (value & np.uint64(0x000000000FFFFFFF)) | ((value & np.uint64(0x0FFFFFFF00000000)) >> np.uint64(4))
    size = np.frexp(end.astype(np.float64))[1].astype(np.int64) // 8  # end = 2 ** (8 * size - 1)
    long = np.flatnonzero(ends == 0)
    if len(long):
        got = _long_varints(buf, pos[long])
        if got is None:
            return None
        value[long], size[long] = got
    return value, size


def _long_varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_varints` byte by byte: ``None`` when one is longer than 10 bytes; bits past the 64th are dropped,
    as protobuf does (a 10-byte varint of a negative int64). Byte ``k`` is read only for the varints still going,
    carried in arrays that shrink as they end."""
    b = buf[pos]
    value = b.astype(np.uint64)
    size = np.ones(len(pos), dtype=np.int64)
    going = b >= 0x80
    if not going.any():
        return value, size
    idx = np.flatnonzero(going)
    at = pos[idx]
    acc = value[idx] & np.uint64(0x7F)
    for k in range(1, 10):
        bk = buf[at + k]
        acc |= (bk & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        done = bk < 0x80
        if done.all():
            value[idx], size[idx] = acc, k + 1
            return value, size
        end = np.flatnonzero(done)
        value[idx[end]], size[idx[end]] = acc[end], k + 1
        going = ~done
        idx, at, acc = idx[going], at[going], acc[going]
    return None


def _fixed(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Little-endian ``width``-byte integers at ``pos``, as uint64."""
    raw = np.ascontiguousarray(buf[pos[:, None] + np.arange(width)])
    return raw.view(np.dtype(f"<u{width}")).ravel().astype(np.uint64)


def decode_fields(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, max_rounds: int = MAX_ROUNDS) -> Fields | None:
    """Split each message ``buf[starts[i]:ends[i]]`` (serialized protobuf) into its fields, all messages at once.

    Round ``r`` reads the ``r``-th field of every message that has one, with numpy over all of them, so the Python
    work is one round per field of the longest message, not one per field. ``buf`` is a uint8 array with
    :data:`WIRE_PAD` bytes after the last message.

    Memory: every round is held until the end (21 bytes a field: message index and position as int32 where they
    fit), then the :class:`Fields` (29 bytes a field), besides one round's temporaries; a field takes at least 2
    bytes, so the caller bounds the memory by the bytes it passes in one call (``_xspace_events.decode_events`` passes
    half a megabyte of events at a time).

    Returns ``None`` for anything this reader does not read, or that is not valid protobuf: a varint over 10
    bytes, a tag or a length over 5, field number 0 or over 2**29 - 1, a group or wire type 6 / 7, a value that
    runs past its message's end; and after ``max_rounds`` rounds (a message of that many fields).
    The caller then lets the protobuf library read (or refuse) the file. Valid protobuf gives every field,
    unknown ones included, exactly as the library's parser walks it (``tests/test_xspace_wire.py`` compares them
    on random messages).
    """
    n = len(starts)
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    # The rounds are held until the end: message indices and positions as int32 where they fit (29 bytes a field
    # become 21; the caller bounds how many fields one call holds, see ``_xspace_events.decode_events``).
    index_type = np.int32 if n < 2**31 else np.int64
    at_type = np.int32 if len(buf) < 2**31 else np.int64
    active = np.flatnonzero(starts < ends).astype(index_type)
    pos, end = starts[active], ends[active]  # of the messages still going, compacted as they end
    rounds: list[tuple[np.ndarray, ...]] = []
    counts = np.zeros(n, dtype=np.int64)
    while len(active):
        if len(rounds) >= max_rounds:
            return None  # a message of that many fields: one round each would cost more than protobuf's parse
        got = _varints(buf, pos)
        if got is None:
            return None
        tag, size = got
        if (size > 5).any():
            return None  # protobuf reads a tag as a uint32, in at most 5 bytes, and refuses a longer one
        pos = pos + size
        if (tag < 8).any() or (tag > (_MAX_FIELD_NUMBER << 3 | 7)).any():
            return None  # field number 0, or past the largest
        number = (tag >> np.uint64(3)).astype(np.int32)
        wire = (tag & np.uint64(7)).astype(np.int8)
        var_mask = (wire == WIRE_VARINT) | (wire == WIRE_LEN)
        if var_mask.all():  # the usual round: every field a varint or length-delimited
            got = _varints(buf, pos)
            if got is None:
                return None
            value, vsize = got
            nxt = pos + vsize
            i64 = i32 = np.zeros(0, dtype=np.int64)
        else:
            value = np.zeros(len(active), dtype=np.uint64)
            nxt = pos.copy()
            var = np.flatnonzero(var_mask)
            i64 = np.flatnonzero(wire == WIRE_I64)
            i32 = np.flatnonzero(wire == WIRE_I32)
            if len(var) + len(i64) + len(i32) < len(active):
                return None  # a group (3, 4), or wire type 6 / 7
            got = _varints(buf, pos[var])
            if got is None:
                return None
            value[var], vsize = got
            nxt[var] += vsize
        at = pos
        if len(i64):
            value[i64] = _fixed(buf, pos[i64], 8)
            nxt[i64] += 8
        if len(i32):
            value[i32] = _fixed(buf, pos[i32], 4)
            nxt[i32] += 4
        if (nxt > end).any():
            return None
        dl = wire == WIRE_LEN
        if dl.any():
            if (nxt - pos)[dl].max() > 5:
                return None  # a length, like a tag, is at most 5 bytes for protobuf's parser
            # A length-delimited value starts after its length and runs ``value`` bytes, within its message.
            if (dl & (value > (end - nxt).astype(np.uint64))).any():
                return None
            at = np.where(dl, nxt, pos)
            nxt = np.where(dl, nxt + value.astype(np.int64), nxt)
        rounds.append((active, number, wire, value, at.astype(at_type)))
        going = nxt < end
        counts[active[~going]] = len(rounds)  # a message's fields: the rounds it took part in
        active, pos, end = active[going], nxt[going], end[going]
    total = int(counts.sum())
    first = np.zeros(n, dtype=np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    out = Fields(
        msg=np.repeat(np.arange(n, dtype=np.int64), counts),
        number=np.empty(total, dtype=np.int32),
        wire=np.empty(total, dtype=np.int8),
        value=np.empty(total, dtype=np.uint64),
        at=np.empty(total, dtype=np.int64),
        rounds=len(rounds),
    )
    for r in range(len(rounds)):
        active, number, wire, value, at = rounds[r]
        rounds[r] = ()  # each round let go as it is copied
        slot = first[active] + r  # the r-th field of its message: messages in order, each one's fields in order
        out.number[slot], out.wire[slot], out.value[slot], out.at[slot] = number, wire, value, at
    return out

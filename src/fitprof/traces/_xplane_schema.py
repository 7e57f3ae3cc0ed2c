"""The XSpace schema shared by the ``.xplane.pb`` reader (:mod:`fitprof.traces.xspace`) and the Kineto -> XSpace
writer (:mod:`fitprof.traces.xspace_write`): the protobuf message classes and the names of the planes, lines and
stats either side relies on.

The message classes are built at runtime from a ``FileDescriptorProto`` replicating tsl's
``tsl/profiler/protobuf/xplane.proto`` (same field numbers, so the bytes are identical), under the package
``fitprof.xplane`` so that they never clash with TensorFlow's ``tensorflow.profiler`` classes in one process. No
TensorFlow or xprof is needed.

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

from typing import Any

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

# Stats only fitprof reads.
STAT_CATEGORY = "category"
STAT_KINETO_CORRELATION = "correlation"
"""Kineto's own name for the correlation id, kept on device events xprof must not count (syncs, memsets)."""
STAT_SOURCE = "fitprof_source"
STAT_FRAMEWORK = "fitprof_framework"
STAT_HOST = "fitprof_host"
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


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name=_FILE, package=_PACKAGE, syntax="proto3")
    for msg_name, fields in _MESSAGES.items():
        msg = fdp.message_type.add(name=msg_name)
        if msg_name in _ONEOFS:
            msg.oneof_decl.add(name=_ONEOFS[msg_name])
        for name, number, label, ftype, type_name, oneof in fields:
            f = msg.field.add(name=name, number=number, label=label, type=ftype)
            if type_name:
                f.type_name = f".{_PACKAGE}.{type_name}"
            if oneof is not None:
                f.oneof_index = oneof
        if msg_name == "XPlane":
            for entry, value_type in _MAP_ENTRIES.items():
                nested = msg.nested_type.add(name=entry)
                nested.options.map_entry = True
                nested.field.add(name="key", number=1, label=_OPT, type=_T.TYPE_INT64)
                nested.field.add(
                    name="value", number=2, label=_OPT, type=_T.TYPE_MESSAGE, type_name=f".{_PACKAGE}.{value_type}"
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


def stat_value(stat: Any, stat_names: dict[int, str]) -> Any:
    """An ``XStat``'s value as Python: ``int`` / ``float`` / ``str``; a ``ref_value`` resolved to the referenced
    stat metadata's name; ``None`` for bytes and unset values."""
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return stat_names.get(stat.ref_value, "")
    if kind is None or kind == "bytes_value":
        return None
    return getattr(stat, kind)

"""Kineto Chrome trace -> XSpace ``.xplane.pb``, so that xprof (TensorBoard's Profile tab) shows a torch run.

xprof 2.24 reads only ``*.xplane.pb`` under ``<run dir>/plugins/profile/<session>/``; a Chrome trace there is
listed without tools. This module writes the XSpace that xprof's trace viewer renders:

* one ``/host:CPU`` plane with one line per Kineto ``(pid, tid)`` (named after Kineto's ``thread_name``
  metadata); every complete (``ph == "X"``) event becomes an XEvent with its scalar ``args`` as stats;
* ``ProfilerStep#N`` events carry the stats xprof uses for step markers, ``step_num=N`` and ``_r=1`` (the
  same as TensorFlow's ``Trace("train", step_num=n, _r=1)``);
* a ``Task Environment`` plane with ``profile_start_time`` / ``profile_stop_time`` (ns since the epoch).

No TensorFlow is needed: the message classes are built at runtime from a ``FileDescriptorProto`` replicating
tsl's ``tsl/profiler/protobuf/xplane.proto`` (same field numbers, so the bytes are identical), under the
package ``fitprof.xplane`` so that it never clashes with TensorFlow's ``tensorflow.profiler`` classes in one
process.

Timestamps: Kineto's ``ts`` are microseconds on the trace's clock, offset by ``baseTimeNanoseconds``. As
TensorFlow's profiler does (``NormalizeTimestamps``), line ``timestamp_ns`` is relative to the profile start
and only the ``Task Environment`` plane holds absolute times (ns since the epoch): xprof works in picoseconds
internally, and absolute nanoseconds times 1000 overflow int64.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from fitprof._session import hostname

_PACKAGE = "fitprof.xplane"
_FILE = "fitprof/xplane.proto"

HOST_PLANE = "/host:CPU"
TASK_ENV_PLANE = "Task Environment"

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_SKIP_CATEGORIES = {"Trace"}  # Kineto's "PyTorch Profiler (0)" span around the whole window

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


# --------------------------------------------------------------------------------------------------- loading
def load_kineto(trace: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A Kineto trace as a dict with ``traceEvents``: from a ``.json``/``.json.gz`` file, a dict or an event list.

    Raises:
        ValueError: if a file is not JSON or the object has no ``traceEvents``.
    """
    if isinstance(trace, (str, os.PathLike)):
        path = Path(trace)
        opener: Any = gzip.open if path.name.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not a readable Kineto trace ({err})") from err
    elif isinstance(trace, Mapping):
        data = dict(trace)
    else:
        data = {"traceEvents": list(trace)}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError("not a Kineto trace: no 'traceEvents' list")
    return data


# --------------------------------------------------------------------------------------------------- builder
class _Plane:
    def __init__(self, plane: Any) -> None:
        self.plane = plane
        self._events: dict[str, int] = {}
        self._stats: dict[str, int] = {}

    def event_id(self, name: str) -> int:
        mid = self._events.get(name)
        if mid is None:
            mid = self._events[name] = len(self._events) + 1
            md = self.plane.event_metadata[mid]
            md.id, md.name = mid, name
        return mid

    def stat_id(self, name: str) -> int:
        sid = self._stats.get(name)
        if sid is None:
            sid = self._stats[name] = len(self._stats) + 1
            sm = self.plane.stat_metadata[sid]
            sm.id, sm.name = sid, name
        return sid

    def add_stat(self, container: Any, name: str, value: Any) -> None:
        stat = container.stats.add(metadata_id=self.stat_id(name))
        if isinstance(value, bool):
            stat.int64_value = int(value)
        elif isinstance(value, int):
            if -(2**63) <= value < 2**63:
                stat.int64_value = value
            else:
                stat.uint64_value = value % 2**64
        elif isinstance(value, float):
            stat.double_value = value
        else:
            stat.str_value = str(value)


def _line_key(pid: Any, tid: Any) -> tuple[str, str]:
    return str(pid), str(tid)


def kineto_to_xspace(
    trace: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    host: str | None = None,
) -> Any:
    """Convert a Kineto trace into an XSpace message.

    Args:
        trace: a ``.pt.trace.json[.gz]`` path, the parsed trace dict, or its list of events.
        host: host name for ``XSpace.hostnames`` (default: the trace's ``host_name``, else this machine's).

    Returns:
        An ``XSpace`` message (see :func:`xplane_classes`); ``SerializeToString()`` gives the ``.xplane.pb``
        bytes.

    Raises:
        ValueError: if ``trace`` is not a readable Kineto trace.
    """
    data = load_kineto(trace)
    cls = xplane_classes()
    base_ns = int(data.get("baseTimeNanoseconds") or 0)
    events = [e for e in data["traceEvents"] if isinstance(e, Mapping)]

    thread_names: dict[tuple[str, str], str] = {}
    process_names: dict[str, str] = {}
    for e in events:
        if e.get("ph") != "M":
            continue
        name = (e.get("args") or {}).get("name")
        if name is None:
            continue
        if e.get("name") == "thread_name":
            thread_names[_line_key(e.get("pid"), e.get("tid"))] = str(name)
        elif e.get("name") == "process_name":
            process_names[str(e.get("pid"))] = str(name)

    complete = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") in _SKIP_CATEGORIES:
            continue
        try:
            ts_ns = base_ns + round(float(e["ts"]) * 1000.0)
            dur_ps = max(round(float(e.get("dur", 0.0)) * 1e6), 0)
        except (KeyError, TypeError, ValueError):
            continue
        complete.append((ts_ns, dur_ps, e))

    space = cls["XSpace"]()
    space.hostnames.append(host or str(data.get("host_name") or hostname()))
    plane = space.planes.add(id=0, name=HOST_PLANE)
    builder = _Plane(plane)

    start_ns = min((ts for ts, _, _ in complete), default=base_ns)
    stop_ns = max((ts + dur // 1000 for ts, dur, _ in complete), default=base_ns)

    by_line: dict[tuple[str, str], list[tuple[int, int, Mapping[str, Any]]]] = {}
    for item in complete:
        by_line.setdefault(_line_key(item[2].get("pid"), item[2].get("tid")), []).append(item)

    for line_id, (key, items) in enumerate(sorted(by_line.items(), key=lambda kv: _sort_key(kv[0])), start=1):
        items.sort(key=lambda it: (it[0], -it[1]))
        line_ts = items[0][0]  # absolute ns; written relative to the profile start, like TensorFlow does
        pid, tid = key
        name = thread_names.get(key) or (f"{process_names[pid]} {tid}" if pid in process_names else f"{pid}/{tid}")
        line = plane.lines.add(id=line_id, display_id=line_id, name=name, timestamp_ns=line_ts - start_ns)
        line_end_ps = 0
        for ts_ns, dur_ps, e in items:
            ev = line.events.add(
                metadata_id=builder.event_id(str(e.get("name", ""))),
                offset_ps=(ts_ns - line_ts) * 1000,
                duration_ps=dur_ps,
            )
            m = _STEP_RE.match(str(e.get("name", "")))
            if m:
                builder.add_stat(ev, "step_num", int(m.group(1)))
                builder.add_stat(ev, "_r", 1)
            cat = e.get("cat")
            if cat:
                builder.add_stat(ev, "category", str(cat))
            for k, v in (e.get("args") or {}).items():
                if isinstance(v, (bool, int, float, str)) and k not in ("Ev Idx", "Record function id"):
                    builder.add_stat(ev, str(k), v)
            line_end_ps = max(line_end_ps, (ts_ns - line_ts) * 1000 + dur_ps)
        line.duration_ps = line_end_ps

    env = space.planes.add(id=1, name=TASK_ENV_PLANE)
    env_builder = _Plane(env)
    start = env.stats.add(metadata_id=env_builder.stat_id("profile_start_time"))
    start.uint64_value = max(start_ns, 0)
    stop = env.stats.add(metadata_id=env_builder.stat_id("profile_stop_time"))
    stop.uint64_value = max(stop_ns, 0)
    return space


def _sort_key(key: tuple[str, str]) -> tuple[int, str, str]:
    pid, tid = key
    return (0 if pid.isdigit() else 1, pid.zfill(20), tid.zfill(20))


def write_xspace(
    trace: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Mapping[str, Any]],
    run_dir: str | os.PathLike[str],
    session: str,
    *,
    host: str | None = None,
) -> Path:
    """Write ``<run_dir>/plugins/profile/<session>/<host>.xplane.pb`` from a Kineto trace.

    Args:
        trace: a ``.pt.trace.json[.gz]`` path, the parsed trace dict, or its list of events.
        run_dir: the TensorBoard run directory (where the run's event files are).
        session: the session folder name; one per profiled window (see :func:`fitprof._session.session_name`).
        host: the file's host name, which xprof lists under "Hosts" (default: this machine's host name).
            Give ``<host>_rank<r>`` when several ranks of one host write into the same session.

    Returns:
        The path written.

    Raises:
        ValueError: if ``trace`` is not a readable Kineto trace.
        OSError: if the file cannot be written.
    """
    host = host or hostname()
    space = kineto_to_xspace(trace, host=host)
    out_dir = Path(run_dir) / "plugins" / "profile" / session
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{host}.xplane.pb"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(space.SerializeToString())
    os.replace(tmp, path)
    return path


__all__ = ["HOST_PLANE", "TASK_ENV_PLANE", "kineto_to_xspace", "load_kineto", "write_xspace", "xplane_classes"]

"""Kineto Chrome trace -> XSpace ``.xplane.pb``, so that xprof (TensorBoard's Profile tab) shows a torch run.

xprof 2.24 reads only ``*.xplane.pb`` under ``<run dir>/plugins/profile/<session>/``; a Chrome trace there is
listed without tools. This module writes an XSpace that xprof's trace viewer renders with every event under its
true name, and that xprof's input-pipeline, overview and op-statistics pages read with fitprof's figures (see
:mod:`fitprof.traces._xplane_schema` for the planes and stats):

* host events (every complete event whose category is not in :data:`fitprof.traces._kineto_rules.DEVICE_CATEGORIES`) on
  one ``/host:CPU`` plane, one line per Kineto ``(pid, tid)`` named after Kineto's ``thread_name`` metadata; device
  events on a ``/device:GPU:<pid>`` plane per device, one ``Stream #<tid>`` line per stream. Every event keeps its
  scalar ``args`` as stats (Kineto's ``correlation`` under xprof's name ``correlation_id``, except on device
  events fitprof does not count: syncs, memsets, device-side annotations, which xprof would count as compute) and
  its category as the ``category`` stat;
* ``ProfilerStep#N`` carries ``step_num=N`` and ``_r=1``, the stats xprof finds steps by (the same as
  TensorFlow's ``Trace("train", step_num=n, _r=1)``);
* the DataLoader's ``enumerate(DataLoader)#...__next__`` carries ``_ipl_stage_name``: xprof then counts the time
  in it as input ("Input" / ``infeedTimeMs``), as fitprof counts it as input wait. (xprof otherwise recognises only
  TensorFlow's ``IteratorGetNext``; the stat changes no name.);
* host operators (``cpu_op``, and the collectives fitprof counts) carry ``tf_op`` = their own name, so xprof's op
  statistics list them (it otherwise counts only names of the form ``<op name>:<op type>``); device events carry
  ``tf_op`` = the host operator that launched them (found as :func:`fitprof.traces.kineto.read_kineto` finds it),
  so xprof attributes device time to ``aten::*`` operators as fitprof does;
* device copies are given xprof's event names (``MemcpyHToD``, ``MemcpyDToH``, ``MemcpyDToD``, by which it files
  them under "Host to device" etc.) with Kineto's name as the event's display name, which the trace viewer shows;
  their ``memcpy_details`` holds ``num_bytes:<bytes>``;
* each device plane also gets a ``Host steps`` line repeating the ``ProfilerStep#N`` markers with the step's
  ``group_id``, so that xprof's steps on a GPU host span the whole step, as fitprof's do (xprof otherwise spans a
  step by its device work only);
* a ``Task Environment`` plane with ``profile_start_time`` / ``profile_stop_time`` (ns since the epoch) and the
  stats fitprof's reader uses to read the file as the PyTorch window it came from (framework, host, rank, world
  size).

Timestamps: Kineto's ``ts`` are microseconds on the trace's clock, offset by ``baseTimeNanoseconds``. As
TensorFlow's profiler does (``NormalizeTimestamps``), line ``timestamp_ns`` is relative to the profile start
and only the ``Task Environment`` plane holds absolute times (ns since the epoch): xprof works in picoseconds
internally, and absolute nanoseconds times 1000 overflow int64.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from fitprof._session import hostname
from fitprof.traces import _xplane_schema as xs
from fitprof.traces._kineto_rules import gc_paused
from fitprof.traces._table import Kind
from fitprof.traces._xplane_schema import HOST_PLANE, TASK_ENV_PLANE, xplane_classes
from fitprof.traces.kineto import complete_events, event_frame, trace_host

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_XPROF_COPY_NAME = {"htod": "MemcpyHToD", "dtoh": "MemcpyDToH", "dtod": "MemcpyDToD"}
"""xprof's names for device copies (``tsl::profiler::kMemcpyHToDOp`` ...), by ``copy_kind`` prefix."""
_DROPPED_ARGS = ("Ev Idx", "Record function id", "correlation")
"""Kineto args not copied as stats: bookkeeping indices, and ``correlation`` (written as ``correlation_id``)."""


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
            with opener(path, "rb") as fh:
                raw = fh.read()
            try:  # msgspec builds the same dicts, lists and scalars as json, 2-3x faster
                data = msgspec.json.decode(raw)
            except (msgspec.DecodeError, RecursionError):  # what it refuses (NaN, 1e400, a lone surrogate ...)
                data = json.loads(raw.decode("utf-8"))  # is read as json reads it, or refused with json's error
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
        self._events: dict[tuple[str, str], int] = {}
        self._stats: dict[str, int] = {}

    def event_id(self, name: str, display_name: str = "") -> int:
        mid = self._events.get((name, display_name))
        if mid is None:
            mid = self._events[(name, display_name)] = len(self._events) + 1
            md = self.plane.event_metadata[mid]
            md.id, md.name = mid, name
            if display_name:
                md.display_name = display_name
        return mid

    def stat_id(self, name: str) -> int:
        sid = self._stats.get(name)
        if sid is None:
            sid = self._stats[name] = len(self._stats) + 1
            sm = self.plane.stat_metadata[sid]
            sm.id, sm.name = sid, name
        return sid

    def add_stat(self, container: Any, name: str, value: Any) -> None:
        container.stats.add(**self.stat(name, value))

    def stat(self, name: str, value: Any) -> dict[str, Any]:
        """The fields of an ``XStat`` of ``name`` = ``value``, as keyword arguments of its constructor (a list of
        them initialises an event's ``stats`` in one call): ``bool`` and ``int`` as ``int64_value`` (an int past
        its range as ``uint64_value``, modulo 2**64), ``float`` as ``double_value``, anything else as its
        ``str``."""
        sid = self._stats.get(name) or self.stat_id(name)
        if isinstance(value, bool):
            return {"metadata_id": sid, "int64_value": int(value)}
        if isinstance(value, int):
            if -(2**63) <= value < 2**63:
                return {"metadata_id": sid, "int64_value": value}
            return {"metadata_id": sid, "uint64_value": value % 2**64}
        if isinstance(value, float):
            return {"metadata_id": sid, "double_value": value}
        return {"metadata_id": sid, "str_value": str(value)}


def _key(value: Any) -> str:
    return str(value)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite float (JSON's 1e400)
        return None


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
        An ``XSpace`` message (see :func:`fitprof.traces._xplane_schema.xplane_classes`); ``SerializeToString()``
        gives the ``.xplane.pb`` bytes. Read back with :func:`fitprof.traces.xspace.read_xspace`, it gives the same
        event table as :func:`fitprof.traces.kineto.read_kineto` on the trace, times included bit for bit, with
        ``attrs`` ``framework="pytorch"``, and ``host`` / ``rank`` / ``world_size`` as the trace says. Device planes
        carry the device's vendor and compute capability from the trace's ``deviceProperties``.

    Raises:
        ValueError: if ``trace`` is not a readable Kineto trace (:class:`fitprof.traces.TraceError`, a
            ``ValueError``, when an event has no numeric ``ts``).
    """
    with gc_paused():  # millions of new objects: collecting meanwhile cost 13% more on the A100 fixture (2.93 s)
        return _convert(trace, host)


def _convert(trace: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Mapping[str, Any]], host: str | None) -> Any:
    data = load_kineto(trace)
    source = trace if isinstance(trace, (str, os.PathLike)) else None
    where = os.fspath(source) if source is not None else "<trace>"
    cls = xplane_classes()
    base_ns = int(data.get("baseTimeNanoseconds") or 0)
    events = [e for e in data["traceEvents"] if isinstance(e, dict)]

    thread_names: dict[tuple[str, str], str] = {}
    process_names: dict[str, str] = {}
    for e in events:
        if e.get("ph") != "M":
            continue
        name = (e.get("args") or {}).get("name")
        if name is None:
            continue
        if e.get("name") == "thread_name":
            thread_names[(_key(e.get("pid")), _key(e.get("tid")))] = str(name)
        elif e.get("name") == "process_name":
            process_names[_key(e.get("pid"))] = str(name)

    complete = complete_events(events)
    frame = event_frame(complete, where)  # the reader's classification: kinds, copy kinds, launching ops
    columns = ("kind", "op", "copy_kind", "on_device", "bytes", "ts_us", "dur_us")
    kinds, ops, copy_kinds, on_device, nbytes, ts_us, durs_us = (
        frame[c].tolist() if len(frame) else [] for c in columns
    )
    # Whole nanoseconds of each float64 time, its integer and fractional microseconds apart: ``t * 1000`` in
    # float64 rounds to 256 ns at Kineto's absolute timestamps (~1.7e15 us), which moved every event and changed the
    # exposed times read back from the XSpace.
    ts_ns = [base_ns + _exact_ns(float(t)) for t in ts_us]
    dur_ps = [max(round(float(d) * 1e6), 0) for d in durs_us]

    space = cls["XSpace"]()
    space.hostnames.append(host or str(data.get("host_name") or hostname()))
    start_ns = min(ts_ns, default=base_ns)
    stop_ns = max((t + d // 1000 for t, d in zip(ts_ns, dur_ps, strict=True)), default=base_ns)

    # (plane key, line key) -> event indices; plane key "" is the host.
    by_line: dict[tuple[str, tuple[str, str]], list[int]] = {}
    for i, event in enumerate(complete):
        pid, tid = _key(event.get("pid")), _key(event.get("tid"))
        plane_key = pid if on_device[i] else ""  # on_device: a DEVICE_CATEGORIES event (the reader's rule)
        by_line.setdefault((plane_key, (pid, tid)), []).append(i)

    host_plane = space.planes.add(id=0, name=HOST_PLANE)
    builders = {"": _Plane(host_plane)}
    device_keys = sorted({pk for pk, _ in by_line if pk}, key=_sort_key_one)
    device_props = _device_properties(data.get("deviceProperties"))
    used: set[int] = set()
    for pk in device_keys:  # Kineto's device pid is the device index; anything else gets the next free one
        index = (
            int(pk) if pk.isdigit() and int(pk) not in used else next(i for i in range(len(used) + 1) if i not in used)
        )
        used.add(index)
        plane = space.planes.add(id=index + 1, name=f"{xs.DEVICE_PLANE_PREFIX}{index}")
        builders[pk] = _Plane(plane)
        _add_device_properties(builders[pk], device_props.get(index))

    line_id = 0
    for line_id, ((plane_key, key), items) in enumerate(
        sorted(by_line.items(), key=lambda kv: (_sort_key_one(kv[0][0]), _sort_key(kv[0][1]))), start=1
    ):
        builder = builders[plane_key]
        items.sort(key=lambda i: (ts_ns[i], -dur_ps[i]))
        line_ts = ts_ns[items[0]]  # absolute ns; written relative to the profile start, like TensorFlow does
        pid, tid = key
        if plane_key:
            name = f"{xs.STREAM_LINE_PREFIX}{tid}"
            display = thread_names.get(key, "")
        else:
            name = thread_names.get(key) or (f"{process_names[pid]} {tid}" if pid in process_names else f"{pid}/{tid}")
            display = ""
        line = builder.plane.lines.add(id=line_id, display_id=line_id, name=name, timestamp_ns=line_ts - start_ns)
        if display:
            line.display_name = display
        line_end_ps = 0
        add_event, device = line.events.add, bool(plane_key)
        for i in items:
            event = complete[i]
            true_name = str(event.get("name", ""))
            xprof_name = _XPROF_COPY_NAME.get(copy_kinds[i][:4], "") if kinds[i] == Kind.MEMCPY else ""
            add_event(
                metadata_id=builder.event_id(xprof_name or true_name, true_name if xprof_name else ""),
                offset_ps=(ts_ns[i] - line_ts) * 1000,
                duration_ps=dur_ps[i],
                stats=_stats(builder, event, kind=kinds[i], op=ops[i], device=device, nbytes=nbytes[i]),
            )
            line_end_ps = max(line_end_ps, (ts_ns[i] - line_ts) * 1000 + dur_ps[i])
        line.duration_ps = line_end_ps

    # The host's step markers, repeated on each device plane with the group id xprof gives their step, so that
    # xprof's device-side step spans the whole ProfilerStep#N as fitprof's does (see _add_host_steps).
    steps = sorted(
        (ts_ns[i], i) for i, e in enumerate(complete) if not on_device[i] and _STEP_RE.match(str(e.get("name", "")))
    )
    for n, pk in enumerate(device_keys, start=1):
        markers = [(ts_ns[i] - start_ns, dur_ps[i], str(complete[i].get("name", ""))) for _, i in steps]
        _add_host_steps(builders[pk], markers, line_id + n)

    env = space.planes.add(id=max(used, default=-1) + 2, name=TASK_ENV_PLANE)
    env_builder = _Plane(env)
    start = env.stats.add(metadata_id=env_builder.stat_id(xs.STAT_PROFILE_START))
    start.uint64_value = max(start_ns, 0)
    stop = env.stats.add(metadata_id=env_builder.stat_id(xs.STAT_PROFILE_STOP))
    stop.uint64_value = max(stop_ns, 0)
    dist = data.get("distributedInfo")
    dist = dist if isinstance(dist, Mapping) else {}
    env_builder.add_stat(env, xs.STAT_SOURCE, xs.SOURCE_KINETO)
    env_builder.add_stat(env, xs.STAT_FRAMEWORK, "pytorch")
    if base_ns:
        env_builder.add_stat(env, xs.STAT_KINETO_BASE_NS, base_ns)
    if source is not None:  # the trace file's name is the authority on its host (even when it names none)
        env_builder.add_stat(env, xs.STAT_HOST, trace_host(source))
    for stat, value in ((xs.STAT_RANK, dist.get("rank")), (xs.STAT_WORLD_SIZE, dist.get("world_size"))):
        number = _int_or_none(value)
        if number is not None:
            env_builder.add_stat(env, stat, number)
    return space


def _device_properties(props: Any) -> dict[int, Mapping[str, Any]]:
    """Kineto's ``deviceProperties`` (one object per device: ``id``, ``name``, ``computeMajor``, ``computeMinor``,
    ``numSms``, ``totalGlobalMem``, ``warpSize``, ...) by device id; {} when the trace has none."""
    out: dict[int, Mapping[str, Any]] = {}
    for p in props if isinstance(props, list) else []:
        if isinstance(p, Mapping) and isinstance(p.get("id"), int) and not isinstance(p.get("id"), bool):
            out[p["id"]] = p
    return out


_AMD_NAME = re.compile(r"\b(amd|radeon|instinct)\b", re.IGNORECASE)


def _add_device_properties(builder: _Plane, props: Mapping[str, Any] | None) -> None:
    """The device plane's capability stats, as TensorFlow writes them and xprof reads them (``device_vendor``,
    ``compute_cap_major`` / ``compute_cap_minor``, ``core_count``, ``memory_size``), from the device's Kineto
    ``deviceProperties``. Without them xprof logs "Unknown device vendor" and leaves the device's model and peaks
    out. The vendor is AMD for a ROCm device (a 64-lane wavefront, or AMD / Radeon / Instinct in the name), else
    NVIDIA. Kineto gives no clock rate or memory bandwidth, so xprof's roofline peaks stay unknown."""
    if not props:
        return
    plane = builder.plane

    def number(key: str) -> int | None:
        value = props.get(key)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    amd = number("warpSize") == 64 or bool(_AMD_NAME.search(str(props.get("name", ""))))
    builder.add_stat(plane, xs.STAT_DEVICE_VENDOR, xs.VENDOR_AMD if amd else xs.VENDOR_NVIDIA)
    for stat, key in (
        (xs.STAT_COMPUTE_CAP_MAJOR, "computeMajor"),
        (xs.STAT_COMPUTE_CAP_MINOR, "computeMinor"),
        (xs.STAT_CORE_COUNT, "numSms"),
        (xs.STAT_MEMORY_SIZE, "totalGlobalMem"),
    ):
        value = number(key)
        if value is not None:
            builder.add_stat(plane, stat, value)
    if props.get("name"):
        builder.add_stat(plane, xs.STAT_DEVICE_NAME, str(props["name"]))


def _exact_ns(us: float) -> int:
    """``us`` (float64 microseconds) as the nearest whole nanosecond, computed without rounding the product: the
    integer part is exact in float64 below 2**53 us, the fraction's nanoseconds need 10 bits."""
    if not math.isfinite(us):
        return 0
    whole = math.floor(us)
    return int(whole) * 1000 + round((us - whole) * 1000.0)


def _add_host_steps(builder: _Plane, steps: list[tuple[int, int, str]], line_id: int) -> None:
    """A ``Host steps`` line on a device plane: one event per host step marker ``(start ns since the profile start,
    duration ps, name)``, in time order, carrying ``group_id`` = its index.

    On a host with a device xprof 2.24 builds steps from device events only: a step spans its device work, so the
    DataLoader wait before the first launch fell outside it (a Lightning step of 10 ms showed as 7.1 ms). xprof
    numbers the groups of its step markers (events with ``_r``) 0, 1, ... in time order and derives each device
    step's span from every device-plane event carrying that ``group_id``; these events widen it to the host step.
    They carry no ``correlation_id``, so xprof files none of their time under any category or operator, and
    fitprof's reader skips the line.
    """
    if not steps:
        return
    line = builder.plane.lines.add(id=line_id, display_id=line_id, name=xs.HOST_STEPS_LINE, timestamp_ns=0)
    end_ps = 0
    for group, (ts_ns, dur_ps, name) in enumerate(steps):
        ev = line.events.add(metadata_id=builder.event_id(name), offset_ps=ts_ns * 1000, duration_ps=dur_ps)
        builder.add_stat(ev, xs.STAT_GROUP_ID, group)
        end_ps = max(end_ps, ts_ns * 1000 + dur_ps)
    line.duration_ps = end_ps


def _stats(
    builder: _Plane, e: Mapping[str, Any], *, kind: str, op: str, device: bool, nbytes: float
) -> list[dict[str, Any]]:
    """The stats of one event (:meth:`_Plane.stat` each): xprof's (steps, input stage, op, correlation, copy
    size), then Kineto's args."""
    stat = builder.stat
    out: list[dict[str, Any]] = []
    name = str(e.get("name", ""))
    m = None if device else _STEP_RE.match(name)  # a device-side mirror of a step is no step marker for xprof
    if m:
        out += (stat(xs.STAT_STEP_NUM, int(m.group(1))), stat(xs.STAT_ROOT, 1))
    device_work = device and kind in (Kind.KERNEL, Kind.MEMCPY, Kind.COLLECTIVE)
    if device_work:
        if op:
            out.append(stat(xs.STAT_TF_OP, op))
        if kind == Kind.MEMCPY and not math.isnan(nbytes):
            out.append(stat(xs.STAT_MEMCPY_DETAILS, f"num_bytes:{int(nbytes)}"))
    elif kind == Kind.INPUT:
        out.append(stat(xs.STAT_INPUT_STAGE, name))
    elif kind in (Kind.OP, Kind.COLLECTIVE):
        out.append(stat(xs.STAT_TF_OP, name))
    cat = e.get("cat")
    if cat:
        out.append(stat(xs.STAT_CATEGORY, str(cat)))
    args = e.get("args")
    if not isinstance(args, Mapping):
        return out
    correlation = _int_or_none(args.get("correlation"))
    if correlation is not None:
        # Device events fitprof does not count (syncs, memsets, device-side annotations) keep Kineto's own name
        # for it, which xprof does not read: it would file their time as device compute of the launching op.
        name = xs.STAT_CORRELATION_ID if device_work or not device else xs.STAT_KINETO_CORRELATION
        out.append(stat(name, correlation))
    out += (
        stat(str(k), v) for k, v in args.items() if isinstance(v, (bool, int, float, str)) and k not in _DROPPED_ARGS
    )
    return out


def _sort_key(key: tuple[str, str]) -> tuple[int, str, str]:
    pid, tid = key
    return (0 if pid.isdigit() else 1, pid.zfill(20), tid.zfill(20))


def _sort_key_one(value: str) -> tuple[int, str]:
    return (0 if value.isdigit() else 1, value.zfill(20))


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
    # Written under a hidden temporary name and renamed (the name fitprof._atomic.temporary_name gives): a writer
    # killed mid-file leaves no half .xplane.pb, and neither xprof nor a remote mirror picks the temporary name up.
    tmp = path.with_name(f".{path.name}.fitprof-tmp-{os.getpid()}")
    try:
        tmp.write_bytes(space.SerializeToString())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


__all__ = ["HOST_PLANE", "TASK_ENV_PLANE", "kineto_to_xspace", "load_kineto", "write_xspace", "xplane_classes"]

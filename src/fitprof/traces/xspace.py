"""XSpace (``.xplane.pb``) reader: TensorFlow / JAX profiles, and PyTorch windows fitprof converted -> the neutral
event table.

Parsing uses the ``protobuf`` library with the schema of :mod:`fitprof.traces._xplane_schema` (the same field
numbers as tsl's ``xplane.proto``), so neither TensorFlow nor xprof is needed. (xprof's C-backed
``xprof.profile_data`` reader was used first; its one ctypes call per event and per stat made a 4,315-event
window take 86 ms to read, against 5 ms for the protobuf walk.)

An XSpace that fitprof converted from a Kineto trace (:mod:`fitprof.traces.xspace_write`; its ``Task
Environment`` plane says ``fitprof_source="kineto"``) is read as the PyTorch window it came from: its events are
rebuilt as Kineto events (category from the ``category`` stat, the true name from the display name where xprof's
copy names replace it, ``correlation`` from ``correlation_id`` or ``correlation``, ``bytes`` / ``kind`` from their stats) and
classified by :func:`fitprof.traces.kineto.event_frame`, exactly as :func:`~fitprof.traces.kineto.read_kineto`
classifies the trace; the stats only xprof reads (``tf_op``, ``_ipl_stage_name``, ``memcpy_details``) and the
device planes' ``Host steps`` lines (copies of the host's step markers) are ignored, so nothing is counted twice. ``attrs`` then also hold ``framework="pytorch"``, the host the trace's file
name gave (the ``.xplane.pb``'s own name when it was converted from an in-memory trace) and the trace's ``rank`` and
``world_size`` where it gave them.

Any other XSpace is classified as TensorFlow writes it (see :mod:`fitprof.traces._table` for the kinds):

* steps: events carrying a ``step_num`` stat outside the ``tf_data*`` / ``tf_Compute*`` lines, i.e. the
  ``tf.profiler.experimental.Trace(..., step_num=n, _r=1)`` markers fitprof writes (xprof needs ``_r=1`` to
  find them; fitprof also accepts Keras's own ``Trace("Profiled Step", step_num=n)`` without it);
* input: ``IteratorGetNextOp::DoCompute`` (and ``IteratorGetNextAsOptionalOp::DoCompute`` of distributed
  iterators, TF ops of type ``IteratorGetNext*``): the training loop blocked on ``tf.data``, as xprof's
  input-pipeline analysis counts it; on JAX, fitprof's ``fitprof/input`` annotation around each batch fetch
  (:data:`INPUT_ANNOTATION`);
* fitprof's own annotations ``fitprof/validation`` and ``fitprof/overhead`` (on host lines outside ``tf_data*`` /
  ``tf_Compute*``) -> ``Kind.NOT_TRAINING``;
* host ops: events on ``tf_Compute*`` (and ``collective_ops*``) lines named ``<op name>:<op type>`` (C++
  scopes such as ``CollectiveOpV2Kernel::Run`` are not ops); the table's ``name`` is the op name,
  as xprof's ``framework_op_stats`` reports it, less the ``StatefulPartitionedCall/`` prefix; collective op types -> ``Kind.COLLECTIVE``;
* XLA-compiled work (Keras ``jit_compile=True``; by event shape, so JAX's CPU runtime too): a host event carrying
  an ``hlo_op`` stat (one XLA thunk, on ``tf_Compute``, ``tf_numa_*_Eigen`` or any thread) -> ``Kind.OP`` named by
  that HLO instruction (``MatMul.4``); the TF async op (``ExecutorState::ProcessAsync::Start``) within which HLO
  ops run on its line -> ``Kind.OP`` named by their ``hlo_module`` (the compiled cluster); XLA's ``end: <op>``
  marks are not TF ops;
* device planes (``/device:GPU:N``), ``Stream`` lines: ``Memcpy*H2D*`` / ``HtoD`` copies -> ``Kind.MEMCPY``
  (pinned / pageable from the ``memcpy_details`` stat), other events -> kernels, attributed to the ``tf_op``
  stat's op name.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from fitprof.traces import _xplane_schema as xs
from fitprof.traces._limits import MAX_XSPACE_STRING_BYTES, Limits, read_bounded, too_many
from fitprof.traces._table import (
    NOT_TRAINING_ANNOTATIONS,
    Kind,
    TraceError,
    make_table,
)
from fitprof.traces.kineto import event_frame

_COLLECTIVE_TYPES = re.compile(r"^(Collective|Nccl|AllReduce|AllGather|ReduceScatter|AllToAll)", re.IGNORECASE)
_INPUT_EVENT = re.compile(r"^(MultiDevice)?IteratorGetNext\w*Op::DoCompute$")
"""The kernels the training loop blocks in while tf.data produces its batch (``IteratorGetNextOp``,
``IteratorGetNextAsOptionalOp`` for distributed iterators, ...)."""
INPUT_ANNOTATION = "fitprof/input"
"""The annotation fitprof's JAX window puts around each batch fetch (Keras's JAX trainer calls ``next(iterator)``
inside ``train_function``, in Python): the training loop waiting for its input, read as ``Kind.INPUT``."""
_FUNCTION_PREFIX = "StatefulPartitionedCall/"
"""Prefix of every op inside a ``tf.function`` (Keras's train step); dropped from op names for readability."""
_TF_OP = re.compile(r"(?P<name>[A-Za-z0-9.][\w.\-/>]*):(?P<type>\w+)")
"""A TF op's event on a ``tf_Compute`` line, ``<op name>:<op type>`` (TF's node-name characters); C++ scopes
(``CollectiveOpV2Kernel::Run``) and XLA's ``end: <hlo op>`` completion marks are not ops."""
_HLO_OP = "hlo_op"
"""Stat naming the HLO instruction of an XLA thunk: XLA's CPU runtime records one event per thunk (``MatMul.4``,
``multiply_add_fusion.7``) on the thread that ran it (``tf_Compute``, ``tf_numa_*_Eigen``, JAX's threads), with
``hlo_op`` and ``hlo_module``; device kernels carry it too (read as the kernel's op)."""
_ASYNC_OP = "ExecutorState::ProcessAsync::Start"
"""TF's executor span of an asynchronous op (stats ``name`` and ``kernel_type``): Keras's ``jit_compile=True``
step calls its XLA cluster through one (``StatefulPartitionedCall``)."""
_BYTES = re.compile(r"(?:num_bytes|size|bytes)\s*[:=]\s*(\d+)")


def _stat_value(stat: Any, stat_names: dict[int, str]) -> str:
    if stat.WhichOneof("value") == "bytes_value":
        return "<bytes>"
    value = xs.stat_value(stat, stat_names)
    return "" if value is None else str(value)


def _stats(meta: Any, event: Any, stat_names: dict[int, str], cache: dict[int, dict[str, str]]) -> dict[str, str]:
    """An event's stats by name, as strings: its metadata's stats, then its own (which win). Read-only: the
    metadata's part is built once per metadata (``cache``) and shared by its events, strings included."""
    base = cache.get(event.metadata_id)
    if base is None:
        base = cache[event.metadata_id] = {}
        if meta is not None:
            for st in meta.stats:
                base[stat_names.get(st.metadata_id, "")] = _stat_value(st, stat_names)
    if not event.stats:
        return base
    out = dict(base)
    for st in event.stats:
        out[stat_names.get(st.metadata_id, "")] = _stat_value(st, stat_names)
    return out


def _copy_kind(name: str, details: str) -> str:
    low = (name + " " + details).lower()
    if "h2d" in low or "htod" in low or "host_to_device" in low:
        if "pageable" in low:
            return "htod_pageable"
        if "pinned" in low:
            return "htod_pinned"
        return "htod"
    if "d2h" in low or "dtoh" in low:
        return "dtoh"
    if "d2d" in low or "dtod" in low:
        return "dtod"
    return ""


def _name_clusters(calls: list[dict[str, Any]], modules: list[tuple[float, str]]) -> None:
    """Make each TF async op within which HLO ops ran on its line an operator named after their ``hlo_module``
    (the XLA cluster it runs: ``a_inference_one_step_on_data_1131__.7`` for Keras's ``jit_compile=True`` step).

    Its self time is then its span less the HLO ops run on its own line: the cluster's dispatch and the time it
    waits for the HLO ops on other threads (``tf_numa_*_Eigen``), which count on their own lines.
    """
    if not calls or not modules:
        return
    modules.sort()
    starts = [m[0] for m in modules]
    for row in calls:
        i = bisect.bisect_left(starts, row["ts_us"])
        if i < len(modules) and starts[i] <= row["ts_us"] + row["dur_us"]:
            row["kind"] = Kind.OP
            row["name"] = modules[i][1] or row["name"]  # an HLO op without its module: keep the executor's name


def _check_bounds(space: Any, path: Path, limits: Limits, error: type[Exception]) -> None:
    """The bounds that hold before any row is built: the events, and the length of every name and metadata string
    (each event's row refers to its metadata's name and stats, so a long one would be repeated per event)."""
    n_events = 0
    for plane in space.planes:
        strings = [plane.name]
        for line in plane.lines:
            n_events += len(line.events)
            strings += (line.name, line.display_name)
        for meta in plane.event_metadata.values():
            strings += (meta.name, meta.display_name)
            strings += (st.str_value for st in meta.stats)
        strings += (m.name for m in plane.stat_metadata.values())
        longest = max(map(len, strings), default=0)
        if longest > MAX_XSPACE_STRING_BYTES:
            raise error(
                f"{path}: plane {plane.name[:80]!r} holds a name or string of {longest:,} characters, more than the "
                f"bound of {MAX_XSPACE_STRING_BYTES:,} on one XSpace string (no profiler writes names that long)"
            )
        if n_events > limits.max_events:
            raise error(too_many(path, f"the XSpace holds at least {n_events:,} events", limits))


def read_xspace(
    path: str | os.PathLike[str], *, max_trace_mb: float | None = None, max_events: int | None = None
) -> pd.DataFrame:
    """Read one ``.xplane.pb`` file into an event table.

    Args:
        path: the XSpace file, e.g. ``<log_dir>/plugins/profile/<session>/<host>.xplane.pb``.
        max_trace_mb: the bound on the file's size in MB (default 512), checked before it is read.
        max_events: the bound on its events (default 10,000,000), checked before the table is built. Every
            name and string in its metadata must also be at most 1 MB (see :mod:`fitprof.traces._limits`).

    Returns:
        The event table (columns in :data:`fitprof.traces.COLUMNS`); ``attrs`` holds ``format="xspace"``,
        ``path`` and ``host`` (the file name's stem). For an XSpace fitprof converted from a Kineto trace, the
        table of that trace (times relative to the profile start) and ``attrs`` ``framework="pytorch"``, ``host``,
        ``rank`` and ``world_size`` as the trace gave them (see this module's docstring).

    Raises:
        TraceError: if the file is missing, empty, or not an XSpace protobuf, or passes a bound (the message names
            the bound and how to raise it).
        ValueError: if a bound is not a positive number.
    """
    limits = Limits.of(max_trace_mb, max_events)
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such file")
    data = read_bounded(p, limits, TraceError, inflate=False)
    if not data:
        raise TraceError(f"{p}: empty file, not an XSpace")
    try:
        space = xs.xplane_classes()["XSpace"].FromString(data)  # a bytearray is read in place, not copied
    except Exception as err:  # DecodeError and friends: not this message type
        raise TraceError(f"{p}: not an XSpace protobuf ({type(err).__name__}: {err})") from None
    del data
    _check_bounds(space, p, limits, TraceError)
    if not any(plane.name.startswith("/host:") for plane in space.planes):
        raise TraceError(f"{p}: an XSpace without a /host: plane, not a profile fitprof can analyse")
    env = _task_environment(space)
    if env.get(xs.STAT_SOURCE) == xs.SOURCE_KINETO:
        return _read_converted(space, p, env)
    rows: list[dict[str, Any]] = []
    op_names: dict[str, str] = {}
    for plane in space.planes:
        pname = plane.name
        on_device = pname.startswith("/device:")
        if not on_device and not pname.startswith("/host:"):
            continue  # Task Environment, metadata planes
        event_meta = dict(plane.event_metadata)
        event_names = {k: m.name for k, m in event_meta.items()}  # one str per name, shared by its events
        meta_stats: dict[int, dict[str, str]] = {}
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        xla = _HLO_OP in stat_names.values()  # XLA-compiled work runs on this plane (also on tf_Compute lines)
        for line in plane.lines:
            lname = line.name
            if on_device and not lname.lower().startswith("stream"):
                continue  # derived lines (XLA Modules, Steps, ...) repeat the stream events
            is_tf_data = lname.startswith("tf_data")
            is_compute = lname.startswith("tf_Compute")
            base_ns = line.timestamp_ns
            # Stats are only needed on device events and on host lines outside the TF executor and tf.data
            # (where step markers and annotations live); most events are on those lines and skip them.
            want_stats = on_device or not (is_tf_data or is_compute) or (xla and is_compute)
            calls: list[dict[str, Any]] = []  # TF async ops of this line that may call an XLA cluster
            modules: list[tuple[float, str]] = []  # (start, hlo_module) of this line's HLO ops
            for ev in line.events:
                meta = event_meta.get(ev.metadata_id)
                name = event_names.get(ev.metadata_id, "")
                stats = _stats(meta, ev, stat_names, meta_stats) if want_stats else {}
                row: dict[str, Any] = {
                    "name": name,
                    "ts_us": (base_ns + ev.offset_ps / 1e3) / 1e3,
                    "dur_us": ev.duration_ps / 1e6,
                    "pid": pname,
                    "tid": lname,
                    "on_device": on_device,
                }
                if on_device:
                    kind = _copy_kind(name, stats.get("memcpy_details", ""))
                    if kind or name.lower().startswith("memcpy"):
                        row["kind"] = Kind.MEMCPY
                        row["copy_kind"] = kind
                        m = _BYTES.search(stats.get("memcpy_details", ""))
                        if m:
                            row["bytes"] = float(m.group(1))
                    elif "nccl" in name.lower() or "rccl" in name.lower():
                        row["kind"] = Kind.COLLECTIVE
                    else:
                        row["kind"] = Kind.KERNEL
                    tf_op = stats.get("tf_op") or stats.get("hlo_op") or ""
                    op = op_names.get(tf_op)
                    if op is None:  # one str per op name, shared by its kernels
                        op = op_names[tf_op] = tf_op.split(":")[0]
                    row["op"] = op
                elif name == INPUT_ANNOTATION or _INPUT_EVENT.match(name):
                    row["kind"] = Kind.INPUT
                elif name in NOT_TRAINING_ANNOTATIONS and not (is_tf_data or is_compute):
                    row["kind"] = Kind.NOT_TRAINING  # fitprof's own spans (validation, its overhead)
                elif _HLO_OP in stats and not is_tf_data:
                    row["kind"] = Kind.OP  # an XLA thunk (HLO op) run on a host thread
                    row["name"] = stats[_HLO_OP] or name
                    modules.append((row["ts_us"], stats.get("hlo_module", "")))
                elif (
                    xla
                    and is_compute
                    and name == _ASYNC_OP
                    and not stats.get("kernel_type", "").startswith(("IteratorGetNext", "MultiDeviceIteratorGetNext"))
                ):
                    row["kind"] = Kind.OTHER  # an XLA cluster's call when HLO ops run inside it (below)
                    calls.append(row)
                elif "step_num" in stats and not (is_tf_data or is_compute):
                    row["kind"] = Kind.STEP
                    try:
                        row["step_num"] = float(stats["step_num"])
                    except ValueError:
                        pass
                elif (is_compute or lname.startswith("collective_ops")) and (op_match := _TF_OP.fullmatch(name)):
                    op_name, op_type = op_match["name"], op_match["type"]
                    row["name"] = op_name.removeprefix(_FUNCTION_PREFIX)
                    if op_type.startswith(("IteratorGetNext", "MultiDeviceIteratorGetNext")):
                        row["kind"] = Kind.INPUT
                    elif _COLLECTIVE_TYPES.match(op_type):
                        row["kind"] = Kind.COLLECTIVE
                    else:
                        row["kind"] = Kind.OP
                elif "_r" in stats and not is_tf_data:
                    row["kind"] = Kind.ANNOTATION
                else:
                    row["kind"] = Kind.OTHER
                rows.append(row)
            _name_clusters(calls, modules)
    table = make_table(rows)
    table.attrs.update({"format": "xspace", "path": str(p), "host": p.name.removesuffix(".xplane.pb")})
    return table


def _task_environment(space: Any) -> dict[str, Any]:
    """The ``Task Environment`` plane's stats by name (empty when there is none)."""
    for plane in space.planes:
        if plane.name == xs.TASK_ENV_PLANE:
            names = {k: v.name for k, v in plane.stat_metadata.items()}
            return {names.get(st.metadata_id, ""): xs.stat_value(st, names) for st in plane.stats}
    return {}


_KINETO_ARGS = {
    xs.STAT_CORRELATION_ID: "correlation",
    xs.STAT_KINETO_CORRELATION: "correlation",
    "bytes": "bytes",
    "kind": "kind",
}
"""The stats the Kineto classification reads, under the names of the Kineto ``args`` they were written from."""


def _read_converted(space: Any, path: Path, env: dict[str, Any]) -> pd.DataFrame:
    """An XSpace fitprof converted from a Kineto trace -> the table ``read_kineto`` gives for that trace."""
    events: list[dict[str, Any]] = []
    for plane in space.planes:
        pname = plane.name
        if not (pname.startswith("/host:") or pname.startswith(xs.DEVICE_PLANE_PREFIX)):
            continue
        metas = dict(plane.event_metadata)
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        wanted = {k: v for k, v in names.items() if v == xs.STAT_CATEGORY or v in _KINETO_ARGS}
        line_names = Counter(line.name for line in plane.lines)
        for line in plane.lines:  # a line is a thread or a stream: its name, made unique when two share one
            if pname.startswith(xs.DEVICE_PLANE_PREFIX) and line.name == xs.HOST_STEPS_LINE:
                continue  # markers for xprof repeating the host's steps: counted once, on the host
            tid = line.name if line_names[line.name] == 1 else f"{line.name} ({line.id})"
            base_ps = line.timestamp_ns * 1000
            for ev in line.events:
                meta = metas.get(ev.metadata_id)
                args: dict[str, Any] = {}
                cat = ""
                for st in ev.stats:
                    key = wanted.get(st.metadata_id)
                    if key is None:
                        continue
                    value = xs.stat_value(st, names)
                    if key == xs.STAT_CATEGORY:
                        cat = str(value)
                    else:
                        args[_KINETO_ARGS[key]] = value
                event: dict[str, Any] = {
                    "ph": "X",
                    "name": (meta.display_name or meta.name) if meta is not None else "",
                    "ts": (base_ps + ev.offset_ps) / 1e6,
                    "dur": ev.duration_ps / 1e6,
                    "pid": pname,
                    "tid": tid,
                    "args": args,
                }
                if cat:
                    event["cat"] = cat
                events.append(event)
    table = make_table(event_frame(events, path))
    host = env.get(xs.STAT_HOST)
    table.attrs.update(
        {
            "format": "xspace",
            "framework": str(env.get(xs.STAT_FRAMEWORK) or "pytorch"),
            "path": str(path),
            # The Kineto file's host when converted from a file, else this file's name (as for any XSpace).
            "host": str(host) if host is not None else path.name.removesuffix(".xplane.pb"),
        }
    )
    for key, stat in (("rank", xs.STAT_RANK), ("world_size", xs.STAT_WORLD_SIZE)):
        value = _int_or_none(env.get(stat))
        if value is not None:  # absent: the file name's _rank<N> suffix gives the rank (fitprof.analyze)
            table.attrs[key] = value
    return table


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None

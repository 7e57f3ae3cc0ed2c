"""XSpace (``.xplane.pb``) reader: TensorFlow / JAX profiles, and PyTorch windows fitprof converted -> the neutral
event table.

Parsing uses the ``protobuf`` library with the schema of :mod:`fitprof.traces._xplane_schema` (the same field
numbers as tsl's ``xplane.proto``), so neither TensorFlow nor xprof is needed (xprof's C-backed
``xprof.profile_data`` reader makes one ctypes call per event and per stat: 86 ms to read a 4,315-event window,
against 5 ms for the protobuf walk). The reader reads only what it uses (:mod:`fitprof.traces._xspace_events`):
protobuf parses the file with each event left as its bytes
(:func:`~fitprof.traces._xplane_schema.xplane_raw_classes`: planes, lines and metadata as messages); the events
of the lines the table is made of are then split into their fields with numpy, half a megabyte of events at a
time (:func:`~fitprof.traces._xplane_schema.decode_fields`), and of their stats only those the rules below read
are turned into Python values. The events of the lines it skips (a device's derived lines, the ``Host steps`` of
a converted file), the stats of host lines whose stats the rules do not read (``tf_Compute`` and ``tf_data``
lines without XLA), and the values of the stats it does not read are not decoded, nor checked, so damage there
leaves the file readable. Damage in what it reads gives protobuf's own error (the file is then parsed whole); a
valid file the decoder does not read (a group, which protobuf skips) is read event by event from protobuf's
messages.

An XSpace that fitprof converted from a Kineto trace (:mod:`fitprof.traces.xspace_write`; its ``Task
Environment`` plane says ``fitprof_source="kineto"``) is read as the PyTorch window it came from: its events go
straight into the Kineto reader's columns (category from the ``category`` stat, the true name from the display
name where xprof's copy names replace it, ``correlation`` from ``correlation_id`` or ``correlation``, ``bytes`` /
``kind`` from their stats) and are classified by the Kineto reader's rules (:mod:`fitprof.traces._kineto_rules`),
exactly as :func:`~fitprof.traces.kineto.read_kineto` classifies the trace; the stats only xprof reads
(``tf_op``, ``_ipl_stage_name``, ``memcpy_details``) and the device planes' ``Host steps`` lines (copies of the
host's step markers) are ignored, so nothing is counted twice. ``attrs`` then also hold
``framework="pytorch"``, the host the trace's file name gave (the ``.xplane.pb``'s own name when it was converted
from an in-memory trace) and the trace's ``rank`` and ``world_size`` where it gave them.

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
  stat's op name; ``launch_us`` is the start of the host API call on ``/host:CUPTI`` carrying the same
  ``correlation_id`` (the first such call), so the analysis counts device work in the step that launched it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fitprof.traces import _kineto_rules as kineto_rules
from fitprof.traces import _xplane_schema as xs
from fitprof.traces._limits import MAX_XSPACE_STRING_BYTES, Limits, read_bounded, too_many
from fitprof.traces._table import (
    NOT_TRAINING_ANNOTATIONS,
    Kind,
    PlainTable,
    TraceError,
    make_table,
    plain_from_columns,
)
from fitprof.traces._xspace_events import (
    BYTES_VALUE,
    DOUBLE,
    REF,
    STR,
    VALUE_FIELDS,
    Events,
    last_stats,
    parse,
    with_events,
)

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


_TF_STATS = ("memcpy_details", "tf_op", _HLO_OP, "hlo_module", "kernel_type", "step_num", "_r")
"""The stats the TensorFlow / JAX classification reads (by name); the values of an event's other stats are never
made Python values (nor their strings checked to be UTF-8)."""


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
    return read_xspace_plain(path, max_trace_mb=max_trace_mb, max_events=max_events).to_frame()


def read_xspace_plain(
    path: str | os.PathLike[str], *, max_trace_mb: float | None = None, max_events: int | None = None
) -> PlainTable:
    """:func:`read_xspace` as plain columns (:class:`~fitprof.traces._table.PlainTable`): the same arrays and
    ``attrs``, no DataFrame built. Raises as :func:`read_xspace`."""
    limits = Limits.of(max_trace_mb, max_events)
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such file")
    data = read_bounded(p, limits, TraceError, inflate=False)
    if not data:
        raise TraceError(f"{p}: empty file, not an XSpace")
    space = parse(data, p, xs.xplane_raw_classes()["XSpace"])  # every event left as its bytes until read
    _check_bounds(space, p, limits, TraceError)
    if not any(plane.name.startswith("/host:") for plane in space.planes):
        raise TraceError(f"{p}: an XSpace without a /host: plane, not a profile fitprof can analyse")
    env = _task_environment(space)
    if env.get(xs.STAT_SOURCE) == xs.SOURCE_KINETO:
        return _read_converted(data, space, p, env)
    table = _table(_tf_frame(data, space, p))
    table.attrs.update({"format": "xspace", "path": str(p), "host": p.name.removesuffix(".xplane.pb")})
    if _is_jax(table):
        table.attrs["framework"] = "jax"  # else the format's: TensorFlow
    return table


_JAX_DISPATCH = ("PjitFunction(", "PmapFunction(")
"""The host events JAX's runtime records for each call of a jitted (or pmapped) function; TensorFlow has none."""


def _is_jax(table: PlainTable) -> bool:
    """Whether a native XSpace's table is JAX's: it holds a jitted call's dispatch (:data:`_JAX_DISPATCH`) or the
    annotation fitprof's JAX window puts around each batch fetch (:data:`INPUT_ANNOTATION`)."""
    names = [str(name) for name in pd.unique(table["name"])]  # each distinct name tested once
    return any(name.startswith(_JAX_DISPATCH) or name == INPUT_ANNOTATION for name in names)


@dataclasses.dataclass(frozen=True)
class _Line:
    """What the TensorFlow classification needs to know of a line."""

    plane: int
    index: int
    """In its plane."""
    name: str
    on_device: bool
    is_tf_data: bool
    is_compute: bool
    xla: bool

    @property
    def want_stats(self) -> bool:
        # Stats are only needed on device events and on host lines outside the TF executor and tf.data (where step
        # markers and annotations live), and on tf_Compute lines of a plane that runs XLA-compiled work.
        return self.on_device or not (self.is_tf_data or self.is_compute) or (self.xla and self.is_compute)


def _table(columns: dict[str, np.ndarray]) -> PlainTable:
    """:func:`make_table` of these columns, in file order (``{}`` for no rows; a column absent gets its default
    on every row), built as the Kineto reader builds its table (:func:`table_from_columns`, one copy of each
    column, the same order by start and longest first)."""
    n = len(columns["ts_us"]) if columns else 0
    if not n:
        return PlainTable.of(make_table(pd.DataFrame([])))
    for col, default, dtype in (
        ("op", "", object),
        ("launch_us", np.nan, np.float64),
        ("copy_kind", "", object),
        ("bytes", np.nan, np.float64),
        ("step_num", np.nan, np.float64),
    ):
        if col not in columns:
            columns[col] = np.full(n, default, dtype=dtype)
    return plain_from_columns(columns)


def _tf_frame(data: bytearray, space: Any, path: Path) -> dict[str, np.ndarray]:
    """The rows of a TensorFlow / JAX XSpace (every column but ``self_us``; ``{}`` for none), in file order.

    Each line's events are read as columns (:func:`with_events`): their stats only on the lines where the
    classification reads stats, and of those only the :data:`_TF_STATS`. An event's classification depends only
    on its line, its metadata (name and stats) and the values of those stats on it, so each distinct
    ``(line, metadata id, values)`` is classified once (:func:`_classify_tf`, the per-event rules)
    and the answer spread over its events with numpy. The XLA clusters are then named per line
    (:func:`_name_clusters`).
    """
    lines: list[tuple[int, int]] = []
    info: list[_Line] = []
    for i, plane in enumerate(space.planes):
        pname = plane.name
        on_device = pname.startswith("/device:")
        if not on_device and not pname.startswith("/host:"):
            continue  # Task Environment, metadata planes
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        xla = _HLO_OP in stat_names.values()  # XLA-compiled work runs on this plane (also on tf_Compute lines)
        for j, line in enumerate(plane.lines):
            lname = line.name
            if on_device and not lname.lower().startswith("stream"):
                continue  # derived lines (XLA Modules, Steps, ...) repeat the stream events
            lines.append((i, j))
            info.append(_Line(i, j, lname, on_device, lname.startswith("tf_data"), lname.startswith("tf_Compute"), xla))
    if not lines:
        return {}
    columns = with_events(
        data, path, space, lines, [li.want_stats for li in info], lambda events: _tf_rows(events, space, info)
    )
    if columns:
        _link_launches(columns)
    return columns


def _tf_rows(events: Events, space: Any, info: list[_Line]) -> dict[str, np.ndarray]:
    n = len(events.metadata_id)
    if not n:
        return {}
    line = events.line
    plane_of_line = np.array([li.plane for li in info], dtype=np.int64)
    # One code per (plane, stat name) of the stats read: stat metadata ids are per plane.
    plane_ids: dict[int, dict[int, int]] = {}
    stat_names: dict[int, dict[int, str]] = {}
    for i in sorted(set(plane_of_line.tolist())):
        names = stat_names[i] = {k: v.name for k, v in space.planes[i].stat_metadata.items()}
        plane_ids[i] = {k: _TF_STATS.index(v) for k, v in names.items() if v in _TF_STATS}
    # The stat values of each event, as the strings the rules read (_stat_text), coded per stat name.
    k = len(_TF_STATS)
    codes = np.full((k, n), -1, dtype=np.int64)
    texts: list[list[str]] = [[] for _ in range(k)]
    stat_plane = plane_of_line[line[events.stat_event]]
    for i, pids in plane_ids.items():
        last = np.full((k, n), -1, dtype=np.int64)
        picked = last_stats(events, stat_plane == i, pids, last)
        if not len(picked):
            continue
        text = events.values(picked)  # a str value is its own text; the other kinds go through _stat_text
        kinds = events.stat_kind[picked]
        other = np.flatnonzero(kinds != STR)
        text[other] = [
            _stat_text(kd, v, stat_names[i]) for kd, v in zip(kinds[other].tolist(), text[other], strict=True)
        ]
        at = np.zeros(len(events.stat_id), dtype=np.int64)
        at[picked] = np.arange(len(picked))
        for w in range(k):
            evs = np.flatnonzero(last[w] >= 0)
            if not len(evs):
                continue
            c, u = pd.factorize(pd.Series(text[at[last[w, evs]]], dtype=object))
            codes[w, evs] = np.asarray(c, dtype=np.int64) + len(texts[w])
            texts[w] += list(u)
    correlation = _correlations(events, space, stat_plane, stat_names)
    # The distinct (line, metadata id, stat values): a code per event, combined one column at a time.
    key = np.asarray(pd.factorize(events.metadata_id)[0], dtype=np.int64)
    for col in (line, *codes):
        key = np.asarray(pd.factorize(key * (int(col.max()) + 2) + col + 1)[0], dtype=np.int64)
    first, inverse = np.unique(key, return_index=True, return_inverse=True)[1:]
    op_names: dict[str, str] = {}
    classes = _Classes(len(first))
    # The distinct events taken by (plane, metadata id), so that one metadata's stats are read once and held only
    # while its events are classified: no Python object per distinct event or metadata outlives its turn (tens of
    # thousands of them, alive at once, set off the garbage collector's full collections in a big window's read).
    plane_of = plane_of_line[line[first]]
    mid_of = events.metadata_id[first]
    held: tuple[int, int] | None = None
    base: dict[str, str] = {}
    for at in np.lexsort((mid_of, plane_of)).tolist():
        e = int(first[at])
        li = info[int(line[e])]
        plane = space.planes[li.plane]
        mid = int(events.metadata_id[e])
        if held != (li.plane, mid):
            held, base = (li.plane, mid), _meta_stats(plane, mid, stat_names[li.plane])
        stats = dict(base) if li.want_stats else {}
        if li.want_stats:
            for w in range(k):
                if codes[w, e] >= 0:
                    stats[_TF_STATS[w]] = texts[w][codes[w, e]]
        name = plane.event_metadata[mid].name if mid in plane.event_metadata else ""  # [] of a missing id adds it
        classes.put(at, _classify_tf(name, stats, li, op_names))
    rows = _spread(classes, inverse, events, info, space)
    rows[_CORRELATION] = correlation
    return rows


_CORRELATION = "_correlation"
"""A column of the TensorFlow rows until the launches are linked (:func:`_link_launches`): an event's
``correlation_id`` stat (NaN without one)."""
_LAUNCH_PLANE = "/host:CUPTI"
"""The plane of the host-side CUDA API calls (``cuLaunchKernel``, ``cuMemcpyHtoDAsync_v2``, ...), each with the
``correlation_id`` of the device activity it launched (TensorFlow's and JAX's GPU tracer)."""


def _correlations(
    events: Events, space: Any, stat_plane: np.ndarray, stat_names: dict[int, dict[int, str]]
) -> np.ndarray:
    """Each event's ``correlation_id`` stat as a float (NaN without one), read apart from the classification's
    stats: one value per device activity, which would make every device event a class of its own."""
    n = len(events.metadata_id)
    out = np.full(n, np.nan)
    for i, names in stat_names.items():
        ids = {k: 0 for k, v in names.items() if v == xs.STAT_CORRELATION_ID}
        last = np.full((1, n), -1, dtype=np.int64)
        picked = last_stats(events, stat_plane == i, ids, last)
        if not len(picked):
            continue
        evs = np.flatnonzero(last[0] >= 0)
        at = np.zeros(len(events.stat_id), dtype=np.int64)
        at[picked] = np.arange(len(picked))
        values = events.values(picked)[at[last[0, evs]]]
        out[evs] = [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else np.nan for v in values]
    return out


def _link_launches(columns: dict[str, np.ndarray]) -> None:
    """``launch_us`` of each device event whose ``correlation_id`` a host API call on :data:`_LAUNCH_PLANE` carries:
    that call's start (the first such call when an id repeats), so that the analysis counts the device work in the
    step that launched it, as it does for Kineto traces; a GPU running behind the host otherwise puts copies and
    kernels in the next step. NaN where the XSpace links nothing (the analysis then takes the event's own start)."""
    correlation = columns.pop(_CORRELATION)
    n = len(correlation)
    launch = np.full(n, np.nan)
    on_device = columns["on_device"].astype(bool)
    calls = np.flatnonzero((columns["pid"] == _LAUNCH_PLANE) & ~on_device & np.isfinite(correlation))
    devices = np.flatnonzero(on_device & np.isfinite(correlation))
    if len(calls) and len(devices):
        order = calls[np.lexsort((columns["ts_us"][calls], correlation[calls]))]
        keys, first = np.unique(correlation[order], return_index=True)
        starts = columns["ts_us"][order[first]]
        pos = np.searchsorted(keys, correlation[devices]).clip(0, len(keys) - 1)
        hit = keys[pos] == correlation[devices]
        launch[devices[hit]] = starts[pos[hit]]
    columns["launch_us"] = launch


def _meta_stats(plane: Any, mid: int, names: dict[int, str]) -> dict[str, str]:
    """The :data:`_TF_STATS` of an event metadata, by name, as strings (later stats of one name win)."""
    if mid not in plane.event_metadata:
        return {}
    out: dict[str, str] = {}
    for st in plane.event_metadata[mid].stats:
        name = names.get(st.metadata_id, "")
        if name in _TF_STATS:
            which = st.WhichOneof("value")
            out[name] = _stat_text(VALUE_FIELDS[which] if which else 0, getattr(st, which) if which else None, names)
    return out


def _stat_text(kind: int, value: Any, stat_names: dict[int, str]) -> str:
    """A stat's value as the TensorFlow rules read it: ``"<bytes>"`` for bytes, a reference as the name it
    refers to, "" for none, else ``str``."""
    if kind == BYTES_VALUE:
        return "<bytes>"
    if kind == REF:
        return stat_names.get(value, "")
    return "" if value is None else str(value)


@dataclasses.dataclass
class _Class:
    """One distinct event's row, but its times: what :func:`_classify_tf` decides."""

    kind: Kind
    name: str
    copy_kind: str | None = None
    nbytes: float = np.nan
    op: str | None = None
    step_num: float = np.nan
    call: bool = False
    """A TF async op that may call an XLA cluster (named by :func:`_name_clusters`)."""
    module: str | None = None
    """An HLO op's ``hlo_module``."""


class _Classes:
    """The distinct events' :class:`_Class` fields as columns, one list a field: the classes as values in a few
    lists, not one Python object per distinct event held until the table is built."""

    FIELDS = ("kind", "name", "copy_kind", "nbytes", "op", "step_num", "call", "module")

    def __init__(self, n: int) -> None:
        self.columns: dict[str, list[Any]] = {f: [None] * n for f in self.FIELDS}

    def put(self, at: int, c: _Class) -> None:
        """Distinct event ``at``'s class."""
        for f, col in self.columns.items():
            col[at] = getattr(c, f)

    def __len__(self) -> int:
        return len(self.columns["kind"])


def _classify_tf(name: str, stats: dict[str, str], li: _Line, op_names: dict[str, str]) -> _Class:
    """An event's kind and row fields from its name, stats and line (the rules of this module's docstring)."""
    is_tf_data, is_compute = li.is_tf_data, li.is_compute
    if li.on_device:
        out = _Class(Kind.KERNEL, name)
        kind = _copy_kind(name, stats.get("memcpy_details", ""))
        if kind or name.lower().startswith("memcpy"):
            out.kind, out.copy_kind = Kind.MEMCPY, kind
            m = _BYTES.search(stats.get("memcpy_details", ""))
            if m:
                out.nbytes = float(m.group(1))
        elif "nccl" in name.lower() or "rccl" in name.lower():
            out.kind = Kind.COLLECTIVE
        tf_op = stats.get("tf_op") or stats.get("hlo_op") or ""
        op = op_names.get(tf_op)
        if op is None:  # one str per op name, shared by its kernels
            op = op_names[tf_op] = tf_op.split(":")[0]
        out.op = op
        return out
    if name == INPUT_ANNOTATION or _INPUT_EVENT.match(name):
        return _Class(Kind.INPUT, name)
    if name in NOT_TRAINING_ANNOTATIONS and not (is_tf_data or is_compute):
        return _Class(Kind.NOT_TRAINING, name)  # fitprof's own spans (validation, its overhead)
    if _HLO_OP in stats and not is_tf_data:  # an XLA thunk (HLO op) run on a host thread
        return _Class(Kind.OP, stats[_HLO_OP] or name, module=stats.get("hlo_module", ""))
    if (
        li.xla
        and is_compute
        and name == _ASYNC_OP
        and not stats.get("kernel_type", "").startswith(("IteratorGetNext", "MultiDeviceIteratorGetNext"))
    ):
        return _Class(Kind.OTHER, name, call=True)  # an XLA cluster's call when HLO ops run inside it
    if "step_num" in stats and not (is_tf_data or is_compute):
        out = _Class(Kind.STEP, name)
        try:
            out.step_num = float(stats["step_num"])
        except ValueError:
            pass
        return out
    if (is_compute or li.name.startswith("collective_ops")) and (op_match := _TF_OP.fullmatch(name)):
        op_name, op_type = op_match["name"], op_match["type"]
        if op_type.startswith(("IteratorGetNext", "MultiDeviceIteratorGetNext")):
            kind = Kind.INPUT
        elif _COLLECTIVE_TYPES.match(op_type):
            kind = Kind.COLLECTIVE
        else:
            kind = Kind.OP
        return _Class(kind, op_name.removeprefix(_FUNCTION_PREFIX))
    if "_r" in stats and not is_tf_data:
        return _Class(Kind.ANNOTATION, name)
    return _Class(Kind.OTHER, name)


def _spread(
    classes: _Classes, inverse: np.ndarray, events: Events, info: list[_Line], space: Any
) -> dict[str, np.ndarray]:
    """The rows: each event gets its distinct event's class, its own times, its plane and line names.

    A column that applies only to some rows (``op`` on device rows, ``copy_kind`` on copies) holds NaN on the
    others, as :class:`pandas.DataFrame` gives for a key missing from a row's dict.
    """
    line = events.line
    base_ns = np.array([float(space.planes[li.plane].lines[li.index].timestamp_ns) for li in info], dtype=np.float64)
    # (base_ns + offset_ps / 1e3) / 1e3 and duration_ps / 1e6, as Python computed them per event: the same IEEE
    # operations on the same float64 values (an int64 converts to the nearest float64 either way).
    ts = (base_ns[line] + events.offset_ps.astype(np.float64) / 1e3) / 1e3
    dur = events.duration_ps.astype(np.float64) / 1e6

    cols = classes.columns

    def column(values: list[Any], dtype: Any = object) -> np.ndarray:
        per_class = np.empty(len(classes), dtype=dtype)
        per_class[:] = values
        return per_class[inverse]

    kind = column(cols["kind"])
    name = column(cols["name"])
    frame: dict[str, Any] = {"name": name, "ts_us": ts, "dur_us": dur}
    plane_names = np.array([space.planes[li.plane].name for li in info], dtype=object)
    frame["pid"] = plane_names[line]
    frame["tid"] = np.array([li.name for li in info], dtype=object)[line]
    frame["on_device"] = np.array([li.on_device for li in info], dtype=bool)[line]
    frame["kind"] = kind
    if any(v is not None for v in cols["copy_kind"]):
        frame["copy_kind"] = column([np.nan if v is None else v for v in cols["copy_kind"]])
    frame["bytes"] = column(cols["nbytes"], np.float64)
    if any(v is not None for v in cols["op"]):
        frame["op"] = column([np.nan if v is None else v for v in cols["op"]])
    frame["step_num"] = column(cols["step_num"], np.float64)
    calls = np.flatnonzero(column(cols["call"], bool))
    if len(calls):
        hlo = np.flatnonzero(column([v is not None for v in cols["module"]], bool))
        _name_clusters(calls, hlo, column(cols["module"]), line, ts, dur, kind, name)
    return frame


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


def _name_clusters(
    calls: np.ndarray,
    hlo: np.ndarray,
    modules: np.ndarray,
    line: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    kind: np.ndarray,
    name: np.ndarray,
) -> None:
    """Make each TF async op within which HLO ops ran on its line an operator named after their ``hlo_module``
    (the XLA cluster it runs: ``a_inference_one_step_on_data_1131__.7`` for Keras's ``jit_compile=True`` step), in
    place on the rows ``calls``; ``hlo``: the rows of HLO ops (``modules``: their modules by row).

    A call is the cluster of the first HLO op of its line that starts at or after it (the HLO ops sorted by start,
    then module name), when that op starts before the call ends. Its self time is then its span less the HLO
    ops run on its own line: the cluster's dispatch and the time it waits for the HLO ops on other threads
    (``tf_numa_*_Eigen``), which count on their own lines.
    """
    for ln in np.unique(line[calls]).tolist():
        rows = calls[line[calls] == ln]
        ops = hlo[line[hlo] == ln]
        if not len(ops):
            continue
        found = sorted(zip(ts[ops].tolist(), modules[ops].tolist(), strict=True))
        starts = np.array([m[0] for m in found], dtype=np.float64)
        i = np.searchsorted(starts, ts[rows], side="left")
        ok = i < len(found)
        rows, i = rows[ok], i[ok]
        inside = starts[i] <= ts[rows] + dur[rows]
        for r, j in zip(rows[inside].tolist(), i[inside].tolist(), strict=True):
            kind[r] = Kind.OP
            name[r] = found[j][1] or name[r]  # an HLO op without its module: keep the executor's name


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


def _int_stat(value: Any) -> int:
    """A Task Environment stat as an int (0 when missing or not a number)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


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
_CONVERTED_STATS = (xs.STAT_CATEGORY, "correlation", "bytes", "kind")
"""What the converted reader reads of an event's stats: its category and those ``args``."""


def _read_converted(data: bytearray, space: Any, path: Path, env: dict[str, Any]) -> PlainTable:
    """An XSpace fitprof converted from a Kineto trace -> the table ``read_kineto`` gives for that trace.

    The events are read as columns (:func:`with_events`) straight into the Kineto reader's columns
    (:class:`fitprof.traces._kineto_rules.Columns`, as its decoder fills them from the trace's JSON) and classified
    by :func:`fitprof.traces._kineto_rules.frame`: the values ``event_frame`` decodes from the events rebuilt as JSON,
    Kineto ``ts`` = (line ``timestamp_ns`` * 1000 + ``offset_ps``) / 1e6 and ``dur`` = ``duration_ps`` / 1e6, the
    name the metadata's display name or else its name, ``cat`` the last ``category`` stat (``str`` of its value),
    the ``args`` the last stat of each of :data:`_KINETO_ARGS`; events whose ``cat`` is ``Trace`` are left out, as
    ``read_kineto`` leaves out the profiler's own span.
    """
    lines: list[tuple[int, int]] = []
    tids: list[str] = []
    for i, plane in enumerate(space.planes):
        pname = plane.name
        if not (pname.startswith("/host:") or pname.startswith(xs.DEVICE_PLANE_PREFIX)):
            continue
        line_names = Counter(line.name for line in plane.lines)
        for j, line in enumerate(plane.lines):  # a line is a thread or a stream: its name, made unique if shared
            if pname.startswith(xs.DEVICE_PLANE_PREFIX) and line.name == xs.HOST_STEPS_LINE:
                continue  # markers for xprof repeating the host's steps: counted once, on the host
            lines.append((i, j))
            tids.append(line.name if line_names[line.name] == 1 else f"{line.name} ({line.id})")
    # The lines count from the profile's start; Kineto's ts from its baseTimeNanoseconds.
    start_ns = _int_stat(env.get(xs.STAT_PROFILE_START)) - _int_stat(env.get(xs.STAT_KINETO_BASE_NS))
    cols = with_events(
        data,
        path,
        space,
        lines,
        [True] * len(lines),
        lambda ev: _converted_columns(ev, space, lines, tids, path, start_ns),
    )
    frame = kineto_rules.frame(cols, path)
    table = _table({c: frame[c].to_numpy() for c in frame.columns})
    del frame
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


def _converted_columns(
    events: Events, space: Any, lines: list[tuple[int, int]], tids: list[str], path: Path, start_ns: int = 0
) -> kineto_rules.Columns:
    """The Kineto reader's columns of a converted XSpace's events (see :func:`_read_converted`); ``start_ns`` is the
    profile's start (the Task Environment's ``profile_start_time``), from which the lines' times count."""
    line = events.line
    plane_of_line = np.array([i for i, _ in lines], dtype=np.int64)
    event_plane = plane_of_line[line]
    n = len(line)
    k = len(_CONVERTED_STATS)
    # Stat metadata ids are per plane: the stats of each plane's events, one name index per id.
    last = np.full((k, n), -1, dtype=np.int64)
    names_of: dict[int, dict[int, str]] = {}
    stat_plane = event_plane[events.stat_event]
    for i in sorted(set(plane_of_line.tolist())):
        names = names_of[i] = {kk: v.name for kk, v in space.planes[i].stat_metadata.items()}
        ids = {
            sid: _CONVERTED_STATS.index(_KINETO_ARGS.get(name, name))
            for sid, name in names.items()
            if name == xs.STAT_CATEGORY or name in _KINETO_ARGS
        }
        last_stats(events, stat_plane == i, ids, last)

    def stat_values(w: int) -> tuple[np.ndarray, np.ndarray]:
        """The events that have stat ``w`` and its values (``ref_value`` resolved, bytes as None: xs.stat_value)."""
        evs = np.flatnonzero(last[w] >= 0)
        picked = last[w, evs]
        values = events.values(picked)
        kinds = events.stat_kind[picked]
        for r in np.flatnonzero((kinds == REF) | (kinds == BYTES_VALUE)).tolist():
            values[r] = names_of[int(event_plane[evs[r]])].get(values[r], "") if kinds[r] == REF else None
        return evs, values

    # cat: str() of the last category stat's value; "" without one. "Trace" events are not complete events.
    cat = np.full(n, "", dtype=object)
    evs, values = stat_values(0)
    if len(evs):
        other = np.flatnonzero(events.stat_kind[last[0, evs]] != STR)
        values[other] = [str(v) for v in values[other].tolist()]
        cat[evs] = values
    keep = np.flatnonzero(cat != "Trace")
    row = np.full(n, -1, dtype=np.int64)
    row[keep] = np.arange(len(keep))

    # ts: the lines start relative to the profile's start (as TensorFlow writes them); adding it back gives the
    # trace's own clock, so that each time is the float64 the Kineto trace's JSON decodes to and the two reads give
    # one table. The sum is exact in integers and split into whole microseconds (exact in float64 below 2**53 us)
    # and the picoseconds left (one rounding): ``(base_ps + offset_ps) / 1e6`` in float64 rounds to 0.25 us at
    # Kineto's absolute timestamps (~1.7e15 us). A decimal Kineto time with at most 3 decimals is never a rounding
    # midpoint of float64, so the two roundings give the correctly rounded time.
    off = events.offset_ps
    ts = np.empty(n, dtype=np.float64)
    for li, (i, j) in enumerate(lines):
        sel = np.flatnonzero(line == li)
        if not len(sel):
            continue
        whole_us, rest_ps = divmod((start_ns + space.planes[i].lines[j].timestamp_ns) * 1000, 10**6)
        more_us, ps = np.divmod(off[sel] + rest_ps, 10**6)
        ts[sel] = (more_us + whole_us).astype(np.float64) + ps / 1e6
    dur = events.duration_ps.astype(np.float64) / 1e6

    # args: a NaN or infinite double as None, the null the Kineto trace's JSON holds for it.
    args: list[tuple[np.ndarray, np.ndarray]] = []
    for w in range(1, k):
        evs, values = stat_values(w)
        doubles = np.flatnonzero(events.stat_kind[last[w, evs]] == DOUBLE)
        values[doubles] = [v if np.isfinite(v) else None for v in values[doubles].tolist()]
        ok = row[evs] >= 0
        args.append((row[evs[ok]], values[ok]))
    m = len(keep)
    correlation = np.full(m, np.nan)
    nbytes = np.full(m, np.nan)
    for out, (rows, values) in zip((correlation, nbytes), args[:2], strict=True):
        if len(rows):
            out[rows] = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    rows, values = args[2]
    kind_arg = {r: v for r, v in zip(rows.tolist(), values.tolist(), strict=True) if v is not None}

    # name: the metadata's display name, else its name ("" for an unknown id); one per (plane, metadata id).
    kept_plane, kept_mid = event_plane[keep], events.metadata_id[keep]
    mid_code, mids = pd.factorize(kept_mid)
    meta_code, meta_keys = pd.factorize(kept_plane * len(mids) + mid_code)
    labels = np.empty(len(meta_keys), dtype=object)
    labels[:] = [
        _display_name(space.planes[key // len(mids)].event_metadata, int(mids[key % len(mids)]))
        for key in meta_keys.tolist()
    ]
    cat_code, cats = _codes(cat[keep], None)
    name_code, name_strings = _codes(np.asarray(meta_code, dtype=np.int64), labels)
    pid_code, pids = _codes(kept_plane, np.array([p.name for p in space.planes], dtype=object))
    tid_code, tids_ = _codes(line[keep], np.array(tids, dtype=object))
    return kineto_rules.Columns(
        ts=ts[keep], dur=dur[keep], cat_code=cat_code, cats=cats, name_code=name_code, names=name_strings,
        pid_code=pid_code, pids=pids, tid_code=tid_code, tids=tids_, correlation=correlation, nbytes=nbytes,
        kind_arg=kind_arg,
    )  # fmt: skip


def _display_name(metas: Any, mid: int) -> str:
    if mid not in metas:  # [] of a missing id would add it
        return ""
    meta = metas[mid]
    return str(meta.display_name or meta.name)


def _codes(keys: np.ndarray, table: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Codes of the values ``table[keys]`` (``keys`` themselves when ``table`` is None) and the distinct values, in
    order of first appearance, as the Kineto reader's columns hold them (``pandas.factorize``); the keys are
    coded first, so that each distinct one's value is looked at once."""
    codes, firsts = pd.factorize(keys, use_na_sentinel=False)
    if table is None:
        return np.asarray(codes, dtype=np.int64), np.asarray(firsts, dtype=object)
    value_codes, uniques = pd.factorize(pd.Series(table[np.asarray(firsts)], dtype=object), use_na_sentinel=False)
    return np.asarray(value_codes, dtype=np.int64)[codes], np.asarray(uniques, dtype=object)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None

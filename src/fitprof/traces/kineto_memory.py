"""The memory events of a Kineto trace (torch ``profile_memory=True``) as a small table of their own.

torch writes one instant event per allocation and per free::

    {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 7249, "tid": 7249,
     "ts": 5236689689631.986, "args": {"Total Reserved": 0, "Total Allocated": 10493952, "Bytes": 10485760,
     "Device Id": -1, "Device Type": 0, "Addr": 139823656464448, ...}}

(read from torch 2.13's export: ``Bytes`` is negative for a free; ``Total Allocated`` / ``Total Reserved`` are the
allocator's totals on that device after the event; ``Device Type`` is c10's ``DeviceType``, 0 the CPU, 1 CUDA).
The event table (:mod:`fitprof.traces._table`) holds timed events only; these instants are read apart, and only
from a file that holds the ``"[memory]"`` name at all, so a trace recorded without ``profile_memory`` costs one
search of its text.

Columns, with their units:

=================  ========  ====================================================================================
column             dtype     meaning
=================  ========  ====================================================================================
ts_us              float64   when, microseconds on the trace's clock (the event table's ``ts_us``)
bytes              float64   bytes allocated (> 0) or freed (< 0)
total_allocated    float64   bytes the device's allocator holds for tensors after the event (NaN: not written)
total_reserved     float64   bytes it reserves, its cache included (NaN: not written)
device_type        int64     c10 ``DeviceType`` (0 CPU, 1 CUDA; -1 not written)
device_id          int64     device index (-1 for the CPU or not written)
pid                str       process, as the event table writes it
tid                str       thread, as the event table writes it
=================  ========  ====================================================================================
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from fitprof.traces._limits import EventCounter, Limits, count_objects, read_bounded
from fitprof.traces._repair import repair_names
from fitprof.traces._table import TraceError

MEMORY_EVENT = "[memory]"
"""The name torch gives its allocation and free instants."""
DEVICE_TYPES = {0: "cpu", 1: "cuda"}
"""c10 ``DeviceType`` values fitprof names (others are shown as ``device type <n>``)."""
COLUMNS: dict[str, str] = {
    "ts_us": "float64",
    "bytes": "float64",
    "total_allocated": "float64",
    "total_reserved": "float64",
    "device_type": "int64",
    "device_id": "int64",
    "pid": "object",
    "tid": "object",
}

_Number = int | float | str | None


class _MemArgs(msgspec.Struct, gc=False, frozen=True):
    nbytes: _Number = msgspec.field(default=None, name="Bytes")
    total_allocated: _Number = msgspec.field(default=None, name="Total Allocated")
    total_reserved: _Number = msgspec.field(default=None, name="Total Reserved")
    device_type: _Number = msgspec.field(default=None, name="Device Type")
    device_id: _Number = msgspec.field(default=None, name="Device Id")


class _MemEvent(msgspec.Struct, gc=False):
    ph: str | None = None
    name: _Number = ""
    pid: _Number = ""
    tid: _Number = ""
    ts: _Number = None
    args: _MemArgs | None = None


class _MemTrace(msgspec.Struct, gc=False):
    traceEvents: list[_MemEvent]


_DECODER = msgspec.json.Decoder(_MemTrace | list[_MemEvent])


def empty_memory_table() -> pd.DataFrame:
    """A memory table without rows (every column of :data:`COLUMNS`, typed)."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in COLUMNS.items()})


def _num(value: _Number) -> float:
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except ValueError:
        return math.nan


def _ident(value: _Number) -> str:
    """A pid or tid as the event table writes it: an integral number without its ``.0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


def read_memory_events(
    path: str | os.PathLike[str], *, max_trace_mb: float | None = None, max_events: int | None = None
) -> pd.DataFrame:
    """The ``[memory]`` instant events of a Kineto trace, in file order (columns: :data:`COLUMNS`).

    Args:
        path: a ``.pt.trace.json[.gz]`` file.
        max_trace_mb, max_events: the bounds of :mod:`fitprof.traces._limits` (defaults 512 MB, 10,000,000
            events), checked before the memory is spent (the decoder here holds every event at once, so its JSON
            objects are bounded too).

    Returns:
        The table; no rows when the trace holds no memory events (recorded without ``profile_memory``).

    Raises:
        TraceError: if the file is missing, unreadable, not JSON or not a Chrome trace, or passes a bound.
        ValueError: if a bound is not a positive number.
    """
    limits = Limits.of(max_trace_mb, max_events)
    p = Path(path)
    data = read_bounded(p, limits, TraceError, count=EventCounter(p, limits, TraceError))
    if data.find(MEMORY_EVENT.encode()) < 0:  # not ``in``: a handed-over map's ``in`` looks for one byte
        return empty_memory_table()
    count_objects(data, p, limits, TraceError)  # the decoder below holds every array element at once
    try:
        try:
            doc = _DECODER.decode(data)
        except msgspec.DecodeError:  # names torch's writer left unescaped (pytorch/pytorch#146900)
            text, names = repair_names(str(data, "utf-8", "surrogateescape"))  # a map has no decode()
            if not names:
                raise
            doc = _DECODER.decode(text.encode("utf-8", "surrogateescape"))
    except msgspec.ValidationError as err:
        raise TraceError(f"{p}: not a Chrome trace ({err})") from None
    except msgspec.DecodeError as err:
        raise TraceError(f"{p}: not valid JSON ({err})") from None
    except RecursionError:
        raise TraceError(f"{p}: nested deeper than a Chrome trace") from None
    del data
    events = doc if isinstance(doc, list) else doc.traceEvents
    mem = [e for e in events if e.name == MEMORY_EVENT and e.ph == "i" and e.args is not None]
    if not mem:
        return empty_memory_table()

    def column(get: object) -> np.ndarray:
        return np.array([_num(get(e)) for e in mem], dtype=float)  # type: ignore[operator]

    dtype = column(lambda e: e.args.device_type)
    dev_id = column(lambda e: e.args.device_id)
    return pd.DataFrame(
        {
            "ts_us": column(lambda e: e.ts),
            "bytes": column(lambda e: e.args.nbytes),
            "total_allocated": column(lambda e: e.args.total_allocated),
            "total_reserved": column(lambda e: e.args.total_reserved),
            "device_type": np.where(np.isnan(dtype), -1, dtype).astype(np.int64),
            "device_id": np.where(np.isnan(dev_id), -1, dev_id).astype(np.int64),
            "pid": np.array([_ident(e.pid) for e in mem], dtype=object),
            "tid": np.array([_ident(e.tid) for e in mem], dtype=object),
        }
    )

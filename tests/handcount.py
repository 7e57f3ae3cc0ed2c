"""Count a trace's figures by hand: the standard library only (``json`` + ``gzip``; the protobuf wire format read
byte by byte for XSpace), never fitprof's readers.

    python tests/handcount.py TRACE.json[.gz] TRACE.xplane.pb ...      # prints each trace's counts as JSON

The tests compare ``fitprof.analyze`` with what :func:`count` finds, so a bug in fitprof's reader or analysis
cannot cancel out: this file shares no code with ``src/fitprof`` and follows the definitions written in the
README and in ``fitprof.analysis`` / ``fitprof.traces.kineto``, walking the events one by one:

* events: the complete ones (``"ph": "X"``) except the profiler's own ``"cat": "Trace"`` span; device events are
  those of the categories Kineto records on a device row (``kernel``, ``gpu_memcpy``, ``gpu_memset``,
  ``gpu_user_annotation``, ``cuda_sync``);
* steps: host ``ProfilerStep#N`` spans (``user_annotation`` or ``cpu_op``); without any, the window is the span
  from the first host event's start to the last host event's end, and ``steps`` is 0; fitprof's
  ``fitprof/validation``, ``fitprof/overhead`` and ``fitprof/checkpoint`` spans inside steps are not step time
  (and device work launched in them is in no step);
* step time on a GPU (docs/metrics.md, "Step time on a GPU"): each kernel, copy and collective kernel launched in
  the steps belongs to the step latest to start at or before its launch; that step's device time is the union of
  its ops' spans, each cut at the start of the first op of any later step; a step whose device time is longer
  than its host span (its ``ProfilerStep`` event, end less start) lengthens the window by the difference. Only
  when the device clock holds: no device event (anything on a device row but ``gpu_user_annotation``) linked to
  its launch starts more than 50 us before the launch or more than 1 s after the last host event's end;
* input: the union of ``enumerate(DataLoader)#...__next__`` spans, clipped to the steps;
* a device event belongs to the step in which the host runtime call with its ``args.correlation`` started
  (``cuda_runtime`` / ``cuda_driver``; the first such call when a correlation id repeats); without one, the
  step in which it started itself;
* HtoD: ``gpu_memcpy`` copies named ``Memcpy HtoD (Pinned|Pageable|... -> Device)`` (or ``args.kind`` HtoD)
  in the steps, with ``args.bytes``;
* collectives: the union of NCCL / RCCL kernels in the steps; without any, the union of host collective spans
  (process-group spans ``nccl:*``, ``gloo:*``, ...; ``c10d::*`` ops; ``record_param_comms``) clipped to the steps;
* operators: with device work in the steps, the summed duration of every kernel, copy and collective kernel in
  the steps by the name of the innermost ``cpu_op`` around its launching runtime call on the same thread (the
  latest to start; the shortest on a tie; the later in the file on an exact tie), or its own name when there is
  none; without device work, host self time (duration less the operators nested directly inside, on the same
  thread) of the ``cpu_op`` events starting in the steps, a collective counting the union of its spans in the
  steps.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}
PG_PREFIXES = ("nccl:", "gloo:", "mpi:", "ucc:", "rccl:", "xccl:")
STEP = re.compile(r"ProfilerStep#(\d+)")
NOT_TRAINING = {"fitprof/validation", "fitprof/overhead", "fitprof/checkpoint"}
CLOCK_EARLY_US = 50.0
CLOCK_LATE_US = 1e6
Interval = tuple[float, float]


def load_events(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The trace's top-level object (``{}`` for a bare list) and its complete events, in file order."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw)
    meta, events = (doc, doc["traceEvents"]) if isinstance(doc, dict) else ({}, doc)
    return meta, [e for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"]


def union(spans: Iterable[Interval]) -> list[Interval]:
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(spans: Iterable[Interval]) -> float:
    return sum(e - s for s, e in spans)


def clip(spans: list[Interval], to: list[Interval]) -> list[Interval]:
    """The parts of ``spans`` inside ``to`` (both disjoint and sorted)."""
    out = []
    for s, e in spans:
        for a, b in to:
            lo, hi = max(s, a), min(e, b)
            if hi > lo:
                out.append((lo, hi))
    return union(out)


def subtract(spans: list[Interval], minus: list[Interval]) -> list[Interval]:
    """The parts of ``spans`` outside every interval of ``minus``: one walk over both in start order (a trace's
    tens of thousands of kernels make a span-by-interval loop take tens of seconds)."""
    cut = union(minus)
    if not cut:
        return union(spans)
    out: list[Interval] = []
    j = 0
    for s, e in sorted(spans):
        while j < len(cut) and cut[j][1] <= s:  # ends before this span and so before every later one
            j += 1
        lo, k = s, j
        while k < len(cut) and cut[k][0] < e:
            a, b = cut[k]
            if a > lo:
                out.append((lo, a))
            lo = max(lo, b)
            k += 1
        if e > lo:
            out.append((lo, e))
    return union(out)


def inside(t: float, spans: list[Interval]) -> bool:
    return any(s <= t < e for s, e in spans)


def host_kind(cat: str, name: str) -> str:
    """What fitprof's README says each host event is."""
    if cat in ("user_annotation", "cpu_op") and STEP.fullmatch(name):
        return "step"
    if cat == "user_annotation":
        if name.startswith("enumerate(DataLoader)#") and "__next__" in name:
            return "input"
        if name in NOT_TRAINING:
            return "not_training"
        return "collective" if name.startswith(PG_PREFIXES) else "annotation"
    if cat == "cpu_op":
        if name.startswith(("c10d::", "c10d_functional::", "_c10d_functional::", *PG_PREFIXES)):
            return "collective"
        return "collective" if name == "record_param_comms" else "op"
    return "other"


def copy_kind(e: dict[str, Any]) -> str:
    name = e["name"]
    m = re.match(r"Memcpy (\w+)(?: \((\w+) -> (\w+)\))?", name)
    direction = m.group(1).lower() if m else ""
    if direction not in ("htod", "dtoh", "dtod", "ptop"):
        direction = str(e.get("args", {}).get("kind", "")).lower()
        direction = {"1": "htod", "2": "dtoh", "3": "dtod"}.get(direction, direction)
    if direction == "htod":
        source = (m.group(2) or "").lower() if m else ""
        return {"pinned": "htod_pinned", "pageable": "htod_pageable"}.get(source, "htod")
    return {"dtoh": "dtoh", "dtod": "dtod", "ptop": "dtod"}.get(direction, "")


def device_kind(e: dict[str, Any]) -> str:
    cat, low = e["cat"], e["name"].lower()
    if cat == "kernel":
        return "collective" if "nccl" in low or "rccl" in low else "kernel"
    if cat == "gpu_memcpy":
        return "memcpy"
    return "annotation" if cat == "gpu_user_annotation" else "other"


def innermost_ops(events: list[dict[str, Any]], queries: list[int]) -> dict[int, str]:
    """``{event index: name}`` of the innermost ``cpu_op`` enclosing each query event on its thread.

    A sweep per thread: operators pushed in order of (start, longest first, file order), popped once they ended
    before the query started; the enclosing operator nearest the top of the stack is the one that started
    last (the shortest, the later in the file, on ties)."""
    by_thread: dict[tuple[str, str], list[tuple[float, int, int, int]]] = defaultdict(list)
    for i, e in enumerate(events):
        if e.get("cat") == "cpu_op":
            by_thread[(str(e.get("pid")), str(e.get("tid")))].append((e["ts"], 0, i, -1))
    for q in queries:
        e = events[q]
        by_thread[(str(e.get("pid")), str(e.get("tid")))].append((e["ts"], 1, q, q))
    out: dict[int, str] = {}
    for items in by_thread.values():
        # ops before queries at the same start; among ops: longest first, then file order
        items.sort(key=lambda it: (it[0], it[1], -events[it[2]].get("dur", 0) if it[1] == 0 else 0, it[2]))
        stack: list[int] = []
        for ts, is_query, i, _ in items:
            while stack and events[stack[-1]]["ts"] + events[stack[-1]].get("dur", 0) < ts:
                stack.pop()
            if not is_query:
                stack.append(i)
                continue
            q_end = ts + events[i].get("dur", 0)
            for j in reversed(stack):
                if events[j]["ts"] + events[j].get("dur", 0) >= q_end:
                    out[i] = events[j]["name"]
                    break
    return out


def host_self_times(events: list[dict[str, Any]], rows: list[int]) -> dict[int, float]:
    """Self time of host operator-like events (ops, collectives, input spans), per thread: duration less the
    parts of the events nested directly inside it."""
    by_thread: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i in rows:
        by_thread[(str(events[i].get("pid")), str(events[i].get("tid")))].append(i)
    out = {i: float(events[i].get("dur", 0)) for i in rows}
    for items in by_thread.values():
        items.sort(key=lambda i: (events[i]["ts"], -events[i].get("dur", 0)))
        stack: list[int] = []
        for i in items:
            t = events[i]["ts"]
            while stack and events[stack[-1]]["ts"] + events[stack[-1]].get("dur", 0) <= t:
                stack.pop()
            if stack:
                p = stack[-1]
                p_end = events[p]["ts"] + events[p].get("dur", 0)
                out[p] -= min(t + events[i].get("dur", 0), p_end) - t
            stack.append(i)
    return {i: max(v, 0.0) for i, v in out.items()}


class _Window:
    """A Kineto trace's complete events, classified, and its analysed window (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.meta, ev = load_events(path)
        self.ev = ev
        self.on_device = on_device = [e.get("cat") in DEVICE_CATS for e in ev]
        self.kinds = kinds = [
            device_kind(e) if d else host_kind(e.get("cat", ""), e["name"]) for e, d in zip(ev, on_device, strict=True)
        ]
        self.step_rows = [i for i, k in enumerate(kinds) if k == "step"]
        if self.step_rows:
            self.steps = union((ev[i]["ts"], ev[i]["ts"] + ev[i]["dur"]) for i in self.step_rows)
        else:
            host = [i for i, d in enumerate(on_device) if not d]
            self.steps = [(min(ev[i]["ts"] for i in host), max(ev[i]["ts"] + ev[i].get("dur", 0) for i in host))]
        excluded = union((ev[i]["ts"], ev[i]["ts"] + ev[i]["dur"]) for i, k in enumerate(kinds) if k == "not_training")
        self.analysed = subtract(self.steps, excluded)
        launch: dict[Any, int] = {}
        for i, e in enumerate(ev):
            corr = e.get("args", {}).get("correlation")
            if e.get("cat") in RUNTIME_CATS and corr is not None and corr not in launch:
                launch[corr] = i
        self.launcher = {
            i: launch.get(ev[i].get("args", {}).get("correlation"), -1) for i, d in enumerate(on_device) if d
        }
        self.anchor = {i: ev[j]["ts"] if j >= 0 else ev[i]["ts"] for i, j in self.launcher.items()}
        self.in_steps = [i for i, t in self.anchor.items() if inside(t, self.analysed)]

    def spans(self, rows: Iterable[int]) -> list[Interval]:
        return union((self.ev[i]["ts"], self.ev[i]["ts"] + self.ev[i].get("dur", 0)) for i in rows)


def device_clock_ok(w: _Window) -> bool:
    """Whether the window's device clock holds: no device event linked to its launch (annotations on a device row
    aside) starts more than :data:`CLOCK_EARLY_US` before the launch, or more than :data:`CLOCK_LATE_US` after the
    last host event's end."""
    ev = w.ev
    host_end = max((e["ts"] + e.get("dur", 0) for e, d in zip(ev, w.on_device, strict=True) if not d), default=math.inf)
    for i, j in w.launcher.items():
        if j < 0 or w.kinds[i] == "annotation":
            continue
        if ev[i]["ts"] < ev[j]["ts"] - CLOCK_EARLY_US or ev[i]["ts"] > host_end + CLOCK_LATE_US:
            return False
    return True


def device_excess_us(w: _Window) -> float:
    """What the steps' device times add to the window (us): over the steps, the device time of each step's ops less
    its host span, where that is positive (see the module docstring)."""
    ev = w.ev
    if w.step_rows:
        host = [(ev[i]["ts"], ev[i]["ts"] + ev[i]["dur"]) for i in w.step_rows]
    else:
        host = list(w.steps)
    # Steps in start order, ties in file order; an op goes to the last step starting at or before its launch.
    order = sorted(range(len(host)), key=lambda k: host[k][0])
    ops: dict[int, list[Interval]] = defaultdict(list)
    for i in w.in_steps:
        if w.kinds[i] not in ("kernel", "memcpy", "collective"):
            continue
        owner = None
        for k in order:
            if host[k][0] <= w.anchor[i]:
                owner = k
        if owner is not None:
            ops[owner].append((ev[i]["ts"], ev[i]["ts"] + ev[i].get("dur", 0)))
    total = 0.0
    for pos, k in enumerate(order):
        if k not in ops:
            continue
        cut = min((s for later in order[pos + 1 :] for s, _ in ops.get(later, [])), default=math.inf)
        busy = length(union((s, max(s, min(e, cut))) for s, e in ops[k]))
        total += max(busy - (host[k][1] - host[k][0]), 0.0)
    return total


def overlap(a: list[Interval], b: list[Interval]) -> float:
    """Length of the intersection of two disjoint, sorted interval lists (a two-pointer walk)."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def exposed(path: str | Path) -> dict[str, float]:
    """Exposed time (us, summed over the steps) of the input wait, the HtoD copies and the collectives, by the
    rules of ``fitprof.analysis``'s docstring, counted here event by event:

    * HtoD: the union of HtoD copies in the steps less the time a kernel or collective kernel in the steps ran;
    * collectives: the union of collective kernels in the steps less the time a compute kernel in the steps ran;
      without any, the host collective spans clipped to the steps less the time a host operator ran on another
      thread, or on the span's own thread outside its spans (``pin_memory`` operators hide nothing);
    * input: with device work in the steps, the input spans clipped to the steps less the device work and the
      host operators as for host collectives; without device work, all of it.
    """
    w = _Window(path)
    ev, kinds = w.ev, w.kinds
    rows = lambda *ks: [i for i in w.in_steps if kinds[i] in ks]  # noqa: E731
    copies = w.spans(i for i in rows("memcpy") if copy_kind(ev[i]).startswith("htod"))
    out = {"htod": length(copies) - overlap(copies, w.spans(rows("kernel", "collective")))}
    coll = w.spans(rows("collective"))
    if coll:
        out["collectives"] = length(coll) - overlap(coll, w.spans(rows("kernel")))
    else:
        out["collectives"] = _host_exposed(w, "collective", [])
    device_work = rows("kernel", "memcpy", "collective")
    if device_work:
        out["input"] = _host_exposed(w, "input", w.spans(device_work))
    else:
        out["input"] = length(clip(w.spans(i for i, k in enumerate(kinds) if k == "input"), w.analysed))
    return out


def _host_exposed(w: _Window, kind: str, device_cover: list[Interval]) -> float:
    ev = w.ev
    host = [i for i, d in enumerate(w.on_device) if not d]
    thread = {i: (str(ev[i].get("pid")), str(ev[i].get("tid"))) for i in host}
    span_rows = [i for i in host if w.kinds[i] == kind]
    spans = clip(w.spans(span_rows), w.analysed)
    compute = [i for i in host if w.kinds[i] == "op" and "pin_memory" not in ev[i]["name"]]
    span_threads = {thread[i] for i in span_rows}
    cover = device_cover + w.spans(i for i in compute if thread[i] not in span_threads)
    for t in span_threads:
        own = w.spans(i for i in compute if thread[i] == t)
        cover += subtract(own, w.spans(i for i in span_rows if thread[i] == t))
    return length(spans) - overlap(spans, union(cover))


def count(path: str | Path, top_k: int = 5) -> dict[str, Any]:
    """Every figure of a Kineto trace, in the trace's microseconds (see the module docstring).

    Returns a dict: ``steps`` (the ``ProfilerStep`` numbers), ``window_us`` (summed step time: ``host_window_us``,
    the steps' host spans less fitprof's spans, plus ``device_excess_us``, what longer device times add, 0 when
    ``device_clock_ok`` is False), ``input_us``,
    ``htod`` / ``htod_pinned`` / ``htod_pageable`` / ``dtoh`` (copies in the steps, each ``{"count", "dur_us",
    "bytes"}``, bytes NaN when some copy does not say), ``dtod_count``, ``collective_us``, ``collective_kernels``, ``op_source``
    (``"device"`` / ``"host"``), ``ops`` (``[(name, us)]``, largest first), ``kinds`` (events per kind, as the
    README's table of categories names them), ``rank`` and ``world_size`` (``distributedInfo``), and over the whole
    trace, steps or not: ``all_copies`` (by copy kind, as above) and ``all_collective_kernels``."""
    w = _Window(path)
    meta, ev, on_device, kinds, spans = w.meta, w.ev, w.on_device, w.kinds, w.spans
    steps, analysed, launcher, anchor, in_steps = w.steps, w.analysed, w.launcher, w.anchor, w.in_steps
    host_window_us = length(analysed)
    clock_ok = device_clock_ok(w)
    excess_us = device_excess_us(w) if clock_ok else 0.0
    window_us = host_window_us + excess_us
    input_us = length(clip(spans(i for i, k in enumerate(kinds) if k == "input"), analysed))

    def copies(kind: str, among: Iterable[int] = in_steps) -> dict[str, Any]:
        rows = [i for i in among if kinds[i] == "memcpy" and copy_kind(ev[i]) == kind]
        sizes = [ev[i].get("args", {}).get("bytes") for i in rows]
        nbytes = math.nan if any(b is None for b in sizes) else float(sum(sizes))
        return {"count": len(rows), "dur_us": float(sum(ev[i]["dur"] for i in rows)), "bytes": nbytes}

    coll_kernels = [i for i in in_steps if kinds[i] == "collective"]
    if coll_kernels:
        collective_us = length(spans(coll_kernels))
    else:
        host_coll = [i for i, k in enumerate(kinds) if k == "collective" and not on_device[i]]
        collective_us = length(clip(spans(host_coll), analysed))

    totals: dict[str, float] = defaultdict(float)
    device_work = [i for i in in_steps if kinds[i] in ("kernel", "memcpy", "collective")]
    if device_work:
        op_source = "device"
        names = innermost_ops(ev, sorted({launcher[i] for i in device_work if launcher[i] >= 0}))
        for i in device_work:
            totals[names.get(launcher[i], ev[i]["name"])] += ev[i]["dur"]
    else:
        op_source = "host"
        oplike = [i for i, k in enumerate(kinds) if k in ("op", "collective", "input") and not on_device[i]]
        self_us = host_self_times(ev, oplike)
        started_in = [i for i in oplike if kinds[i] != "input" and inside(ev[i]["ts"], analysed)]
        for i in started_in:
            if kinds[i] == "op":
                totals[ev[i]["name"]] += self_us[i]
        for name in {ev[i]["name"] for i in started_in if kinds[i] == "collective"}:
            same = [i for i in started_in if ev[i]["name"] == name]
            totals[name] = length(clip(spans(same), steps))
    ops = sorted(totals.items(), key=lambda kv: -kv[1])[:top_k]

    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    return {
        "steps": sorted(int(STEP.fullmatch(ev[i]["name"]).group(1)) for i in w.step_rows),  # type: ignore[union-attr]
        "window_us": window_us,
        "host_window_us": host_window_us,
        "device_excess_us": excess_us,
        "device_clock_ok": clock_ok,
        "input_us": input_us,
        "htod_pinned": copies("htod_pinned"),
        "htod_pageable": copies("htod_pageable"),
        "htod": copies("htod"),
        "dtoh": copies("dtoh"),
        "dtod_count": copies("dtod")["count"],
        "collective_us": collective_us,
        "collective_kernels": len(coll_kernels),
        "op_source": op_source,
        "ops": ops,
        "kinds": dict(Counter(kinds)),
        # the whole trace, steps or not: what the reader's table holds
        "all_copies": {k: copies(k, anchor) for k in ("htod_pinned", "htod_pageable", "htod", "dtoh", "dtod")},
        "all_collective_kernels": sum(kinds[i] == "collective" for i in anchor),
        "rank": dist.get("rank"),
        "world_size": dist.get("world_size"),
    }


# ------------------------------------------------------------------------------------------------ XSpace


def _message(data: bytes) -> dict[int, list[Any]]:
    """One protobuf message from its wire format: ``{field number: [values]}`` (varints as ints, length-delimited
    fields as bytes; XSpace uses no other wire types where this looks)."""
    out: dict[int, list[Any]] = defaultdict(list)
    i = 0

    def varint() -> int:
        nonlocal i
        shift = value = 0
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while i < len(data):
        key = varint()
        num, wire = key >> 3, key & 7
        if wire == 0:
            out[num].append(varint())
        elif wire == 2:
            size = varint()
            out[num].append(data[i : i + size])
            i += size
        elif wire == 1:
            out[num].append(data[i : i + 8])
            i += 8
        elif wire == 5:
            out[num].append(data[i : i + 4])
            i += 4
        else:
            raise ValueError(f"wire type {wire} at byte {i}")
    return out


def count_xspace(path: str | Path) -> dict[str, Any]:
    """The step and input figures of an ``.xplane.pb``, read from its wire format with the standard library
    (field numbers of tsl's ``xplane.proto``): on ``/host:`` planes, the steps are the events carrying a
    ``step_num`` stat outside the ``tf_data*`` / ``tf_Compute*`` lines; input is the union of
    ``IteratorGetNextOp::DoCompute`` spans clipped to the steps. Returns ``steps`` (their numbers), ``window_us``,
    ``input_us``, ``ops`` (the set of ``op name`` of ``tf_Compute`` events named ``<op name>:<op type>``) and
    ``device_events`` (events on ``/device:`` planes' ``Stream`` lines)."""
    space = _message(Path(path).read_bytes())
    step_spans: list[Interval] = []
    step_nums: list[int] = []
    inputs: list[Interval] = []
    ops: set[str] = set()
    device_events = 0
    for raw_plane in space[1]:
        plane = _message(raw_plane)
        name = plane[2][0].decode() if plane[2] else ""
        meta_names: dict[int, str] = {}
        for entry in plane[4]:
            kv = _message(entry)
            meta = _message(kv[2][0]) if kv[2] else {}
            meta_names[kv[1][0] if kv[1] else 0] = meta[2][0].decode() if meta.get(2) else ""
        stat_names: dict[int, str] = {}
        for entry in plane[5]:
            kv = _message(entry)
            meta = _message(kv[2][0]) if kv[2] else {}
            stat_names[kv[1][0] if kv[1] else 0] = meta[2][0].decode() if meta.get(2) else ""
        for raw_line in plane[3]:
            line = _message(raw_line)
            lname = line[2][0].decode() if line[2] else ""
            base_ns = line[3][0] if line[3] else 0
            if name.startswith("/device:"):
                if lname.lower().startswith("stream"):
                    device_events += len(line[4])
                continue
            if not name.startswith("/host:"):
                continue
            for raw_event in line[4]:
                event = _message(raw_event)
                ename = meta_names.get(event[1][0] if event[1] else 0, "")
                start = (base_ns + (event[2][0] if event[2] else 0) / 1e3) / 1e3
                end = start + (event[3][0] if event[3] else 0) / 1e6
                stats = {}
                for raw_stat in event[4]:
                    stat = _message(raw_stat)
                    stats[stat_names.get(stat[1][0] if stat[1] else 0, "")] = stat.get(4, stat.get(3, [None]))[0]
                if ename == "IteratorGetNextOp::DoCompute":
                    inputs.append((start, end))
                elif "step_num" in stats and not lname.startswith(("tf_data", "tf_Compute")):
                    step_spans.append((start, end))
                    step_nums.append(stats["step_num"])
                elif lname.startswith("tf_Compute") and ":" in ename and "::" not in ename:
                    ops.add(ename.rpartition(":")[0])
    steps = union(step_spans)
    return {
        "steps": sorted(step_nums),
        "window_us": length(steps),
        "input_us": length(clip(union(inputs), steps)),
        "ops": ops,
        "device_events": device_events,
    }


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        counted = count_xspace(arg) if arg.endswith(".xplane.pb") else count(arg)
        print(json.dumps({"trace": arg, **counted}, indent=1, default=str))

"""Event table -> :class:`~fitprof.analysis.BottleneckReport`: step time, input share, host-to-device copies,
collectives, top operators, what covers the step, the verdict.

Pure and framework-free: the same table from a Kineto trace or an XSpace gives figures with the same meaning.
See :mod:`fitprof.traces._table` for the table's columns and :mod:`fitprof.metrics` for the definitions.
:func:`analyze_table` runs the steps below in order, each a function of the window and the masks before it.

A trace without step markers is analysed as one span, from its first to its last host event: ``steps_analyzed`` is
0, a warning and the headline say so, and the verdict is that span's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fitprof.analysis import intervals
from fitprof.analysis.clock import check_device_clock, without_device_figures
from fitprof.analysis.columns import Distinct, group_sums
from fitprof.analysis.device_time import device_excess_us
from fitprof.analysis.intervals import Spans
from fitprof.analysis.report import FRAMEWORK_OF_FORMAT, BottleneckReport, Framework, OpStat, check_framework
from fitprof.analysis.speedups import exposed_times, potential_speedups
from fitprof.analysis.verdict import advice_for, verdict_for
from fitprof.traces._table import CHECKPOINT_ANNOTATION, OVERHEAD_ANNOTATION, Kind, PlainTable


def analyze_table(
    table: pd.DataFrame | PlainTable,
    *,
    top_k: int = 5,
    framework: str | None = None,
    source: str = "",
    host: str = "",
    rank: int | None = None,
    world_size: int | None = None,
) -> BottleneckReport:
    """Compute the bottleneck figures of one profiled window.

    Args:
        table: an event table (:func:`fitprof.traces.read_trace` output, or its plain columns:
            :func:`fitprof.traces.read_trace_plain`). Either is analysed as the same numpy columns.
        top_k: how many operators to rank by self time (>= 1).
        framework: ``"tensorflow"`` or ``"pytorch"`` (:data:`~fitprof.analysis.FRAMEWORKS`; picks the advice
            wording); None: from the reader that made ``table`` (``table.attrs["framework"]`` where the reader sets
            it, else ``table.attrs["format"]`` through :data:`~fitprof.analysis.FRAMEWORK_OF_FORMAT`).
        source: where the table came from, copied into the report.
        host: the host the trace was recorded on, copied into the report.
        rank: the global rank of the process that recorded it (None: unknown), copied into the report.
        world_size: how many ranks the run had (None: unknown), copied into the report.

    Returns:
        The report. Steps are the ``Kind.STEP`` events; without any, the whole host span of the trace is
        analysed as one window, ``steps_analyzed`` is 0 and a warning says so.

    Raises:
        ValueError: if ``top_k`` < 1, or ``framework`` is not one of :data:`~fitprof.analysis.FRAMEWORKS` (or None
            and the table says no format).
    """
    if top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
    fw = _framework(table, framework)
    where: dict[str, Any] = {"framework": fw, "source": source, "host": host, "rank": rank, "world_size": world_size}
    warnings: list[str] = [str(w) for w in table.attrs.get("warnings") or []]  # the reader's (repaired names)
    # The columns as numpy arrays: a frame's or series' construction costs more than a small window's sums, and
    # pandas deep-copies a frame's attrs into every frame or series derived from it.
    table = PlainTable.of(table)
    w = _window(table, warnings)
    if w.step_total_us <= 0:
        return _empty_report(where, warnings)
    # Device events belong to the step in which they were launched.
    launch = np.asarray(table["launch_us"], dtype=float)
    dev_in = w.on_device & w.in_steps(np.where(np.isnan(launch), w.ts, launch))
    host_in = ~w.on_device & w.in_steps(w.ts)
    device_work = w.on_device & ~w.kind.equal(Kind.ANNOTATION, Kind.STEP, Kind.NOT_TRAINING)
    clock = check_device_clock(w.ts, w.end, w.on_device, launch, device_work, dev_in)
    if clock.ok:
        # A device running behind the host makes the step as long as the device's work (docs/metrics.md).
        w = _with_device_time(w, launch, dev_in)

    input_us = _input_us(w)
    copies = _copies(w, dev_in)
    coll, coll_us = _collectives(w, dev_in)
    exposed = exposed_times(table, w.ts, w.end, w.kind, w.on_device, dev_in, copies.htod, coll, w.steps, w.excluded)
    ops = _operators(w, dev_in, host_in, top_k)
    cover = _coverage(w, dev_in, host_in)

    n_div = w.n_div
    input_percent = 100.0 * input_us / w.step_total_us
    htod_percent = 100.0 * copies.htod_us / w.step_total_us
    collective_percent = 100.0 * coll_us / w.step_total_us
    # The verdict rests on the exposed shares: overlapped copies and collectives cost the step nothing.
    htod_exposed_percent = min(100.0 * exposed["htod"] / w.step_total_us, htod_percent)
    collective_exposed_percent = min(100.0 * exposed["collectives"] / w.step_total_us, collective_percent)
    verdict = verdict_for(
        input_percent,
        htod_exposed_percent,
        n_div if len(w.steps[0]) else 0,
        collective_exposed_percent,
        cover.device_busy_percent if cover.device_work else cover.host_op_percent,
        device=cover.device_work,
    )
    pageable_share = copies.pageable_us / copies.htod_us if copies.htod_us > 0 else 0.0
    step_time_us = w.step_total_us / n_div
    report = BottleneckReport(
        steps_analyzed=w.n_steps,
        step_time_ms=step_time_us / 1e3,
        input_ms_per_step=input_us / n_div / 1e3,
        input_percent=input_percent,
        htod_ms_per_step=copies.htod_us / n_div / 1e3,
        htod_percent=htod_percent,
        htod_bytes_per_step=copies.htod_bytes / n_div,
        htod_gb_per_s=copies.htod_gb_per_s,
        htod_pinned_ms_per_step=copies.pinned_us / n_div / 1e3,
        htod_pageable_ms_per_step=copies.pageable_us / n_div / 1e3,
        dtoh_ms_per_step=copies.dtoh_us / n_div / 1e3,
        collective_ms_per_step=coll_us / n_div / 1e3,
        self_ms_per_step=_own_us(w) / n_div / 1e3,
        checkpoint_ms_per_step=_annotated_us(w, CHECKPOINT_ANNOTATION) / n_div / 1e3,
        optimizer_ms_per_step=_optimizer_ms_per_step(w),
        collective_percent=collective_percent,
        htod_exposed_percent=htod_exposed_percent,
        collective_exposed_percent=collective_exposed_percent,
        top_ops=ops.top,
        op_time_source=ops.source,
        verdict=verdict,
        advice=advice_for(
            verdict,
            fw,
            pageable_share=pageable_share,
            top=ops.top[0] if ops.top else None,
            tf_data=tf_data_stages(table) if fw == "tensorflow" else None,
        ),
        warnings=warnings,
        op_percent_total=ops.percent_total,
        host_op_percent=cover.host_op_percent,
        unattributed_percent=100.0 - cover.host_op_percent,
        device_busy_percent=cover.device_busy_percent,
        top_host_op=ops.top_host,
        top_host_op_percent=ops.top_host_percent,
        **where,
        **potential_speedups(step_time_us / 1e3, {k: v / n_div / 1e3 for k, v in exposed.items()}),
        device_offset_us=clock.offset_us,
    )
    return report if clock.ok else without_device_figures(report, clock.note)


def tf_data_stages(table: pd.DataFrame | PlainTable) -> frozenset[str]:
    """The ``tf.data`` stages the trace shows: the parts of its ``Iterator::Root::Prefetch::ParallelMapV2...``
    event names (``{"Root", "Prefetch", "ParallelMapV2"}``); empty when no ``tf.data`` iterator ran in it."""
    stages: set[str] = set()
    for name in map(str, pd.unique(np.asarray(table["name"]))):  # each distinct name once
        if name.startswith("Iterator::"):
            stages.update(part.partition("[")[0] for part in name.split("::")[1:])
    return frozenset(stages)


def _framework(table: pd.DataFrame | PlainTable, framework: str | None) -> Framework:
    """``framework``, else the one the reader names, else the one of the trace format."""
    if framework is None:
        # A reader may say (fitprof's converted torch window is an XSpace of framework "pytorch"); else the format.
        framework = str(table.attrs.get("framework") or FRAMEWORK_OF_FORMAT.get(str(table.attrs.get("format")), ""))
        if not framework:
            raise ValueError("framework is None and the table names no trace format: pass framework=")
    return check_framework(framework)


@dataclass(frozen=True)
class _Window:
    """The analysed window: the table's columns as arrays, its steps, and the spans inside them that are not
    training (``Kind.NOT_TRAINING``: validation, checkpoints), which no figure counts."""

    table: PlainTable
    ts: np.ndarray
    end: np.ndarray
    dur: np.ndarray
    kind: Distinct
    on_device: np.ndarray
    steps: Spans
    excluded: Spans
    not_training: np.ndarray
    n_steps: int
    step_total_us: float
    """Summed length of the steps less the excluded spans (us), each step lengthened to its device span where the
    device ran behind the host (:func:`_with_device_time`)."""
    device_paced: bool = False
    """Some step's device span outlasted its host span: the device's work, not the host spans, bounds the steps."""

    @property
    def n_div(self) -> int:
        """What per-step figures are divided by: the steps, or 1 for a trace analysed as one span."""
        return max(self.n_steps, 1)

    def in_steps(self, times: np.ndarray) -> np.ndarray:
        """Boolean mask: which times fall inside a step and outside the excluded spans."""
        return intervals.inside(times, self.steps) & ~intervals.inside(times, self.excluded)

    def clipped_us(self, spans: Spans) -> float:
        """Length of the disjoint ``spans`` inside the steps, less the excluded spans (us)."""
        return intervals.overlap(spans, self.steps) - intervals.overlap(
            intervals.intersect(spans, self.steps), self.excluded
        )


def _window(table: PlainTable, warnings: list[str]) -> _Window:
    """The steps (the union of the ``Kind.STEP`` events; without any, the host span of the whole trace, with a
    warning appended to ``warnings``) and the excluded spans inside them."""
    ts = np.asarray(table["ts_us"], dtype=float)
    dur = np.asarray(table["dur_us"], dtype=float)
    end = ts + dur
    kind = Distinct(np.asarray(table["kind"]))
    on_device = np.asarray(table["on_device"], dtype=bool)
    is_step = kind.equal(Kind.STEP)
    n_steps = int(is_step.sum())
    if n_steps:
        steps = intervals.union(ts[is_step], end[is_step])
    else:
        on_host = ~on_device
        if on_host.any():
            steps = (np.array([ts[on_host].min()]), np.array([end[on_host].max()]))
            warnings.append("No step markers in the trace: the whole trace was analysed as one window.")
        else:
            steps = (np.array([]), np.array([]))
    not_training = kind.equal(Kind.NOT_TRAINING)
    excluded = intervals.union(ts[not_training], end[not_training])
    step_total_us = float(np.sum(steps[1] - steps[0])) - intervals.overlap(steps, excluded)
    return _Window(
        table=table,
        ts=ts,
        end=end,
        dur=dur,
        kind=kind,
        on_device=on_device,
        steps=steps,
        excluded=excluded,
        not_training=not_training,
        n_steps=n_steps,
        step_total_us=step_total_us,
    )


def _with_device_time(w: _Window, launch: np.ndarray, dev_in: np.ndarray) -> _Window:
    """``w`` with each step as long as the longer of its host span and the device span of the work it launched
    (:func:`fitprof.analysis.device_time.device_excess_us`); ``w`` itself when no device span is longer, so a
    CPU-only trace keeps its figures to the bit."""
    ops = dev_in & w.kind.equal(Kind.KERNEL, Kind.MEMCPY, Kind.COLLECTIVE)
    if not ops.any():
        return w
    if w.n_steps:
        is_step = w.kind.equal(Kind.STEP)
        starts, ends = w.ts[is_step], w.end[is_step]
    else:
        starts, ends = w.steps
    launched_at = np.where(np.isnan(launch[ops]), w.ts[ops], launch[ops])  # as ``dev_in`` files them
    excess = device_excess_us(starts, ends, w.ts[ops], w.end[ops], launched_at)
    if excess <= 0:
        return w
    return dataclasses.replace(w, step_total_us=w.step_total_us + excess, device_paced=True)


def _own_us(w: _Window) -> float:
    """fitprof's own time in the steps: its ``fitprof/overhead`` spans (excluded from step time already), us."""
    own = Distinct(w.table["name"], w.not_training).equal(OVERHEAD_ANNOTATION)
    return intervals.overlap(intervals.union(w.ts[own], w.end[own]), w.steps)


def _annotated_us(w: _Window, name: str) -> float:
    """The time of one of fitprof's not-training annotations (a checkpoint save) in the steps, excluded from step
    time already, us."""
    spans = Distinct(w.table["name"], w.not_training).equal(name)
    return intervals.overlap(intervals.union(w.ts[spans], w.end[spans]), w.steps)


OPTIMIZER_STEP = "Optimizer.step#"
"""The name prefix of torch's span around each optimizer step (``Optimizer.step#SGD.step``, recorded by
``torch.optim.Optimizer``'s profiling hook)."""


def _optimizer_ms_per_step(w: _Window) -> float:
    """The optimizer's steps: the union of the host's ``Optimizer.step#...`` spans, clipped to the steps, less the
    excluded spans (validation, checkpoint saves, fitprof's own), ms per step; NaN (``math.nan`` itself, as a report
    file reads it back) when the trace has no such span."""
    spans = Distinct(np.asarray(w.table["name"]), ~w.on_device).mask(lambda u: str(u).startswith(OPTIMIZER_STEP))
    if not spans.any():
        return math.nan
    return w.clipped_us(intervals.union(w.ts[spans], w.end[spans])) / w.n_div / 1e3


def _input_us(w: _Window) -> float:
    """Input wait: the union of input spans, clipped to the steps, less excluded spans (us)."""
    inp = w.kind.equal(Kind.INPUT)
    return w.clipped_us(intervals.union(w.ts[inp], w.end[inp]))


@dataclass(frozen=True)
class _Copies:
    """The device copies launched in the steps (times in us, summed over the steps)."""

    htod: np.ndarray
    """Boolean mask of the host-to-device copies."""
    htod_us: float
    htod_bytes: float
    htod_gb_per_s: float
    pinned_us: float
    pageable_us: float
    dtoh_us: float


def _copies(w: _Window, dev_in: np.ndarray) -> _Copies:
    """Host-to-device copies (time, bytes, bandwidth, pinned and pageable time) and device-to-host time."""
    nbytes = np.asarray(w.table["bytes"], dtype=float)
    memcpy = w.kind.equal(Kind.MEMCPY)
    copies = Distinct(w.table["copy_kind"], dev_in)  # each distinct copy kind in the steps tested once
    htod = dev_in & memcpy & copies.mask(lambda ck: str(ck).startswith("htod"))
    known_bytes = htod & ~np.isnan(nbytes)
    # Copies of unknown size (ROCm traces give no bytes) leave bytes and bandwidth unknown: NaN, not 0.
    bytes_unknown = bool(htod.any()) and not known_bytes.any()
    known_us = w.dur[known_bytes].sum()
    htod_gb_per_s = float(nbytes[known_bytes].sum() / known_us / 1e3) if known_us > 0 else 0.0
    return _Copies(
        htod=htod,
        htod_us=float(w.dur[htod].sum()),
        htod_bytes=math.nan if bytes_unknown else float(nbytes[known_bytes].sum()),
        htod_gb_per_s=math.nan if bytes_unknown else htod_gb_per_s,
        pinned_us=float(w.dur[copies.equal("htod_pinned")].sum()),  # False outside dev_in
        pageable_us=float(w.dur[copies.equal("htod_pageable")].sum()),
        dtoh_us=float(w.dur[memcpy & copies.equal("dtoh")].sum()),
    )


def _collectives(w: _Window, dev_in: np.ndarray) -> tuple[np.ndarray, float]:
    """The collective rows (mask) and their time in the steps (us): the device time of collective kernels
    launched in the steps when there are any, else the host time blocked in collectives, clipped to the steps
    (never more than the step time)."""
    coll = w.kind.equal(Kind.COLLECTIVE)
    if (coll & dev_in).any():
        sel = coll & dev_in
        return coll, intervals.union_length(w.ts[sel], w.end[sel])
    sel = coll & ~w.on_device
    return coll, w.clipped_us(intervals.union(w.ts[sel], w.end[sel]))


@dataclass(frozen=True)
class _Operators:
    top: list[OpStat]
    """The ``top_k`` operators by self time."""
    source: str
    """``"device"`` (device time of kernels, copies and collectives by launching operator) or ``"host"``."""
    percent_total: float
    """Self time of every ranked operator, summed, over step time (%)."""
    top_host: str
    """The host operator with the most self time ("" when none)."""
    top_host_percent: float


def _operators(w: _Window, dev_in: np.ndarray, host_in: np.ndarray, top_k: int) -> _Operators:
    """Top operators by self time: device time when the steps launched device work, else host self time."""
    table, kind = w.table, w.kind
    device_ops = dev_in & kind.equal(Kind.KERNEL, Kind.MEMCPY, Kind.COLLECTIVE)
    name_col = np.asarray(table["name"])
    if device_ops.any():
        source = "device"
        # The launching operator's name, else the event's own.
        op_names = np.asarray(table["op"])[device_ops]
        names = np.where(op_names != "", op_names, name_col[device_ops])
        self_us = w.dur[device_ops]
    else:
        source = "host"
        ops = host_in & kind.equal(Kind.OP, Kind.COLLECTIVE)
        names = name_col[ops]
        self_us = np.asarray(table["self_us"], dtype=float)[ops]
    keys, sums = group_sums(names, self_us)
    if source == "host":
        # One collective is often recorded on two threads at once (the caller and the backend's worker):
        # count the time it spans, clipped to the steps, not the sum over threads.
        coll_rows = host_in & kind.equal(Kind.COLLECTIVE)
        if coll_rows.any():
            at = {key: i for i, key in enumerate(keys.tolist())}
            coll_names = name_col[coll_rows]
            g_start, g_end = w.ts[coll_rows], w.end[coll_rows]
            for name in pd.unique(coll_names).tolist():
                rows = coll_names == name
                sums[at[name]] = intervals.overlap(intervals.union(g_start[rows], g_end[rows]), w.steps)
    ranked = _descending(sums)[:top_k]
    if source == "host":
        top_host = ranked[:1]
        host_keys, host_sums = keys, sums
    else:  # the host operator that holds the host longest (what the device waits for when it idles)
        host_op = host_in & kind.equal(Kind.OP)
        host_keys, host_sums = group_sums(name_col[host_op], np.asarray(table["self_us"], dtype=float)[host_op])
        top_host = _largest(host_sums)
    total = w.step_total_us
    return _Operators(
        top=[OpStat(str(keys[i]), float(sums[i]) / w.n_div / 1e3, 100.0 * float(sums[i]) / total) for i in ranked],
        source=source,
        percent_total=100.0 * float(np.where(np.isnan(sums), 0.0, sums).sum()) / total,
        top_host=str(host_keys[top_host[0]]) if len(top_host) else "",
        top_host_percent=100.0 * float(host_sums[top_host[0]]) / total if len(top_host) else math.nan,
    )


def _descending(values: np.ndarray) -> np.ndarray:
    """The positions of ``values`` from the largest, ties in their order, NaN last: the order of pandas'
    ``Series.sort_values(ascending=False, kind="stable")`` (its ``nargsort``: the non-NaN values reversed, sorted
    stably, the order reversed back)."""
    nan = np.isnan(values)
    idx = np.flatnonzero(~nan)[::-1]
    order = idx[values[idx].argsort(kind="stable")][::-1]
    return np.concatenate([order, np.flatnonzero(nan)])


def _largest(values: np.ndarray) -> np.ndarray:
    """The position of the largest non-NaN value, the first of equal ones (``Series.nlargest(1)``); empty if
    none."""
    valid = np.flatnonzero(~np.isnan(values))
    if not len(valid):
        return valid
    return valid[np.flatnonzero(values[valid] == values[valid].max())[:1]]


@dataclass(frozen=True)
class _Coverage:
    host_op_percent: float
    """Share of the step in which a host operator, input wait or collective ran on some thread (%)."""
    device_busy_percent: float
    """Share of the step in which the device ran work launched in the steps (%); NaN without device work."""
    device_work: bool
    """The steps launched device work (kernels, copies, collectives)."""


def _coverage(w: _Window, dev_in: np.ndarray, host_in: np.ndarray) -> _Coverage:
    """What covers the step: host operators (their union over threads) and the device's work."""
    host_work = host_in & w.kind.equal(Kind.OP, Kind.INPUT, Kind.COLLECTIVE)
    host_op_percent = 100.0 * w.clipped_us(intervals.union(w.ts[host_work], w.end[host_work]))
    host_op_percent /= w.step_total_us
    device_work = dev_in & w.kind.equal(Kind.KERNEL, Kind.MEMCPY, Kind.COLLECTIVE)
    device_busy_percent = math.nan
    if device_work.any():
        busy = intervals.union(w.ts[device_work], w.end[device_work])
        # Work of device-paced steps runs past their host spans: count all of it (the steps were lengthened).
        busy_us = float(np.sum(busy[1] - busy[0])) if w.device_paced else w.clipped_us(busy)
        device_busy_percent = 100.0 * busy_us / w.step_total_us
    return _Coverage(host_op_percent, device_busy_percent, bool(device_work.any()))


def _empty_report(where: dict[str, Any], warnings: list[str]) -> BottleneckReport:
    """The ``no-steps`` report: every figure NaN."""
    nan = math.nan
    return BottleneckReport(
        steps_analyzed=0,
        step_time_ms=nan,
        input_ms_per_step=nan,
        input_percent=nan,
        htod_ms_per_step=nan,
        htod_percent=nan,
        htod_bytes_per_step=nan,
        htod_gb_per_s=nan,
        htod_pinned_ms_per_step=nan,
        htod_pageable_ms_per_step=nan,
        dtoh_ms_per_step=nan,
        collective_ms_per_step=nan,
        collective_percent=nan,
        top_ops=[],
        op_time_source="",
        verdict="no-steps",
        advice=advice_for("no-steps", where["framework"], pageable_share=0.0, top=None),
        warnings=[*warnings, "The profile holds no event inside a training step."],
        **where,
    )

"""Event table -> :class:`BottleneckReport`: step time, input share, host-to-device copies, top operators.

Pure and framework-free: the same table from a Kineto trace or an XSpace gives figures with the same meaning.
See :mod:`fitprof.traces._table` for the table's columns and :mod:`fitprof.metrics` for the definitions.

Verdict thresholds (percent of step time), also documented in the README:

* ``input-bound``: ``input_percent >= INPUT_BOUND_PERCENT`` (20) and input is the larger of input and HtoD;
* ``host-to-device-bound``: ``htod_percent >= HTOD_BOUND_PERCENT`` (15);
* ``communication-bound``: ``collective_percent >= COMMUNICATION_BOUND_PERCENT`` (20) and larger than input and
  HtoD: collectives (all-reduce, ...) are not mistaken for compute;
* ``compute-bound``: ``input_percent < 10`` and ``htod_percent < 10``: the top operator is named;
* ``balanced``: anything in between (some input or copy wait, none dominant);
* ``no-steps``: the trace holds no event inside an analysed step.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast, get_args

import numpy as np
import pandas as pd

from fitprof import metrics
from fitprof.traces._table import Kind

INPUT_BOUND_PERCENT = 20.0
HTOD_BOUND_PERCENT = 15.0
COMPUTE_BOUND_MAX_PERCENT = 10.0

COMMUNICATION_BOUND_PERCENT = 20.0

Framework = Literal["tensorflow", "pytorch"]
"""The framework a trace comes from: ``"tensorflow"`` (an XSpace: TensorFlow, Keras on TensorFlow, JAX) or
``"pytorch"`` (a Kineto trace: PyTorch, Lightning, Keras on torch). It picks the advice wording."""
FRAMEWORKS: tuple[Framework, ...] = get_args(Framework)
FRAMEWORK_OF_FORMAT: dict[str, Framework] = {"xspace": "tensorflow", "kineto": "pytorch"}
"""The framework of each trace format (``table.attrs["format"]``, set by the readers)."""


def check_framework(framework: str) -> Framework:
    """``framework`` if it is one of :data:`FRAMEWORKS`.

    Raises:
        ValueError: for any other value.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    return cast(Framework, framework)


@dataclass(frozen=True)
class OpStat:
    """One operator of the top-k list.

    Attributes:
        name: operator name (the launching host op for device time, e.g. ``aten::addmm``).
        self_ms_per_step: self time summed over the analysed steps, divided by their number (ms).
        percent: ``self_ms_per_step`` over ``step_time_ms``, times 100.
    """

    name: str
    self_ms_per_step: float
    percent: float


@dataclass(frozen=True)
class BottleneckReport:
    """Bottleneck figures for one profiled window (one epoch, one rank).

    Built complete by :func:`analyze_table` and never changed afterwards (frozen; use
    :func:`dataclasses.replace` for a variant). Every ``*_ms`` figure is in milliseconds, every ``*_percent`` in
    percent of step time (0-100), ``htod_gb_per_s`` in GB/s (1e9 bytes per second). See :mod:`fitprof.metrics`
    for which events each figure is computed from. ``framework`` is one of :data:`FRAMEWORKS`; ``host``,
    ``rank`` and ``world_size`` say where the trace was recorded (``rank`` / ``world_size`` None when unknown).
    """

    steps_analyzed: int
    step_time_ms: float
    input_ms_per_step: float
    input_percent: float
    htod_ms_per_step: float
    htod_percent: float
    htod_bytes_per_step: float
    htod_gb_per_s: float
    htod_pinned_ms_per_step: float
    htod_pageable_ms_per_step: float
    dtoh_ms_per_step: float
    collective_ms_per_step: float
    collective_percent: float
    top_ops: list[OpStat]
    op_time_source: str
    verdict: str
    advice: list[str]
    framework: Framework
    source: str = ""
    host: str = ""
    rank: int | None = None
    world_size: int | None = None
    warnings: list[str] = field(default_factory=list)

    def scalars(self) -> dict[str, float]:
        """The figures under their logged keys (``fitprof/step_time_ms``, ..., ``fitprof/top_ops/<op>``)."""
        out = {
            metrics.STEP_TIME_MS.key: self.step_time_ms,
            metrics.INPUT_PERCENT.key: self.input_percent,
            metrics.HTOD_MS_PER_STEP.key: self.htod_ms_per_step,
            metrics.HTOD_PERCENT.key: self.htod_percent,
            metrics.COLLECTIVE_PERCENT.key: self.collective_percent,
            metrics.STEPS_ANALYZED.key: float(self.steps_analyzed),
        }
        for op in self.top_ops:
            out[metrics.top_op_key(op.name)] = op.self_ms_per_step
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (``top_ops`` as a list of dicts)."""
        return asdict(self)

    def headline(self) -> str:
        """One line: the verdict with its evidence."""
        if self.verdict == "no-steps":
            return "no-steps: no training step was found in the profile."
        top = self.top_ops[0] if self.top_ops else None
        if self.verdict == "input-bound":
            why = f"the training loop waited for input {self.input_percent:.1f}% of step time"
        elif self.verdict == "host-to-device-bound":
            why = f"host-to-device copies took {self.htod_percent:.1f}% of step time"
        elif self.verdict == "communication-bound":
            why = f"collective communication took {self.collective_percent:.1f}% of step time"
        elif self.verdict == "compute-bound":
            why = f"top operator {top.name} takes {top.percent:.1f}% of step time" if top else "no input or copy wait"
        else:
            why = f"input {self.input_percent:.1f}%, host-to-device {self.htod_percent:.1f}% of step time"
        return f"{self.verdict}: {why}."

    def summary_markdown(self) -> str:
        """Verdict, advice and the top-operator table, as Markdown (TensorBoard's Text tab renders it)."""
        lines = [
            f"**{self.headline()}**",
            "",
            f"Step time {self.step_time_ms:.2f} ms over {self.steps_analyzed} steps; input "
            f"{self.input_percent:.1f}%; host-to-device {self.htod_ms_per_step:.3f} ms/step "
            f"({self.htod_percent:.1f}%).",
            "",
        ]
        lines += [f"- {a}" for a in self.advice]
        if self.top_ops:
            lines += [
                "",
                f"| operator ({self.op_time_source} self time) | ms/step | % of step |",
                "|---|---:|---:|",
            ]
            lines += [f"| {o.name} | {o.self_ms_per_step:.3f} | {o.percent:.1f} |" for o in self.top_ops]
        lines += [f"\n_{w}_" for w in self.warnings]
        return "\n".join(lines)


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into sorted, disjoint ones."""
    if len(starts) == 0:
        return starts.astype(float), ends.astype(float)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def _overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Total length of the intersection of two disjoint, sorted interval sets."""
    (as_, ae), (bs, be) = a, b
    total, i, j = 0.0, 0, 0
    while i < len(as_) and j < len(bs):
        lo, hi = max(as_[i], bs[j]), min(ae[i], be[j])
        if hi > lo:
            total += hi - lo
        if ae[i] < be[j]:
            i += 1
        else:
            j += 1
    return total


def _inside(times: np.ndarray, spans: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Boolean mask: which times fall inside one of the disjoint, sorted spans."""
    s, e = spans
    if len(s) == 0:
        return np.zeros(len(times), dtype=bool)
    k = np.searchsorted(s, times, side="right") - 1
    ok = k >= 0
    out = np.zeros(len(times), dtype=bool)
    out[ok] = times[ok] < e[k[ok]]
    return out


def _advice(report_verdict: str, framework: str, *, pageable_share: float, top: OpStat | None) -> list[str]:
    torch_like = framework == "pytorch"
    if report_verdict == "input-bound":
        if torch_like:
            return [
                "Load batches in parallel: raise `DataLoader(num_workers=...)` and keep them alive with "
                "`persistent_workers=True`.",
                "Move per-sample work (augmentation, decoding) out of `__getitem__` or precompute it.",
            ]
        return [
            "Overlap input with compute: end the `tf.data` pipeline with `.prefetch(tf.data.AUTOTUNE)` and "
            "give `map` `num_parallel_calls=tf.data.AUTOTUNE`.",
            "`.cache()` what does not change between epochs (decoding, resizing) before random augmentation.",
        ]
    if report_verdict == "host-to-device-bound":
        tips = []
        if pageable_share > 0.5:
            tips.append(
                "Most copies come from pageable memory: use `DataLoader(pin_memory=True)` (PyTorch) so "
                "copies run from pinned memory at full bandwidth."
            )
        tips.append(
            "Copy less: send compact dtypes (uint8 images) and convert on the device; "
            "use `non_blocking=True` copies that overlap compute."
        )
        return tips
    if report_verdict == "communication-bound":
        if torch_like:
            return [
                "Overlap gradient communication with backward: tune DDP `bucket_cap_mb`, and use "
                "`no_sync()` / gradient accumulation to all-reduce less often.",
                "Raise the per-device batch size so each all-reduce serves more compute.",
            ]
        return [
            "All-reduce less often: larger per-replica batches, or `steps_per_execution` on TPUs.",
            "Check the interconnect: collectives should overlap the backward pass.",
        ]
    if report_verdict == "compute-bound":
        name = f"`{top.name}`" if top else "the top operator"
        return [
            f"The input pipeline keeps up; speed up the model itself, starting with {name}.",
            "Try mixed precision and larger batches where the device is not full.",
        ]
    if report_verdict == "balanced":
        return ["No single bottleneck: input and compute both matter; check the top operators and the input wait."]
    return ["Profile a later window with more steps (`profile_batch`)."]


def verdict_for(input_percent: float, htod_percent: float, steps: int, collective_percent: float = 0.0) -> str:
    """The verdict label from the figures, by the thresholds in this module's docstring."""
    if steps <= 0:
        return "no-steps"
    if input_percent >= INPUT_BOUND_PERCENT and input_percent >= max(htod_percent, collective_percent):
        return "input-bound"
    if htod_percent >= HTOD_BOUND_PERCENT and htod_percent >= collective_percent:
        return "host-to-device-bound"
    if collective_percent >= COMMUNICATION_BOUND_PERCENT:
        return "communication-bound"
    if input_percent < COMPUTE_BOUND_MAX_PERCENT and htod_percent < COMPUTE_BOUND_MAX_PERCENT:
        return "compute-bound"
    return "balanced"


def analyze_table(
    table: pd.DataFrame,
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
        table: an event table (:func:`fitprof.traces.read_trace` output).
        top_k: how many operators to rank by self time (>= 1).
        framework: ``"tensorflow"`` or ``"pytorch"`` (:data:`FRAMEWORKS`; picks the advice wording); None: from
            the reader that made ``table`` (``table.attrs["format"]``, :data:`FRAMEWORK_OF_FORMAT`).
        source: where the table came from, copied into the report.
        host: the host the trace was recorded on, copied into the report.
        rank: the global rank of the process that recorded it (None: unknown), copied into the report.
        world_size: how many ranks the run had (None: unknown), copied into the report.

    Returns:
        The report. Steps are the ``Kind.STEP`` events; without any, the whole host span of the trace is
        analysed as one window, ``steps_analyzed`` is 0 and a warning says so.

    Raises:
        ValueError: if ``top_k`` < 1, or ``framework`` is not one of :data:`FRAMEWORKS` (or None and the table
            says no format).
    """
    if top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
    if framework is None:
        framework = FRAMEWORK_OF_FORMAT.get(str(table.attrs.get("format")), "")
        if not framework:
            raise ValueError("framework is None and the table names no trace format: pass framework=")
    fw = check_framework(framework)
    where: dict[str, Any] = {"framework": fw, "source": source, "host": host, "rank": rank, "world_size": world_size}
    warnings: list[str] = []
    ts = table["ts_us"].to_numpy(dtype=float)
    end = ts + table["dur_us"].to_numpy(dtype=float)
    kind = table["kind"].to_numpy()
    on_device = table["on_device"].to_numpy(dtype=bool)

    is_step = kind == Kind.STEP
    n_steps = int(is_step.sum())
    if n_steps:
        steps = _union(ts[is_step], end[is_step])
    else:
        on_host = ~on_device
        if on_host.any():
            steps = (np.array([ts[on_host].min()]), np.array([end[on_host].max()]))
            warnings.append("No step markers in the trace: the whole trace was analysed as one window.")
        else:
            steps = (np.array([]), np.array([]))
    excluded = _union(ts[kind == Kind.NOT_TRAINING], end[kind == Kind.NOT_TRAINING])
    step_total_us = float(np.sum(steps[1] - steps[0])) - _overlap(steps, excluded)
    n_div = max(n_steps, 1)
    if step_total_us <= 0:
        return _empty_report(where, warnings)

    def in_steps(times: np.ndarray) -> np.ndarray:
        return _inside(times, steps) & ~_inside(times, excluded)

    # Input wait: the union of input spans, clipped to the steps, less excluded spans.
    inp = kind == Kind.INPUT
    input_union = _union(ts[inp], end[inp])
    input_us = _overlap(input_union, steps) - _overlap(_intersect(input_union, steps), excluded)

    # Device events belong to the step in which they were launched.
    launch = table["launch_us"].to_numpy(dtype=float)
    anchor = np.where(np.isnan(launch), ts, launch)
    dev_in = on_device & in_steps(anchor)
    host_in = ~on_device & in_steps(ts)

    copy_kind = table["copy_kind"].to_numpy()
    dur = table["dur_us"].to_numpy(dtype=float)
    nbytes = table["bytes"].to_numpy(dtype=float)
    htod = dev_in & (kind == Kind.MEMCPY) & np.char.startswith(copy_kind.astype(str), "htod")
    htod_us = float(dur[htod].sum())
    known_bytes = htod & ~np.isnan(nbytes)
    # Copies of unknown size (ROCm traces give no bytes) leave bytes and bandwidth unknown: NaN, not 0.
    bytes_unknown = bool(htod.any()) and not known_bytes.any()
    htod_bytes = math.nan if bytes_unknown else float(nbytes[known_bytes].sum())
    known_us = dur[known_bytes].sum()
    htod_gb_per_s = float(nbytes[known_bytes].sum() / known_us / 1e3) if known_us > 0 else 0.0
    htod_gb_per_s = math.nan if bytes_unknown else htod_gb_per_s
    pinned_us = float(dur[dev_in & (copy_kind == "htod_pinned")].sum())
    pageable_us = float(dur[dev_in & (copy_kind == "htod_pageable")].sum())
    dtoh_us = float(dur[dev_in & (kind == Kind.MEMCPY) & (copy_kind == "dtoh")].sum())

    coll = kind == Kind.COLLECTIVE
    if (coll & dev_in).any():  # device time of collective kernels launched in the steps
        sel = coll & dev_in
        coll_us = _union_length(ts[sel], end[sel])
    else:  # host time blocked in collectives, clipped to the steps (never more than the step time)
        sel = coll & ~on_device
        coll_union = _union(ts[sel], end[sel])
        coll_us = _overlap(coll_union, steps) - _overlap(_intersect(coll_union, steps), excluded)

    # Top operators by self time.
    device_ops = dev_in & np.isin(kind, [Kind.KERNEL, Kind.MEMCPY, Kind.COLLECTIVE])
    if device_ops.any():
        source_name = "device"
        sub = table.loc[device_ops]
        names = sub["op"].where(sub["op"] != "", sub["name"])
        self_us = sub["dur_us"]
    else:
        source_name = "host"
        sel = host_in & np.isin(kind, [Kind.OP, Kind.COLLECTIVE, Kind.INPUT])
        sub = table.loc[sel & (kind != Kind.INPUT)]
        names = sub["name"]
        self_us = sub["self_us"]
    totals = self_us.groupby(names.to_numpy()).sum()
    if source_name == "host":
        # One collective is often recorded on two threads at once (the caller and the backend's worker):
        # count the time it spans, clipped to the steps, not the sum over threads.
        coll_sub = sub[sub["kind"] == Kind.COLLECTIVE]
        for name, group in coll_sub.groupby("name"):
            g_start = group["ts_us"].to_numpy(dtype=float)
            totals[name] = _overlap(_union(g_start, g_start + group["dur_us"].to_numpy(dtype=float)), steps)
    ranked = totals.sort_values(ascending=False, kind="stable").head(top_k)
    step_time_us = step_total_us / n_div
    top_ops = [
        OpStat(str(name), float(v) / n_div / 1e3, 100.0 * float(v) / step_total_us) for name, v in ranked.items()
    ]

    input_percent = 100.0 * input_us / step_total_us
    htod_percent = 100.0 * htod_us / step_total_us
    collective_percent = 100.0 * coll_us / step_total_us
    verdict = verdict_for(input_percent, htod_percent, n_div if len(steps[0]) else 0, collective_percent)
    pageable_share = pageable_us / htod_us if htod_us > 0 else 0.0
    return BottleneckReport(
        steps_analyzed=n_steps,
        step_time_ms=step_time_us / 1e3,
        input_ms_per_step=input_us / n_div / 1e3,
        input_percent=input_percent,
        htod_ms_per_step=htod_us / n_div / 1e3,
        htod_percent=htod_percent,
        htod_bytes_per_step=htod_bytes / n_div,
        htod_gb_per_s=htod_gb_per_s,
        htod_pinned_ms_per_step=pinned_us / n_div / 1e3,
        htod_pageable_ms_per_step=pageable_us / n_div / 1e3,
        dtoh_ms_per_step=dtoh_us / n_div / 1e3,
        collective_ms_per_step=coll_us / n_div / 1e3,
        collective_percent=collective_percent,
        top_ops=top_ops,
        op_time_source=source_name,
        verdict=verdict,
        advice=_advice(verdict, fw, pageable_share=pageable_share, top=top_ops[0] if top_ops else None),
        warnings=warnings,
        **where,
    )


def _intersect(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Intersection of two disjoint, sorted interval sets, as a disjoint, sorted set."""
    (as_, ae), (bs, be) = a, b
    out_s: list[float] = []
    out_e: list[float] = []
    i = j = 0
    while i < len(as_) and j < len(bs):
        lo, hi = max(as_[i], bs[j]), min(ae[i], be[j])
        if hi > lo:
            out_s.append(lo)
            out_e.append(hi)
        if ae[i] < be[j]:
            i += 1
        else:
            j += 1
    return np.array(out_s, dtype=float), np.array(out_e, dtype=float)


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    s, e = _union(starts, ends)
    return float(np.sum(e - s))


def _empty_report(where: dict[str, Any], warnings: list[str]) -> BottleneckReport:
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
        advice=_advice("no-steps", where["framework"], pageable_share=0.0, top=None),
        warnings=[*warnings, "The profile holds no event inside a training step."],
        **where,
    )

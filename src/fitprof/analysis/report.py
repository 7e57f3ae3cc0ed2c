"""The result of an analysis, :class:`BottleneckReport`, and its text: headline, speedup and throughput lines,
the Markdown summary, the logged scalars.

Every figure is computed by :func:`fitprof.analysis.analyze_table`; this module only holds and words them.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast, get_args

from fitprof import metrics
from fitprof.analysis.speedups import SPEEDUP_CLAUSE_MIN, SPEEDUP_FIXES

CHECKPOINT_NAMED_PERCENT = 10.0
"""The headline names the checkpoint saves inside the analysed steps when they took this share of the step time
(what is left once they are taken out) or more: the same 10% as a part of the epoch named in its verdict."""
OVERLAP_CLAUSE_MIN_PERCENT = 5.0
"""The smallest share of the step (percent) that overlap with compute hid from collectives or HtoD copies (total
less exposed) which the headline mentions (``collectives 33.8% of step time, 9.9% not hidden behind compute``): the
verdict rests on the exposed shares, and the headline says so where the difference matters."""

Framework = Literal["tensorflow", "pytorch", "jax"]
"""The framework a trace comes from: ``"tensorflow"`` (an XSpace of TensorFlow, Keras on TensorFlow), ``"jax"``
(an XSpace of JAX, Keras on JAX: the reader finds JAX's ``PjitFunction(...)`` dispatches or fitprof's JAX input
annotation) or ``"pytorch"`` (a Kineto trace: PyTorch, Lightning, Keras on torch). It picks the advice wording."""
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
class AllocStat:
    """One operator of the top allocators (:mod:`fitprof.analysis.memory`).

    Attributes:
        name: the innermost host operator around the allocations (or ``(outside operators)``).
        allocs_per_step: its allocations in the analysed steps, divided by their number.
        mb_per_step: the bytes those asked for, divided by the number of steps (MB, 1e6 bytes).
        percent: its share of the bytes allocated in the steps (0-100).
    """

    name: str
    allocs_per_step: float
    mb_per_step: float
    percent: float


@dataclass(frozen=True)
class BottleneckReport:
    """Bottleneck figures for one profiled window (one epoch, one rank).

    Built complete by :func:`~fitprof.analysis.analyze_table` and never changed afterwards (frozen; use
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
    op_percent_total: float = math.nan
    """Self time of every operator ranked for ``top_ops`` (the same source), summed, over step time (%); host
    self times add up over threads, so it can pass 100."""
    host_op_percent: float = math.nan
    """Share of step time (%) in which at least one host operator, input wait or collective ran on some thread."""
    unattributed_percent: float = math.nan
    """``100 - host_op_percent``: step time outside every host operator, input wait and collective (framework and
    Python overhead between operators, idle threads)."""
    device_busy_percent: float = math.nan
    """Share of step time (%) in which the device ran kernels, copies or collectives launched in the steps (their
    union); NaN on a trace without device work. ``100 -`` it is the device's idle share."""
    top_host_op: str = ""
    """The host operator with the most self time in the steps ("" when none), whatever ``op_time_source`` is."""
    top_host_op_percent: float = math.nan
    """``top_host_op``'s self time over step time (%)."""
    input_exposed_ms_per_step: float = math.nan
    htod_exposed_ms_per_step: float = math.nan
    collective_exposed_ms_per_step: float = math.nan
    htod_exposed_percent: float = math.nan
    """``htod_exposed_ms_per_step`` over step time (%): the part of ``htod_percent`` not hidden behind kernels. The
    verdict rests on it."""
    collective_exposed_percent: float = math.nan
    """``collective_exposed_ms_per_step`` over step time (%): the part of ``collective_percent`` not hidden behind
    compute. The verdict rests on it."""
    step_time_if_no_input_ms: float = math.nan
    step_time_if_no_htod_ms: float = math.nan
    step_time_if_no_collectives_ms: float = math.nan
    speedup_if_no_input: float = math.nan
    speedup_if_no_htod: float = math.nan
    speedup_if_no_collectives: float = math.nan
    samples_per_step: float = math.nan
    """Mean samples per profiled step, read from the batch by the callback (NaN: unknown, or a bare trace)."""
    samples_per_s: float = math.nan
    """``samples_per_step / (step_time_ms / 1000)``: samples in the analysed steps over their summed step time."""
    items_per_step: float = math.nan
    """Mean of the user's ``count_items(batch)`` (tokens, ...) per profiled step (NaN: no function)."""
    items_per_s: float = math.nan
    """``items_per_step / (step_time_ms / 1000)``."""
    flops_per_step: float = math.nan
    """FLOPs of one training step (forward and backward matrix products and convolutions), counted by the callback
    on a step outside the analysed ones (:mod:`fitprof.throughput`)."""
    flops_per_s: float = math.nan
    """``flops_per_step / (step_time_ms / 1000)``: achieved FLOP/s."""
    peak_flops_per_s: float = math.nan
    """Dense peak FLOP/s of the device at ``compute_dtype`` (:data:`fitprof.throughput.PEAK_FLOPS`, else derived from
    the device's properties: ``mfu_note`` says so); NaN on a CPU or an unknown device."""
    mfu: float = math.nan
    """``flops_per_s / peak_flops_per_s`` (ratio 0-1): model FLOPs utilisation; NaN on a CPU or unknown device."""
    device_name: str = ""
    """The accelerator's name as the framework gives it ("" on a CPU or when unknown)."""
    compute_dtype: str = ""
    """The compute dtype the peak was picked for (``float32``, ``tf32``, ``bfloat16``, ``float16``)."""
    mfu_note: str = ""
    """Why ``mfu`` (or ``flops_per_s``) is NaN; with a finite ``mfu``, "" when the peak is the datasheet's
    (:data:`fitprof.throughput.PEAK_FLOPS`), ``"peak derived from the device (...)"`` when it was derived from the
    device's properties (:func:`fitprof.throughput.derived_peak_flops_per_s`)."""
    self_ms_per_step: float = math.nan
    """fitprof's own time inside the analysed steps (its ``fitprof/overhead`` spans), ms per step; already left
    out of ``step_time_ms``. NaN in report files written before it existed."""
    contention: str = ""
    """Why the verdict is ``cpu-contended`` (the callback's evidence; :func:`fitprof.analysis.verdict.cpu_contended`),
    "" otherwise."""
    checkpoint_ms_per_step: float = math.nan
    """Checkpoint saves inside the analysed steps (the ``fitprof/checkpoint`` spans), ms per step; already left out
    of ``step_time_ms``. NaN in report files written before it existed."""
    optimizer_ms_per_step: float = math.nan
    """The optimizer's step inside the analysed steps (torch's ``Optimizer.step#...`` spans, their union, less
    validation, checkpoint saves and fitprof's own spans), ms per step; NaN where the trace has none."""
    memory_device: str = ""
    """Where the allocations of the churn figures were made (``cuda``, ``cpu``); "" when the trace holds no memory
    events (recorded without torch's ``profile_memory``) and the churn figures are NaN."""
    allocs_per_step: float = math.nan
    """Allocations inside the analysed steps per step (:mod:`fitprof.analysis.memory`)."""
    alloc_mb_per_step: float = math.nan
    """MB (1e6 bytes) those allocations asked for, per step."""
    allocated_peak_mb: float = math.nan
    """The most the steps' allocations held at once (MB): the largest rise of the running sum of the ``Bytes`` of
    the allocations and frees in the analysed steps on ``memory_device``."""
    heavy_churn: bool = False
    """The steps allocate at least :data:`fitprof.analysis.memory.HEAVY_CHURN_RATIO` times ``allocated_peak_mb``."""
    top_alloc_ops: list[AllocStat] = field(default_factory=list)
    """The operators that allocated most bytes in the steps, largest first."""
    device_clock_ok: bool = True
    """The device events' clock can be trusted (:mod:`fitprof.analysis.clock`): no device event is timed before its
    launch or long after the trace's last host event, and the launch lag has not grown since the fit's first window.
    True also where nothing could be checked (no device events, no launch links: XSpace traces)."""
    device_clock_note: str = ""
    """Why ``device_clock_ok`` is False ("" when it is True); the device figures are NaN then."""
    device_offset_us: float = math.nan
    """The window's launch lag: the smallest delay from a launch to its device event's start among the device
    events launched in the steps (us); NaN without them. A clock offset that builds up over the process raises it
    from window to window (:func:`fitprof.analysis.clock.across_windows`)."""

    def scalars(self) -> dict[str, float]:
        """The figures under their logged keys: each of :data:`fitprof.metrics.BASE_METRICS` read from the field it
        names (``fitprof/step_time_ms``, ...), the operators by rank, ``fitprof/top_op_1_ms`` ...
        ``fitprof/top_op_<len(top_ops)>_ms`` (ms per step), and the churn figures of a trace with memory events."""
        out = {m.key: float(getattr(self, m.field)) for m in metrics.BASE_METRICS}  # each figure's own field
        for i, op in enumerate(self.top_ops, start=1):
            out[metrics.top_op_rank_key(i)] = op.self_ms_per_step
        if self.memory_device:  # a trace with memory events (profile_memory): every window of the fit has them
            out.update({m.key: float(getattr(self, m.field)) for m in metrics.CHURN_METRICS})
        return out

    def op_scalars(self) -> dict[str, float]:
        """The top operators' self time per step (ms) under their names, ``fitprof/top_ops/<op name>``: the
        TensorBoard-only keys (see :data:`fitprof.metrics.TOP_OP`)."""
        return {metrics.top_op_key(op.name): op.self_ms_per_step for op in self.top_ops}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (``top_ops`` as a list of dicts)."""
        return asdict(self)

    def headline(self) -> str:
        """One line: the verdict with its evidence (where the step time goes, with shares)."""
        if self.verdict == "no-steps":
            return "no-steps: no training step was found in the profile."
        if self.contention:
            return f"{self.verdict}: {self.contention}.{self.checkpoint_clause()}"
        if not self.device_clock_ok:
            return f"{self.verdict}: input {self.input_percent:.1f}% of step time; {self.device_clock_note}"
        top = self.top_ops[0] if self.top_ops else None
        top_text = f"top operator {one_line(top.name)} takes {top.percent:.1f}%" if top else "no operator recorded"
        if self.verdict == "input-bound":
            why = f"the training loop waited for input {self.input_percent:.1f}% of step time"
        elif self.verdict == "host-to-device-bound":
            why = f"host-to-device copies took {self._share_text('htod', OVERLAP_CLAUSE_MIN_PERCENT)}"
            why += self._pageable_text()
        elif self.verdict == "communication-bound":
            why = f"collective communication took {self._share_text('collective', OVERLAP_CLAUSE_MIN_PERCENT)}"
        elif self.verdict == "compute-bound":
            if math.isfinite(self.device_busy_percent):
                cover = f"the device is busy {self.device_busy_percent:.1f}% of step time"
            elif math.isfinite(self.host_op_percent):
                cover = f"operators cover {self.host_op_percent:.1f}% of step time"
            else:
                cover = "no input or copy wait"
            why = f"{cover}; {top_text}"
        elif self.verdict == "host-bound":
            why = (
                f"the device is idle {100.0 - self.device_busy_percent:.1f}% of step time, waiting for the host "
                f"(host operators cover {self.host_op_percent:.1f}%, outside them {self.unattributed_percent:.1f}%"
                f"{self._top_host_text()}); {top_text} on the device{self._copies_text()}"
            )
        elif self.verdict == "overhead-bound":
            why = (
                f"{self.unattributed_percent:.1f}% of step time runs outside any operator (framework and Python "
                f"overhead); operators cover {self.host_op_percent:.1f}%, {top_text}"
            )
        else:
            why = f"input {self.input_percent:.1f}%, host-to-device {self.htod_percent:.1f}% of step time"
        if self.verdict not in ("host-to-device-bound", "communication-bound"):
            why += self._hidden_text()
        span = (
            f" (no step markers: the whole trace, {self.step_time_ms:.2f} ms, was analysed as one span)"
            if self.steps_analyzed == 0
            else ""
        )
        return f"{self.verdict}: {why}.{span}{self.speedup_clause()}{self.checkpoint_clause()}"

    def checkpoint_clause(self) -> str:
        """`` Checkpoint saves took another 84.8 ms/step (145% of step time), left out of it: save less often,
        weights only, or asynchronously.`` when the saves inside the steps took :data:`CHECKPOINT_NAMED_PERCENT` of
        the step time or more, else ""."""
        ms = self.checkpoint_ms_per_step
        if not (ms > 0 and self.step_time_ms > 0) or 100.0 * ms / self.step_time_ms < CHECKPOINT_NAMED_PERCENT:
            return ""
        return (
            f" Checkpoint saves took another {ms:.1f} ms/step ({100.0 * ms / self.step_time_ms:.0f}% of step time), "
            "left out of it: save less often, weights only, or asynchronously."
        )

    def _share_text(self, what: str, min_hidden: float = 0.05) -> str:
        """``"35.2% of step time, 18.9% not hidden behind compute"``: the total share, and the exposed one when
        overlap hid at least ``min_hidden`` percent of the step."""
        total, exposed = (
            (self.htod_percent, self.htod_exposed_percent)
            if what == "htod"
            else (self.collective_percent, self.collective_exposed_percent)
        )
        text = f"{total:.1f}% of step time"
        if math.isfinite(exposed) and total - exposed >= min_hidden:
            text += f", {exposed:.1f}% not hidden behind compute"
        return text

    def _hidden_text(self) -> str:
        """Why a collective or HtoD share did not decide the verdict although large: overlap with compute hid at
        least :data:`OVERLAP_CLAUSE_MIN_PERCENT` of the step from it. "" when it hid less."""
        parts = [
            f"{name} {self._share_text(what, OVERLAP_CLAUSE_MIN_PERCENT)}"
            for what, name, total, exposed in (
                ("collective", "collectives", self.collective_percent, self.collective_exposed_percent),
                ("htod", "host-to-device copies", self.htod_percent, self.htod_exposed_percent),
            )
            if math.isfinite(exposed) and total - exposed >= OVERLAP_CLAUSE_MIN_PERCENT
        ]
        return f"; {'; '.join(parts)}" if parts else ""

    def _top_host_text(self) -> str:
        if not self.top_host_op:
            return ""
        return f"; top host operator {one_line(self.top_host_op)} {self.top_host_op_percent:.1f}%"

    def _pageable_text(self) -> str:
        if self.htod_ms_per_step > 0 and self.htod_pageable_ms_per_step > 0:
            return f", {100.0 * self.htod_pageable_ms_per_step / self.htod_ms_per_step:.0f}% of it from pageable memory"
        return ""

    def _copies_text(self) -> str:
        if not self.htod_ms_per_step > 0:
            return ""
        return f"; host-to-device copies {self.htod_percent:.1f}%{self._pageable_text()}"

    def best_speedup(self) -> tuple[str, float, float] | None:
        """``(fix, speedup, step_time_if_fixed_ms)`` of the largest finite potential speedup (``fix`` a key of
        :data:`SPEEDUP_FIXES`; ties: input, then HtoD, then collectives); None when none is finite."""
        options = [
            ("input", self.speedup_if_no_input, self.step_time_if_no_input_ms),
            ("htod", self.speedup_if_no_htod, self.step_time_if_no_htod_ms),
            ("collectives", self.speedup_if_no_collectives, self.step_time_if_no_collectives_ms),
        ]
        finite = [o for o in options if math.isfinite(o[1]) and math.isfinite(o[2])]
        return max(finite, key=lambda o: o[1]) if finite else None

    def speedup_clause(self) -> str:
        """`` Steps would be up to 2.9x faster (80.0 -> 28.0 ms) with the input wait hidden (upper bound).``: the
        largest potential speedup (:meth:`best_speedup`), or "" when it is below :data:`SPEEDUP_CLAUSE_MIN`."""
        best = self.best_speedup()
        if best is None or best[1] < SPEEDUP_CLAUSE_MIN:
            return ""
        fix, speedup, fixed_ms = best
        return (
            f" Steps would be up to {speedup:.1f}x faster ({self.step_time_ms:.1f} -> {fixed_ms:.1f} ms) with "
            f"{SPEEDUP_FIXES[fix]} (upper bound)."
        )

    def speedup_line(self) -> str:
        """The three potential speedups, each as the step time if fixed and a factor (upper bounds)."""
        parts = [
            f"{SPEEDUP_FIXES[fix]} {ms:.2f} ms ({x:.2f}x)"
            for fix, ms, x in (
                ("input", self.step_time_if_no_input_ms, self.speedup_if_no_input),
                ("htod", self.step_time_if_no_htod_ms, self.speedup_if_no_htod),
                ("collectives", self.step_time_if_no_collectives_ms, self.speedup_if_no_collectives),
            )
            if math.isfinite(ms) and math.isfinite(x)
        ]
        return "Step time if fixed (upper bounds on the gain): " + "; ".join(parts) + "." if parts else ""

    def throughput_line(self) -> str:
        """``Throughput: 1234.5 samples/s; 3.1e+09 FLOP/step, 2.5e+11 FLOP/s, MFU 12.3%.`` (the finite parts; "" when
        none is finite)."""
        parts = [
            f"{value:.1f} {unit}/s"
            for value, unit in ((self.samples_per_s, "samples"), (self.items_per_s, "items"))
            if math.isfinite(value)
        ]
        if math.isfinite(self.flops_per_step):
            parts.append(f"{self.flops_per_step:.3g} FLOP/step")
        if math.isfinite(self.flops_per_s):
            parts.append(f"{self.flops_per_s:.3g} FLOP/s")
        if math.isfinite(self.mfu):
            derived = f" ({self.mfu_note})" if self.mfu_note.startswith("peak derived") else ""
            parts.append(f"MFU {100 * self.mfu:.1f}% of {self.device_name}'s dense {self.compute_dtype} peak{derived}")
        elif math.isfinite(self.flops_per_s) and self.mfu_note:
            parts.append(f"no MFU ({self.mfu_note})")
        return "Throughput: " + "; ".join(parts) + "." if parts else ""

    def churn_line(self) -> str:
        """``Memory churn (cpu): 11.0 allocations, 20.3 MB allocated per step (at most 2.0 MB held at once); top allocator
        aten::empty 98.7%.`` (and `` Heavy churn.``); "" without memory events."""
        if not self.memory_device:
            return ""
        top = self.top_alloc_ops[0] if self.top_alloc_ops else None
        top_text = f"; top allocator {one_line(top.name)} {top.percent:.1f}%" if top else ""
        return (
            f"Memory churn ({self.memory_device}): {self.allocs_per_step:.1f} allocations, "
            f"{self.alloc_mb_per_step:.1f} MB allocated per step (at most {self.allocated_peak_mb:.1f} MB held at once)"
            f"{top_text}.{' Heavy churn.' if self.heavy_churn else ''}"
        )

    def summary_markdown(self) -> str:
        """Verdict, advice and the top-operator table, as Markdown (TensorBoard's Text tab renders it)."""
        lines = [
            f"**{self.headline()}**",
            "",
            f"Step time {self.step_time_ms:.2f} ms over {self.steps_analyzed} steps; input "
            f"{self.input_percent:.1f}%"
            + (
                f"; host-to-device {self.htod_ms_per_step:.3f} ms/step ({self._share_text('htod')})"
                if self.device_clock_ok
                else "; device figures left out (device clock)"
            )
            + (f"; collectives {self._share_text('collective')}." if self.collective_percent > 0 else ".")
            + (
                f" fitprof's own time {self.self_ms_per_step:.3f} ms/step (left out of step time)."
                if math.isfinite(self.self_ms_per_step)
                else ""
            ),
            "",
        ]
        if self.speedup_line():
            lines += [self.speedup_line(), ""]
        if self.throughput_line():
            lines += [self.throughput_line(), ""]
        if self.churn_line():
            lines += [self.churn_line(), ""]
        lines += [f"- {a}" for a in self.advice]
        if self.top_ops:
            lines += [
                "",
                f"| # | operator ({self.op_time_source} self time) | ms/step | % of step |",
                "|---:|---|---:|---:|",
            ]
            lines += [  # '#' is the i of the logged key fitprof/top_op_<i>_ms
                f"| {i} | {one_line(o.name).replace('|', chr(92) + '|')} | {o.self_ms_per_step:.3f} | {o.percent:.1f} |"
                for i, o in enumerate(self.top_ops, start=1)
            ]
        if self.top_alloc_ops:
            lines += ["", f"| operator (allocations on {self.memory_device}) | allocs/step | MB/step | % of bytes |"]
            lines += ["|---|---:|---:|---:|"]
            lines += [
                f"| {one_line(o.name).replace('|', chr(92) + '|')} | {o.allocs_per_step:.1f} | {o.mb_per_step:.3f} | "
                f"{o.percent:.1f} |"
                for o in self.top_alloc_ops
            ]
        lines += [f"\n_{w}_" for w in self.warnings]
        return "\n".join(lines)


_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def one_line(name: str) -> str:
    """``name`` for a table cell or a line of text: tabs, newlines and other control characters written as
    Python escapes (``\\t``, ``\\n``, ``\\x07``), so a ``record_function`` name never breaks a row."""
    return _CONTROL.sub(lambda m: repr(m.group(0))[1:-1], name)

"""Event table -> :class:`BottleneckReport`: step time, input share, host-to-device copies, top operators.

Pure and framework-free: the same table from a Kineto trace or an XSpace gives figures with the same meaning.
See :mod:`fitprof.traces._table` for the table's columns and :mod:`fitprof.metrics` for the definitions.

Verdict thresholds (percent of step time), also documented in the README:

* ``input-bound``: ``input_percent >= INPUT_BOUND_PERCENT`` (20) and input is the larger of input and HtoD;
* ``host-to-device-bound``: ``htod_percent >= HTOD_BOUND_PERCENT`` (15);
* ``communication-bound``: ``collective_percent >= COMMUNICATION_BOUND_PERCENT`` (20) and larger than input and
  HtoD: collectives (all-reduce, ...) are not mistaken for compute;
* with ``input_percent < 10`` and ``htod_percent < 10``, what covers the step decides (``busy_percent``: the
  device's busy share on a trace with device work, the host operators' share otherwise):

  - ``compute-bound``: ``busy_percent >= COMPUTE_COVERS_PERCENT`` (50): the operators hold most of the step; the
    headline gives their share and the top operator's;
  - ``host-bound`` (device traces): the device is idle more than half of the step, waiting for the host;
  - ``overhead-bound`` (host-only traces): more than half of the step runs outside any operator (framework and
    Python overhead between operators, ``unattributed_percent``);

* ``balanced``: anything in between (some input or copy wait, none dominant);
* ``no-steps``: the trace holds no event inside an analysed step.

A trace without step markers is analysed as one span, from its first to its last host event: ``steps_analyzed`` is
0, a warning and the headline say so, and the verdict is that span's.

Potential speedups (upper bounds, :func:`potential_speedups`): the step time if the *exposed* part of one
bottleneck were hidden, where exposed means the part of the step when nothing else ran:

* input: the input wait (union of input spans inside the steps, less excluded spans) less the time device work
  (kernels, copies, collectives launched in the steps) or host operators on other threads ran. On a trace
  without device events the loop's input wait is exposed by construction: all of it counts;
* HtoD: the device time of host-to-device copies launched in the steps (their union) less the time a kernel or a
  collective kernel ran on the device;
* collectives: with device collectives, their device time (union) less the time a compute kernel ran; without,
  the host time blocked in collectives inside the steps less the time host operators ran on other threads.

A host operator hides nothing while a span of the same bottleneck is open on its own thread (the collate ops
nested in a DataLoader ``__next__``, an op around an all-reduce), and pin-memory ops are input work, not compute.
``step_time_if_no_X_ms = step_time_ms - X_exposed_ms_per_step`` and ``speedup_if_no_X = step_time_ms /
step_time_if_no_X_ms``. Each is an upper bound on the gain: it assumes the hidden work costs nothing else
(overlapped input still takes CPU time; an overlapped copy still takes bandwidth), so a measured fix lands at or
below it. The headline names the largest one when it is at least :data:`SPEEDUP_CLAUSE_MIN`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypedDict, cast, get_args

import numpy as np
import pandas as pd

from fitprof import metrics
from fitprof.traces._table import CHECKPOINT_ANNOTATION, OVERHEAD_ANNOTATION, Kind

CHECKPOINT_NAMED_PERCENT = 10.0
"""The headline names the checkpoint saves inside the analysed steps when they took this share of the step time
(what is left once they are taken out) or more: the same 10% as a part of the epoch named in its verdict."""
INPUT_BOUND_PERCENT = 20.0
HTOD_BOUND_PERCENT = 15.0
COMPUTE_BOUND_MAX_PERCENT = 10.0
COMPUTE_COVERS_PERCENT = 50.0
"""Share of the step (percent) that compute must cover for ``compute-bound``: the device's busy time on a trace
with device work, else the host operators' (their union over threads)."""

COMMUNICATION_BOUND_PERCENT = 20.0
SPEEDUP_CLAUSE_MIN = 1.05
"""The smallest potential speedup the headline names (a 5% gain); below it the clause is left out."""
SPEEDUP_FIXES = {
    "input": "the input wait hidden",
    "htod": "HtoD copies overlapped",
    "collectives": "collectives overlapped",
}
"""What each potential speedup assumes, as the headline says it."""

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
    """Dense peak FLOP/s of the device at ``compute_dtype`` (:data:`fitprof.throughput.PEAK_FLOPS`); NaN on a CPU."""
    mfu: float = math.nan
    """``flops_per_s / peak_flops_per_s`` (ratio 0-1): model FLOPs utilisation; NaN on a CPU or unknown device."""
    device_name: str = ""
    """The accelerator's name as the framework gives it ("" on a CPU or when unknown)."""
    compute_dtype: str = ""
    """The compute dtype the peak was picked for (``float32``, ``tf32``, ``bfloat16``, ``float16``)."""
    mfu_note: str = ""
    """Why ``mfu`` (or ``flops_per_s``) is NaN ("" when it is not)."""
    self_ms_per_step: float = math.nan
    """fitprof's own time inside the analysed steps (its ``fitprof/overhead`` spans), ms per step; already left
    out of ``step_time_ms``. NaN in report files written before it existed."""
    checkpoint_ms_per_step: float = math.nan
    """Checkpoint saves inside the analysed steps (the ``fitprof/checkpoint`` spans), ms per step; already left out
    of ``step_time_ms``. NaN in report files written before it existed."""

    def scalars(self) -> dict[str, float]:
        """The figures under their logged keys: ``fitprof/step_time_ms``, ..., and the operators by rank,
        ``fitprof/top_op_1_ms`` ... ``fitprof/top_op_<len(top_ops)>_ms`` (ms per step; see :mod:`fitprof.metrics`)."""
        out = {
            metrics.STEP_TIME_MS.key: self.step_time_ms,
            metrics.INPUT_PERCENT.key: self.input_percent,
            metrics.HTOD_MS_PER_STEP.key: self.htod_ms_per_step,
            metrics.HTOD_PERCENT.key: self.htod_percent,
            metrics.COLLECTIVE_PERCENT.key: self.collective_percent,
            metrics.STEPS_ANALYZED.key: float(self.steps_analyzed),
            metrics.SPEEDUP_IF_NO_INPUT.key: self.speedup_if_no_input,
            metrics.SPEEDUP_IF_NO_HTOD.key: self.speedup_if_no_htod,
            metrics.SPEEDUP_IF_NO_COLLECTIVES.key: self.speedup_if_no_collectives,
            metrics.STEP_TIME_IF_NO_INPUT_MS.key: self.step_time_if_no_input_ms,
            metrics.STEP_TIME_IF_NO_HTOD_MS.key: self.step_time_if_no_htod_ms,
            metrics.STEP_TIME_IF_NO_COLLECTIVES_MS.key: self.step_time_if_no_collectives_ms,
            metrics.SAMPLES_PER_S.key: self.samples_per_s,
            metrics.ITEMS_PER_S.key: self.items_per_s,
            metrics.FLOPS_PER_STEP.key: self.flops_per_step,
            metrics.FLOPS_PER_S.key: self.flops_per_s,
            metrics.MFU.key: self.mfu,
            metrics.SELF_MS_PER_STEP.key: self.self_ms_per_step,
            metrics.CHECKPOINT_MS_PER_STEP.key: self.checkpoint_ms_per_step,
        }
        for i, op in enumerate(self.top_ops, start=1):
            out[metrics.top_op_rank_key(i)] = op.self_ms_per_step
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
        top = self.top_ops[0] if self.top_ops else None
        top_text = f"top operator {one_line(top.name)} takes {top.percent:.1f}%" if top else "no operator recorded"
        if self.verdict == "input-bound":
            why = f"the training loop waited for input {self.input_percent:.1f}% of step time"
        elif self.verdict == "host-to-device-bound":
            why = f"host-to-device copies took {self.htod_percent:.1f}% of step time{self._pageable_text()}"
        elif self.verdict == "communication-bound":
            why = f"collective communication took {self.collective_percent:.1f}% of step time"
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
        span = (
            f" (no step markers: the whole trace, {self.step_time_ms:.2f} ms, was analysed as one span)"
            if self.steps_analyzed == 0
            else ""
        )
        return f"{self.verdict}: {why}.{span}{self.speedup_clause()}{self.checkpoint_clause()}"

    def checkpoint_clause(self) -> str:
        """`` Checkpoint saves took another 84.8 ms/step (145% of step time), left out of it: save less often or
        asynchronously.`` when the saves inside the steps took :data:`CHECKPOINT_NAMED_PERCENT` of the step time or
        more, else ""."""
        ms = self.checkpoint_ms_per_step
        if not (ms > 0 and self.step_time_ms > 0) or 100.0 * ms / self.step_time_ms < CHECKPOINT_NAMED_PERCENT:
            return ""
        return (
            f" Checkpoint saves took another {ms:.1f} ms/step ({100.0 * ms / self.step_time_ms:.0f}% of step time), "
            "left out of it: save less often, weights only, or asynchronously."
        )

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
            parts.append(f"MFU {100 * self.mfu:.1f}% of {self.device_name}'s dense {self.compute_dtype} peak")
        elif math.isfinite(self.flops_per_s) and self.mfu_note:
            parts.append(f"no MFU ({self.mfu_note})")
        return "Throughput: " + "; ".join(parts) + "." if parts else ""

    def summary_markdown(self) -> str:
        """Verdict, advice and the top-operator table, as Markdown (TensorBoard's Text tab renders it)."""
        lines = [
            f"**{self.headline()}**",
            "",
            f"Step time {self.step_time_ms:.2f} ms over {self.steps_analyzed} steps; input "
            f"{self.input_percent:.1f}%; host-to-device {self.htod_ms_per_step:.3f} ms/step "
            f"({self.htod_percent:.1f}%)."
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
        lines += [f"\n_{w}_" for w in self.warnings]
        return "\n".join(lines)


_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def one_line(name: str) -> str:
    """``name`` for a table cell or a line of text: tabs, newlines and other control characters written as
    Python escapes (``\\t``, ``\\n``, ``\\x07``), so a ``record_function`` name never breaks a row."""
    return _CONTROL.sub(lambda m: repr(m.group(0))[1:-1], name)


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
    """Total length of the intersection of two disjoint, sorted interval sets.

    The pieces' lengths are added left to right (``np.cumsum`` is sequential, unlike ``np.sum``'s pairwise
    summation), in the order a two-pointer merge meets them: the same float, bit for bit, as that merge's loop.
    """
    lo, hi = _intersect(a, b)
    return float(np.cumsum(hi - lo)[-1]) if len(lo) else 0.0


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


class _Distinct:
    """One column's values (at some rows), each distinct value tested once: ``pd.factorize`` codes the rows, a test
    runs on the distinct values, and each row's small integer code looks its answer up (one gather per mask).
    :meth:`mask` and :meth:`equal` give the masks that testing every row gives (``values == v``, ``np.isin``,
    ``str.startswith``, ``in``), without a Python or string comparison per row for each mask asked."""

    def __init__(self, values: np.ndarray, rows: np.ndarray | None = None) -> None:
        """``rows``: a boolean mask of the rows to code (None: all); the masks are False at every other row."""
        self._n = len(values)
        self._rows = None if rows is None else np.flatnonzero(rows)
        codes, self._uniques = pd.factorize(values if self._rows is None else values[self._rows])
        # The codes live as long as the analysis: 1 byte a row for the few kinds, not factorize's 8.
        self._codes = codes.astype(np.int8) if len(self._uniques) < 127 else codes

    def mask(self, test: Callable[[Any], bool]) -> np.ndarray:
        """Boolean mask of the rows whose value passes ``test``."""
        # Code -1, a missing value (None, NaN), is never a hit: it compares unequal to every string and its ``str``
        # ("None", "nan") starts with no prefix the analysis asks for.
        passed = np.zeros(len(self._uniques) + 1, dtype=bool)  # the last slot: code -1, never a hit
        passed[:-1] = [bool(test(u)) for u in self._uniques]
        hit = passed[self._codes]
        if self._rows is None:
            return hit
        out = np.zeros(self._n, dtype=bool)
        out[self._rows] = hit
        return out

    def equal(self, *values: object) -> np.ndarray:
        """Boolean mask of the rows whose value equals one of ``values``."""
        return self.mask(lambda u: any(bool(u == v) for v in values))


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
    if report_verdict == "host-bound":
        tips = [
            "The device waits for the host: give it more work per launch (larger batches) and fewer launches "
            "(`torch.compile`, CUDA graphs, `jit_compile=True` in Keras).",
        ]
        if pageable_share > 0.5:
            tips.append("Copy from pinned memory (`DataLoader(pin_memory=True)`) so copies overlap compute.")
        return tips
    if report_verdict == "overhead-bound":
        if torch_like:
            return [
                "Most of the step is Python and framework overhead between operators: use larger batches, and move "
                "per-step work (logging, `.item()`, metrics) out of `training_step`; `torch.compile` fuses small ops.",
            ]
        return [
            "Most of the step is framework overhead between operators: use larger batches, run several steps per "
            "call (`steps_per_execution`) and compile the step (`jit_compile=True`).",
        ]
    if report_verdict == "balanced":
        return ["No single bottleneck: input and compute both matter; check the top operators and the input wait."]
    return ["Profile a later window with more steps (`profile_batch`)."]


def verdict_for(
    input_percent: float,
    htod_percent: float,
    steps: int,
    collective_percent: float = 0.0,
    busy_percent: float = math.nan,
    *,
    device: bool = False,
) -> str:
    """The verdict label from the figures, by the thresholds in this module's docstring.

    Args:
        busy_percent: the share of the step that compute covers (the device's busy share when ``device``, else
            the host operators'); NaN (unknown) never turns ``compute-bound`` into another verdict.
        device: the trace has device work (``host-bound`` rather than ``overhead-bound``).
    """
    if steps <= 0:
        return "no-steps"
    if input_percent >= INPUT_BOUND_PERCENT and input_percent >= max(htod_percent, collective_percent):
        return "input-bound"
    if htod_percent >= HTOD_BOUND_PERCENT and htod_percent >= collective_percent:
        return "host-to-device-bound"
    if collective_percent >= COMMUNICATION_BOUND_PERCENT:
        return "communication-bound"
    if input_percent < COMPUTE_BOUND_MAX_PERCENT and htod_percent < COMPUTE_BOUND_MAX_PERCENT:
        if busy_percent < COMPUTE_COVERS_PERCENT:
            return "host-bound" if device else "overhead-bound"
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
            the reader that made ``table`` (``table.attrs["framework"]`` where the reader sets it, else
            ``table.attrs["format"]`` through :data:`FRAMEWORK_OF_FORMAT`).
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
        # A reader may say (fitprof's converted torch window is an XSpace of framework "pytorch"); else the format.
        framework = str(table.attrs.get("framework") or FRAMEWORK_OF_FORMAT.get(str(table.attrs.get("format")), ""))
        if not framework:
            raise ValueError("framework is None and the table names no trace format: pass framework=")
    fw = check_framework(framework)
    where: dict[str, Any] = {"framework": fw, "source": source, "host": host, "rank": rank, "world_size": world_size}
    warnings: list[str] = [str(w) for w in table.attrs.get("warnings") or []]  # the reader's (repaired names)
    ts = table["ts_us"].to_numpy(dtype=float)
    end = ts + table["dur_us"].to_numpy(dtype=float)
    kind = _Distinct(table["kind"].to_numpy())
    on_device = table["on_device"].to_numpy(dtype=bool)

    is_step = kind.equal(Kind.STEP)
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
    not_training = kind.equal(Kind.NOT_TRAINING)
    excluded = _union(ts[not_training], end[not_training])
    spans = _Distinct(table["name"].to_numpy(), not_training)
    own = spans.equal(OVERHEAD_ANNOTATION)
    own_us = _overlap(_union(ts[own], end[own]), steps)
    saves = spans.equal(CHECKPOINT_ANNOTATION)
    checkpoint_us = _overlap(_union(ts[saves], end[saves]), steps)
    step_total_us = float(np.sum(steps[1] - steps[0])) - _overlap(steps, excluded)
    n_div = max(n_steps, 1)
    if step_total_us <= 0:
        return _empty_report(where, warnings)

    def in_steps(times: np.ndarray) -> np.ndarray:
        return _inside(times, steps) & ~_inside(times, excluded)

    # Input wait: the union of input spans, clipped to the steps, less excluded spans.
    inp = kind.equal(Kind.INPUT)
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
    memcpy = kind.equal(Kind.MEMCPY)
    copies = _Distinct(copy_kind, dev_in)  # each distinct copy kind of the device rows in the steps tested once
    htod = dev_in & memcpy & copies.mask(lambda ck: str(ck).startswith("htod"))
    htod_us = float(dur[htod].sum())
    known_bytes = htod & ~np.isnan(nbytes)
    # Copies of unknown size (ROCm traces give no bytes) leave bytes and bandwidth unknown: NaN, not 0.
    bytes_unknown = bool(htod.any()) and not known_bytes.any()
    htod_bytes = math.nan if bytes_unknown else float(nbytes[known_bytes].sum())
    known_us = dur[known_bytes].sum()
    htod_gb_per_s = float(nbytes[known_bytes].sum() / known_us / 1e3) if known_us > 0 else 0.0
    htod_gb_per_s = math.nan if bytes_unknown else htod_gb_per_s
    pinned_us = float(dur[copies.equal("htod_pinned")].sum())  # False outside dev_in
    pageable_us = float(dur[copies.equal("htod_pageable")].sum())
    dtoh_us = float(dur[memcpy & copies.equal("dtoh")].sum())

    coll = kind.equal(Kind.COLLECTIVE)
    if (coll & dev_in).any():  # device time of collective kernels launched in the steps
        sel = coll & dev_in
        coll_us = _union_length(ts[sel], end[sel])
    else:  # host time blocked in collectives, clipped to the steps (never more than the step time)
        sel = coll & ~on_device
        coll_union = _union(ts[sel], end[sel])
        coll_us = _overlap(coll_union, steps) - _overlap(_intersect(coll_union, steps), excluded)

    exposed = _exposed_times(table, ts, end, kind, on_device, dev_in, htod, coll, steps, excluded)

    # Top operators by self time.
    device_ops = dev_in & kind.equal(Kind.KERNEL, Kind.MEMCPY, Kind.COLLECTIVE)
    if device_ops.any():
        source_name = "device"
        # The launching operator's name, else the event's own; the same keys and values in the same order as a
        # frame of these rows would give the groupby below, without copying the rows into one.
        ops = table["op"].to_numpy()[device_ops]
        names = np.where(ops != "", ops, table["name"].to_numpy()[device_ops])
        self_us = pd.Series(dur[device_ops])
    else:
        source_name = "host"
        sel = host_in & kind.equal(Kind.OP, Kind.COLLECTIVE, Kind.INPUT)
        sub = table.loc[sel & ~kind.equal(Kind.INPUT), ["name", "kind", "ts_us", "dur_us", "self_us"]]
        names = sub["name"].to_numpy()
        self_us = sub["self_us"]
    totals = self_us.groupby(names).sum()
    if source_name == "host":
        # One collective is often recorded on two threads at once (the caller and the backend's worker):
        # count the time it spans, clipped to the steps, not the sum over threads.
        coll_sub = sub[sub["kind"] == Kind.COLLECTIVE]
        for name, group in coll_sub.groupby("name"):
            g_start = group["ts_us"].to_numpy(dtype=float)
            totals[name] = _overlap(_union(g_start, g_start + group["dur_us"].to_numpy(dtype=float)), steps)
    ranked = totals.sort_values(ascending=False, kind="stable").head(top_k)
    op_percent_total = 100.0 * float(totals.sum()) / step_total_us
    if source_name == "host":
        top_host = ranked.head(1)
    else:  # the host operator that holds the host longest (what the device waits for when it idles)
        host_op = host_in & kind.equal(Kind.OP)
        host_self_us = pd.Series(table["self_us"].to_numpy(dtype=float)[host_op])
        top_host = host_self_us.groupby(table["name"].to_numpy()[host_op]).sum().nlargest(1)
    step_time_us = step_total_us / n_div

    # What covers the step: host operators (their union over threads) and the device's work.
    host_work = host_in & kind.equal(Kind.OP, Kind.INPUT, Kind.COLLECTIVE)
    host_union = _union(ts[host_work], end[host_work])
    host_op_percent = 100.0 * (_overlap(host_union, steps) - _overlap(_intersect(host_union, steps), excluded))
    host_op_percent /= step_total_us
    device_work = dev_in & kind.equal(Kind.KERNEL, Kind.MEMCPY, Kind.COLLECTIVE)
    device_busy_percent = math.nan
    if device_work.any():
        dev_union = _union(ts[device_work], end[device_work])
        busy_us = _overlap(dev_union, steps) - _overlap(_intersect(dev_union, steps), excluded)
        device_busy_percent = 100.0 * busy_us / step_total_us
    top_ops = [
        OpStat(str(name), float(v) / n_div / 1e3, 100.0 * float(v) / step_total_us) for name, v in ranked.items()
    ]

    input_percent = 100.0 * input_us / step_total_us
    htod_percent = 100.0 * htod_us / step_total_us
    collective_percent = 100.0 * coll_us / step_total_us
    on_device_work = bool(device_work.any())
    verdict = verdict_for(
        input_percent,
        htod_percent,
        n_div if len(steps[0]) else 0,
        collective_percent,
        device_busy_percent if on_device_work else host_op_percent,
        device=on_device_work,
    )
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
        self_ms_per_step=own_us / n_div / 1e3,
        checkpoint_ms_per_step=checkpoint_us / n_div / 1e3,
        collective_percent=collective_percent,
        top_ops=top_ops,
        op_time_source=source_name,
        verdict=verdict,
        advice=_advice(verdict, fw, pageable_share=pageable_share, top=top_ops[0] if top_ops else None),
        warnings=warnings,
        op_percent_total=op_percent_total,
        host_op_percent=host_op_percent,
        unattributed_percent=100.0 - host_op_percent,
        device_busy_percent=device_busy_percent,
        top_host_op=str(top_host.index[0]) if len(top_host) else "",
        top_host_op_percent=100.0 * float(top_host.iloc[0]) / step_total_us if len(top_host) else math.nan,
        **where,
        **potential_speedups(step_time_us / 1e3, {k: v / n_div / 1e3 for k, v in exposed.items()}),
    )


class Speedups(TypedDict):
    """The potential-speedup fields of a :class:`BottleneckReport` (see :func:`potential_speedups`)."""

    input_exposed_ms_per_step: float
    htod_exposed_ms_per_step: float
    collective_exposed_ms_per_step: float
    step_time_if_no_input_ms: float
    step_time_if_no_htod_ms: float
    step_time_if_no_collectives_ms: float
    speedup_if_no_input: float
    speedup_if_no_htod: float
    speedup_if_no_collectives: float


def potential_speedups(step_time_ms: float, exposed_ms: dict[str, float]) -> Speedups:
    """The potential-speedup fields of a report from the step time and the exposed time of each bottleneck.

    Args:
        step_time_ms: mean step time (ms).
        exposed_ms: ``{"input": ..., "htod": ..., "collectives": ...}``, exposed ms per step (see the module
            docstring).

    Returns:
        ``{input,htod,collective}_exposed_ms_per_step``, ``step_time_if_no_{input,htod,collectives}_ms``
        (``step_time_ms`` less the exposed time, ms) and ``speedup_if_no_{input,htod,collectives}`` (the step time
        over that; ``inf`` when the exposed time is the whole step). Upper bounds on the gain of each fix.
    """
    ex = {fix: min(max(exposed_ms[fix], 0.0), step_time_ms) for fix in ("input", "htod", "collectives")}
    fixed = {fix: step_time_ms - v for fix, v in ex.items()}
    x = {fix: step_time_ms / v if v > 0 else math.inf for fix, v in fixed.items()}
    return Speedups(
        input_exposed_ms_per_step=ex["input"],
        htod_exposed_ms_per_step=ex["htod"],
        collective_exposed_ms_per_step=ex["collectives"],
        step_time_if_no_input_ms=fixed["input"],
        step_time_if_no_htod_ms=fixed["htod"],
        step_time_if_no_collectives_ms=fixed["collectives"],
        speedup_if_no_input=x["input"],
        speedup_if_no_htod=x["htod"],
        speedup_if_no_collectives=x["collectives"],
    )


def _exposed_times(
    table: pd.DataFrame,
    ts: np.ndarray,
    end: np.ndarray,
    kind: _Distinct,
    on_device: np.ndarray,
    dev_in: np.ndarray,
    htod: np.ndarray,
    coll: np.ndarray,
    steps: tuple[np.ndarray, np.ndarray],
    excluded: tuple[np.ndarray, np.ndarray],
) -> dict[str, float]:
    """Exposed time (us, summed over the steps) of the input wait, HtoD copies and collectives (module docstring)."""
    kernels = dev_in & kind.equal(Kind.KERNEL)
    dev_work = dev_in & kind.equal(Kind.KERNEL, Kind.MEMCPY, Kind.COLLECTIVE)
    host_op = (~on_device) & kind.equal(Kind.OP)
    # Pinning a batch is input work, not compute (only host operators' names are looked at, each distinct one once).
    host_compute = host_op & ~_Distinct(table["name"].to_numpy(), host_op).mask(lambda name: "pin_memory" in name)
    # One integer per (pid, tid). Only host rows' threads are ever compared (every use below is under a host mask),
    # so only theirs are coded; the integers differ from codes over the whole table, the equalities do not.
    host = np.flatnonzero(~on_device)
    pid_code, _ = pd.factorize(table["pid"].to_numpy()[host])
    tid_code, tids = pd.factorize(table["tid"].to_numpy()[host])
    thread = np.zeros(len(ts), dtype=np.int64)
    thread[host] = pid_code.astype(np.int64) * (len(tids) + 1) + tid_code

    def host_spans_exposed(span_mask: np.ndarray, device_hides: np.ndarray | None) -> float:
        spans = _subtract(_intersect(_union(ts[span_mask], end[span_mask]), steps), excluded)
        hide = [] if device_hides is None else [_union(ts[device_hides], end[device_hides])]
        span_threads = set(thread[span_mask])
        other = host_compute & ~np.isin(thread, list(span_threads))
        hide.append(_union(ts[other], end[other]))
        for t in span_threads:  # ops on a thread hide nothing while that thread is inside a span
            own = host_compute & (thread == t)
            mine = span_mask & (thread == t)
            hide.append(_subtract(_union(ts[own], end[own]), _union(ts[mine], end[mine])))
        cover = _union(np.concatenate([h[0] for h in hide]), np.concatenate([h[1] for h in hide]))
        return _length(spans) - _overlap(spans, cover)

    inp = kind.equal(Kind.INPUT)
    if dev_work.any():
        input_us = host_spans_exposed(inp & ~on_device, dev_work)
    else:  # CPU only: the loop thread blocks on its input and nothing else trains; exposed by construction
        spans = _subtract(_intersect(_union(ts[inp], end[inp]), steps), excluded)
        input_us = _length(spans)
    copies = _union(ts[htod], end[htod])
    busy = dev_in & kind.equal(Kind.KERNEL, Kind.COLLECTIVE)
    htod_us = _length(copies) - _overlap(copies, _union(ts[busy], end[busy]))
    if (coll & dev_in).any():
        c = _union(ts[coll & dev_in], end[coll & dev_in])
        coll_us = _length(c) - _overlap(c, _union(ts[kernels], end[kernels]))
    else:
        coll_us = host_spans_exposed(coll & ~on_device, None)
    return {"input": input_us, "htod": htod_us, "collectives": coll_us}


def _length(a: tuple[np.ndarray, np.ndarray]) -> float:
    return float(np.sum(a[1] - a[0]))


def _subtract(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The parts of the disjoint, sorted intervals ``a`` outside the disjoint, sorted intervals ``b``."""
    if len(b[0]) == 0 or len(a[0]) == 0:
        return a[0].astype(float), a[1].astype(float)
    gaps_s = np.concatenate([[-np.inf], b[1]])
    gaps_e = np.concatenate([b[0], [np.inf]])
    keep = gaps_e > gaps_s
    return _intersect(a, (gaps_s[keep], gaps_e[keep]))


def _intersect(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Intersection of two disjoint, sorted interval sets, as a disjoint, sorted set.

    Vectorised form of the two-pointer merge (advance ``a`` when its interval ends first, else ``b``; keep each
    piece of positive length), which meets every pair of overlapping intervals once, in order of ``a``'s index
    then ``b``'s. For sets as :func:`_union` makes them (each interval's start at most its end, each end before
    the next start or at it) the pairs of positive overlap are, for interval ``i`` of ``a``, the ``j`` of ``b`` with
    ``be[j] > as[i]`` and ``bs[j] < ae[i]``: a run of consecutive ``j`` that two ``searchsorted`` calls on ``b``'s
    (non-decreasing) ends and starts find, listed ``i`` by ``i``: the merge's order (its position only moves
    forward in both sets, and it reaches every such pair: while behind ``i`` it advances ``a``, whose intervals
    end by ``as[i] < be[j]``; while behind ``j`` it advances ``b``, whose intervals end by ``bs[j] < ae[i]``).
    Each piece is the merge's ``max(as, bs)``, ``min(ae, be)`` (written as ``where`` to return the same operand
    on a tie, as Python's ``max`` and ``min`` do). Sets that do not meet those conditions (an interval with its
    end before its start, from a negative duration; NaN) go through the merge loop itself.
    """
    (as_, ae), (bs, be) = a, b
    if len(as_) == 0 or len(bs) == 0:
        return np.array([], dtype=float), np.array([], dtype=float)
    if not (_ordered_disjoint(as_, ae) and _ordered_disjoint(bs, be)):
        return _intersect_merge(a, b)
    first = np.searchsorted(be, as_, side="right")  # the first j with be[j] > as[i]
    stop = np.searchsorted(bs, ae, side="left")  # the first j with bs[j] >= ae[i]
    count = np.maximum(stop - first, 0)
    total = int(count.sum())
    i = np.repeat(np.arange(len(as_)), count)
    j = np.arange(total) + np.repeat(first - (np.cumsum(count) - count), count)
    a_s, a_e, b_s, b_e = as_[i], ae[i], bs[j], be[j]
    lo = np.where(b_s > a_s, b_s, a_s).astype(float, copy=False)
    hi = np.where(b_e < a_e, b_e, a_e).astype(float, copy=False)
    keep = hi > lo
    return (lo, hi) if keep.all() else (lo[keep], hi[keep])


def _ordered_disjoint(starts: np.ndarray, ends: np.ndarray) -> bool:
    """Every interval's start at most its end and each end at or before the next start (no NaN): the shape of
    :func:`_union`'s output for intervals of non-negative length, and of :func:`_subtract`'s gaps."""
    return bool(np.all(starts <= ends) and np.all(ends[:-1] <= starts[1:]))


def _intersect_merge(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_intersect` as the two-pointer merge loop, for sets :func:`_ordered_disjoint` rejects."""
    as_, ae = a[0].tolist(), a[1].tolist()
    bs, be = b[0].tolist(), b[1].tolist()
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

"""Exposed times and the potential speedups of a window: what each bottleneck costs when nothing hides it.

Potential speedups (upper bounds, :func:`potential_speedups`): the step time if the *exposed* part of one
bottleneck were hidden, where exposed means the part of the step when nothing else ran (:func:`exposed_times`):

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

import functools
import math
from typing import TypedDict

import numpy as np
import pandas as pd

from fitprof.analysis import intervals
from fitprof.analysis.columns import Distinct
from fitprof.analysis.intervals import Spans
from fitprof.traces._table import Kind, PlainTable

SPEEDUP_CLAUSE_MIN = 1.05
"""The smallest potential speedup the headline names (a 5% gain); below it the clause is left out."""
SPEEDUP_FIXES = {
    "input": "the input wait hidden",
    "htod": "HtoD copies overlapped",
    "collectives": "collectives overlapped",
}
"""What each potential speedup assumes, as the headline says it."""


class Speedups(TypedDict):
    """The potential-speedup fields of a :class:`~fitprof.analysis.BottleneckReport` (see
    :func:`potential_speedups`)."""

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


def exposed_times(
    table: pd.DataFrame | PlainTable,
    ts: np.ndarray,
    end: np.ndarray,
    kind: Distinct,
    on_device: np.ndarray,
    dev_in: np.ndarray,
    htod: np.ndarray,
    coll: np.ndarray,
    steps: Spans,
    excluded: Spans,
) -> dict[str, float]:
    """Exposed time (us, summed over the steps) of the input wait, HtoD copies and collectives (module docstring).

    Args:
        table: the event table; ``ts`` and ``end`` its start and end times (us), ``kind`` its kind column.
        on_device: device rows; ``dev_in``: device rows launched in the steps; ``htod``: the HtoD copies among
            them; ``coll``: collective rows (host or device).
        steps: the analysed steps; ``excluded``: spans inside them that are not training (validation, ...).

    Returns:
        ``{"input": us, "htod": us, "collectives": us}``.
    """
    kernels = dev_in & kind.equal(Kind.KERNEL)
    dev_work = dev_in & kind.equal(Kind.KERNEL, Kind.MEMCPY, Kind.COLLECTIVE)

    @functools.cache
    def host_threads() -> tuple[np.ndarray, np.ndarray]:
        """The host compute rows and one integer per row's (pid, tid), made at the first host span asked for."""
        host_op = (~on_device) & kind.equal(Kind.OP)
        # Pinning a batch is input work, not compute (only host operators' names are looked at, each distinct
        # one once).
        names = Distinct(np.asarray(table["name"]), host_op)
        host_compute = host_op & ~names.mask(lambda name: "pin_memory" in name)
        # Only host rows' threads are ever compared (every use below is under a host mask), so only theirs are
        # coded; the integers differ from codes over the whole table, the equalities do not.
        host = np.flatnonzero(~on_device)
        pid_code, _ = pd.factorize(np.asarray(table["pid"])[host])
        tid_code, tids = pd.factorize(np.asarray(table["tid"])[host])
        thread = np.zeros(len(ts), dtype=np.int64)
        thread[host] = pid_code.astype(np.int64) * (len(tids) + 1) + tid_code
        return host_compute, thread

    def host_spans_exposed(span_mask: np.ndarray, device_hides: np.ndarray | None) -> float:
        if not span_mask.any():  # no span, nothing exposed (0.0, as the sums below give): no thread is coded
            return 0.0
        host_compute, thread = host_threads()
        spans = intervals.subtract(intervals.intersect(intervals.union(ts[span_mask], end[span_mask]), steps), excluded)
        hide = [] if device_hides is None else [intervals.union(ts[device_hides], end[device_hides])]
        span_threads = set(thread[span_mask])
        other = host_compute & ~np.isin(thread, list(span_threads))
        hide.append(intervals.union(ts[other], end[other]))
        for t in span_threads:  # ops on a thread hide nothing while that thread is inside a span
            own = host_compute & (thread == t)
            mine = span_mask & (thread == t)
            hide.append(intervals.subtract(intervals.union(ts[own], end[own]), intervals.union(ts[mine], end[mine])))
        cover = intervals.union(np.concatenate([h[0] for h in hide]), np.concatenate([h[1] for h in hide]))
        return intervals.length(spans) - intervals.overlap(spans, cover)

    inp = kind.equal(Kind.INPUT)
    if dev_work.any():
        input_us = host_spans_exposed(inp & ~on_device, dev_work)
    else:  # CPU only: the loop thread blocks on its input and nothing else trains; exposed by construction
        spans = intervals.subtract(intervals.intersect(intervals.union(ts[inp], end[inp]), steps), excluded)
        input_us = intervals.length(spans)
    copies = intervals.union(ts[htod], end[htod])
    busy = dev_in & kind.equal(Kind.KERNEL, Kind.COLLECTIVE)
    htod_us = intervals.length(copies) - intervals.overlap(copies, intervals.union(ts[busy], end[busy]))
    if (coll & dev_in).any():
        c = intervals.union(ts[coll & dev_in], end[coll & dev_in])
        coll_us = intervals.length(c) - intervals.overlap(c, intervals.union(ts[kernels], end[kernels]))
    else:
        coll_us = host_spans_exposed(coll & ~on_device, None)
    return {"input": input_us, "htod": htod_us, "collectives": coll_us}

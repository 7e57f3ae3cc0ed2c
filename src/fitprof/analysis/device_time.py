"""Step time on a device that runs behind the host: how much longer the steps' device work kept the device busy
than their host spans lasted.

Without a synchronisation inside the step, the host enqueues a step's kernels and copies and moves on: its
``ProfilerStep#N`` span ends long before the device has run that work, and a window of such steps, timed by the
host spans alone, understates the step time (and overstates FLOP/s and MFU) by as much as the device lags.

Each device op (kernel, copy, collective) belongs to the step whose host span holds its launch (the runtime call
Kineto links to it by its ``correlation`` id; XSpace by its launch stat; an op without a linked launch by its own
start). A step's **device time** is the time in which at least one of its ops ran (the union over streams), from
its first op's start up to the next step's first op's start (work of two steps that overlaps on several streams
counts once). A step lasts the longer of its host span and its device time: the device cannot run a step's work in
less than the time it was busy with it, and a host that finishes first waits for it sooner or later. Device time
counts busy time only, never the device's idle gaps, so a step whose last kernel merely ends after its host span
(launch lag) keeps its host span. :func:`device_excess_us` returns what the longer device times add over a window.
Steps that launched no device work, and every step of a CPU-only trace, add nothing.
"""

from __future__ import annotations

import numpy as np

from fitprof.analysis import intervals


def device_excess_us(
    step_start: np.ndarray,
    step_end: np.ndarray,
    dev_start: np.ndarray,
    dev_end: np.ndarray,
    dev_launch: np.ndarray,
) -> float:
    """Summed ``max(0, device time - host span)`` over the steps (us); see the module docstring.

    Args:
        step_start, step_end: the steps' host spans (us), shape ``(n_steps,)``, any order.
        dev_start, dev_end: the device ops launched in the steps (us, the device's clock), shape ``(m,)``.
        dev_launch: each op's launch time (us, the host's clock; its own start where unlinked), shape ``(m,)``; it
            picks the op's step (the last step starting at or before it).

    Returns:
        0.0 when no step's device time is longer than its host span (and when there is no device op).
    """
    if not len(dev_start) or not len(step_start):
        return 0.0
    order = np.argsort(step_start, kind="stable")
    starts, ends = step_start[order], step_end[order]
    step = np.searchsorted(starts, dev_launch, side="right") - 1
    keep = step >= 0
    step, dev_start, dev_end = step[keep], dev_start[keep], dev_end[keep]
    n = len(starts)
    first = np.full(n, np.inf)
    np.minimum.at(first, step, dev_start)
    # The next step's first device op start, for each step (inf when no later step launched device work).
    later_first = np.minimum.accumulate(first[::-1])[::-1]
    nxt = np.append(later_first[1:], np.inf)
    total = 0.0
    by_step = np.argsort(step, kind="stable")
    bounds = np.searchsorted(step[by_step], np.arange(n + 1))
    for i in np.flatnonzero(np.isfinite(first)):
        rows = by_step[bounds[i] : bounds[i + 1]]
        s = dev_start[rows]
        busy_us = intervals.union_length(s, np.maximum(s, np.minimum(dev_end[rows], nxt[i])))
        total += max(busy_us - float(ends[i] - starts[i]), 0.0)
    return total

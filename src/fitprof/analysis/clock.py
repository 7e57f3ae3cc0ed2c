"""Whether a window's device clock can be trusted, within the window and from window to window.

A Kineto trace times device events (kernels, copies, collectives) on the device's clock, converted to the host's;
the analysis puts each device event in the step whose ``ProfilerStep#N`` holds its launch (``launch_us``, the host
call linked to it by its correlation id) and adds up its time there. Torch has had profiler sessions in one process
whose device records carry a wrong clock (pytorch/pytorch#175790, only the first CUDA profile of a process correct;
pytorch/pytorch#192021, more records with the wrong clock at each session). A fit opens a window every epoch, so
the figures of a later window can rest on such records. Two checks, each on what the trace itself holds:

* **within the window** (:func:`check_device_clock`): no device event can start before the host call that
  launched it, so before the ``ProfilerStep#N`` that holds the launch. A device event linked to its launch that
  starts more than :data:`CLOCK_TOLERANCE_US` before it is timed outside its step's markers. Nor can one start
  long after the host's last event: the host may run ahead of the device by the work queued at the window's end,
  never by :data:`LATE_TOLERANCE_US`;
* **from window to window** (:func:`across_windows`): the window's *launch lag*, the smallest delay from a launch
  to its device event's start among the events launched in the steps (``device_offset_us``: the device's idle
  moments, when a launched kernel starts at once, a few microseconds on a healthy clock), against the fit's first
  window's. A clock offset that builds up over the process raises it; it may grow by
  :data:`OFFSET_GROWTH_MIN_US`, or by :data:`OFFSET_GROWTH_STEP_SHARE` of the step time when that is more
  (a queue that never drains in a window moves the lag by up to a step), before the window is called unreliable.

A window that fails either check keeps its host figures (step time, input wait, host operators) and has its device
figures set to NaN (:func:`without_device_figures`): the HtoD, DtoH and collective times and shares, the exposed
shares and the speedups that rest on them, the device's busy share and, when they are device times, the top
operators (dropped). ``device_clock_ok`` is False and ``device_clock_note`` says why; the callbacks warn once with
that note. Traces without launch links (XSpace: TensorFlow, JAX) and traces without device events are not
checked: ``device_clock_ok`` stays True and ``device_offset_us`` NaN.

Measured on the real A100 and MI250 traces of ``../shared/fixtures/kineto``: no device event starts before its
launch (smallest lags 0, 4, 6 and 10.5 us) or ends after the host's last event (a torch window that stops without
waiting for the device may hold device work after it: hence the loose bound on that side).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fitprof.analysis.report import BottleneckReport

CLOCK_TOLERANCE_US = 50.0
"""How far (us) a device event may start before its launch before its clock is called wrong: well above the
conversion error of the host and device clocks (a few microseconds) and far below the errors of a wrong clock
(milliseconds and more)."""
LATE_TOLERANCE_US = 1e6
"""How far (us) after the trace's last host event a device event may start: the work still queued when the host
stopped recording, which a step-sized queue keeps far below a second."""
OFFSET_GROWTH_MIN_US = 1_000.0
"""The launch lag (``device_offset_us``) may grow this much (us) over the first window's before a window is called
unreliable."""
OFFSET_GROWTH_STEP_SHARE = 0.5
"""... or this share of the window's step time, when that is more."""


@dataclass(frozen=True)
class ClockCheck:
    """The device clock of one window (:func:`check_device_clock`).

    Attributes:
        ok: no device event is timed outside its step's markers (True also when nothing could be checked).
        note: why the clock is not trusted ("" when it is).
        offset_us: the launch lag: the smallest delay from a launch to its device event's start among the events
            launched in the steps (us); NaN without such events.
    """

    ok: bool
    note: str
    offset_us: float


def check_device_clock(
    ts: np.ndarray,
    end: np.ndarray,
    on_device: np.ndarray,
    launch: np.ndarray,
    checked: np.ndarray,
    in_steps: np.ndarray,
) -> ClockCheck:
    """Check the device events of one window against their launches and the host's last event.

    Args:
        ts, end: every event's start and end (us, the trace's clock), shape ``(n,)``.
        on_device: which events ran on the device.
        launch: the start of each device event's launch call (us; NaN when it is not linked).
        checked: which events to check (device work: kernels, copies, collectives, memsets; not annotations).
        in_steps: which device events were launched in the analysed steps (their lag gives ``offset_us``).
    """
    linked = checked & on_device & ~np.isnan(launch)
    if not linked.any():
        return ClockCheck(True, "", math.nan)
    lag = ts[linked] - launch[linked]
    host = ~on_device
    host_end = float(end[host].max()) if host.any() else math.inf
    early = int(np.count_nonzero(lag < -CLOCK_TOLERANCE_US))
    late = int(np.count_nonzero(ts[linked] > host_end + LATE_TOLERANCE_US))
    steps_lag = ts[linked & in_steps] - launch[linked & in_steps]
    offset = float(steps_lag.min()) if steps_lag.size else math.nan
    if not (early or late):
        return ClockCheck(True, "", offset)
    parts = []
    if early:
        parts.append(f"{early} start before their launch (by up to {-float(lag.min()) / 1e3:.3g} ms)")
    if late:
        over = float(ts[linked].max()) - host_end
        parts.append(f"{late} start after the trace's last host event (by up to {over / 1e6:.3g} s)")
    n = int(np.count_nonzero(linked))
    note = (
        f"the device clock of this window is wrong: of its {n} device events, {' and '.join(parts)}, outside their "
        "steps' markers"
    )
    return ClockCheck(False, note, offset)


_DEVICE_FIELDS = (
    "htod_ms_per_step",
    "htod_percent",
    "htod_gb_per_s",
    "htod_pinned_ms_per_step",
    "htod_pageable_ms_per_step",
    "dtoh_ms_per_step",
    "collective_ms_per_step",
    "collective_percent",
    "device_busy_percent",
    "htod_exposed_ms_per_step",
    "collective_exposed_ms_per_step",
    "htod_exposed_percent",
    "collective_exposed_percent",
    "step_time_if_no_htod_ms",
    "step_time_if_no_collectives_ms",
    "speedup_if_no_htod",
    "speedup_if_no_collectives",
)
"""The report's figures that rest on device times: NaN in a window whose device clock is wrong."""

UNRELIABLE_SUFFIX = "; its device figures (HtoD, DtoH, collectives, device busy share, device operator times) are NaN"


def without_device_figures(report: BottleneckReport, note: str) -> BottleneckReport:
    """``report`` with its device figures NaN (see the module docstring), ``device_clock_ok`` False and ``note``
    (why) in ``device_clock_note`` and in its warnings. A report already marked keeps its first note."""
    if not report.device_clock_ok:
        return report
    note = f"{note}{UNRELIABLE_SUFFIX}."
    device_ops = report.op_time_source == "device"
    nan: dict[str, Any] = dict.fromkeys(_DEVICE_FIELDS, math.nan)
    return dataclasses.replace(
        report,
        **nan,
        top_ops=[] if device_ops else report.top_ops,
        op_percent_total=math.nan if device_ops else report.op_percent_total,
        device_clock_ok=False,
        device_clock_note=note,
        warnings=[*report.warnings, note],
    )


def across_windows(report: BottleneckReport, first: BottleneckReport | None) -> BottleneckReport:
    """``report`` against the fit's first window (``first``; None: this is the first, or its own clock was wrong,
    which leaves nothing to compare with): unreliable
    (:func:`without_device_figures`) when its launch lag ``device_offset_us`` grew by more than
    :data:`OFFSET_GROWTH_MIN_US`, or :data:`OFFSET_GROWTH_STEP_SHARE` of its step time when that is more.
    ``report`` unchanged otherwise, and when either lag is NaN."""
    if first is None or first is report or not first.device_clock_ok:
        return report
    now, then = report.device_offset_us, first.device_offset_us
    if not (math.isfinite(now) and math.isfinite(then)):
        return report
    allowed = max(OFFSET_GROWTH_MIN_US, OFFSET_GROWTH_STEP_SHARE * 1e3 * report.step_time_ms)
    if not math.isfinite(allowed) or now - then <= allowed:
        return report
    note = (
        f"the device clock of this window has drifted: its launch lag is {now / 1e3:.3g} ms, {(now - then) / 1e3:.3g} "
        f"ms more than the first window's ({then / 1e3:.3g} ms)"
    )
    return without_device_figures(report, note)

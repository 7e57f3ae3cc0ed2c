"""What the whole-dict tests expect of one epoch's logged figures, built from where each figure comes from (the
window's report, the fake clock the fit ran on, the process's own readings), and the key-by-key comparison.

As Lightning's ``ThroughputMonitor`` tests do: the clock is patched, so every figure timed by fitprof's clock is
known exactly, and the whole dict is compared, value by value, never a list of keys."""

from __future__ import annotations

import math
from typing import Any

from fitprof import metrics
from fitprof.analysis import BottleneckReport


class Measured:
    """The process's own reading (memory, CPU use): no clock gives it, so the value must be a finite number."""

    def __repr__(self) -> str:
        return "<a finite reading>"


MEASURED = Measured()
NAN = math.nan

PROCESS_EPOCH_KEYS = (
    metrics.EPOCH_CPU_PERCENT.key,
    metrics.EPOCH_INVOLUNTARY_SWITCHES_PER_S.key,
    metrics.EPOCH_RUN_WAIT_PERCENT.key,
    metrics.EPOCH_OWN_THREADS_CPU_PERCENT.key,
    metrics.EPOCH_MEMORY_PEAK_MB.key,
    metrics.EPOCH_MEMORY_IN_USE_MB.key,
    metrics.EPOCH_MEMORY_HEADROOM_PERCENT.key,
)
"""The epoch figures read from the process (getrusage, schedstat, the host's memory)."""


def window_from_report(report: BottleneckReport | None, top_k: int) -> dict[str, Any]:
    """A window's figures as the report gives them, each read from the report field of the key's own name (not
    through the registry the code uses), the operators by rank; every figure NaN without a report."""
    names = [m.key.removeprefix(metrics.PREFIX) for m in metrics.in_group("") if m.field]
    out: dict[str, Any] = {}
    for name in names:
        out[metrics.PREFIX + name] = NAN if report is None else float(getattr(report, name))
    for i in range(1, top_k + 1):
        ops = [] if report is None else report.top_ops
        out[metrics.top_op_rank_key(i)] = ops[i - 1].self_ms_per_step if i <= len(ops) else NAN
    measured = MEASURED if report is not None else NAN
    out[metrics.MEMORY_PEAK_MB.key] = measured
    out[metrics.MEMORY_HEADROOM_PERCENT.key] = measured
    out[metrics.MEMORY_RESERVED_PEAK_MB.key] = NAN  # the host has no allocator's reserve
    return out


def compare(logged: dict[str, Any], expected: dict[str, Any], *, rel: float = 1e-9) -> list[str]:
    """Each difference between the two dicts, key by key: a missing or extra key, or a value that differs by more
    than ``rel`` of it (NaN equals NaN; :data:`MEASURED` matches any finite number)."""
    wrong = [f"{k}: not logged" for k in expected if k not in logged]
    wrong += [f"{k}: logged but not expected ({logged[k]!r})" for k in logged if k not in expected]
    for key in expected.keys() & logged.keys():
        want, got = expected[key], float(logged[key])
        if want is MEASURED:
            ok = math.isfinite(got)
        elif math.isnan(want):
            ok = math.isnan(got)
        else:
            ok = math.isclose(got, want, rel_tol=rel, abs_tol=1e-12)
        if not ok:
            wrong.append(f"{key}: logged {got!r}, expected {want!r}")
    return sorted(wrong)

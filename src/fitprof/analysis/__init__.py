"""Event table -> :class:`BottleneckReport`: step time, input share, host-to-device copies, top operators, the
verdict and the potential speedups. Pure and framework-free.

One module a job:

* :mod:`fitprof.analysis.table`: :func:`analyze_table`, the table-to-report function, in named steps;
* :mod:`fitprof.analysis.report`: :class:`BottleneckReport` and its text (headline, lines, Markdown, scalars);
* :mod:`fitprof.analysis.verdict`: the verdict thresholds (named, in one place), :func:`verdict_for`, the advice;
* :mod:`fitprof.analysis.speedups`: exposed times and :func:`potential_speedups`;
* :mod:`fitprof.analysis.intervals`: interval maths on disjoint, sorted spans;
* :mod:`fitprof.analysis.columns`: masks over one column, each distinct value tested once;
* :mod:`fitprof.analysis.memory`: allocation churn from a trace's memory events (torch ``profile_memory``);
* :mod:`fitprof.analysis.clock`: whether the window's device clock can be trusted, in the window and across windows.
"""

from __future__ import annotations

from fitprof.analysis.clock import ClockCheck, across_windows, check_device_clock, without_device_figures
from fitprof.analysis.report import (
    FRAMEWORK_OF_FORMAT,
    FRAMEWORKS,
    AllocStat,
    BottleneckReport,
    Framework,
    OpStat,
    check_framework,
    one_line,
)
from fitprof.analysis.speedups import SPEEDUP_CLAUSE_MIN, SPEEDUP_FIXES, Speedups, potential_speedups
from fitprof.analysis.table import analyze_table
from fitprof.analysis.verdict import (
    COMMUNICATION_BOUND_PERCENT,
    COMPUTE_BOUND_MAX_PERCENT,
    COMPUTE_COVERS_PERCENT,
    CPU_CONTENDED,
    HTOD_BOUND_PERCENT,
    INPUT_BOUND_PERCENT,
    PAGEABLE_ADVICE_SHARE,
    advice_for,
    cpu_contended,
    verdict_for,
)

__all__ = [
    "COMMUNICATION_BOUND_PERCENT",
    "COMPUTE_BOUND_MAX_PERCENT",
    "COMPUTE_COVERS_PERCENT",
    "CPU_CONTENDED",
    "FRAMEWORKS",
    "FRAMEWORK_OF_FORMAT",
    "HTOD_BOUND_PERCENT",
    "INPUT_BOUND_PERCENT",
    "PAGEABLE_ADVICE_SHARE",
    "SPEEDUP_CLAUSE_MIN",
    "SPEEDUP_FIXES",
    "AllocStat",
    "BottleneckReport",
    "ClockCheck",
    "Framework",
    "OpStat",
    "Speedups",
    "across_windows",
    "advice_for",
    "analyze_table",
    "check_device_clock",
    "check_framework",
    "cpu_contended",
    "one_line",
    "potential_speedups",
    "verdict_for",
    "without_device_figures",
]

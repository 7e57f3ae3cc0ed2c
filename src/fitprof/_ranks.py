"""Cross-rank figures for distributed runs, framework-free.

Each rank packs its report into a fixed-length vector (:func:`pack`), the adapter all-gathers the vectors with
its framework's collective (``torch.distributed.all_gather``, ``tf.distribute`` ``gather``), and rank 0 turns
them into scalars with :func:`combine`. A rank whose window was empty or whose analysis failed sends a vector
marked invalid, so the collective always completes and no rank waits for another.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fitprof import metrics
from fitprof.analysis import BottleneckReport

FIELDS = (
    "step_time_ms",
    "input_percent",
    "htod_ms_per_step",
    "htod_percent",
    "collective_percent",
    "steps_analyzed",
)
"""The report fields exchanged between ranks, in vector order after the leading validity flag."""
VECTOR_LENGTH = 1 + len(FIELDS)

STEP_TIME_MS_MAX = metrics.PREFIX + "step_time_ms_max"
STEP_TIME_MS_MAX_RANK = metrics.PREFIX + "step_time_ms_max_rank"
INPUT_PERCENT_MAX = metrics.PREFIX + "input_percent_max"
INPUT_PERCENT_MAX_RANK = metrics.PREFIX + "input_percent_max_rank"
RANKS_REPORTED = metrics.PREFIX + "ranks_reported"


def pack(report: BottleneckReport | None) -> list[float]:
    """The vector one rank contributes: ``[valid, *FIELDS]`` (``valid`` 0.0 and NaNs when ``report`` is None)."""
    if report is None or report.steps_analyzed <= 0 or not math.isfinite(report.step_time_ms):
        return [0.0] + [math.nan] * len(FIELDS)
    return [1.0] + [float(getattr(report, f)) for f in FIELDS]


def combine(vectors: Sequence[Sequence[float]]) -> dict[str, float]:
    """Scalars over all ranks from the gathered vectors (index = global rank).

    Returns:
        ``fitprof/<field>`` as the mean over the ranks that reported (``steps_analyzed`` summed),
        ``fitprof/step_time_ms_max`` / ``fitprof/input_percent_max`` and the rank each belongs to
        (``..._max_rank``), and ``fitprof/ranks_reported``. Empty when no rank reported.
    """
    valid = [(rank, v) for rank, v in enumerate(vectors) if len(v) == VECTOR_LENGTH and v[0] > 0.5]
    if not valid:
        return {}
    out: dict[str, float] = {}
    for i, field in enumerate(FIELDS, start=1):
        values = [v[i] for _, v in valid]
        key = metrics.PREFIX + field
        out[key] = float(sum(values)) if field == "steps_analyzed" else float(sum(values) / len(values))
    slow_rank, slow = max(valid, key=lambda rv: rv[1][1 + FIELDS.index("step_time_ms")])
    in_rank, inp = max(valid, key=lambda rv: rv[1][1 + FIELDS.index("input_percent")])
    out[STEP_TIME_MS_MAX] = float(slow[1 + FIELDS.index("step_time_ms")])
    out[STEP_TIME_MS_MAX_RANK] = float(slow_rank)
    out[INPUT_PERCENT_MAX] = float(inp[1 + FIELDS.index("input_percent")])
    out[INPUT_PERCENT_MAX_RANK] = float(in_rank)
    out[RANKS_REPORTED] = float(len(valid))
    return out

"""Cross-rank figures of distributed runs, defined once: used by both callbacks, the TensorBoard text and
``fitprof report`` / ``fitprof analyze``. Framework-free.

In a callback each rank packs its report into a fixed-length vector (:func:`pack`), the adapter all-gathers
the vectors with its framework's collective (``torch.distributed.all_gather``, ``tf.distribute`` ``gather``),
and :func:`combine` turns them into scalars. A rank whose window was empty or whose analysis failed sends a
vector marked invalid, so the collective always completes and no rank waits for another.

The figures (:func:`spread`, over the ranks with a finite step time):

* slowest / fastest rank: the largest / smallest ``step_time_ms`` (ties: the lowest rank);
* most input-bound rank: the largest finite ``input_percent``;
* spreads: max - min of ``step_time_ms`` and of ``input_percent`` (percentage points);
* straggler: the most input-bound rank when the input spread is at least :data:`STRAGGLER_INPUT_SPREAD`
  points, else the slowest rank. Synchronous training (DDP, ``MultiWorkerMirroredStrategy``) makes fast ranks
  wait in the all-reduce, so step times come out alike; a rank that waits for its input much more than the
  others is then the one holding everybody up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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

STRAGGLER_INPUT_SPREAD = 10.0
"""Input-share spread (percentage points) above which the most input-bound rank is named the straggler."""


@dataclass(frozen=True)
class RankFigures:
    """The figures of one rank that the cross-rank figures are computed from."""

    rank: int
    step_time_ms: float
    input_percent: float


@dataclass(frozen=True)
class Spread:
    """Cross-rank figures of one window (see the module docstring for each definition)."""

    ranks: tuple[int, ...]
    slowest: RankFigures
    fastest: RankFigures
    most_input_bound: RankFigures
    step_time_ms_spread: float
    input_percent_spread: float
    straggler: RankFigures

    @property
    def straggler_by_input(self) -> bool:
        """Whether the straggler was named by its input share rather than by its step time."""
        return self.straggler is self.most_input_bound and self.straggler is not self.slowest


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _extremes(group: Sequence[RankFigures]) -> tuple[RankFigures, RankFigures, RankFigures, float]:
    """``(slowest, fastest, most input-bound, input spread)`` of a non-empty group in rank order."""
    slowest = max(group, key=lambda f: f.step_time_ms)
    fastest = min(group, key=lambda f: f.step_time_ms)
    with_input = [f for f in group if _finite(f.input_percent)]
    if not with_input:
        return slowest, fastest, slowest, math.nan
    inputs = [f.input_percent for f in with_input]
    return slowest, fastest, max(with_input, key=lambda f: f.input_percent), max(inputs) - min(inputs)


def spread(figures: Sequence[RankFigures]) -> Spread | None:
    """The cross-rank figures over the ranks with a finite step time; None with fewer than two such ranks.

    Ties go to the lowest rank.
    """
    group = sorted((f for f in figures if _finite(f.step_time_ms)), key=lambda f: f.rank)
    if len({f.rank for f in group}) < 2:
        return None
    slowest, fastest, most_input, input_spread = _extremes(group)
    straggler = most_input if _finite(input_spread) and input_spread >= STRAGGLER_INPUT_SPREAD else slowest
    return Spread(
        ranks=tuple(sorted({f.rank for f in group})),
        slowest=slowest,
        fastest=fastest,
        most_input_bound=most_input,
        step_time_ms_spread=slowest.step_time_ms - fastest.step_time_ms,
        input_percent_spread=input_spread,
        straggler=straggler,
    )


def pack(report: BottleneckReport | None) -> list[float]:
    """The vector one rank contributes: ``[valid, *FIELDS]`` (``valid`` 0.0 and NaNs when ``report`` is None)."""
    if report is None or report.steps_analyzed <= 0 or not math.isfinite(report.step_time_ms):
        return [0.0] + [math.nan] * len(FIELDS)
    return [1.0] + [float(getattr(report, f)) for f in FIELDS]


def _valid(vectors: Sequence[Sequence[float]]) -> list[tuple[int, Sequence[float]]]:
    return [(rank, v) for rank, v in enumerate(vectors) if len(v) == VECTOR_LENGTH and v[0] > 0.5]


def combine(vectors: Sequence[Sequence[float]]) -> dict[str, float]:
    """Scalars over all ranks from the gathered vectors (index = global rank).

    Returns:
        ``fitprof/<field>`` as the mean over the ranks that reported (``steps_analyzed`` summed),
        ``fitprof/step_time_ms_max`` / ``fitprof/input_percent_max`` and the rank each belongs to
        (``..._max_rank``: the slowest and the most input-bound rank of :func:`spread`), and
        ``fitprof/ranks_reported``. Empty when no rank reported.
    """
    valid = _valid(vectors)
    if not valid:
        return {}
    out: dict[str, float] = {}
    for i, field in enumerate(FIELDS, start=1):
        values = [v[i] for _, v in valid]
        key = metrics.PREFIX + field
        out[key] = float(sum(values)) if field == "steps_analyzed" else float(sum(values) / len(values))
    slowest, _, most_input, _ = _extremes(_figures(valid))
    out[STEP_TIME_MS_MAX] = slowest.step_time_ms
    out[STEP_TIME_MS_MAX_RANK] = float(slowest.rank)
    out[INPUT_PERCENT_MAX] = most_input.input_percent
    out[INPUT_PERCENT_MAX_RANK] = float(most_input.rank)
    out[RANKS_REPORTED] = float(len(valid))
    return out


def _figures(valid: Sequence[tuple[int, Sequence[float]]]) -> list[RankFigures]:
    i_step, i_input = 1 + FIELDS.index("step_time_ms"), 1 + FIELDS.index("input_percent")
    return [RankFigures(rank, float(v[i_step]), float(v[i_input])) for rank, v in valid]


def summary_line(vectors: Sequence[Sequence[float]], combined: dict[str, float], world_size: int) -> str:
    """The Markdown line that opens rank 0's text summary: the slowest rank, the most input-bound rank and the
    straggler (:func:`spread`), with the means of :func:`combine`."""
    c = combined
    line = (
        f"**Across ranks** ({int(c[RANKS_REPORTED])} of {world_size} reported; figures are means): slowest rank "
        f"{int(c[STEP_TIME_MS_MAX_RANK])} at {c[STEP_TIME_MS_MAX]:.2f} ms/step (mean "
        f"{c[metrics.STEP_TIME_MS.key]:.2f}); largest input share rank {int(c[INPUT_PERCENT_MAX_RANK])} at "
        f"{c[INPUT_PERCENT_MAX]:.1f}% (mean {c[metrics.INPUT_PERCENT.key]:.1f}%)."
    )
    s = spread(_figures(_valid(vectors)))
    if s is not None:
        line += f" Straggler: rank {s.straggler.rank}" + (
            f" (input share {s.input_percent_spread:.1f} points above the least input-bound rank)."
            if s.straggler_by_input
            else " (slowest step)."
        )
    return (
        line + " Under synchronous training the all-reduce makes every rank wait for the slowest, so step times "
        "come out alike and the input share names the rank that starves the others."
    )

"""When windows open: pure step arithmetic, no state and no framework (the engine's schedule).

Steps are 1-based within the epoch; with ``steps_per_execution`` = ``spe`` > 1 (Keras) one call runs ``spe``
batches and step numbers go up by ``spe``. A window of ``profile_batch=(first, last)`` opens one call early: its
*warm-up* step, recorded but not marked, takes the profiler's start-up, so that cost is never in an analysed step.
Its FLOPs are counted on the call before the warm-up call (or, without one, on the first call after the window):
counting slows the step it counts, so it is neither an analysed step nor the warm-up step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from fitprof.fit.config import ProfileConfig


class Plan(NamedTuple):
    """One epoch's scheduled window.

    Attributes:
        warm_up: the step before which the profiler starts: ``first - spe`` (the warm-up call), or ``first``
            itself when the epoch has no step before it (``first == 1``, or resumed at ``first``).
        count_step: the step whose FLOPs are counted.
    """

    warm_up: int
    count_step: int

    @classmethod
    def off(cls) -> Plan:
        """No window this epoch."""
        return cls(0, 0)

    def start(self, count_pending: bool) -> int:
        """The first step the scheduled block holds: its FLOP-count step when that comes first and is still to
        come, else its warm-up step."""
        if count_pending and self.count_step < self.warm_up:
            return self.count_step
        return self.warm_up


def plan(config: ProfileConfig, *, next_step: int = 1, spe: int = 1) -> Plan:
    """The window of an epoch whose next step is ``next_step`` (1 unless resumed mid-epoch).

    E.g. ``profile_batch=(6, 10)``: warm-up 5, FLOPs counted on step 4; ``(2, 3)``: warm-up 1, FLOPs on step 4
    (no step before the warm-up one); ``(1, 3)``: no warm-up step (opens before step 1), FLOPs on step 4.
    """
    first, last = config.first_step, config.last_step
    warm_up = max(first - spe, next_step)
    count = max(warm_up - spe, next_step) if next_step < warm_up < first else last + 1
    return Plan(warm_up, count)


def yield_to(plan: Plan, config: ProfileConfig, busy: Sequence[tuple[int, int]]) -> tuple[Plan, int | None]:
    """The epoch's ``plan`` beside other profilers' steps (``busy``: each one's first and last step, inclusive): one
    that ends on the warm-up step only costs the window its warm-up step (it opens at its first step); one that
    shares a step with the window takes the window. The plan, and the index in ``busy`` of the profiler that takes
    the window (None: none does)."""
    for i, (first, last) in enumerate(busy):
        if plan.warm_up <= last < config.first_step:
            plan = Plan(config.first_step, plan.count_step)
        elif overlaps(first, last, config.first_step, config.last_step):
            return plan, i
    return plan, None


def overlaps(a_first: int, a_last: int, b_first: int, b_last: int) -> bool:
    """Whether steps ``a_first..a_last`` and ``b_first..b_last`` (inclusive) share a step."""
    return a_first <= b_last and b_first <= a_last


def may_trigger(
    n: int, *, length: int, spe: int = 1, scheduled: int | None = None, busy: Sequence[tuple[int, int]] = ()
) -> bool:
    """Whether a triggered window may open after step ``n``, as far as the steps go: its warm-up call begins at
    ``n + 1``, its ``length`` analysed calls follow and it closes at the call after them (``closing``). It must
    close before the scheduled block begins (``scheduled``, :meth:`Plan.start`; None when the epoch has none left)
    and share no step, the closing call included, with another profiler's steps (``busy``).
    """
    closing = n + 1 + spe * (length + 1)
    if any(overlaps(n + 1, closing, first, last) for first, last in busy):
        return False
    return scheduled is None or closing < scheduled

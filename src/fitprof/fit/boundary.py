"""Where a framework's training steps begin and end, as the engine sees them: one small strategy object per
framework, which its adapter hands to :class:`~fitprof.fit.engine.FitEngine` (:data:`KERAS`, :data:`LIGHTNING`).

- Keras (``step_start``): step ``k`` runs from ``step_start(k)`` to the next ``step_start``, ``validation_start``
  or ``epoch_end``; windows are marked at ``step_start``. Keras validates after the epoch's last training step, so
  validation closes an open window.
- Lightning (``step_end``): step ``n`` runs from the previous ``step_end`` (or ``epoch_start``) to ``step_end(n)``,
  so a step holds its batch fetch; windows are marked at ``step_end`` for the next step, which the adapter's
  ``ends_after`` says exists. Validation runs inside a step's interval: inside a window it is annotated and left
  out of step time. A step marked for a next step that never ran is dropped when the window stops.

Framework-free: nothing here imports a framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Framework = Literal["keras", "lightning"]


@dataclass(frozen=True)
class StepBoundary:
    """One framework's step boundary (see the module docstring).

    Attributes:
        framework: the framework's name, as the epoch-parts probe and the per-epoch file name it.
        hook: the engine event at which a step ends and the next begins (``"step_start"`` or ``"step_end"``), for
            messages and ``repr`` only.
        at_step_start: steps end at ``step_start`` (Keras); else at ``step_end`` (Lightning).
    """

    framework: Framework
    hook: str
    at_step_start: bool

    @property
    def at_step_end(self) -> bool:
        """Steps end at ``step_end`` (Lightning)."""
        return not self.at_step_start

    @property
    def sees_epoch_end(self) -> bool:
        """At a step boundary the framework can tell whether the step that just ended was the epoch's last
        (``ends_after``, asked before a window marks a next step that may never run)."""
        return not self.at_step_start

    @property
    def drops_open_step(self) -> bool:
        """A window stopped at an epoch's or a fit's end holds a step marked for a next step that never ran."""
        return not self.at_step_start

    @property
    def validation_closes_window(self) -> bool:
        """Validation comes after the epoch's last training step (Keras), so it closes an open window; else it runs
        inside a step's interval and is annotated in the window."""
        return self.at_step_start

    def origin_at_epoch_start(self, next_step: int) -> bool:
        """Whether the epoch's start is the first step's start (so the first step is timed from it): at
        ``step_end`` boundaries, unless the epoch was resumed past its first step. Else the first boundary only
        sets the origin."""
        return not self.at_step_start and next_step == 1

    def opens_at_epoch_start(self, next_step: int, warm_up: int) -> bool:
        """Whether the scheduled window opens at the epoch's start (the warm-up step, or resumed past it, is the
        first step of a ``step_end`` epoch, which has no boundary before it)."""
        return not self.at_step_start and next_step >= warm_up


KERAS = StepBoundary("keras", "step_start", at_step_start=True)
"""Keras: a step ends where the next begins (``on_train_batch_begin``)."""

LIGHTNING = StepBoundary("lightning", "step_end", at_step_start=False)
"""Lightning: a step ends at ``on_train_batch_end`` and holds its batch fetch."""

"""The slowdown-triggered windows of one :class:`~fitprof.fit.engine.FitEngine`, framework-free: feeding clean steps
to the trigger, where an opened window's analysed steps end, each closed window's wall times judged (a false alarm
is taken back), the stopped windows kept until their epoch's end (:meth:`TriggeredWindows.take`), then counted for
the fit (:meth:`TriggeredWindows.published_in`); the engine's epoch end analyses and publishes them
(:mod:`fitprof.fit.epoch_end`).

The engine keeps the window state machine (starting, marking and stopping the window, which window is open) and
calls this bookkeeping at each of its turns; whether a window may open at all is the engine's to say (it knows the
open window, the schedule and another profiler's steps: :func:`fitprof.fit.schedule.may_trigger`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fitprof.analysis import BottleneckReport
from fitprof.fit.result import Triggered
from fitprof.fit.steps import SlowdownTrigger, TriggerEvent
from fitprof.profilers.base import ProfileWindow


class TriggeredWindows:
    """The bookkeeping of the triggered windows of one engine, from the firing to the published line.

    Args:
        trigger: the slowdown trigger (None: no triggered windows; :meth:`feed` never fires).
        length: the analysed steps (calls) of a triggered window (:attr:`length`).

    Attributes:
        trigger: as given.
        length: the analysed steps (calls) of a triggered window.
        steps_fed: the clean steps fed to the trigger this fit (its step numbering).
        published: one ``(epoch, event, report or None)`` per triggered window of this fit, in order.
        false_alarms: ``(epoch, step)`` of each triggered window that proved a false alarm -> its steps' median wall
            time (ms).
    """

    def __init__(self, trigger: SlowdownTrigger | None, *, length: int) -> None:
        self.trigger = trigger
        self.length = length
        self.published: list[tuple[int, TriggerEvent, BottleneckReport | None]] = []
        self.false_alarms: dict[tuple[int, int], float] = {}
        self._last = 0  # the last analysed step of the open window
        self._times: list[int] = []  # the open window's step boundaries (ns), from its first analysed step on
        self._pending: list[tuple[ProfileWindow, Path, TriggerEvent]] = []  # stopped this epoch, published at its end
        self._fired: Any = None  # the trigger's own record of the firing whose window is open
        self.steps_fed = 0

    def begin_fit(self) -> None:
        """A ``fit`` begins: forget the last fit's windows, firings and false alarms."""
        self.published = []
        self.false_alarms = {}
        self._pending = []
        self.steps_fed = 0
        if self.trigger is not None:
            self.trigger.reset()

    def begin_epoch(self) -> None:
        """An epoch begins (a new iterator, maybe a new learning rate): the trigger starts a fresh baseline."""
        self._last = 0
        if self.trigger is not None:
            self.trigger.reset_run()

    def feed(self, dt: int | None, n: int, may_open: Callable[[int], bool]) -> TriggerEvent | None:
        """Feed a clean step's wall time ``dt`` (ns; None: the step was left out) to the trigger; the firing,
        numbered as step ``n`` of the epoch, or None. ``may_open(n)``: whether a window may open after step ``n``,
        asked for slow steps only (the longer check)."""
        trigger = self.trigger
        if dt is None or trigger is None:
            return None
        self.steps_fed += 1
        allowed = dt <= trigger.threshold_ns or may_open(n)
        fired = trigger.observe(dt, self.steps_fed, allowed=allowed)
        if fired is None:
            return None
        self._fired = fired  # the trigger's own record, to withdraw if the window proves a false alarm
        return TriggerEvent(n, fired.step_time_ms, fired.baseline_ms, fired.threshold_ms)

    def opened(self, k: int, spe: int) -> None:
        """A triggered window opened before step ``k``, its warm-up step: the next :attr:`length` steps (calls of
        ``spe`` batches) are analysed."""
        self._last = k + spe * self.length
        self._times = []

    def boundary(self, k: int, now: int) -> bool:
        """Step boundary ``k`` of the open window, at ``now`` (ns), from its first analysed step on: kept for
        judging its steps' wall times; whether its analysed steps are done (it closes here)."""
        self._times.append(now)
        return k > self._last

    def closed(self, epoch: int, window: ProfileWindow, trace: Path, event: TriggerEvent) -> None:
        """A triggered window stopped with its trace: judged (:meth:`_judge`) and kept for its epoch's end."""
        self._judge(epoch, event)
        self._pending.append((window, trace, event))

    def _judge(self, epoch: int, event: TriggerEvent) -> None:
        """When the closed window's steps' median wall time is within the threshold the trigger fired against (no
        slower than the baseline, beyond its noise), the firing was a false alarm (a transient stall, e.g. another
        process on the cores): the trigger takes it back, so it uses up neither ``max_windows`` nor the
        ``min_spacing`` gap, and the window's line says so. Judged as the window closes, so that a real slowdown
        soon after can still fire in this epoch. Wall times include the profiler's own cost, so a window is never
        called a false alarm for being cheap to profile."""
        durations = sorted(b - a for a, b in itertools.pairwise(self._times))
        if not durations or self.trigger is None or self._fired is None:
            return
        mid = len(durations) // 2
        median_ns = durations[mid] if len(durations) % 2 else (durations[mid - 1] + durations[mid]) / 2
        if median_ns / 1e6 <= event.threshold_ms:
            self.trigger.withdraw(self._fired)
            self.false_alarms[(epoch, event.step)] = median_ns / 1e6
        self._fired = None

    def take(self) -> list[tuple[ProfileWindow, Path, TriggerEvent]]:
        """The epoch ended: the triggered windows stopped in it (each with its trace and firing), handed over once."""
        pending, self._pending = self._pending, []
        return pending

    def published_in(self, triggered: Iterable[Triggered]) -> None:
        """The epoch's triggered windows were analysed (each with ``epoch``, ``event`` and ``report``,
        :class:`fitprof.fit.result.Triggered`): counted in :attr:`published`."""
        self.published += [(t.epoch, t.event, t.report) for t in triggered]

    def __getstate__(self) -> dict[str, Any]:
        """Copied and pickled with the engine: this fit's stopped windows are not copied."""
        return {**self.__dict__, "_pending": []}

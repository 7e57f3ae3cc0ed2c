"""Where a whole fit's wall time went: before the first epoch, the epochs, after the last (framework-free).

:class:`FitClock` is kept by the epoch-parts probe (:class:`fitprof.fit.epoch_parts.EpochParts`), which reads one
clock for every event: it notes the fit's start (the callback's first hook), the first epoch's start (its span's
start, which may be before the epoch-start hook: Lightning builds epoch 0's loader before it), the sanity check,
and fitprof's own hooks outside any epoch. At the fit's end it builds one :class:`FitWall`, whose
``setup_s + epochs_s + teardown_s`` is ``wall_s`` (integer nanoseconds from one clock, so exactly, up to the float
conversion) when the epochs' spans join up, as they do in a fit that ran to its end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fitprof import metrics

__all__ = ["FitClock", "FitWall"]


@dataclass(frozen=True)
class FitWall:
    """One fit's wall time and its parts (s).

    Attributes:
        wall_s: from the callback's first hook to the fit's end.
        setup_s: from the fit's start to the first epoch's span start (the sanity check included); the whole
            wall when no epoch ran.
        epochs_s: the sum of the epochs' ``wall_s`` (:class:`fitprof.fit.epoch_parts.EpochWall`).
        teardown_s: from the last epoch's close (:meth:`fitprof.fit.epoch_parts.EpochParts.close`) to the fit's
            end (0 when no epoch ran).
        profiling_s: fitprof's own time over the fit, inside the three parts above (not added to them again).
        sanity_check_s: Lightning's sanity check, inside ``setup_s`` (0 when none ran).
        checkpoint_s: every save of the fit: the epochs' saves (the last epoch's included) plus any in the teardown.
    """

    wall_s: float
    setup_s: float
    epochs_s: float
    teardown_s: float
    profiling_s: float
    sanity_check_s: float
    checkpoint_s: float

    def seconds(self) -> dict[str, float]:
        """The figures in seconds, keyed without the ``_s`` suffix (``wall``, ``setup``, ``epochs``, ...): what
        ``FitProfiler.fit_seconds`` holds."""
        return {name.removesuffix("_s"): float(value) for name, value in asdict(self).items()}

    def scalars(self) -> dict[str, float]:
        """The ``fitprof/fit/*`` keys of :data:`fitprof.metrics.FIT_METRICS`."""
        return {metrics.FIT_PREFIX + name: float(value) for name, value in asdict(self).items()}


class FitClock:
    """The fit-level marks (ns, one clock) that :class:`FitWall` is built from; see the module docstring."""

    def __init__(self) -> None:
        self.start(0)
        self.t0 = -1  # no fit started

    def start(self, now: int) -> None:
        """A fit starts at ``now``: forget the previous fit's marks."""
        self.t0 = now
        self.first_span = -1  # the first epoch's span start, -1 before it
        self.own_ns = 0  # fitprof's own hooks outside any epoch span
        self._own_t0 = 0
        self._own_depth = 0
        self.sanity_ns = 0
        self._sanity_t0 = 0

    def own_enter(self, now: int) -> None:
        """fitprof's own hook starts while no epoch is counted."""
        self._own_depth += 1
        if self._own_depth == 1:
            self._own_t0 = now

    def own_leave(self, now: int) -> bool:
        """The hook :meth:`own_enter` opened ends; False when none was open (the caller's span, not ours)."""
        if self._own_depth == 0:
            return False
        self._own_depth -= 1
        if self._own_depth == 0:
            self.own_ns += now - self._own_t0
        return True

    def sanity_start(self, now: int) -> None:
        """A validation run starts before the first epoch: Lightning's sanity check."""
        if self.t0 >= 0 and self.first_span < 0:
            self._sanity_t0 = now

    def sanity_end(self, now: int) -> None:
        """That validation run ends."""
        if self._sanity_t0:
            self.sanity_ns += now - self._sanity_t0
            self._sanity_t0 = 0

    def wall(
        self,
        now: int,
        *,
        epochs_ns: int,
        epochs_profiling_ns: int,
        epochs_checkpoint_ns: int,
        last_end: int,
        tail_profiling_ns: int,
        tail_checkpoint_ns: int,
    ) -> FitWall | None:
        """The fit's figures at its end ``now``; None when no fit started.

        Args:
            now: the fit's end (ns).
            epochs_ns, epochs_profiling_ns, epochs_checkpoint_ns: the finished epochs' wall, profiling and checkpoint
                time summed (ns).
            last_end: the last epoch's close (ns; -1 when no epoch closed).
            tail_profiling_ns, tail_checkpoint_ns: fitprof's own time and the saves after the last epoch's close.
        """
        if self.t0 < 0:
            return None
        wall = now - self.t0
        if last_end < 0 or self.first_span < 0:
            setup, teardown = wall, 0
        else:
            setup, teardown = self.first_span - self.t0, now - last_end
        profiling = self.own_ns + epochs_profiling_ns + tail_profiling_ns
        return FitWall(
            wall_s=wall / 1e9,
            setup_s=setup / 1e9,
            epochs_s=epochs_ns / 1e9 if last_end >= 0 else 0.0,
            teardown_s=teardown / 1e9,
            profiling_s=min(profiling, wall) / 1e9,
            sanity_check_s=self.sanity_ns / 1e9,
            checkpoint_s=(epochs_checkpoint_ns + tail_checkpoint_ns) / 1e9,
        )

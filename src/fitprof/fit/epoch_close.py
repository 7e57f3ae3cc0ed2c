"""An epoch's close, framework-free: its result held from fitprof's epoch-end hook to the point where the epoch's
parts are final, then completed and written.

The framework runs callbacks after fitprof's epoch-end hook: Lightning moves ``ModelCheckpoint`` (its save at the
epoch's end) after every other callback, a Keras ``ModelCheckpoint`` may be listed after fitprof. Such a save
belongs to the epoch whose end made it, so the epoch does not close at fitprof's hook but later
(:meth:`fitprof.fit.epoch_parts.EpochParts.close`):

* Lightning: at the next epoch's start (``on_train_epoch_start``), or at the fit's end (``on_train_end``) for the
  last epoch;
* Keras: just before ``History`` records the epoch's ``logs`` (``History`` runs after every callback the user
  listed; fitprof wraps its ``on_epoch_end``), else at the next epoch's start or the fit's end.

At the hook, :class:`EpochClose` keeps the epoch's :class:`~fitprof.fit.result.EpochResult` (its window, step
timing and probes' figures, and the parts so far); at the close it puts the final parts
(:data:`fitprof.metrics.EPOCH_PARTS_METRICS`) and the verdicts they give into it, writes the epoch's line to the
per-epoch file (:meth:`fitprof.fit.publishing.EpochPublisher.record`) and hands the result back for the adapter to
log (the final parts: Lightning's loggers as one more row at the epoch's step; Keras's ``logs`` before ``History``
and fitprof's event file) and print.
"""

from __future__ import annotations

from fitprof import metrics
from fitprof.fit.epoch_parts import EpochParts, contention
from fitprof.fit.publishing import EpochPublisher
from fitprof.fit.result import EpochResult

PART_KEYS = frozenset(m.key for m in metrics.EPOCH_PARTS_METRICS)
"""The ``fitprof/epoch/*`` keys whose values are final only at the epoch's close (the parts and the CPU use over
the epoch's span)."""


def part_figures(figures: dict[str, float]) -> dict[str, float]:
    """The :data:`PART_KEYS` of ``figures``."""
    return {k: v for k, v in figures.items() if k in PART_KEYS}


class EpochClose:
    """Holds an epoch's result from its end hook to its close (see the module docstring).

    Args:
        parts: the engine's epoch-parts probe.
        publisher: the engine's publisher (the per-epoch file's line).

    Attributes:
        held: ``(epoch, result)`` of the epoch waiting for its close, None when none waits.
    """

    def __init__(self, parts: EpochParts, publisher: EpochPublisher) -> None:
        self.parts = parts
        self.publisher = publisher
        self.held: tuple[int, EpochResult] | None = None

    def hold(self, epoch: int, result: EpochResult) -> None:
        """Epoch ``epoch``'s end hook built ``result``: kept for its close (one held before closes first, without
        a clock of its own: its parts close where the probe says)."""
        if self.held is not None:
            self.close()
        self.held = (epoch, result)

    def close(self, now_ns: int | None = None) -> EpochResult | None:
        """The held epoch closes at ``now_ns`` (ns, the engine's clock): its final parts and their verdicts go into
        its result, whose line is written to the per-epoch file; returns it (None when no epoch was held)."""
        held, self.held = self.held, None
        if held is None:
            return None
        epoch, result = held
        try:
            final = self.parts.close(now_ns)
            if final is None:  # closed already (or never counted: a fit that raised): its figures as they are
                final = self.parts.results.get(epoch)
            if final is not None and final.epoch == epoch:
                result.epoch.update(final.scalars())
                result.verdicts = self.parts.verdicts(epoch)
                result.contended = contention(final, self.parts.framework) is not None
        except Exception as err:  # never in the way of training: the parts as they were at the end hook
            self.publisher.warn("close", f"fitprof: could not close epoch {epoch}'s figures ({err!r}).")
        self.publisher.record(epoch, result)
        return result

    def drop(self) -> None:
        """Forget the held epoch (a new fit)."""
        self.held = None

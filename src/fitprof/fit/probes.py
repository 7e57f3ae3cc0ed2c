"""Probes: per-epoch and per-window figures measured alongside the engine's own, written once for both callbacks.

A probe is any object with some of the methods of :class:`Probe`; it is registered with one line in
:class:`fitprof.fit.engine.FitEngine`'s constructor (``probes=(...)``). The engine forwards every event it gets
from its adapter to each probe that defines a method of that name, with the engine clock's ``now_ns``
(``time.perf_counter_ns`` unless a test injects a fake clock), and merges what the probe returns into what it
publishes:

- :meth:`Probe.epoch_figures` (keys ``fitprof/epoch/...``) at each epoch's end, through the same channels as the
  engine's own ``fitprof/epoch/*`` keys (the epoch ``logs`` and event file in Keras, ``callback_metrics`` and the
  loggers in Lightning, and the epoch's :class:`fitprof.fit.steps.EpochSteps`-derived scalars in ``FitProfiler.epoch_figures``);
- :meth:`Probe.window_figures` (keys ``fitprof/...``) into the scalars logged for the profiled window of the epoch,
  beside the report's;
- ``advice`` into the lines the epoch's result carries for the adapter to print.

A probe that raises is warned about once (its key is the probe's class name) and left out of that event; it never
stops training. Framework-free: a probe that needs a framework imports it itself, lazily.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Protocol

EVENTS = (
    "fit_start",
    "epoch_start",
    "step_start",
    "step_end",
    "validation_start",
    "validation_end",
    "checkpoint_start",
    "checkpoint_end",
    "epoch_end",
    "fit_end",
    "exception",
    "window_start",
    "window_end",
)
"""The event methods a probe may define, each called as ``method(*args, now_ns=...)``."""


class Probe(Protocol):
    """What a probe may define; every method is optional (the engine calls only those a probe has).

    Event methods take the event's own arguments and the keyword ``now_ns`` (the engine clock's reading, ns):

    - ``fit_start(*, now_ns)``, ``fit_end(*, now_ns)``, ``exception(exc, *, now_ns)``;
    - ``epoch_start(epoch, *, now_ns)``, ``epoch_end(epoch, *, now_ns)`` (0-based epoch; ``epoch_end`` comes before
      :meth:`epoch_figures`);
    - ``step_start(step, batch, *, now_ns)``, ``step_end(step, batch, *, now_ns)`` (1-based step in the epoch; the
      batch as the framework's hook gets it, None where the hook has none; Keras calls no ``step_end``: its step
      ends at the next ``step_start`` or at ``epoch_end``);
    - ``validation_start(*, now_ns)``, ``validation_end(*, now_ns)``, ``checkpoint_start(*, now_ns)``,
      ``checkpoint_end(*, now_ns)`` (Keras and Lightning report a save as one point: both come at once);
    - ``window_start(*, now_ns)``, ``window_end(*, now_ns)``: the profiled window's first analysed step begins /
      the window stops (scheduled windows only, not triggered ones).

    And, at an epoch's end, ``advice(*, waiting_only)``: one line of advice for the epoch that ended, or None
    (``waiting_only``: only when there is something to act on), which the epoch's result carries and the adapter
    prints on rank 0 when ``verbose`` (:class:`fitprof.fit.loader.LoaderProbe`'s, for one).
    """

    def epoch_figures(self) -> dict[str, float]:
        """This epoch's figures, keys ``fitprof/epoch/...``, the same keys every epoch (NaN where there is no
        figure), each key's unit in its name."""
        ...

    def window_figures(self) -> dict[str, float]:
        """The figures of the window that closed in this epoch, keys ``fitprof/...`` (NaN where none)."""
        ...


class Probes:
    """The registered probes, called by event name (see the module docstring).

    Args:
        probes: the probe objects.
        warn: the adapter's warn-once (``warn(key, message)``), for a probe that raises.
    """

    def __init__(self, probes: Iterable[Any], warn: Callable[[str, str], None]) -> None:
        self.probes = tuple(probes)
        self._warn = warn
        self._by_event: dict[str, tuple[Callable[..., Any], ...]] = {
            name: tuple(m for m in (getattr(p, name, None) for p in self.probes) if callable(m)) for name in EVENTS
        }

    def __bool__(self) -> bool:
        return bool(self.probes)

    def call(self, event: str, *args: Any, now_ns: int) -> None:
        """Call ``event(*args, now_ns=now_ns)`` on every probe that defines it."""
        for method in self._by_event[event]:
            try:
                method(*args, now_ns=now_ns)
            except Exception as err:
                self.failed(method, err)

    def methods(self, event: str) -> tuple[Callable[..., Any], ...]:
        """The bound ``event`` methods of the probes that define it, in order: for a caller that sends that event
        every step and calls them itself, each inside its own ``try`` that hands a failure to :meth:`failed`."""
        return self._by_event[event]

    def figures(self, kind: str) -> dict[str, float]:
        """The merged ``epoch_figures()`` or ``window_figures()`` (``kind`` "epoch" or "window") of every probe
        that defines it, values as floats (non-numbers left out)."""
        out: dict[str, float] = {}
        for probe in self.probes:
            method = getattr(probe, f"{kind}_figures", None)
            if not callable(method):
                continue
            try:
                for key, value in dict(method()).items():
                    out[str(key)] = float(value)
            except Exception as err:
                self.failed(method, err)
        return out

    def advice(self) -> list[str]:
        """Each probe's advice line for the epoch that ended, where it has something to act on
        (``advice(waiting_only=True)``), in order."""
        out: list[str] = []
        for probe in self.probes:
            method = getattr(probe, "advice", None)
            if not callable(method):
                continue
            try:
                line = method(waiting_only=True)
            except Exception as err:
                self.failed(method, err)
                continue
            if line:
                out.append(str(line))
        return out

    def failed(self, method: Any, err: Exception) -> None:
        """Warn once that ``method``'s probe raised ``err`` (its figures are left out)."""
        owner = type(getattr(method, "__self__", method)).__name__
        self._warn(f"probe-{owner}", f"fitprof: the probe {owner} failed ({err!r}); its figures are left out.")


def finite(figures: dict[str, float]) -> dict[str, float]:
    """``figures`` without its NaN and infinite values (what is logged to a logger that keeps no NaN)."""
    return {k: v for k, v in figures.items() if math.isfinite(v)}

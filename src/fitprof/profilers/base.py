"""The one interface every profiler window implements (TensorFlow, JAX, torch): :class:`ProfileWindow`.

The engine (:mod:`fitprof.fit.engine`) opens at most one window at a time and drives it through these calls
only, so a new profiler is one class implementing them plus one line in the adapter's table of windows. Framework
free: the protocol names no framework type.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol


class ProfileWindow(Protocol):
    """One profiling window: start, mark steps, annotate, stop and export.

    Life cycle: :meth:`start` once; then any number of :meth:`begin_step` / :meth:`end_step` and span pairs; then
    either :meth:`stop` (export the trace and return its path) or :meth:`abort` (keep nothing). After a
    :meth:`stop` that returned a temporary copy (``session_dir`` None: the log directory could not be written),
    :meth:`cleanup` deletes that copy once it has been analysed.

    Attributes:
        session_dir: the window's session folder ``<log_dir>/plugins/profile/<session>/`` once it exists (the
            ``.xplane.pb`` of an XSpace profiler, the converted copy of a Kineto trace); None before, or when the
            trace could only be kept as a temporary copy.
    """

    session_dir: Path | None

    def start(self) -> None:
        """Start the profiler.

        Raises:
            RuntimeError: when it cannot start (another profiler runs, the framework refused); the message says
                why in words a user can act on, and nothing is left running.
        """

    def begin_step(self, step: int) -> None:
        """Close the open step marker, if any, and open the one of ``step`` (1-based, as the adapter numbers
        steps in the epoch). An open overhead span stays open around the switch."""

    def end_step(self) -> None:
        """Close the open step marker, if any."""

    def begin_overhead(self) -> None:
        """Open the ``fitprof/overhead`` span around the caller's own work (left out of step time, reported as
        ``fitprof/self_ms_per_step``); a no-op when one is open or the profiler is not running."""

    def end_overhead(self) -> None:
        """Close the span :meth:`begin_overhead` opened, if any."""

    def begin_annotation(self, name: str) -> None:
        """Open a named span inside the window (e.g. ``fitprof/validation``); a no-op outside a window."""

    def end_annotation(self) -> None:
        """Close the innermost span :meth:`begin_annotation` opened, if any."""

    def stop(self, *, drop_open_step: bool = False) -> Path:
        """Stop the profiler and export the trace.

        Args:
            drop_open_step: leave the open step out of the trace (it never finished: an exception, or the
                epoch ended before it).

        Returns:
            The exported trace (``.xplane.pb`` or ``.pt.trace.json.gz``).

        Raises:
            RuntimeError: when the profiler could not stop or wrote nothing; it is stopped either way.
        """
        ...

    def cleanup(self) -> None:
        """Delete the temporary copy :meth:`stop` returned when the log directory could not be written."""

    def abort(self) -> None:
        """Stop a running profiler without keeping anything (after a failure, or a window with nothing to
        analyse); never raises."""


class WindowBusy(RuntimeError):
    """:meth:`ProfileWindow.start` found another profiler running: the message for the warning, and ``reason``,
    the short cause the end-of-fit "nothing was profiled" warning names."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class StepSpans:
    """The nesting of the step marker and the ``fitprof/overhead`` span, written once for every window.

    Spans must nest: a switch of step marker inside the caller's overhead span closes the span, switches the
    marker and reopens the span inside the new step. A window provides ``_close_overhead() -> bool`` (whether
    one was open), ``_end_step()`` and ``begin_overhead()``.
    """

    def _close_overhead(self) -> bool:
        raise NotImplementedError

    def _end_step(self) -> None:
        raise NotImplementedError

    def begin_overhead(self) -> None:
        raise NotImplementedError

    def _switch_step(self, open_step: Callable[[], None]) -> None:
        """Close the open step marker, call ``open_step`` (which may open the next), keep the overhead span."""
        overhead = self._close_overhead()
        self._end_step()
        open_step()
        if overhead:
            self.begin_overhead()

    def end_step(self) -> None:
        """Close the open step marker, if any (an open overhead span is closed first and reopened after)."""
        self._switch_step(lambda: None)

    def end_overhead(self) -> None:
        """Close the span :meth:`begin_overhead` opened, if any."""
        self._close_overhead()

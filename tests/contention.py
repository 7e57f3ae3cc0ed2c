"""Timing tests that hold on a busy machine: each measures the machine's contention over its own run, and a failure
under contention is retried once, then skipped with the measured contention as its reason. It never fails for the
load alone; a failure on a quiet machine (or a quiet retry) still fails.

What counts as contended, over the span of the test (and of any span its module recorded with :func:`measured`,
such as a module-scoped child run whose results the test reads):

* the test thread's own run-queue wait (``/proc/thread-self/schedstat``, field 2: ready to run, waiting for a core)
  is :data:`CONTENDED_PERCENT` or more of the wall time, as fitprof's own ``cpu-contended`` epoch verdict counts it
  (``fitprof.fit.epoch_parts.CONTENDED_WAIT_PERCENT``);
* or the machine had a task waiting for a core that share of the time (Linux pressure stall information,
  ``/proc/pressure/cpu`` ``some``): a test whose timing is in a child process or a worker thread waits on that;
* or, where neither file can be read, the 1-minute load average per core at the end is over 1, or the children
  waited for involuntary switches at :data:`SWITCHES_PER_CPU_S` per CPU second or more (``getrusage``).

Use ``@tolerates_load`` on a test function (it keeps the signature, so fixtures still arrive); wrap the work of a
module-scoped fixture in ``with measured(__name__):`` so that its tests see the contention of the run they read.
"""

from __future__ import annotations

import functools
import os
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

CONTENDED_PERCENT = 20.0
"""A wait for a core over this share of the wall time makes a span contended: fitprof's ``cpu-contended`` bar
(``fitprof.fit.epoch_parts.CONTENDED_WAIT_PERCENT``, measured on this project's 2-core machine)."""

SWITCHES_PER_CPU_S = 1000.0
"""Without schedstat and pressure files: children's involuntary switches per CPU second that make a span contended
(``fitprof.fit.epoch_parts.CONTENDED_SWITCHES_PER_CPU_S``)."""

F = TypeVar("F", bound=Callable[..., Any])


def _schedstat_ns() -> int | None:
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _pressure_us() -> int | None:
    """The machine's total time with some task waiting for a core, us (``/proc/pressure/cpu``, ``some total=``)."""
    try:
        with open("/proc/pressure/cpu", encoding="ascii") as f:
            some = f.readline().split()
        return int(next(field for field in some if field.startswith("total="))[len("total=") :])
    except (OSError, ValueError, StopIteration):
        return None


def _load_per_core() -> float:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return float("nan")


@dataclass(frozen=True)
class Contention:
    """The contention measured over one span.

    Attributes:
        wall_s: the span's wall time (s).
        wait_percent: the measuring thread's run-queue wait over the wall time, times 100; NaN without schedstat.
        pressure_percent: the machine's time with a task waiting for a core over the wall time, times 100; NaN
            without ``/proc/pressure/cpu``.
        child_switches_per_cpu_s: involuntary switches of the children waited for in the span per CPU second of
            theirs; NaN when they used no CPU.
        load_per_core: the 1-minute load average over the core count at the span's end.
    """

    wall_s: float
    wait_percent: float
    pressure_percent: float
    child_switches_per_cpu_s: float
    load_per_core: float

    @property
    def contended(self) -> bool:
        """Whether the span waited for cores enough to spoil a timing (see the module's docstring)."""
        if self.wait_percent >= CONTENDED_PERCENT or self.pressure_percent >= CONTENDED_PERCENT:
            return True
        if self.wait_percent != self.wait_percent and self.pressure_percent != self.pressure_percent:
            return self.load_per_core > 1.0 or self.child_switches_per_cpu_s >= SWITCHES_PER_CPU_S
        return False

    def describe(self) -> str:
        return (
            f"run-queue wait {self.wait_percent:.0f}% of {self.wall_s:.1f} s, machine waiting for a core "
            f"{self.pressure_percent:.0f}% (bar {CONTENDED_PERCENT:.0f}%), load {self.load_per_core:.1f} per core"
        )


class Span:
    """Measures :class:`Contention` from its creation to :meth:`stop`, on the thread that created it."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._wait0 = _schedstat_ns()
        self._psi0 = _pressure_us()
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._child0 = (r.ru_utime + r.ru_stime, r.ru_nivcsw)

    def stop(self) -> Contention:
        wall = max(time.perf_counter() - self._t0, 1e-9)
        wait1, psi1 = _schedstat_ns(), _pressure_us()
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu, switches = r.ru_utime + r.ru_stime - self._child0[0], r.ru_nivcsw - self._child0[1]
        nan = float("nan")
        return Contention(
            wall_s=wall,
            wait_percent=nan if wait1 is None or self._wait0 is None else 100.0 * (wait1 - self._wait0) * 1e-9 / wall,
            pressure_percent=nan if psi1 is None or self._psi0 is None else 100.0 * (psi1 - self._psi0) * 1e-6 / wall,
            child_switches_per_cpu_s=switches / cpu if cpu > 0 else nan,
            load_per_core=_load_per_core(),
        )


_RECORDED: dict[str, list[Contention]] = {}


@contextmanager
def measured(key: str) -> Iterator[None]:
    """Records the contention of the enclosed work (a module-scoped child run, say) under ``key`` (the test
    module's ``__name__``), for :func:`tolerates_load` to weigh when a test of that module fails."""
    span = Span()
    try:
        yield
    finally:
        _RECORDED.setdefault(key, []).append(span.stop())


def _worst(spans: list[Contention]) -> Contention | None:
    contended = [c for c in spans if c.contended]
    return contended[0] if contended else None


def tolerates_load(test: F) -> F:
    """Runs a timing test; when it fails on a contended machine, runs it once more, and when that fails contended
    too, skips it naming the contention. A failure on a quiet machine, or a quiet retry's failure, is raised."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        recorded = _RECORDED.get(test.__module__, [])
        span = Span()
        try:
            return test(*args, **kwargs)
        except AssertionError as first:
            contended = _worst([span.stop(), *recorded])
            if contended is None:
                raise
            reason = f"{type(first).__name__}: {str(first).splitlines()[0][:200] if str(first) else ''}"
        span = Span()
        try:
            return test(*args, **kwargs)
        except AssertionError:
            again = _worst([span.stop(), *recorded])
            if again is None:
                raise
            pytest.skip(
                f"{test.__name__}: machine contended ({again.describe()}): failed twice under load, first with {reason}"
            )

    return run  # type: ignore[return-value]

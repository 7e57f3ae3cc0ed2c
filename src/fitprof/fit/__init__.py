"""The engine both callbacks drive (:class:`~fitprof.fit.engine.FitEngine`), its schedule, the epoch-end pipeline
and the probe extension point. Framework-free."""

from __future__ import annotations

from fitprof.fit.boundary import KERAS, LIGHTNING, StepBoundary
from fitprof.fit.engine import FitEngine
from fitprof.fit.probes import Probe, Probes
from fitprof.fit.result import Busy, EpochLog, EpochResult, Triggered, Work

__all__ = [
    "KERAS",
    "LIGHTNING",
    "Busy",
    "EpochLog",
    "EpochResult",
    "FitEngine",
    "Probe",
    "Probes",
    "StepBoundary",
    "Triggered",
    "Work",
]

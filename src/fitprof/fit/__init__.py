"""The engine both callbacks drive (:class:`~fitprof.fit.engine.FitEngine`), its schedule, the epoch-end pipeline
and the probe extension point. Framework-free."""

from __future__ import annotations

from fitprof.fit.engine import FitEngine
from fitprof.fit.events import Busy, EpochResult, Triggered, Work
from fitprof.fit.probes import Probe, Probes

__all__ = ["Busy", "EpochResult", "FitEngine", "Probe", "Probes", "Triggered", "Work"]

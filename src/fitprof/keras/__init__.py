"""Keras 3 adapter: ``from fitprof.keras import FitProfiler``."""

from fitprof.keras.fit_profiler import FitProfiler

__all__ = ["FitProfiler"]

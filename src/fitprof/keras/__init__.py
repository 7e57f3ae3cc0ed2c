"""Keras 3 adapter: ``from fitprof.keras import FitProfiler``.

Importing this package imports Keras and its backend; a missing Keras, or a missing backend (TensorFlow, torch),
raises ``ModuleNotFoundError`` naming the package really missing and the ``pip install`` line that fixes it, as
``fitprof.lightning`` does for torch and Lightning.
"""

from __future__ import annotations

from fitprof._imports import require

require("keras", "fitprof.keras")

from fitprof.keras.fit_profiler import FitProfiler  # noqa: E402

__all__ = ["FitProfiler"]

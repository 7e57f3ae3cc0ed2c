"""Lightning adapter: :class:`FitProfiler`, a ``lightning.pytorch`` callback.

Importing this package imports torch and Lightning; a missing one raises ``ModuleNotFoundError`` with the
``pip install`` line that fixes it.
"""

from __future__ import annotations

from fitprof._imports import require

require("torch", "fitprof.lightning")
require("lightning", "fitprof.lightning")

from fitprof.lightning.fit_profiler import FitProfiler  # noqa: E402

__all__ = ["FitProfiler"]

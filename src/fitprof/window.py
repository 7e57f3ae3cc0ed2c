"""The epoch-end pipeline, under the name it has had since the first release: see :mod:`fitprof.fit.pipeline`."""

from __future__ import annotations

from fitprof.fit.pipeline import (
    OP_GROWTH_FLOOR,
    EpochLog,
    Gather,
    Log,
    WindowPipeline,
    compare_windows,
    epoch_scalars,
    every_key,
    logged_keys,
    representativeness,
    summary_line,
    trigger_line,
    trigger_scalars,
)

__all__ = [
    "OP_GROWTH_FLOOR",
    "EpochLog",
    "Gather",
    "Log",
    "WindowPipeline",
    "compare_windows",
    "epoch_scalars",
    "every_key",
    "logged_keys",
    "representativeness",
    "summary_line",
    "trigger_line",
    "trigger_scalars",
]

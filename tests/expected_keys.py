"""The keys fitprof adds to Keras ``logs`` (and so to ``History`` and ``CSVLogger`` columns) with ``top_k=3``.

The epoch's and the trigger's keys are written out by hand from the metrics reference (docs/metrics.md), so a key
the code drops or renames fails a test instead of changing what the test expects. The window's figures come from the
metrics registry, where each names the report field it is read from: a window figure is one ``Metric`` row, and the
whole-dict tests (``tests/test_*_logged_dict.py``) compare each logged value with that report field, so a figure
dropped, renamed or logged as NaN forever still fails a test."""

from __future__ import annotations

from fitprof import metrics

WINDOW_KEYS = [
    *metrics.BASE_KEYS,  # each window figure read from its report field (tests/test_metrics_registry.py)
    *(metrics.top_op_rank_key(i) for i in range(1, 4)),
    *(m.key for m in metrics.MEMORY_METRICS),
]
"""The profiled window's keys (docs/metrics.md), NaN in an epoch without a window."""
EPOCH_KEYS = [
    "fitprof/epoch/step_time_ms_p50",
    "fitprof/epoch/step_time_ms_p90",
    "fitprof/epoch/step_time_ms_max",
    "fitprof/epoch/input_percent",
    "fitprof/epoch/samples_per_s",
    "fitprof/epoch/steps_timed",
    "fitprof/epoch/memory_peak_mb",
    "fitprof/epoch/memory_in_use_mb",
    "fitprof/epoch/memory_growth_mb",
    "fitprof/epoch/memory_headroom_percent",
    "fitprof/epoch/loader_workers",
    "fitprof/epoch/loader_busy_percent",
    "fitprof/epoch/loader_batch_ms",
    "fitprof/epoch/loader_workers_needed",
    "fitprof/epoch/step_time_if_enough_workers_ms",
    "fitprof/epoch/wall_s",
    "fitprof/epoch/train_steps_s",
    "fitprof/epoch/input_s",
    "fitprof/epoch/validation_s",
    "fitprof/epoch/checkpoint_s",
    "fitprof/epoch/callbacks_s",
    "fitprof/epoch/startup_s",
    "fitprof/epoch/profiling_s",
    "fitprof/epoch/other_s",
    "fitprof/epoch/cpu_percent",
    "fitprof/epoch/involuntary_switches_per_s",
    "fitprof/epoch/run_wait_percent",
    "fitprof/epoch/own_threads_cpu_percent",
]
"""The always-on step timing's keys: a figure every epoch."""
TRIGGER_KEYS = ["fitprof/trigger/step", "fitprof/trigger/step_time_ms", "fitprof/trigger/baseline_ms"]
"""A triggered window's keys: NaN when nothing triggered (no trigger here)."""

"""The keys fitprof adds to Keras ``logs`` (and so to ``History`` and ``CSVLogger`` columns) with ``top_k=3``,
written out by hand from the metrics reference (docs/metrics.md), so a key the code drops or renames fails a test
instead of changing what the test expects."""

from __future__ import annotations

WINDOW_KEYS = [
    "fitprof/step_time_ms",
    "fitprof/input_percent",
    "fitprof/htod_ms_per_step",
    "fitprof/htod_percent",
    "fitprof/collective_percent",
    "fitprof/htod_exposed_percent",
    "fitprof/collective_exposed_percent",
    "fitprof/steps_analyzed",
    "fitprof/speedup_if_no_input",
    "fitprof/speedup_if_no_htod",
    "fitprof/speedup_if_no_collectives",
    "fitprof/step_time_if_no_input_ms",
    "fitprof/step_time_if_no_htod_ms",
    "fitprof/step_time_if_no_collectives_ms",
    "fitprof/samples_per_s",
    "fitprof/items_per_s",
    "fitprof/flops_per_step",
    "fitprof/flops_per_s",
    "fitprof/mfu",
    "fitprof/self_ms_per_step",
    "fitprof/top_op_1_ms",
    "fitprof/top_op_2_ms",
    "fitprof/top_op_3_ms",
    "fitprof/memory_peak_mb",
    "fitprof/memory_reserved_peak_mb",
    "fitprof/memory_headroom_percent",
    "fitprof/checkpoint_ms_per_step",
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
]
"""The always-on step timing's keys: a figure every epoch."""
TRIGGER_KEYS = ["fitprof/trigger/step", "fitprof/trigger/step_time_ms", "fitprof/trigger/baseline_ms"]
"""A triggered window's keys: NaN when nothing triggered (no trigger here)."""

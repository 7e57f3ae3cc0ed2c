"""Shared printing for the examples: one row per profiled epoch (same columns for Keras and Lightning)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def print_reports(reports: Mapping[int, Any], logdir: str) -> None:
    """Print the per-epoch bottleneck table, the last verdict's advice and the TensorBoard command."""
    # "analysed": the window's steps the figures come from, not the epoch's (48 in the digits example)
    header = f"{'epoch':>5} {'analysed':>8} {'step ms':>9} {'input %':>8} {'HtoD ms/step':>12}  {'verdict':<22} top op"
    print(header)
    print("-" * len(header))
    for epoch, r in sorted(reports.items()):
        top = f"{r.top_ops[0].name} ({r.top_ops[0].self_ms_per_step:.3f} ms)" if r.top_ops else "-"
        print(
            f"{epoch:>5} {r.steps_analyzed:>8} {r.step_time_ms:>9.2f} {r.input_percent:>8.1f} "
            f"{r.htod_ms_per_step:>12.3f}  {r.verdict:<22} {top}"
        )
    if reports:
        last = reports[max(reports)]
        print()
        print(last.headline())
        for advice in last.advice:
            print(f"  - {advice}")
    print()
    print(f"View it in TensorBoard (Scalars, Text and Profile tabs):\n  tensorboard --logdir {logdir}")

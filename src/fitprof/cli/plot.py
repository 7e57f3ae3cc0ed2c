"""``fitprof report --plot``: the step-time breakdown of each window as stacked bars (matplotlib, imported lazily)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from fitprof.cli.render import by_run, finite

SEGMENTS = ("input wait", "host-to-device", "other/compute")
"""Names of the stacked segments of ``--plot`` (ms per step): input wait, HtoD copy time, the rest."""


def plot_breakdown(records: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Save the step-time breakdown of each window as stacked bars, one panel per run.

    Each bar is one epoch (and rank, when a run has several); its segments, in ms per step, are
    ``"input wait"`` (``input_ms_per_step``), ``"host-to-device"`` (``htod_ms_per_step``) and
    ``"other/compute"`` (``step_time_ms`` less the two, at least 0). A window without steps gets an empty bar
    marked "no steps".

    Args:
        records: window records (``fitprof report`` rows).
        path: the image file; the format follows its extension (``.png``).

    Raises:
        ImportError: if matplotlib is not installed.
        OSError: if the file cannot be written.
        ValueError: if there is no record or matplotlib cannot save to that file type.
    """
    if not records:
        raise ValueError("nothing to plot")
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            f"--plot needs matplotlib, which is not installed: pip install 'fitprof[plot]' ({err})"
        ) from None

    runs = by_run(records)
    fig = Figure(figsize=(max(6.0, 1.2 + 0.9 * max(len(g) for _, g in runs)), 1.2 + 3.0 * len(runs)), dpi=100)
    fig.set_layout_engine("constrained")
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    colors = {"input wait": "tab:orange", "host-to-device": "tab:green", "other/compute": "tab:blue"}
    for ax, (run, group) in zip(axes, runs, strict=True):
        several_ranks = len({r["rank"] for r in group}) > 1
        labels: list[str] = []
        parts: dict[str, list[float]] = {name: [] for name in SEGMENTS}
        totals: list[float] = []
        for r in group:
            label = str(r["epoch"]) if r["epoch"] is not None else "-"
            labels.append(f"{label}\nrank {r['rank']}" if several_ranks else label)
            step = r["step_time_ms"] if finite(r["step_time_ms"]) else 0.0
            inp = r["input_ms_per_step"] if finite(r["input_ms_per_step"]) else 0.0
            htod = r["htod_ms_per_step"] if finite(r["htod_ms_per_step"]) else 0.0
            parts["input wait"].append(inp)
            parts["host-to-device"].append(htod)
            parts["other/compute"].append(max(step - inp - htod, 0.0))
            totals.append(step)
        x = list(range(len(group)))
        bottom = [0.0] * len(group)
        for name in SEGMENTS:
            ax.bar(x, parts[name], bottom=bottom, color=colors[name], label=name, width=0.6)
            bottom = [b + v for b, v in zip(bottom, parts[name], strict=True)]
        top = max(totals) if any(totals) else 1.0
        for xi, total, r in zip(x, totals, group, strict=True):
            text = f"{total:.2f} ms" if finite(r["step_time_ms"]) else "no steps"
            ax.text(xi, total + 0.02 * top, text, ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, top * 1.18)
        ax.set_xticks(x, labels)
        half, middle = max(len(x), 3) / 2, (len(x) - 1) / 2  # bars keep their width with one or two epochs
        ax.set_xlim(middle - half, middle + half)
        ax.set_xlabel("epoch / rank" if several_ranks else "epoch")
        ax.set_ylabel("time per step (ms)")
        ax.set_title(f"run: {run}")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside upper center", ncols=len(SEGMENTS), frameon=False)
    fig.savefig(os.fspath(path))

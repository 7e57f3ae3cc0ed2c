"""``fitprof report --plot``: the step-time breakdown of each window and, beside it, where each epoch's wall time
went, as stacked bars, CPU-contended windows and epochs marked (matplotlib, imported lazily)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from fitprof.cli.render import by_run, finite, several_fits

SEGMENTS = ("input wait", "host-to-device", "other/compute")
"""Names of the stacked segments of ``--plot`` (ms per step): input wait, HtoD copy time, the rest."""

EPOCH_SEGMENTS = (
    ("steps", "tab:cyan"),
    ("input", "gold"),
    ("validation", "tab:purple"),
    ("checkpoints", "tab:brown"),
    ("callbacks", "tab:pink"),
    ("start-up", "tab:olive"),
    ("fitprof", "tab:gray"),
    ("other", "silver"),
)
"""The stacked segments of an epoch's bar (s) and their colours, none of the windows' colours: the training steps
less their input wait, the input wait, then the epoch's other parts (``fitprof report``'s epoch columns)."""

CONTENDED = "CPU-contended"


def _epoch_parts(r: dict[str, Any]) -> list[float]:
    """An epoch record's :data:`EPOCH_SEGMENTS` values (s; a missing or NaN part is 0)."""

    def get(key: str) -> float:
        value = r.get(key)
        return float(value) if isinstance(value, (int, float)) and finite(value) else 0.0

    steps, inp = get("train_steps_s"), get("input_s")
    rest = ("validation_s", "checkpoint_s", "callbacks_s", "startup_s", "profiling_s", "other_s")
    return [max(steps - inp, 0.0), inp, *(get(k) for k in rest)]


def _contended_epoch(r: dict[str, Any]) -> bool:
    return any(str(v).startswith(CONTENDED) for v in r.get("verdicts") or [])


def plot_breakdown(
    records: Sequence[dict[str, Any]], path: str | os.PathLike[str], epochs: Sequence[dict[str, Any]] = ()
) -> None:
    """Save the step-time breakdown of each window as stacked bars, one panel per run, and with ``epochs`` where
    each epoch's wall time went in a panel beside it.

    Each window bar is one epoch (and rank, when a run has several); its segments, in ms per step, are
    ``"input wait"`` (``input_ms_per_step``), ``"host-to-device"`` (``htod_ms_per_step``) and
    ``"other/compute"`` (``step_time_ms`` less the two, at least 0). A window without steps gets an empty bar
    marked "no steps"; a window whose verdict is ``cpu-contended`` is labelled so. Each epoch bar (s) stacks
    :data:`EPOCH_SEGMENTS`; a CPU-contended epoch (its verdicts say so) is hatched and labelled.

    Args:
        records: window records (``fitprof report`` rows).
        path: the image file; the format follows its extension (``.png``).
        epochs: epoch records (``fitprof report`` rows of the per-epoch files); none: the windows only.

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
    width = max(6.0, 1.2 + 0.9 * max(len(g) for _, g in runs))
    fig = Figure(figsize=(width * (2 if epochs else 1), 1.2 + 3.0 * len(runs)), dpi=100)
    fig.set_layout_engine("constrained")
    grid = fig.subplots(len(runs), 2 if epochs else 1, squeeze=False)
    axes = grid[:, 0]
    colors = {"input wait": "tab:orange", "host-to-device": "tab:green", "other/compute": "tab:blue"}
    for row, (ax, (run, group)) in enumerate(zip(axes, runs, strict=True)):
        several_ranks = len({r["rank"] for r in group}) > 1
        fits = several_fits(group)
        labels: list[str] = []
        parts: dict[str, list[float]] = {name: [] for name in SEGMENTS}
        totals: list[float] = []
        for r in group:
            label = str(r["epoch"]) if r["epoch"] is not None else "-"
            label = f"{label}\nfit {r['fit']}" if fits else label
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
            text += f"\n{CONTENDED}" if r.get("verdict") == "cpu-contended" else ""
            ax.text(xi, total + 0.02 * top, text, ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, top * 1.18)
        ax.set_xticks(x, labels)
        half, middle = max(len(x), 3) / 2, (len(x) - 1) / 2  # bars keep their width with one or two epochs
        ax.set_xlim(middle - half, middle + half)
        ax.set_xlabel("epoch / rank" if several_ranks else "epoch")
        ax.set_ylabel("time per step (ms)")
        ax.set_title(f"run: {run}")
        if epochs:
            _epoch_panel(grid[row, 1], run, [e for e in epochs if e["run"] == run])
    handles, names = axes[0].get_legend_handles_labels()
    if epochs:  # plain patches: the bars' own may be hatched
        from matplotlib.patches import Patch

        handles += [Patch(color=color) for _, color in EPOCH_SEGMENTS]
        names += [name for name, _ in EPOCH_SEGMENTS]
    fig.legend(handles, names, loc="outside upper center", ncols=min(len(names), 6), frameon=False)
    fig.savefig(os.fspath(path))


def _epoch_panel(ax: Any, run: str, group: list[dict[str, Any]]) -> None:
    """One run's epochs as stacked bars of :data:`EPOCH_SEGMENTS` (s), CPU-contended ones hatched and labelled."""
    ax.set_title(f"run: {run}: where each epoch's wall time went")
    ax.set_xlabel("epoch")
    ax.set_ylabel("wall time (s)")
    if not group:
        ax.text(0.5, 0.5, "no per-epoch file", ha="center", va="center", transform=ax.transAxes)
        return
    several = len({(e.get("fit"), e["rank"]) for e in group}) > 1
    labels = [f"{e['epoch']}\nrank {e['rank']}" if several else str(e["epoch"]) for e in group]
    x = list(range(len(group)))
    values = [_epoch_parts(e) for e in group]
    hatch = ["//" if _contended_epoch(e) else "" for e in group]
    bottom = [0.0] * len(group)
    for i, (name, color) in enumerate(EPOCH_SEGMENTS):
        heights = [v[i] for v in values]
        bars = ax.bar(x, heights, bottom=bottom, color=color, label=name, width=0.6)
        for bar, h in zip(bars, hatch, strict=True):
            bar.set_hatch(h)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    top = max(bottom) if any(bottom) else 1.0
    for xi, total, e in zip(x, bottom, group, strict=True):
        text = f"{total:.2f} s" + (f"\n{CONTENDED}" if _contended_epoch(e) else "")
        ax.text(xi, total + 0.02 * top, text, ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, top * 1.25)
    ax.set_xticks(x, labels)
    half, middle = max(len(x), 3) / 2, (len(x) - 1) / 2
    ax.set_xlim(middle - half, middle + half)

"""Text renderers of ``fitprof`` records: ``table``, ``markdown``, ``json`` and ``csv``.

A record is a dict: a ``trace`` or ``window`` row (every :class:`~fitprof.BottleneckReport` field, its
``headline``, and ``record`` / ``run`` / ``epoch`` / ``rank``), a ``spread`` row across ranks, or an ``epoch`` row
(where one epoch's wall time went: ``wall_s`` and its parts, CPU use, ``verdicts``). Framework-free.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from fitprof import metrics
from fitprof.analysis import one_line
from fitprof.report_files import clean_json

FORMATS = ("table", "json", "csv", "markdown")
RECORD_TRACE = "trace"
"""``record`` of a row from ``fitprof analyze`` (one trace file)."""
RECORD_WINDOW = "window"
"""``record`` of a row from ``fitprof report`` (one profiled window: run, epoch, rank)."""
RECORD_SPREAD = "spread"
"""``record`` of a rank-spread summary (max - min across the ranks of one group of rows)."""
RECORD_EPOCH = "epoch"
"""``record`` of a row from a per-epoch file (one epoch and rank: where its wall time went, its verdicts)."""
RECORD_FIT = "fit"
"""``record`` of a fit's row from a per-epoch file (one fit and rank: before, in and after its epochs)."""
FIT_PARTS = ("wall_s", "setup_s", "sanity_check_s", "epochs_s", "teardown_s", "profiling_s", "checkpoint_s")
"""The ``fitprof/fit/*`` figures of a fit row, prefix dropped, in the order they are printed."""
EPOCH_PARTS = (
    "train_steps_s",
    "input_s",
    "validation_s",
    "checkpoint_s",
    "callbacks_s",
    "startup_s",
    "profiling_s",
    "other_s",
)
"""The parts of an epoch row, in table order (``input_s`` lies inside ``train_steps_s``)."""
_EPOCH_CPU = ("cpu_percent", "involuntary_switches_per_s", "run_wait_percent", "own_threads_cpu_percent")
RECORD_COMPARE = "compare"
"""``record`` of ``fitprof compare``'s summary (the two sides, the thresholds, the status and the headline)."""
RECORD_FIGURE = "figure"
"""``record`` of one figure ``fitprof compare`` compared (step time, input wait, ...)."""
RECORD_OPERATOR = "operator"
"""``record`` of one operator ``fitprof compare`` compared (self time per step)."""
_NAME_WIDTH = 40


def finite(value: Any) -> bool:
    """Whether ``value`` is a finite number (None and NaN are not)."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def _public(rec: dict[str, Any]) -> dict[str, Any]:
    """The record as strict JSON (NaN and infinities -> ``None``)."""
    return dict(clean_json(rec))


def render(records: Sequence[dict[str, Any]], fmt: str) -> str:
    """The records as text in one of :data:`FORMATS`.

    Args:
        records: rows built by ``report`` / ``analyze`` (trace or window records, then spread records).
        fmt: ``"table"``, ``"markdown"``, ``"json"`` or ``"csv"``.

    Returns:
        The text, ending in a newline.

    Raises:
        ValueError: for an unknown format.
    """
    if fmt == "json":
        return json.dumps([_public(r) for r in records], indent=2, allow_nan=False) + "\n"
    compared = bool(records) and records[0]["record"] == RECORD_COMPARE
    if fmt == "csv" and not compared:
        return _csv(records)
    if fmt in ("table", "markdown"):
        text = _compare_text if compared else _text
        return text(records, markdown=fmt == "markdown")
    raise ValueError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")


_CSV_COLUMNS = (
    "record",
    "run",
    "epoch",
    "rank",
    "world_size",
    "framework",
    *(m.field for m in metrics.BASE_METRICS),  # every logged window figure, as its report field
    "input_ms_per_step",
    "htod_gb_per_s",
    "top_op",
    "top_op_ms_per_step",
    "top_op_percent",
    *(m.field for m in metrics.CHURN_METRICS),
    "top_allocator",
    "top_allocator_mb_per_step",
    "verdict",
    "headline",
    "advice",
    "source",
    "fit",
    "session",
    "trigger_step",
)
_CSV_SPREAD_COLUMNS = (
    "ranks",
    "step_time_ms_spread",
    "input_percent_spread",
    "slowest_rank",
    "slowest_step_time_ms",
    "fastest_rank",
    "fastest_step_time_ms",
    "slowest_source",
    "most_input_bound_rank",
    "input_percent_max",
    "straggler_rank",
)
_INT_COLUMNS = (
    "epoch",
    "fit",
    "trigger_step",
    "rank",
    "world_size",
    "steps_analyzed",
    "slowest_rank",
    "fastest_rank",
    "most_input_bound_rank",
    "straggler_rank",
)


def _csv(records: Sequence[dict[str, Any]]) -> str:
    import pandas as pd

    rows = []
    epoch_columns = ("wall_s", *EPOCH_PARTS, *_EPOCH_CPU, "epoch_verdicts")
    for rec in records:
        if rec["record"] == RECORD_FIT:
            rows.append({k: v for k, v in rec.items() if k in _CSV_COLUMNS or k in FIT_PARTS})
            continue
        if rec["record"] == RECORD_EPOCH:
            row = {k: v for k, v in rec.items() if k in _CSV_COLUMNS or k in epoch_columns}
            row["epoch_verdicts"] = " ".join(rec.get("verdicts") or [])
            rows.append(row)
            continue
        row = {k: v for k, v in rec.items() if k in _CSV_COLUMNS or k in _CSV_SPREAD_COLUMNS}
        ops = rec.get("top_ops") or []
        if rec["record"] != RECORD_SPREAD:
            row["top_op"] = ops[0]["name"] if ops else ""
            row["top_op_ms_per_step"] = ops[0]["self_ms_per_step"] if ops else math.nan
            row["top_op_percent"] = ops[0]["percent"] if ops else math.nan
            allocs = rec.get("top_alloc_ops") or []
            row["top_allocator"] = allocs[0]["name"] if allocs else ""
            row["top_allocator_mb_per_step"] = allocs[0]["mb_per_step"] if allocs else math.nan
            row["advice"] = " ".join(rec.get("advice") or [])
        if "ranks" in row:
            row["ranks"] = " ".join(str(r) for r in row["ranks"])
        rows.append(row)
    columns = list(_CSV_COLUMNS)
    if any(r["record"] == RECORD_SPREAD for r in records):
        columns += _CSV_SPREAD_COLUMNS
    if any(r["record"] == RECORD_EPOCH for r in records):
        columns += epoch_columns
    if any(r["record"] == RECORD_FIT for r in records):
        columns += [c for c in FIT_PARTS if c not in columns]
    frame = pd.DataFrame(rows, columns=columns)
    for col in _INT_COLUMNS:
        if col in frame:
            frame[col] = frame[col].astype("Int64")
    buf = io.StringIO()
    frame.to_csv(buf, index=False, lineterminator="\n")
    return buf.getvalue()


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _short(name: str, width: int = _NAME_WIDTH) -> str:
    """``name`` on one line (:func:`fitprof.analysis.one_line`), cut in the middle to ``width`` characters (both
    ends of op and kernel names say something)."""
    name = one_line(name)
    if len(name) <= width:
        return name
    head = (width - 1) // 3
    return name[:head] + "…" + name[len(name) - (width - 1 - head) :]


def _text(records: Sequence[dict[str, Any]], *, markdown: bool) -> str:
    """The aligned table (or Markdown table), then per run: each row's headline and the run's advice."""
    rows = [r for r in records if r["record"] not in (RECORD_SPREAD, RECORD_EPOCH, RECORD_FIT)]
    spreads = [r for r in records if r["record"] == RECORD_SPREAD]
    epochs = [r for r in records if r["record"] == RECORD_EPOCH]
    fits = [r for r in records if r["record"] == RECORD_FIT]
    lines = _window_text(rows, spreads, markdown=markdown) if rows or spreads else []
    if epochs:
        lines += _epoch_text(epochs, markdown=markdown)
    if fits:
        lines += _fit_text(fits, markdown=markdown)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def _window_text(rows: list[dict[str, Any]], spreads: list[dict[str, Any]], *, markdown: bool) -> list[str]:
    ranks = {r["rank"] for r in rows if r["rank"] is not None}
    show_rank = len(ranks) > 1 or bool(ranks - {0})
    show_epoch = any(r["epoch"] is not None for r in rows)
    show_fit = several_fits(rows)  # several fits into one run directory: tell them apart
    header = ["run"]
    header += ["fit", "session"] * show_fit + ["epoch"] * show_epoch + ["rank"] * show_rank
    header += [
        "framework",
        "steps",
        "step ms",
        "input %",
        "HtoD ms/step",
        "HtoD %",
        "top op",
        "top %",
        "up to",
        "verdict",
    ]
    body = []
    for r in rows:
        top = r["top_ops"][0] if r["top_ops"] else None
        cells = [r["run"]]
        cells += [_fmt(r.get("fit"), "d"), r.get("session") or "-"] * show_fit
        cells += [_epoch_cell(r)] * show_epoch + [_fmt(r["rank"], "d")] * show_rank
        cells += [
            r["framework"] or "-",
            str(r["steps_analyzed"]),
            _fmt(r["step_time_ms"], ".2f"),
            _fmt(r["input_percent"], ".1f"),
            _fmt(r["htod_ms_per_step"], ".3f"),
            _fmt(r["htod_percent"], ".1f"),
            # Markdown is read rendered (a wrapped cell costs nothing) and pasted into issues: the whole name.
            (one_line(top["name"]) if markdown else _short(top["name"])) if top else "-",
            _fmt(top["percent"], ".1f") if top else "-",
            _best_speedup(r),
            r["verdict"],
        ]
        body.append(cells)
    left = {"run", "session", "framework", "top op", "up to", "verdict"}
    lines = _markdown_table(header, body, left) if markdown else _plain_table(header, body, left)
    lines.append("")
    for run, group in by_run(rows):
        lines += [f"**{_md_escape(run)}**", ""] if markdown else [run]
        bullet = "- " if markdown else "  "
        for r in group:
            where = []
            if show_fit and r.get("fit") is not None:
                where.append(f"fit {r['fit']} ({r['session']})")
            if r["epoch"] is not None:
                where.append(f"epoch {r['epoch']}")
            if r.get("trigger_step") is not None:
                where.append(f"window triggered by a slowdown after step {r['trigger_step']}")
            if show_rank and r["rank"] is not None:
                where.append(f"rank {r['rank']}")
            prefix = f"{', '.join(where)}: " if where else ""
            lines.append(f"{bullet}{prefix}{r['headline']}")
            if r.get("churn"):  # a window recorded with profile_memory
                lines.append(f"{bullet}{prefix}{r['churn']}")
        notes = _unique(w for r in group for w in r.get("warnings") or [])
        lines += [f"{bullet}note: {w}" for w in notes]
        latest = {r["verdict"]: r for r in group}  # per verdict, the advice of its last row (it names that op)
        for verdict, r in latest.items():
            if r.get("advice"):
                lines.append(f"{bullet}advice ({verdict}):")
                lines += [f"  - {a}" if markdown else f"    - {a}" for a in r["advice"]]
        lines.append("")
    if spreads:
        lines += (
            ["**Rank spread** (max - min across ranks)", ""] if markdown else ["Rank spread (max - min across ranks)"]
        )
        for s in spreads:
            epoch = f", epoch {s['epoch']}" if s["epoch"] is not None else ""
            lines.append(
                f"{'- ' if markdown else '  '}{s['run']}{epoch}: step time spread "
                f"{_fmt(s['step_time_ms_spread'], '.2f')} ms, input share spread "
                f"{_fmt(s['input_percent_spread'], '.1f')} points; slowest: rank {s['slowest_rank']} "
                f"({_fmt(s['slowest_step_time_ms'], '.2f')} ms/step, {s['slowest_source']}); "
                f"straggler: rank {s['straggler_rank']}"
            )
        lines.append("")
    return lines


def _epoch_text(epochs: list[dict[str, Any]], *, markdown: bool) -> list[str]:
    """The per-epoch table: where each epoch's wall time went (s) and its CPU use, then each epoch's verdicts."""
    ranks = {r["rank"] for r in epochs}
    show_rank = len(ranks) > 1 or bool(ranks - {0})
    show_fit = several_fits(epochs)
    header = ["run"] + ["fit"] * show_fit + ["epoch"] + ["rank"] * show_rank
    header += ["wall s", "steps s", "input s", "valid s", "ckpt s", "callbacks s", "startup s", "fitprof s"]
    header += ["other s", "CPU %", "run wait %"]
    body = []
    for r in epochs:
        cells = [r["run"]] + [_fmt(r.get("fit"), "d")] * show_fit + [_fmt(r["epoch"], "d")]
        cells += [_fmt(r["rank"], "d")] * show_rank
        cells += [_fmt(r.get(k), ".2f") for k in ("wall_s", *EPOCH_PARTS)]
        cells += [_fmt(r.get("cpu_percent"), ".0f"), _fmt(r.get("run_wait_percent"), ".0f")]
        body.append(cells)
    title = "Epochs: where the wall time went (s; input is inside steps)"
    lines = [f"**{title}**", ""] if markdown else [title]
    lines += _markdown_table(header, body, {"run"}) if markdown else _plain_table(header, body, {"run"})
    lines.append("")
    bullet = "- " if markdown else "  "
    for run, group in by_run(epochs):
        said = [r for r in group if r.get("verdicts")]
        if not said:
            continue
        lines += [f"**{_md_escape(run)}**", ""] if markdown else [run]
        for r in said:
            where = f"fit {r['fit']}, " if show_fit else ""
            where += f"rank {r['rank']}, " if show_rank else ""
            lines += [f"{bullet}{where}epoch {r['epoch']}: {v}" for v in r["verdicts"]]
        lines.append("")
    return lines


def _fit_text(fits: list[dict[str, Any]], *, markdown: bool) -> list[str]:
    """The per-fit table: the fit's wall time and its parts (s): setup (the sanity check inside it), epochs,
    teardown; fitprof's own time and the saves are inside them."""
    show_rank = bool({r["rank"] for r in fits} - {0})
    header = ["run", "fit"] + ["rank"] * show_rank
    header += ["wall s", "setup s", "sanity s", "epochs s", "teardown s", "fitprof s", "ckpt s"]
    body = []
    for r in fits:
        cells = [r["run"], _fmt(r.get("fit"), "d")] + [_fmt(r["rank"], "d")] * show_rank
        body.append(cells + [_fmt(r.get(k), ".2f") for k in FIT_PARTS])
    title = "Fits: where the wall time went (s; setup + epochs + teardown = wall, fitprof and ckpt inside them)"
    lines = [f"**{title}**", ""] if markdown else [title]
    lines += _markdown_table(header, body, {"run"}) if markdown else _plain_table(header, body, {"run"})
    lines.append("")
    return lines


_FIX_LABELS = (("input", "input"), ("htod", "HtoD"), ("collectives", "collectives"))


def _best_speedup(rec: dict[str, Any]) -> str:
    """The "up to" cell: the largest potential speedup and what it hides (``1.54x input``), ``-`` when unknown."""
    options = [
        (float(rec[f"speedup_if_no_{fix}"]), label)
        for fix, label in _FIX_LABELS
        if finite(rec.get(f"speedup_if_no_{fix}"))
    ]
    best = max(options, key=lambda o: o[0], default=None)
    return "-" if best is None else f"{best[0]:.2f}x {best[1]}"


def _plain_table(header: list[str], body: list[list[str]], left: set[str]) -> list[str]:
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if h in left else c.rjust(w) for c, w, h in zip(cells, widths, header, strict=True)
        ).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(row) for row in body)]


def _md_escape(text: str) -> str:
    return text.replace("|", r"\|")


def _markdown_table(header: list[str], body: list[list[str]], left: set[str]) -> list[str]:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(_md_escape(c) for c in cells) + " |"

    rule = "|" + "|".join("---" if h in left else "---:" for h in header) + "|"
    return [line(header), rule, *(line(row) for row in body)]


def _epoch_cell(r: dict[str, Any]) -> str:
    """The epoch, and ``trig@S`` for a window the slowdown trigger opened after step ``S``."""
    cell = _fmt(r["epoch"], "d")
    step = r.get("trigger_step")
    return cell if step is None else f"{cell} trig@{step}"


def by_run(rows: Iterable[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["run"], []).append(r)
    return list(groups.items())


def several_fits(rows: Iterable[dict[str, Any]]) -> bool:
    """Whether ``rows`` come from more than one fit into one run directory (``fit`` above 1)."""
    return any((r.get("fit") or 1) > 1 for r in rows)


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _compare_text(records: Sequence[dict[str, Any]], *, markdown: bool) -> str:
    """``fitprof compare``'s output: the status, the two sides and the headline, then a table of the figures and
    one of the operators (each side's median, its spread, the change, the ratio of the medians with its interval
    and what it means)."""
    head = records[0]
    figures = [r for r in records if r["record"] == RECORD_FIGURE]
    operators = [r for r in records if r["record"] == RECORD_OPERATOR]
    status = {"regression": "REGRESSION", "inconclusive": "INCONCLUSIVE"}.get(head["status"], "no regression")
    sides = [
        f"{which}: {head[which]} ({head[which + '_kind']}, {head[which + '_windows']} window"
        f"{'s' if head[which + '_windows'] != 1 else ''}"
        + (f", {head[which + '_epochs']} epochs of {head[which + '_runs']} run(s)" if head.get(which + "_runs") else "")
        + ")"
        for which in ("baseline", "candidate")
    ]
    limits = head.get("thresholds") or {"step": head["fail_over_percent"]}
    same = len(set(limits.values())) == 1
    shown = f"{head['fail_over_percent']:g}%" if same else ", ".join(f"{k} {v:g}%" for k, v in limits.items())
    gate = (
        f"gate: a figure grown by more than its threshold ({shown}) with its {head.get('confidence', 0.99):.0%} "
        f"bootstrap interval excluding no change (ms figures and operators also by more than {head['min_ms']:g} "
        "ms/step; the step's parts and operators only when the step time grew too)"
    )
    bullet = "- " if markdown else "  "
    if markdown:
        lines = [f"### fitprof compare: {status}", "", f"**{_md_escape(head['headline'])}**", ""]
        lines += [f"{bullet}{_md_escape(x)}" for x in (*sides, gate)]
    else:
        lines = [f"fitprof compare: {status}", head["headline"], *(f"{bullet}{x}" for x in (*sides, gate))]
    lines += [f"{bullet}CPU-contended: {n}" for n in head.get("contention") or []]
    lines += [f"{bullet}note: {n}" for n in head.get("notes") or []]
    lines.append("")
    header = [
        "figure",
        "unit",
        "baseline",
        "+-",
        "candidate",
        "+-",
        "change",
        "change %",
        "ratio [interval]",
        "verdict",
    ]
    body = [[r["label"], r["unit"], *_compare_cells(r)] for r in figures]
    left = {"figure", "unit", "operator", "verdict"}
    table = _markdown_table if markdown else _plain_table
    if body:
        lines += table(header, body, left)
        lines.append("")
    if operators:
        header = ["operator", "baseline ms/step", "+-", "candidate ms/step", "+-", *header[6:]]
        lines += table(header, [[_short(r["name"]), *_compare_cells(r)] for r in operators], left)
        lines.append("")
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def _compare_cells(r: dict[str, Any]) -> list[str]:
    """Baseline, its spread, candidate, its spread, change, change %, noise and the verdict of one compared row;
    a side that does not rank an operator shows the most it can have had there (``<= 0.12``)."""
    spec = ".4g"
    base = _fmt(r["baseline"], spec)
    cand = _fmt(r["candidate"], spec)
    if r["status"] == "new":
        base = f"<= {base}"
    elif r["status"] == "gone":
        cand = f"<= {cand}"
    change = "-" if r["status"] == "gone" or not finite(r["change"]) else format(r["change"], "+.4g")
    pct = "-" if r["status"] == "gone" or not finite(r["change_percent"]) else format(r["change_percent"], "+.1f")
    return [
        base,
        _fmt(r["baseline_spread"], spec),
        cand,
        _fmt(r["candidate_spread"], spec),
        change,
        pct,
        _ratio_cell(r),
        _compare_verdict(r),
    ]


def _ratio_cell(r: dict[str, Any]) -> str:
    """``1.23 [1.18, 1.29]``: the ratio of the medians and its bootstrap interval (``-`` when unknown)."""
    if r["status"] != "both" or not finite(r.get("ratio", math.nan)):
        return "-"
    if not finite(r.get("ratio_low", math.nan)):
        return format(r["ratio"], ".3f")
    return f"{r['ratio']:.3f} [{r['ratio_low']:.3f}, {r['ratio_high']:.3f}]"


def _compare_verdict(r: dict[str, Any]) -> str:
    """What a compared row's change means, in a few words (``REGRESSION`` for what fails the gate)."""
    new = " (new)" if r["status"] == "new" else ""
    if r["regression"]:
        return "REGRESSION" + new
    if r["status"] == "gone":
        return "no longer ranked"
    if r.get("sporadic"):
        return f"worse in {r['candidate_windows']} window{'s' if r['candidate_windows'] != 1 else ''} only{new}"
    if r["status"] == "new":
        return "new"
    if not finite(r["change"]) or r["change"] == 0:
        return "same"
    if r["significant"] is False:
        return "not significant"
    if r.get("share_held"):
        return "slower, same share"
    if r.get("step_held"):
        return "slower, step not"
    if r.get("small_for_step"):
        return "slower, small for the step"
    return "worse" if r["worse"] else "better"

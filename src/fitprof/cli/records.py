"""The records the ``fitprof`` subcommands print: one per window or trace (every :class:`BottleneckReport` field
and its headline, after where it comes from), and one per group of ranks (the spread across them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fitprof.analysis import BottleneckReport
from fitprof.cli.render import RECORD_SPREAD, finite
from fitprof.cross_rank import RankFigures, Spread, spread

LEADING_KEYS = ("record", "run", "epoch", "rank", "world_size", "framework")
"""The fields a record starts with, before the report's."""


def make_record(
    report: BottleneckReport, *, record: str, run: str, epoch: int | None, rank: int | None
) -> dict[str, Any]:
    """One output record: where it comes from, then every :class:`BottleneckReport` field and its headline."""
    fields = report.to_dict()
    fields["rank"] = rank
    out: dict[str, Any] = {
        "record": record,
        "run": run,
        "epoch": epoch,
        "fit": None,
        "session": None,
        "trigger_step": None,
    }
    out.update({k: fields[k] for k in LEADING_KEYS if k in fields})
    out.update(fields)
    out["headline"] = report.headline()
    out["churn"] = report.churn_line()
    return out


def spreads(
    records: list[dict[str, Any]],
    *,
    key: Callable[[dict[str, Any]], tuple[Any, ...]],
    label: Callable[[list[dict[str, Any]]], str],
) -> list[dict[str, Any]]:
    """A spread record (:func:`fitprof.cross_rank.spread`) for every group (by ``key``) of rows that holds two
    ranks or more with a step time."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rec in records:
        if rec["record"] != RECORD_SPREAD and rec["rank"] is not None and finite(rec["step_time_ms"]):
            groups.setdefault(key(rec), []).append(rec)
    out = []
    for group in groups.values():
        s = spread([RankFigures(r["rank"], r["step_time_ms"], r["input_percent"]) for r in group])
        if s is None:
            continue
        source = next(r["source"] for r in group if r["rank"] == s.slowest.rank)
        out.append(
            {
                "record": RECORD_SPREAD,
                "run": label(group),
                "epoch": group[0]["epoch"],
                "rank": None,
                "world_size": group[0]["world_size"],
                "ranks": list(s.ranks),
                "step_time_ms_spread": s.step_time_ms_spread,
                "input_percent_spread": s.input_percent_spread,
                "slowest_rank": s.slowest.rank,
                "slowest_step_time_ms": s.slowest.step_time_ms,
                "slowest_source": source,
                "fastest_rank": s.fastest.rank,
                "fastest_step_time_ms": s.fastest.step_time_ms,
                "most_input_bound_rank": s.most_input_bound.rank,
                "input_percent_max": s.most_input_bound.input_percent,
                "straggler_rank": s.straggler.rank,
                "headline": spread_headline(s),
            }
        )
    return out


def spread_headline(s: Spread) -> str:
    """One line: the straggler, why, the slowest and fastest rank and the input-share spread."""
    why = (
        f" (input {s.most_input_bound.input_percent:.1f}% of its step time, {s.input_percent_spread:.1f} points "
        "more than the least input-bound rank)"
        if s.straggler_by_input
        else ""
    )
    input_spread = format(s.input_percent_spread, ".1f") if finite(s.input_percent_spread) else "-"
    return (
        f"straggler: rank {s.straggler.rank}{why}; slowest step: rank {s.slowest.rank}, "
        f"{s.slowest.step_time_ms:.2f} ms/step, {s.step_time_ms_spread:.2f} ms more than rank {s.fastest.rank} "
        f"({s.fastest.step_time_ms:.2f} ms); input share spread {input_spread} points."
    )

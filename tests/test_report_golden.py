"""Every field of the report of every pinned trace (``tests/report_cases.py``), bit for bit, against the reports
recorded in ``tests/data/reports.json``; and the analysis of the reader's DataFrame (``analyze_table(read_trace(...))``)
against ``fitprof.analyze``'s, which carries the reader's plain columns without building a DataFrame."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import report_cases

import fitprof
from fitprof._session import split_rank
from fitprof.traces import read_trace

GOLDEN = json.loads(report_cases.GOLDEN.read_text())
CASES = report_cases.cases()


def test_every_recorded_case_is_listed() -> None:
    assert set(GOLDEN) == set(CASES) | {k for k in GOLDEN if k.startswith("shared/") and k not in CASES}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_report_bit_for_bit(name: str, tmp_path: Path) -> None:
    if name not in CASES:
        pytest.skip(f"{name}: ../shared/fixtures not present")
    path = CASES[name](tmp_path)
    got = report_cases.report_fields(fitprof.analyze(path, top_k=8), tmp_path)
    want = GOLDEN[name]
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == want[key], key


@pytest.mark.parametrize("name", sorted(CASES))
def test_dataframe_and_columns_give_one_report(name: str, tmp_path: Path) -> None:
    path = CASES[name](tmp_path)
    table = read_trace(path)
    named_host, named_rank = split_rank(str(table.attrs.get("host") or ""))
    rank = table.attrs.get("rank", named_rank)
    world = table.attrs.get("world_size")
    via_frame = fitprof.analyze_table(
        table,
        top_k=8,
        source=str(path),
        host=named_host,
        rank=None if rank is None else int(rank),
        world_size=None if world is None else int(world),
    )
    direct = fitprof.analyze(path, top_k=8)
    if table.attrs.get("profile_memory"):
        pytest.skip("the memory churn is added by analyze only")
    assert report_cases.report_fields(via_frame, tmp_path) == report_cases.report_fields(direct, tmp_path)

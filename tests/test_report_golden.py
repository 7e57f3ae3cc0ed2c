"""Every field of the report of every pinned trace (``tests/report_cases.py``), bit for bit, against the reports
recorded in ``tests/data/reports.json``; and the analysis of the reader's DataFrame (``analyze_table(read_trace(...))``)
against ``fitprof.analyze``'s, which carries the reader's plain columns without building a DataFrame."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fitprof
import report_cases
from fitprof._session import split_rank
from fitprof.analysis import columns
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


def _bits(a: np.ndarray) -> list[str]:
    return [float(v).hex() for v in a]


@pytest.mark.parametrize("seed", range(6))
def test_group_sums_match_pandas_bit_for_bit(seed: int) -> None:
    """The Python Kahan loop of small inputs against pandas' groupby itself: values of every magnitude, NaN, both
    infinities, signed zeros, missing keys."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    values = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 9, n)
    special = rng.integers(0, 40, n)
    values[special == 0] = np.nan
    values[special == 1] = np.inf if seed % 2 else -np.inf
    values[special == 2] = -0.0
    values[special == 3] = 1e300
    keys = np.array([f"op{k}" for k in rng.integers(0, 1 + n // 50, n)], dtype=object)
    keys[rng.integers(0, 200, n) == 0] = None
    want = pd.Series(values).groupby(keys).sum()
    got_keys, got = columns._kahan_group_sums(keys, values)
    assert got_keys.tolist() == want.index.tolist()
    assert _bits(got) == _bits(want.to_numpy(dtype=float))


@pytest.mark.parametrize("name", sorted(CASES))
def test_group_sums_of_each_case_match_pandas(name: str, tmp_path: Path) -> None:
    """Every case's operator self times and device times by name, summed both ways."""
    table = read_trace(CASES[name](tmp_path))
    on_device = table["on_device"].to_numpy()
    for mask, col in ((on_device, "dur_us"), (~on_device, "self_us"), (~on_device, "dur_us")):
        keys, values = table["name"].to_numpy()[mask], table[col].to_numpy(dtype=float)[mask]
        want = pd.Series(values).groupby(keys).sum()
        got_keys, got = columns._kahan_group_sums(keys, values)
        assert got_keys.tolist() == want.index.tolist()
        assert _bits(got) == _bits(want.to_numpy(dtype=float))


@pytest.mark.parametrize("seed", range(6))
def test_operator_ranking_matches_pandas(seed: int) -> None:
    """The ranking of operator totals (``sort_values(ascending=False, kind="stable")``) and the top host operator
    (``nlargest(1)``), ties, NaN and signed zeros included, as pandas orders them."""
    from fitprof.analysis import table as analysis_table

    rng = np.random.default_rng(seed)
    values = rng.integers(0, 6, int(rng.integers(1, 40))).astype(float)  # many ties
    values[rng.integers(0, 8, len(values)) == 0] = np.nan
    values[values == 0] = -0.0 if seed % 2 else 0.0
    s = pd.Series(values)
    want = s.sort_values(ascending=False, kind="stable").index.to_numpy()
    assert analysis_table._descending(values).tolist() == want.tolist()
    largest = s.nlargest(1)
    got = analysis_table._largest(values)
    assert got.tolist() == largest.index.tolist() or (np.isnan(values).all() and not len(got))

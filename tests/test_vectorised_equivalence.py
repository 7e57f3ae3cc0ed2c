"""The vectorised interval helpers of :mod:`fitprof.analysis.intervals` and the vectorised self times of
:mod:`fitprof.traces._table` against the loops they replaced (kept here, verbatim in their logic, as the
reference), on seeded random inputs: ties, touching intervals, partial overlaps, empty sets, zero and negative
lengths, microsecond magnitudes of real traces. The results must be equal bit for bit (``tobytes``), not close."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from fitprof import analysis
from fitprof.analysis import intervals
from fitprof.analysis.columns import Distinct
from fitprof.traces import _table


def _bits(x: object) -> bytes:
    return np.asarray(x, dtype=float).tobytes()


# --- the reference loops (main at 7526b3e) ------------------------------------------------------------------------


def ref_overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    (as_, ae), (bs, be) = a, b
    total, i, j = 0.0, 0, 0
    while i < len(as_) and j < len(bs):
        lo, hi = max(as_[i], bs[j]), min(ae[i], be[j])
        if hi > lo:
            total += hi - lo
        if ae[i] < be[j]:
            i += 1
        else:
            j += 1
    return total


def ref_intersect(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    (as_, ae), (bs, be) = a, b
    out_s: list[float] = []
    out_e: list[float] = []
    i = j = 0
    while i < len(as_) and j < len(bs):
        lo, hi = max(as_[i], bs[j]), min(ae[i], be[j])
        if hi > lo:
            out_s.append(lo)
            out_e.append(hi)
        if ae[i] < be[j]:
            i += 1
        else:
            j += 1
    return np.array(out_s, dtype=float), np.array(out_e, dtype=float)


def ref_subtract(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    if len(b[0]) == 0 or len(a[0]) == 0:
        return a[0].astype(float), a[1].astype(float)
    gaps_s = np.concatenate([[-np.inf], b[1]])
    gaps_e = np.concatenate([b[0], [np.inf]])
    keep = gaps_e > gaps_s
    return ref_intersect(a, (gaps_s[keep], gaps_e[keep]))


# --- random interval sets ------------------------------------------------------------------------------------------


def _raw(rng: np.random.Generator, n: int, *, negative: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``n`` intervals at a Kineto clock's magnitude (about 1.7e12 us, fractional microseconds), with many ties:
    starts and lengths drawn from a coarse grid half the time, a tenth of the lengths 0."""
    base = 1.7e12 + rng.integers(0, 10**6)
    coarse = rng.integers(0, 200, n) * 5.0
    fine = rng.uniform(0, 1000, n).round(3)
    starts = base + np.where(rng.random(n) < 0.5, coarse, fine)
    lengths = np.where(rng.random(n) < 0.5, rng.integers(0, 6, n) * 5.0, rng.exponential(20.0, n).round(3))
    lengths[rng.random(n) < 0.1] = 0.0
    if negative:
        lengths[rng.random(n) < 0.2] *= -1.0
    return starts, starts + lengths


def _sets(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n = int(rng.choice([0, 1, 2, 5, 30, 300]))
    return intervals.union(*_raw(rng, n))


@pytest.mark.parametrize("seed", range(40))
def test_intersect_overlap_subtract_equal_the_merge_loops(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(25):
        a, b = _sets(rng), _sets(rng)
        if rng.random() < 0.2:  # b's intervals touching a's: shared end points
            b = intervals.union(np.concatenate([a[1], b[0]]), np.concatenate([a[1] + 5.0, b[1]]))
        got, want = intervals.intersect(a, b), ref_intersect(a, b)
        assert _bits(got[0]) == _bits(want[0]) and _bits(got[1]) == _bits(want[1])
        assert _bits(intervals.overlap(a, b)) == _bits(ref_overlap(a, b))
        got, want = intervals.subtract(a, b), ref_subtract(a, b)
        assert _bits(got[0]) == _bits(want[0]) and _bits(got[1]) == _bits(want[1])


@pytest.mark.parametrize("seed", range(10))
def test_sets_with_negative_lengths_take_the_merge_loop_with_the_same_result(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    for _ in range(25):
        a = intervals.union(*_raw(rng, int(rng.integers(1, 60)), negative=True))
        b = intervals.union(*_raw(rng, int(rng.integers(1, 60)), negative=True))
        got, want = intervals.intersect(a, b), ref_intersect(a, b)
        assert _bits(got[0]) == _bits(want[0]) and _bits(got[1]) == _bits(want[1])
        assert _bits(intervals.overlap(a, b)) == _bits(ref_overlap(a, b))


def test_overlap_adds_left_to_right_not_pairwise() -> None:
    """Many pieces of lengths whose sum depends on the order of addition: a pairwise sum would differ."""
    rng = np.random.default_rng(7)
    lengths = rng.uniform(0.1, 1.0, 4096) * 10.0 ** rng.integers(-6, 6, 4096)
    starts = np.cumsum(lengths + 1.0)
    a = (starts, starts + lengths)
    b = (np.array([0.0]), np.array([starts[-1] + 10.0]))
    sequential = ref_overlap(a, b)
    assert float(np.sum(lengths)) != sequential  # the input does tell the two orders apart
    assert _bits(intervals.overlap(a, b)) == _bits(sequential)


def test_empty_sets() -> None:
    empty = (np.array([]), np.array([]))
    one = (np.array([1.0]), np.array([2.0]))
    for a, b in [(empty, empty), (empty, one), (one, empty)]:
        assert intervals.overlap(a, b) == 0.0
        assert len(intervals.intersect(a, b)[0]) == 0
    assert _bits(intervals.subtract(one, empty)[0]) == _bits(one[0])


# --- self times ----------------------------------------------------------------------------------------------------


def ref_self_times(df: pd.DataFrame) -> np.ndarray:
    """``_table._self_times`` of main at 7526b3e: the stack walk per thread."""
    dur = df["dur_us"].to_numpy(dtype=float, copy=True)
    if df.empty:
        return dur
    rows = np.flatnonzero(
        df["kind"].isin(_table._SELF_TIME_KINDS).to_numpy(dtype=bool) & ~df["on_device"].to_numpy(dtype=bool)
    )
    ts_ops = df["ts_us"].to_numpy(dtype=float)[rows]
    ts, end = ts_ops.tolist(), (ts_ops + dur[rows]).tolist()
    out = dur[rows].tolist()
    threads = df[["pid", "tid"]].take(rows)
    for _, idx in threads.groupby(["pid", "tid"], sort=False).indices.items():
        stack: list[int] = []
        for i in idx.tolist():
            t = ts[i]
            while stack and end[stack[-1]] <= t:
                stack.pop()
            if stack:
                parent = stack[-1]
                out[parent] -= min(end[i], end[parent]) - t
            stack.append(i)
    dur[rows] = out
    return np.maximum(dur, 0.0)


_KINDS = ["op", "op", "op", "collective", "input", "annotation", "kernel", "step", "other"]


def _random_table(rng: np.random.Generator, n: int, *, nan: bool = False, negative: bool = False) -> pd.DataFrame:
    """Nested operators on a few threads: each event starts inside a random open one or after it (ties in starts
    and ends, touching neighbours, partial overlaps, zero lengths), on the magnitudes of a Kineto clock."""
    base = 1.7e12 + float(rng.integers(0, 10**6))
    ts = np.empty(n)
    dur = np.empty(n)
    t = base
    for k in range(n):
        if k and rng.random() < 0.6:  # inside (or at the start of, or touching the end of) an earlier event
            j = int(rng.integers(max(0, k - 20), k))
            ts[k] = ts[j] + float(rng.choice([0.0, dur[j], round(rng.uniform(0, max(dur[j], 0.0)), 3)]))
        else:
            t += float(rng.choice([0.0, 5.0, round(rng.exponential(30.0), 3)]))
            ts[k] = t
        dur[k] = float(rng.choice([0.0, 5.0, 10.0, round(rng.exponential(15.0), 3)]))
    if negative:
        dur[rng.random(n) < 0.1] *= -1.0
    if nan:
        ts[rng.random(n) < 0.05] = np.nan
        dur[rng.random(n) < 0.05] = np.nan
    return _table.make_table(
        pd.DataFrame(
            {
                "name": [f"op{k % 7}" for k in range(n)],
                "kind": rng.choice(_KINDS, n),
                "ts_us": ts,
                "dur_us": dur,
                "pid": rng.choice(["1", "2"], n),
                "tid": rng.choice(["10", "11", "12"], n),
                "on_device": rng.random(n) < 0.1,
            }
        )
    )


@pytest.mark.parametrize("seed", range(30))
def test_self_times_equal_the_stack_walk(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in (0, 1, 2, 17, 400):
        table = _random_table(rng, n, negative=seed % 3 == 0)
        assert _bits(_table._self_times(table)) == _bits(ref_self_times(table))
        assert _bits(table["self_us"]) == _bits(ref_self_times(table))  # make_table's column


@pytest.mark.parametrize("seed", range(5))
def test_self_times_with_nan_times_equal_the_stack_walk(seed: int) -> None:
    rng = np.random.default_rng(500 + seed)
    table = _random_table(rng, 300, nan=True)
    assert _bits(_table._self_times(table)) == _bits(ref_self_times(table))


def test_many_children_subtract_in_order() -> None:
    """One parent with 5,000 children of lengths whose total depends on the order of subtraction, beside parents of
    1, 2 and 3 children: each parent's subtractions stay sequential and in table order."""
    rng = np.random.default_rng(3)
    n = 5000
    lengths = rng.uniform(0.1, 1.0, n) * 10.0 ** rng.integers(-3, 3, n)
    starts = 1e5 + np.concatenate([[0.0], np.cumsum(lengths + 0.001)[:-1]])  # siblings, 1 ns apart
    ts = np.concatenate([[1e5 - 1.0], starts, [2e7, 2e7 + 1, 3e7, 3e7 + 1, 3e7 + 2]])
    dur = np.concatenate([[starts[-1] + 1e6], lengths, [5.0, 1.0, 9.0, 0.25, 0.5]])  # a parent far longer
    table = _table.make_table(
        pd.DataFrame({"name": "op", "kind": "op", "ts_us": ts, "dur_us": dur, "pid": "1", "tid": "1"})
    )
    want = ref_self_times(table)
    lost = (table["ts_us"] + table["dur_us"] - table["ts_us"]).to_numpy()[1 : n + 1]
    assert want[0] == np.subtract.accumulate(np.concatenate([[table["dur_us"][0]], lost]))[-1]  # all children
    assert want[0] != table["dur_us"][0] - np.sum(lost)  # a pairwise sum would give another float
    assert _bits(_table._self_times(table)) == _bits(want)


def test_parents_of_long_sibling_runs_and_deep_nesting() -> None:
    """The pointer jumping on its worst shapes: 10,000 siblings under one parent, and a 2,000-deep nest."""
    n = 10_000
    ts = np.concatenate([[0.0], np.arange(n, dtype=float)])
    end = np.concatenate([[n + 1.0], np.arange(n, dtype=float) + 1.0])
    first = np.zeros(n + 1, dtype=bool)
    first[0] = True
    assert (_table._parents(ts, end, first) == np.concatenate([[-1], np.zeros(n, dtype=np.int64)])).all()
    d = 2000
    ts = np.arange(d, dtype=float)
    end = 2.0 * d - ts
    first = np.zeros(d, dtype=bool)
    first[0] = True
    assert (_table._parents(ts, end, first) == np.arange(-1, d - 1)).all()


# --- masks of the kind, copy-kind and name columns -------------------------------------------------------------------


def test_kind_masks_equal_comparing_every_row() -> None:
    rng = np.random.default_rng(11)
    values = np.array([*rng.choice([str(k) for k in _table.KINDS], 500), None, np.nan, "", "OP"], dtype=object)
    kinds = Distinct(values)
    for k in _table.KINDS:
        assert (kinds.equal(k) == (values == k)).all()
    for group in [(_table.Kind.KERNEL, _table.Kind.MEMCPY, _table.Kind.COLLECTIVE), (_table.Kind.OP,)]:
        assert (kinds.equal(*group) == np.isin(values, list(group))).all()
        assert (~kinds.equal(*group) == ~np.isin(values, list(group))).all()


def test_value_masks_equal_the_row_by_row_tests() -> None:
    rng = np.random.default_rng(12)
    kinds = ["htod_pinned", "htod_pageable", "htod", "dtoh", "dtod", "", "xhtod"]
    copy_kind = np.array([*rng.choice(kinds, 400), None, np.nan], dtype=object)
    rows = rng.random(len(copy_kind)) < 0.7
    copies = Distinct(copy_kind, rows)
    got = copies.mask(lambda ck: str(ck).startswith("htod"))
    assert (got == (rows & np.char.startswith(copy_kind.astype(str), "htod"))).all()
    for kind in kinds:
        assert (copies.equal(kind) == (rows & (copy_kind == kind))).all()
    names = np.array(rng.choice(["aten::pin_memory", "aten::_pin_memory", "aten::mm", "pin", "x pin_memory y"], 300))
    names = names.astype(object)
    got = Distinct(names, rows[:300]).mask(lambda name: "pin_memory" in name)
    want = rows[:300] & pd.Series(names, dtype=object).str.contains("pin_memory", regex=False).to_numpy(dtype=bool)
    assert (got == want).all()
    assert not Distinct(names, np.zeros(300, dtype=bool)).mask(lambda name: True).any()


@pytest.mark.parametrize("seed", range(8))
def test_reports_equal_with_the_reference_interval_loops(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole reports on random tables (steps, operators, input, collectives, device work), once with the vectorised
    helpers and once with the merge loops patched in: every field equal, floats bit for bit."""
    rng = np.random.default_rng(900 + seed)
    table = _random_table(rng, 600)
    table["launch_us"] = np.where(table["on_device"], table["ts_us"] - 1.0, np.nan)
    got = dataclasses.asdict(analysis.analyze_table(table, framework="pytorch"))
    assert got["steps_analyzed"] > 0 and got["verdict"] != "no-steps"
    monkeypatch.setattr(intervals, "overlap", ref_overlap)
    monkeypatch.setattr(intervals, "intersect", ref_intersect)
    monkeypatch.setattr(intervals, "subtract", ref_subtract)
    want = dataclasses.asdict(analysis.analyze_table(table, framework="pytorch"))
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, float):
            assert _bits(got[key]) == _bits(value), key
        else:
            assert got[key] == value, key


@pytest.mark.parametrize("seed", range(20))
def test_start_order_equals_lexsort(seed: int) -> None:
    rng = np.random.default_rng(300 + seed)
    n = int(rng.choice([0, 1, 2, 50, 3000]))
    ts = 1.7e12 + rng.integers(0, max(n // 4, 1), n) * 5.0 + np.where(rng.random(n) < 0.3, rng.uniform(0, 5, n), 0.0)
    dur = np.where(rng.random(n) < 0.5, rng.integers(0, 4, n) * 5.0, rng.exponential(10.0, n))
    if seed % 4 == 0:
        ts[rng.random(n) < 0.1] = -0.0 if seed % 8 == 0 else 0.0
        dur[rng.random(n) < 0.1] = -0.0
    if seed % 5 == 0:
        ts[rng.random(n) < 0.05] = np.nan
        dur[rng.random(n) < 0.05] = np.nan
    assert (_table._start_order(ts, dur) == np.lexsort((-dur, ts))).all()


def test_a_deep_chain_before_many_siblings_is_walked_not_jumped() -> None:
    """A chain of ``d`` nested operators that each end before the next sibling starts, then ``k`` siblings under
    the outer one: every sibling would follow the chain one level per round of pointer jumping (``d`` rounds of
    the whole array). ``_parents`` gives up after 64 rounds, and ``_self_times`` walks the stack instead, with
    the same result bit for bit."""
    d = k = 300
    ts = [0.0] + [1.0 + i for i in range(d)] + [2.0 * d + 5 + j for j in range(k)]
    dur = [10.0 * d + 900] + [2.0 * d - 2 * i for i in range(d)] + [0.5] * k
    table = _table.make_table(
        pd.DataFrame({"name": "op", "kind": "op", "ts_us": ts, "dur_us": dur, "pid": "1", "tid": "1"})
    )
    rows = table["ts_us"].to_numpy()
    first = np.zeros(len(rows), dtype=bool)
    first[0] = True
    assert _table._parents(rows, rows + table["dur_us"].to_numpy(), first) is None
    assert _bits(table["self_us"].to_numpy()) == _bits(ref_self_times(table))


def test_masks_of_many_distinct_passing_values() -> None:
    """Thousands of distinct names that pass a test (``pin_memory`` in each): one lookup per row, the same mask."""
    names = np.array([f"aten::pin_memory_{i % 3000}" if i % 4 else f"aten::mm_{i}" for i in range(12_000)], object)
    got = Distinct(names).mask(lambda u: "pin_memory" in u)
    assert (got == np.array(["pin_memory" in n for n in names])).all() and got.sum() == 9000

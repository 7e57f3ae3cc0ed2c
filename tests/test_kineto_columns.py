"""The Kineto reader's vectorised steps against slow, obvious references, on random inputs.

The reader turns a batch of decoded events into columns without Python code per event (``_ColumnBuilder.add``),
converts numbers with numpy where it can (``_numeric``), finds each operator's parent by pointer jumping
(``_parents``) and the operator that encloses each launch call for all threads at once (``_enclosing_ops``). Each is
checked here against a plain per-event loop written the way the rule reads, on seeded random inputs full of the
odd values a trace can hold (numbers as strings, ``null``, integers past 64 bits, ties, partial overlaps), bit for
bit.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd
import pytest

from fitprof.traces import TraceError, kineto
from fitprof.traces import _kineto_rules as kineto_rules

# ----------------------------------------------------------------------------------------------------------------
# Columns of a batch of events


def _odd_scalar(rng: random.Random) -> Any:
    """A value a trace may hold where a name, pid or tid is expected."""
    return rng.choice(
        [
            rng.randint(0, 4),
            rng.randint(-3, 3) * 1.0,  # equal to an int: shares its code with it
            rng.choice(["a", "b", "1", "", "aten::mm", "é"]),
            None,
            2**63 + rng.randint(0, 2),
            rng.choice([0.5, -0.0, 1e300]),
        ]
    )


def _odd_number(rng: random.Random) -> Any:
    """A value a trace may hold where ``args.correlation`` / ``args.bytes`` is expected."""
    return rng.choice(
        [
            rng.randint(0, 50),
            rng.randint(0, 50) + 0.25,
            str(rng.randint(0, 9)),
            "x",
            None,
            2**53 + 1,
            2**64 + 1,
            -(2**63) - 1,
            2**70,
            -0.0,
        ]
    )


def _random_events(rng: random.Random, n: int, odd: bool) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for _ in range(n):
        e: dict[str, Any] = {
            "ph": rng.choice(["X"] * 6 + ["s", "f", "i", "M", None]),
            "ts": rng.choice([rng.randint(0, 10**6), rng.randint(0, 10**6) + 0.5]),
        }
        if rng.random() < 0.9:
            e["cat"] = rng.choice(["cpu_op", "kernel", "cuda_runtime", "gpu_memcpy", "cpu_to_cuda", "Trace", 5])
        for key in ("name", "pid", "tid"):
            if rng.random() < 0.95:
                e[key] = _odd_scalar(rng) if odd and rng.random() < 0.3 else rng.choice(["n1", "n2", 7, 8])
        if rng.random() < 0.8:
            e["dur"] = rng.choice([rng.randint(0, 100), rng.random() * 100])
        r = rng.random()
        if r < 0.1:
            e["args"] = None
        elif r < 0.7:
            args: dict[str, Any] = {"other": [1, {"x": 2}]}
            for key in ("correlation", "bytes", "kind"):
                if rng.random() < 0.6:
                    args[key] = _odd_number(rng) if odd else rng.randint(0, 50)
            e["args"] = args
        if rng.random() < 0.3:
            e["id"] = rng.choice([rng.randint(0, 9), "a", 1.5])
        events.append(e)
    return events


def _reference_columns(events: list[dict[str, Any]], batches: list[int]) -> dict[str, Any]:
    """The columns, one event at a time: the complete events, codes by first appearance (``==`` as a dict's keys;
    a ``null`` is ``"nan"``, a new one in each batch, as ``pandas.factorize`` made it on main),
    ``pandas.to_numeric(errors="coerce")`` for the args numbers, the legacy flow arrows."""
    ends = set(itertools.accumulate(batches))
    out: dict[str, Any] = {k: [] for k in ("ts", "dur", "correlation", "nbytes")}
    ids: dict[str, dict[Any, int]] = {k: {} for k in ("cat", "name", "pid", "tid")}
    codes: dict[str, list[int]] = {k: [] for k in ids}
    kind_arg: dict[int, Any] = {}
    flows = []
    row = 0
    nulls: dict[str, Any] = {}
    for i, e in enumerate(events):
        if i in ends:
            nulls = {}
        ph, cat = e.get("ph"), e.get("cat", "")
        if ph in ("s", "f") and isinstance(cat, str) and cat.startswith("cpu_to_"):
            ts = e.get("ts")
            flows.append(
                (
                    ph,
                    str(e.get("name", "")),
                    float(ts) if ts is not None else math.nan,
                    str(e.get("tid", "")),
                    e.get("id"),
                )
            )
        if ph != "X" or cat == "Trace":
            continue
        for key in ids:
            value = e.get(key, "")
            if value is None:
                value = nulls.setdefault(key, float("nan"))
            codes[key].append(ids[key].setdefault(value, len(ids[key])))
        out["ts"].append(float(e["ts"]))
        out["dur"].append(float(e.get("dur", 0.0)))
        args = e.get("args") or {}
        for key, field in (("correlation", "correlation"), ("nbytes", "bytes")):
            value = pd.to_numeric(pd.Series([args.get(field)], dtype=object), errors="coerce").iloc[0]
            out[key].append(float(value))
        if args.get("kind") is not None:
            kind_arg[row] = args["kind"]
        row += 1
    result = {k: np.array(v, dtype=np.float64) for k, v in out.items()}
    for key in ids:
        result[f"{key}_code"] = np.array(codes[key], dtype=np.int64)
        result[f"{key}s"] = [str(u) for u in ids[key]]
    result["kind_arg"] = kind_arg
    result["flows"] = flows
    return result


def _same_floats(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a.view(np.int64), b.view(np.int64)))


def _builder_columns(events: list[dict[str, Any]], batches: list[int]) -> kineto_rules.Columns:
    builder = kineto._ColumnBuilder(Path("random.json"), len(events) + 1)
    start = 0
    for size in [*batches, len(events)]:
        chunk = events[start : start + size]
        start += len(chunk)
        builder.add(kineto._BATCH_DECODER.decode(msgspec.json.encode(chunk)))
    return builder.finish()


@pytest.mark.parametrize("odd", [False, True])
def test_column_builder_matches_a_per_event_reference(odd: bool) -> None:
    rng = random.Random(1707 + odd)
    for trial in range(40):
        events = _random_events(rng, rng.randint(0, 120), odd)
        for e in events:  # a complete event without a numeric ts is an error, tested below
            if e.get("ph") == "X":
                e["ts"] = e.get("ts") or 0
        batches = [rng.randint(1, 30) for _ in range(rng.randint(0, 5))]
        got = _builder_columns(events, batches)
        want = _reference_columns(events, batches)
        where = f"trial {trial}, batches {batches}"
        for key in ("ts", "dur", "correlation", "nbytes"):
            assert _same_floats(getattr(got, key), want[key]), (where, key, getattr(got, key), want[key])
        for key in ("cat", "name", "pid", "tid"):
            assert np.array_equal(getattr(got, f"{key}_code"), want[f"{key}_code"]), (where, key)
            assert list(getattr(got, f"{key}s")) == want[f"{key}s"], (where, key)
        assert got.kind_arg == want["kind_arg"], where
        assert [f[:4] for f in got.flows] == [f[:4] for f in want["flows"]], where
        assert [f[4] for f in got.flows] == [f[4] for f in want["flows"]], where


def test_column_builder_names_the_bad_event() -> None:
    events = [{"ph": "X", "ts": 1, "dur": 2}, {"ph": "i", "ts": "x"}, {"ph": "X", "ts": "nope", "dur": 1}]
    with pytest.raises(TraceError, match=r"complete event 1 has ts 'nope'"):
        _builder_columns(events, [])
    with pytest.raises(TraceError, match=r"complete event 3 has dur None"):
        _builder_columns([{"ph": "X", "ts": 1}] * 3 + [{"ph": "X", "ts": 1, "dur": None}], [2])


@pytest.mark.parametrize(
    "values",
    [
        [1, 2.5, math.nan],
        [2**63, 1.5],
        [2**63],
        [2**64 - 1, 0.5],
        [2**64],
        [2**70, 1.5],
        [-(2**63) - 1],
        [2**53 + 1, 0.5],
        [2**53 + 1],
        [-0.0, 0],
        ["12", 1, None],
        ["x", math.nan],
        [None, None],
        [],
    ],
)
def test_numeric_is_pandas_to_numeric(values: list[Any]) -> None:
    want = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    assert _same_floats(kineto._numeric(values), want)


def test_numeric_past_float_range_fails_as_pandas_does() -> None:
    with pytest.raises(OverflowError):
        pd.to_numeric(pd.Series([2**1030, 1.5], dtype=object), errors="coerce")
    with pytest.raises(OverflowError):
        kineto._numeric([2**1030, 1.5])


_TS_VALUES = [
    [1, 2.5, 3],
    [2**53 + 1, 0.5],
    [2**64 - 1, 2**70, -(2**63) - 1],
    [-0.0, 0],
    ["12", " 12 ", "1e3", "1_000", "-0.0", 7],
    [1, "nope"],
    [1, None],
    [1, "nan"],
    [1, "inf"],
    [1.5, math.inf],
    [2**1030, 1.5],
    ["1" * 400],
    [],
]


@pytest.mark.parametrize("values", _TS_VALUES)
def test_numbers_without_a_list_are_the_numbers_of_the_list(values: list[Any]) -> None:
    """``_numbers_of`` (numpy.fromiter over the events' field) gives ``_numbers`` of the field's list bit for bit,
    and the same error (message naming the event and value, or exception type) where that raises."""
    rows = [kineto._Event(ph="X", ts=v) for v in values]

    def outcome(fn: Any) -> Any:
        try:
            return fn()
        except (TraceError, OverflowError) as err:
            return type(err), str(err)

    want = outcome(lambda: kineto._numbers(values, "ts", "t.json", 3))
    got = outcome(lambda: kineto._numbers_of(rows, kineto._TS, "ts", "t.json", 3))
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and _same_floats(got, want), (got, want)
    else:
        assert got == want


def test_positions_finds_every_equal_item() -> None:
    rng = random.Random(3)
    for _ in range(50):
        values = [rng.choice(["Trace", "cpu_op", 5, None, "Trace "]) for _ in range(rng.randint(0, 40))]
        assert kineto._positions(values, "Trace") == [i for i, v in enumerate(values) if v == "Trace"]


def test_interner_matches_pandas_factorize_across_batches() -> None:
    """The interner of main at 7526b3e coded each batch with :func:`pandas.factorize` and merged the batches'
    uniques in a dict; the dict-only interner gives the same codes and kept values."""
    rng = random.Random(5)
    for _ in range(50):
        batches = [[_odd_scalar(rng) for _ in range(rng.randint(0, 40))] for _ in range(rng.randint(1, 4))]
        old_ids: dict[Any, int] = {}
        new = kineto._Interner()
        for values in batches:
            codes, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=False)
            lut = np.array([old_ids.setdefault(u, len(old_ids)) for u in uniques], dtype=np.int64)
            want = lut[codes] if len(lut) else np.zeros(0, dtype=np.int64)
            assert np.array_equal(new.codes(values), want), values
        assert list(map(type, new.ids)) == list(map(type, old_ids))
        assert new.strings().tolist() == ["" if u is None else str(u) for u in old_ids]  # main's strings()


def test_interner_of_integer_runs_gives_the_codes_of_every_lookup() -> None:
    """Process and thread ids (``_Interner(runs=True)``): a batch of Python ints only is coded a run of equal
    values at a time; the codes, the kept values and their types are those of the lookup of every value, across
    batches that mix ints with floats (``5.0`` then ``5``), strings, ``None`` and ints past int64."""
    rng = random.Random(11)
    runs_taken = 0
    for _ in range(200):
        batches = []
        for _ in range(rng.randint(1, 4)):
            values: list[Any] = []
            pool = [rng.randint(-3, 3), rng.randint(0, 10**6), 2**62, -(2**62)]
            while len(values) < rng.randint(0, 60):
                values += [rng.choice(pool)] * rng.randint(1, 9)  # runs of one id, as a thread's events come
            if rng.random() < 0.3:  # a batch the run path must leave to the lookup of every value
                values.insert(rng.randint(0, len(values)), rng.choice([5.0, "5", None, 2**64, 1.5, -(2**63) - 1]))
            batches.append(values)
        runs, every = kineto._Interner(runs=True), kineto._Interner()
        for values in batches:
            runs_taken += bool(values) and all(type(v) is int and -(2**63) <= v < 2**63 for v in values)
            assert np.array_equal(runs.codes(values), every.codes(values)), values
        assert list(map(repr, runs.ids)) == list(map(repr, every.ids))  # repr: None is kept as a NaN of its own
        assert runs.strings().tolist() == every.strings().tolist()
    assert runs_taken > 100


# ----------------------------------------------------------------------------------------------------------------
# Parents and enclosing operators


def _stack_parents(end: list[float]) -> list[int]:
    """The stack loop of main at 7526b3e: pop while the top ends before this one; the top left is the parent."""
    parent = [-1] * len(end)
    stack: list[int] = []
    for i, e in enumerate(end):
        while stack and end[stack[-1]] < e:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def _random_intervals(rng: random.Random, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intervals on a few threads with many ties, nested, disjoint and partly overlapping; sorted by thread, then
    start, longest first, then as generated."""
    thread = np.array([rng.randint(0, 3) for _ in range(n)], dtype=np.int64)
    ts = np.array([rng.randint(0, 30) for _ in range(n)], dtype=np.float64)
    dur = np.array([rng.choice([0, 1, 2, 5, rng.randint(0, 40)]) for _ in range(n)], dtype=np.float64)
    order = np.lexsort((-dur, ts, thread))
    return thread[order], ts[order], dur[order]


@pytest.mark.parametrize("rounds", [64, 1, 0])
def test_parents_is_the_stack_loop(rounds: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """On every thread separately; ``rounds`` 1 and 0 leave (nearly) everything to the one-by-one finish."""
    monkeypatch.setattr(kineto_rules, "_PARENT_ROUNDS", rounds)
    rng = random.Random(99)
    for _ in range(200):
        thread, ts, dur = _random_intervals(rng, rng.randint(0, 60))
        end = ts + dur
        want = np.full(len(end), -1, dtype=np.int64)
        for t in np.unique(thread):
            rows = np.flatnonzero(thread == t)
            want[rows] = [rows[p] if p >= 0 else -1 for p in _stack_parents(end[rows].tolist())]
        assert np.array_equal(kineto_rules.parents(end, thread), want), (thread, end)
        one = thread == (thread[0] if len(thread) else 0)
        assert np.array_equal(kineto_rules.parents(end[one]), _stack_parents(end[one].tolist()))


def test_parents_of_a_deep_nest_and_a_long_sawtooth() -> None:
    """The shapes that need many jumping rounds: a nest 500 deep closed by one that outlasts it, siblings."""
    end = np.array([1000.0 - i for i in range(500)] + [2000.0] + [2000.0 + i for i in range(300)])
    assert np.array_equal(kineto_rules.parents(end), _stack_parents(end.tolist()))


def test_enclosing_ops_is_the_rule() -> None:
    """Each query's operator: on its thread, starting at or before it and ending at or after it; of several the
    latest start, then the shortest, then the later row."""
    rng = random.Random(3)
    for _ in range(150):
        n = rng.randint(1, 80)
        ts = np.array([rng.randint(0, 25) for _ in range(n)], dtype=np.float64)
        dur = np.array([rng.choice([0, 1, 3, rng.randint(0, 30)]) for _ in range(n)], dtype=np.float64)
        pid = np.array([rng.randint(0, 1) for _ in range(n)], dtype=np.int64)
        tid = np.array([rng.randint(0, 2) for _ in range(n)], dtype=np.int64)
        is_op = np.array([rng.random() < 0.6 for _ in range(n)])
        queries = np.unique(np.array([rng.randrange(n) for _ in range(rng.randint(0, 20))], dtype=np.int64))
        got = kineto_rules.enclosing_ops(ts, dur, np.flatnonzero(is_op), kineto_rules.Threads(pid, tid, 3), queries)
        for q, row in zip(queries.tolist(), got.tolist(), strict=True):
            q_end = ts[q] + dur[q]
            cands = [
                j
                for j in range(n)
                if is_op[j] and pid[j] == pid[q] and tid[j] == tid[q] and ts[j] <= ts[q] and ts[j] + dur[j] >= q_end
            ]
            want = max(cands, key=lambda j: (ts[j], -dur[j], j)) if cands else -1
            assert row == want, (q, cands)


# ----------------------------------------------------------------------------------------------------------------
# The whole frame


def test_frame_is_the_same_with_the_sorted_pair_classes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The distinct (category, name) pairs found with a table and with :func:`numpy.unique` classify alike."""
    import gputrace

    doc, _ = gputrace.kineto_trace(seed=4)
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps(doc))
    table = kineto.read_kineto(path)
    monkeypatch.setattr(kineto_rules, "_DENSE_PAIRS", 0)  # only below the event count: numpy.unique
    doc["traceEvents"] = doc["traceEvents"] + [
        {"ph": "X", "cat": f"c{i}", "name": f"n{i}", "pid": 1, "tid": 1, "ts": 0, "dur": 0} for i in range(60)
    ]
    path.write_text(json.dumps(doc))
    wide = kineto.read_kineto(path)
    extra = wide["name"].str.match(r"n\d+$")
    assert int(extra.sum()) == 60
    assert (wide.loc[extra, "kind"] == "other").all()
    assert wide.loc[~extra].reset_index(drop=True).drop(columns="self_us").equals(table.drop(columns="self_us"))

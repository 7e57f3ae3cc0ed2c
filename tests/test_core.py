"""The framework-free core: imports, the analysis on hand-built tables, the XSpace reader's errors."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from fitprof import TraceError, analyze, analyze_table
from fitprof.analysis import verdict_for
from fitprof.traces import make_table
from shared_fixtures import DDP_RANKS


@pytest.mark.slow
def test_core_imports_no_framework() -> None:
    code = (
        "import sys, fitprof, fitprof.analysis, fitprof.traces, fitprof.traces.kineto, fitprof.traces.xspace, "
        "fitprof.metrics, fitprof.cli\n"
        "bad = [m for m in ('tensorflow', 'torch', 'lightning', 'keras', 'pytorch_lightning') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _ev(name: str, kind: str, ts: float, dur: float, **kw: object) -> dict[str, object]:
    return {
        "name": name,
        "kind": kind,
        "ts_us": ts,
        "dur_us": dur,
        "pid": kw.pop("pid", "1"),
        "tid": kw.pop("tid", "1"),
        **kw,
    }


def test_analysis_on_a_hand_built_window() -> None:
    # Two 10 ms steps. Step 1 waits 4 ms for input, step 2 waits 2 ms; an HtoD copy of 1 ms (1 MB, pinned)
    # is launched in step 1 and runs after it ends (it still belongs to step 1); validation of 5 ms inside
    # step 2 is excluded, and so is its own input fetch.
    table = make_table(
        [
            _ev("ProfilerStep#1", "step", 0, 10_000, step_num=1),
            _ev("ProfilerStep#2", "step", 10_000, 15_000, step_num=2),
            _ev("next", "input", 0, 4_000),
            _ev("next", "input", 10_000, 2_000),
            _ev("fitprof/validation", "not_training", 19_000, 5_000),
            _ev("next", "input", 20_000, 1_000),
            _ev("aten::linear", "op", 4_000, 5_000),
            _ev("aten::addmm", "op", 4_500, 3_000),
            _ev("aten::linear", "op", 12_000, 5_000),
            _ev("aten::addmm", "op", 12_500, 3_000),
            _ev(
                "Memcpy HtoD",
                "memcpy",
                10_500,
                1_000,
                on_device=True,
                launch_us=9_000.0,
                copy_kind="htod_pinned",
                bytes=1e6,
                pid="0",
                tid="7",
            ),
        ]
    )
    report = analyze_table(table, top_k=1, framework="pytorch")
    assert report.steps_analyzed == 2
    assert report.step_time_ms == pytest.approx((10 + 15 - 5) / 2)
    assert report.input_percent == pytest.approx(100 * 6 / 20)
    assert report.htod_ms_per_step == pytest.approx(0.5)
    assert report.htod_percent == pytest.approx(100 * 1 / 20)
    assert report.htod_bytes_per_step == pytest.approx(5e5)
    assert report.htod_gb_per_s == pytest.approx(1.0)  # 1 MB in 1 ms
    assert report.htod_pinned_ms_per_step == pytest.approx(0.5)
    # Device events exist, so operators are ranked by device time (the copy, no launching op known).
    assert report.op_time_source == "device"
    assert report.verdict == "input-bound"
    assert "num_workers" in report.advice[0]
    scal = report.scalars()
    assert scal["fitprof/input_percent"] == pytest.approx(30.0)
    assert report.self_ms_per_step == 0.0  # no fitprof/overhead span in this window


def test_fitprofs_own_spans_are_left_out_and_reported() -> None:
    # Two 10 ms steps; fitprof's own span of 3 ms ends step 1 (1 ms of input wait inside it), and one of 2 ms
    # straddles the boundary (1 ms in step 2, 1 ms outside every step); one of 4 ms lies before the first step
    # (the warm-up step: not analysed).
    table = make_table(
        [
            _ev("fitprof/overhead", "not_training", -5_000, 4_000),
            _ev("ProfilerStep#1", "step", 0, 10_000, step_num=1),
            _ev("ProfilerStep#2", "step", 11_000, 10_000, step_num=2),
            _ev("next", "input", 0, 2_000),
            _ev("next", "input", 6_000, 1_000),
            _ev("fitprof/overhead", "not_training", 7_000, 3_000),
            _ev("next", "input", 7_000, 1_000),
            _ev("fitprof/overhead", "not_training", 10_000, 2_000),
        ]
    )
    report = analyze_table(table, framework="pytorch")
    assert report.steps_analyzed == 2
    assert report.step_time_ms == pytest.approx((10 + 10 - 3 - 1) / 2)
    assert report.input_percent == pytest.approx(100 * 3 / 16)  # the input inside fitprof's span is not counted
    assert report.self_ms_per_step == pytest.approx((3 + 1) / 2)
    assert report.scalars()["fitprof/self_ms_per_step"] == pytest.approx(2.0)


def test_host_self_time_subtracts_nested_operators() -> None:
    table = make_table(
        [
            _ev("ProfilerStep#1", "step", 0, 10_000),
            _ev("aten::linear", "op", 1_000, 6_000),
            _ev("aten::addmm", "op", 1_500, 4_000),
            _ev("my_annotation", "annotation", 1_000, 8_000),
        ]
    )
    report = analyze_table(table, top_k=5, framework="pytorch")
    assert [(o.name, o.self_ms_per_step) for o in report.top_ops] == [("aten::addmm", 4.0), ("aten::linear", 2.0)]
    assert report.op_time_source == "host"
    assert report.verdict == "compute-bound"


def test_no_step_markers_analyses_the_whole_trace() -> None:
    table = make_table([_ev("op", "op", 0, 1_000), _ev("IteratorGetNext", "input", 1_000, 1_000)])
    report = analyze_table(table, framework="pytorch")
    assert report.steps_analyzed == 0
    assert report.step_time_ms == pytest.approx(2.0)
    assert report.input_percent == pytest.approx(50.0)
    assert any("No step markers" in w for w in report.warnings)


def test_empty_table_is_no_steps() -> None:
    report = analyze_table(make_table(pd.DataFrame()), framework="pytorch")
    assert report.verdict == "no-steps" and math.isnan(report.step_time_ms)


@pytest.mark.parametrize(
    ("inp", "htod", "coll", "verdict"),
    [
        (25, 0, 0, "input-bound"),
        (5, 20, 0, "host-to-device-bound"),
        (5, 5, 0, "compute-bound"),
        (15, 0, 0, "balanced"),
        (5, 0, 40, "communication-bound"),
        (30, 0, 40, "communication-bound"),
        (45, 0, 40, "input-bound"),
    ],
)
def test_verdict_thresholds(inp: float, htod: float, coll: float, verdict: str) -> None:
    assert verdict_for(inp, htod, 3, coll) == verdict


def test_gloo_rank_waiting_in_all_reduce_is_communication_bound() -> None:
    """Rank 0 of the shipped gloo pair (tests/data/README.md) waits in the all-reduce for the slow rank 1."""
    report = analyze(DDP_RANKS[0])
    assert report.verdict == "communication-bound"
    assert 20 <= report.collective_percent <= 100
    assert report.collective_percent > report.input_percent
    assert "bucket_cap_mb" in report.advice[0]


def test_an_operators_scalar_key_keeps_its_name_with_spaces_as_underscores() -> None:
    """The TensorBoard tag of a top operator: the name as the trace gives it, ``/`` and ``:`` kept, spaces (which
    autograd's node names hold) made ``_``; the tests that read the tags back build them the same way."""
    from fitprof.metrics import top_op_key

    assert top_op_key("aten::mm") == "fitprof/top_ops/aten::mm"
    name = "autograd::engine::evaluate_function: AddmmBackward0"
    assert top_op_key(name) == "fitprof/top_ops/autograd::engine::evaluate_function:_AddmmBackward0"
    assert top_op_key(" model/dense/MatMul ") == "fitprof/top_ops/model/dense/MatMul"


def test_top_k_checked() -> None:
    with pytest.raises(ValueError, match="top_k"):
        analyze_table(make_table(pd.DataFrame()), top_k=0, framework="pytorch")


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("missing.xplane.pb", None, "no such file"),
        ("empty.xplane.pb", b"", "empty"),
        ("garbage.xplane.pb", b"\x00\xff this is not a protobuf \xff" * 10, "not an XSpace"),
        ("notes.txt", b"hello", "not a trace file name"),
    ],
)
def test_bad_xspace_files(tmp_path: Path, name: str, content: bytes | None, match: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TraceError, match=match) as err:
        analyze(path)
    assert name in str(err.value)


def test_rank_combine_names_the_straggler_and_skips_empty_ranks() -> None:
    from fitprof.cross_rank import combine, pack

    def rep(step: float, inp: float) -> object:
        table = make_table(
            [_ev("ProfilerStep#1", "step", 0, step * 1e3), _ev("next", "input", 0, step * 1e3 * inp / 100)]
        )
        return analyze_table(table, framework="pytorch")

    vectors = [pack(rep(10, 5)), pack(None), pack(rep(30, 60))]
    out = combine(vectors)
    assert out["fitprof/step_time_ms"] == pytest.approx(20.0)
    assert out["fitprof/step_time_ms_max"] == pytest.approx(30.0)
    assert out["fitprof/step_time_ms_max_rank"] == 2.0
    assert out["fitprof/input_percent_max"] == pytest.approx(60.0)
    assert out["fitprof/input_percent_max_rank"] == 2.0
    assert out["fitprof/ranks_reported"] == 2.0
    assert combine([pack(None), pack(None)]) == {}


def test_the_summary_line_names_the_straggler_as_fitprof_report_does() -> None:
    """Rank 0 has the slowest step, rank 1 waits for input 55 points more: both the TensorBoard text and the CLI's
    spread (one definition, :func:`fitprof.cross_rank.spread`) name rank 1 the straggler."""
    from fitprof.cross_rank import RankFigures, combine, pack, spread, summary_line

    def rep(step: float, inp: float) -> Any:
        table = make_table(
            [_ev("ProfilerStep#1", "step", 0, step * 1e3), _ev("next", "input", 0, step * 1e3 * inp / 100)]
        )
        return analyze_table(table, framework="pytorch", rank=0, world_size=2)

    vectors = [pack(rep(30, 5)), pack(rep(28, 60))]
    line = summary_line(vectors, combine(vectors), world_size=2)
    assert "slowest rank 0 at 30.00 ms/step" in line
    assert "Straggler: rank 1 (input share 55.0 points above the least input-bound rank)" in line
    s = spread([RankFigures(0, 30.0, 5.0), RankFigures(1, 28.0, 60.0)])
    assert s is not None and (s.slowest.rank, s.most_input_bound.rank, s.straggler.rank) == (0, 1, 1)
    # Under the 10-point threshold the slowest rank is the straggler.
    s = spread([RankFigures(0, 30.0, 5.0), RankFigures(1, 28.0, 14.0)])
    assert s is not None and s.straggler.rank == 0


def test_the_report_is_built_complete_and_frozen(tmp_path: Path) -> None:
    """``analyze`` of an XSpace named ``<host>_rank<N>.xplane.pb`` gives host, rank and framework in the report
    itself (converted from an in-memory torch trace: framework ``pytorch``, host and rank from the file name); the
    report cannot be changed afterwards."""
    import dataclasses

    from fitprof.traces.xspace_write import write_xspace

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 10_000},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 1_000, "dur": 8_000},
    ]
    path = write_xspace(events, tmp_path, "s", host="node7_rank3")
    report = analyze(path)
    assert (report.framework, report.host, report.rank, report.world_size) == ("pytorch", "node7", 3, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.rank = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="framework must be one of"):
        analyze_table(make_table([_ev("op", "op", 0, 1_000)]), framework="torch")


def test_require_names_the_package_really_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fitprof._imports import require

    (tmp_path / "fitprof_outer_pkg.py").write_text("import fitprof_inner_missing_pkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as caught:
        require("fitprof_outer_pkg", "the feature")
    assert caught.value.name == "fitprof_inner_missing_pkg"
    assert str(caught.value) == (
        "the feature needs `fitprof_inner_missing_pkg` (imported by `fitprof_outer_pkg`), which is not installed: "
        "pip install fitprof_inner_missing_pkg"
    )
    with pytest.raises(ModuleNotFoundError, match=r"^the feature needs `fitprof_absent_pkg`, which is not installed"):
        require("fitprof_absent_pkg", "the feature")


def test_warn_once_one_category_prefix_reset_and_errors_to_logging(caplog: pytest.LogCaptureFixture) -> None:
    import warnings

    from fitprof import FitProfilerWarning
    from fitprof._warn import WarnOnce

    warn_once = WarnOnce()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_once("k", "first")
        warn_once("k", "again")  # the same problem: not again
        warn_once.reset()  # a new fit
        warn_once("k", "fitprof: after reset")
    assert [(w.category, str(w.message), w.filename) for w in caught] == [
        (FitProfilerWarning, "fitprof: first", __file__),
        (FitProfilerWarning, "fitprof: after reset", __file__),
    ]
    with warnings.catch_warnings(), caplog.at_level("WARNING"):
        warnings.simplefilter("error")
        warn_once("other", "as error")  # -W error: logged, never raised
    assert [r.getMessage() for r in caplog.records] == ["fitprof: as error"]

"""A checkpoint save inside a profiled window: annotated, taken out of step time, reported per step and named."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fitprof import analyze, analyze_table, metrics
from fitprof.traces import make_table
from fitprof.traces._table import CHECKPOINT_ANNOTATION


def _ev(name: str, kind: str, ts: float, dur: float, **kw: object) -> dict[str, object]:
    return {"name": name, "kind": kind, "ts_us": ts, "dur_us": dur, "pid": "1", "tid": "1", **kw}


def _saving_window() -> list[dict[str, object]]:
    # Four steps of 50 ms training; steps 2 and 4 hold a 85 ms save (as ModelCheckpoint(save_freq=2) does), with
    # the state's own operators inside it.
    events: list[dict[str, object]] = []
    t = 0.0
    for n in range(1, 5):
        save = 85_000.0 if n % 2 == 0 else 0.0
        events.append(_ev(f"ProfilerStep#{n}", "step", t, 50_000 + save, step_num=n))
        events.append(_ev("aten::mm", "op", t + 1_000, 40_000))
        if save:
            events.append(_ev(CHECKPOINT_ANNOTATION, "not_training", t + 50_000, save))
            events.append(_ev("aten::copy_", "op", t + 51_000, 80_000))
        t += 50_000 + save
    return events


def test_a_save_is_out_of_step_time_and_reported_per_step() -> None:
    report = analyze_table(make_table(_saving_window()), framework="pytorch")
    assert report.steps_analyzed == 4
    assert report.step_time_ms == pytest.approx(50.0)
    assert report.checkpoint_ms_per_step == pytest.approx(2 * 85.0 / 4)
    assert report.scalars()[metrics.CHECKPOINT_MS_PER_STEP.key] == pytest.approx(42.5)
    assert report.top_ops[0].name == "aten::mm"  # the save's copies are not the step's operators
    head = report.headline()
    assert "Checkpoint saves took another 42.5 ms/step (85% of step time), left out of it" in head
    assert metrics.CHECKPOINT_MS_PER_STEP.key in metrics.BASE_KEYS


def test_no_save_reports_zero_and_names_nothing() -> None:
    events = [e for e in _saving_window() if e["name"] not in (CHECKPOINT_ANNOTATION, "aten::copy_")]
    report = analyze_table(make_table(events), framework="pytorch")
    assert report.checkpoint_ms_per_step == 0.0
    assert "Checkpoint" not in report.headline()


def test_the_kineto_reader_classifies_the_save_annotation(tmp_path: Path) -> None:
    trace = []
    for e in _saving_window():
        cat = "user_annotation" if e["kind"] in ("step", "not_training") else "cpu_op"
        trace.append(
            {"ph": "X", "cat": cat, "name": e["name"], "pid": 1, "tid": 1, "ts": e["ts_us"], "dur": e["dur_us"]}
        )
    path = tmp_path / "w.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": trace}, f)
    report = analyze(path)
    assert report.step_time_ms == pytest.approx(50.0)
    assert report.checkpoint_ms_per_step == pytest.approx(42.5)


def test_a_contended_epoch_turns_the_window_verdict() -> None:
    """The trace alone says compute-bound; the callback knows the thread waited for a core."""
    from fitprof.analysis import CPU_CONTENDED, cpu_contended

    events = [_ev(f"ProfilerStep#{n}", "step", 50_000 * n, 50_000, step_num=n) for n in range(4)]
    events += [_ev("aten::mm", "op", 50_000 * n + 1_000, 45_000) for n in range(4)]
    report = analyze_table(make_table(events), framework="pytorch")
    assert report.verdict == "compute-bound"
    turned = cpu_contended(report, "the training thread waited for a core 47% of epoch 0 (...)", "use fewer threads")
    assert turned.verdict == CPU_CONTENDED and turned.advice[0] == "use fewer threads"
    # the trace's own advice is kept, said to be for when the cores are free (not "speed up" beside "waiting")
    assert len(turned.advice) == 1 + len(report.advice) >= 2
    assert turned.advice[1] == "once the cores are free, t" + report.advice[0][1:], turned.advice
    assert all(a.startswith("once the cores are free, ") for a in turned.advice[1:]), turned.advice
    head = turned.headline()
    assert head.startswith("cpu-contended: the training thread waited for a core 47% of epoch 0")
    assert "the trace alone says compute-bound" in head and "speed up" not in head
    assert turned.step_time_ms == report.step_time_ms  # the figures stay what was measured
    assert cpu_contended(turned, "x", "y") is turned


def test_contention_leaves_a_wait_the_trace_shows() -> None:
    from fitprof.analysis import cpu_contended

    events = [_ev(f"ProfilerStep#{n}", "step", 50_000 * n, 50_000, step_num=n) for n in range(4)]
    events += [_ev("next", "input", 50_000 * n, 30_000) for n in range(4)]
    report = analyze_table(make_table(events), framework="pytorch")
    assert report.verdict == "input-bound"
    assert cpu_contended(report, "waited", "fewer threads") is report

"""``fitprof compare``: planted traces and report files (written by fitprof's own writers) whose every duration is
known, compared in-process; one slow test with real Lightning runs and a planted slower operator."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fitprof
from fitprof.cli import main
from fitprof.cli.compare import records as compare_records
from fitprof.compare import CompareInputError, against_baseline, compare, load_baseline, load_side
from fitprof.fit.setup import structure_fingerprint
from fitprof.metrics import (
    EPOCH_INPUT_PERCENT,
    EPOCH_STEP_TIME_MS_P50,
    EPOCH_STEPS_TIMED,
    VS_BASELINE_STEP_TIME_PERCENT,
)
from fitprof.report_files import find_epoch_files, find_report_files, read_epoch_file, write_report_file
from planted import write_run_trace, xus
from shared_fixtures import KERAS_XSPACE, LIGHTNING_CPU

DATALOADER_NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
BASE_OPS = {"aten::addmm": 6.0, "aten::relu": 1.0, "aten::cumsum": 0.5, "aten::sum": 0.3, "aten::tiny": 0.01}
"""Self time per step (ms) of each planted operator; the steps hold a 1 ms input wait before them."""
INPUT_MS = 1.0


def kineto_window(
    path: Path,
    ops: dict[str, float],
    *,
    seed: int,
    jitter: float,
    steps: int = 5,
    rank: int | None = None,
    world_size: int | None = None,
    input_ms: float = INPUT_MS,
) -> Path:
    """A Kineto trace of ``steps`` ``ProfilerStep#N``: a DataLoader wait of ``input_ms``, then each operator of
    ``ops`` one after the other for its time (ms) scaled by one factor per window, uniform in
    ``1 +- jitter`` (seeded): the window-to-window spread. Durations in whole microseconds."""
    rng = np.random.default_rng(seed)
    scale = 1 + rng.uniform(-jitter, jitter)
    durs = {name: round(ms * 1000 * scale) for name, ms in ops.items()}
    wait = round(input_ms * 1000 * scale)

    events = []
    t = 1000
    for n in range(1, steps + 1):
        step = wait + sum(durs.values())
        events.append(xus("user_annotation", f"ProfilerStep#{n}", t, step))
        events.append(xus("user_annotation", DATALOADER_NEXT, t, wait))
        at = t + wait
        for name, dur in durs.items():
            events.append(xus("cpu_op", name, at, dur))
            at += dur
        t += step
    return write_run_trace(path, events, rank=rank, world_size=world_size)


def run_dir(
    root: Path,
    ops: dict[str, float],
    *,
    seed: int,
    jitter: float = 0.02,
    epochs: int = 3,
    samples_per_step: float = 32.0,
    world_size: int | None = None,
    triggered: dict[str, float] | None = None,
    input_ms: float = INPUT_MS,
    per_epoch: dict[int, dict[str, float]] | None = None,
    fields: dict[str, Any] | None = None,
) -> Path:
    """A run directory as the callbacks lay it out: per epoch, a trace in ``plugins/profile/<session>/`` and its
    report file (analysed with :func:`fitprof.analyze`, written with :func:`write_report_file`); with
    ``triggered``, also one window the slowdown trigger opened in epoch 0, holding those operators."""
    per_epoch = per_epoch or {}
    windows = [(e, f"2026_01_01_00_00_{e:02d}_epoch{e}", per_epoch.get(e, ops)) for e in range(epochs)]
    if triggered is not None:
        windows.append((0, "2026_01_01_00_00_09_epoch0_trigger_step20", triggered))
    for epoch, session, window_ops in windows:
        rank = 0 if world_size else None
        trace = kineto_window(
            root / "plugins" / "profile" / session / "host.pt.trace.json",
            window_ops,
            seed=seed * 100 + epoch,
            jitter=jitter,
            rank=rank,
            world_size=world_size,
            input_ms=input_ms,
        )
        report = dataclasses.replace(fitprof.analyze(trace), samples_per_step=samples_per_step, **(fields or {}))
        write_report_file(root, session=session, epoch=epoch, report=report, trace=trace, rank=rank or 0)
    return root


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str | os.PathLike[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["compare", *(os.fspath(a) for a in argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def as_json(capsys: pytest.CaptureFixture[str], *argv: str | os.PathLike[str]) -> tuple[int, list[dict[str, Any]]]:
    rc, out, err = run_cli(capsys, *argv, "--format", "json")
    assert "Traceback" not in err
    return rc, json.loads(out) if out else []


def row(records: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(r for r in records if r.get("name") == name)


def slower(name: str, ms: float) -> dict[str, float]:
    return {**BASE_OPS, name: ms}


# ---------------------------------------------------------------------------------------------- the verdicts


def test_planted_slower_operator_fails_and_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    cand = run_dir(tmp_path / "cand", slower("aten::cumsum", 2.5), seed=2)
    rc, records = as_json(capsys, base, cand)
    assert rc == 1
    head = records[0]
    assert head["record"] == "compare" and head["status"] == "regression"
    assert "aten::cumsum" in head["headline"]
    op = row(records, "aten::cumsum")
    assert op["record"] == "operator" and op["regression"] and op["significant"]
    # the values are the analysed ones: medians over the windows of each side's report files
    for side, path in (("baseline", base), ("candidate", cand)):
        reports = [load_side(f).windows[0].report for f in find_report_files(path)]
        times = [next(o.self_ms_per_step for o in r.top_ops if o.name == "aten::cumsum") for r in reports]
        assert op[side] == pytest.approx(np.median(times), rel=1e-9)
        assert op[f"{side}_mean"] == pytest.approx(np.mean(times), rel=1e-9)
        assert op[f"{side}_spread"] == pytest.approx(np.std(times, ddof=1), rel=1e-9)
        assert row(records, "step_time_ms")[side] == pytest.approx(np.median([r.step_time_ms for r in reports]))
    assert op["change"] == pytest.approx(op["candidate"] - op["baseline"])
    # the operators that did not change are not regressions
    assert not row(records, "aten::addmm")["regression"]
    assert not row(records, "aten::relu")["regression"]


def test_two_runs_of_the_same_code_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = run_dir(tmp_path / "a", BASE_OPS, seed=1, jitter=0.05)
    b = run_dir(tmp_path / "b", BASE_OPS, seed=2, jitter=0.05)
    for x, y in ((a, b), (b, a), (a, a)):
        rc, records = as_json(capsys, x, y)
        assert rc == 0, records[0]["headline"]
        assert records[0]["status"] == "ok"
        assert not any(r.get("regression") for r in records)


def test_a_change_within_the_run_to_run_spread_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same +15% candidate fails against a steady baseline and passes against one whose windows spread
    wider than that: the spread the runs show decides, not the threshold alone."""
    steady = run_dir(tmp_path / "steady", BASE_OPS, seed=1, jitter=0.01)
    noisy = run_dir(tmp_path / "noisy", BASE_OPS, seed=3, jitter=0.4, epochs=4)
    cand = run_dir(tmp_path / "cand", {k: v * 1.15 for k, v in BASE_OPS.items()}, seed=2, jitter=0.01)
    rc, records = as_json(capsys, steady, cand)
    step = row(records, "step_time_ms")
    assert rc == 1 and step["regression"] and step["significant"]
    rc, records = as_json(capsys, noisy, cand)
    step = row(records, "step_time_ms")
    assert step["change_percent"] > 10  # past the threshold: only the interval keeps it from failing
    assert step["ratio_low"] < 1 < step["ratio_high"], step
    assert rc == 0 and step["significant"] is False and not step["regression"]
    assert "not significant" in records[0]["headline"]


def test_fail_over_and_min_ms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Steady windows (no spread): +7.2% of step time passes the default 10% and fails --fail-over 5; an operator
    of 0.01 ms that doubles fails only once --min-ms is under its 0.01 ms growth."""
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1, jitter=0)
    ops = {**{k: v * 1.08 for k, v in BASE_OPS.items()}, "aten::tiny": 0.02}
    cand = run_dir(tmp_path / "cand", ops, seed=1, jitter=0)
    rc, records = as_json(capsys, base, cand)
    assert rc == 0, records[0]["headline"]
    planted = 100 * ((INPUT_MS + sum(ops.values())) / (INPUT_MS + sum(BASE_OPS.values())) - 1)  # 7.2%
    assert row(records, "step_time_ms")["change_percent"] == pytest.approx(planted, rel=1e-6)
    assert row(records, "aten::tiny")["change_percent"] == pytest.approx(100.0)
    assert not row(records, "aten::tiny")["regression"]
    rc, records = as_json(capsys, base, cand, "--fail-over", "5")
    assert rc == 1
    assert row(records, "step_time_ms")["regression"]
    assert not row(records, "aten::tiny")["regression"]  # 0.01 ms growth is under --min-ms 0.1
    rc, records = as_json(capsys, base, cand, "--fail-over", "50", "--min-ms", "0.005")
    assert rc == 1
    assert [r["name"] for r in records if r.get("regression")] == ["aten::tiny"]


def test_memory_figures_are_compared_where_present_and_never_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1, fields={"alloc_mb_per_step": 20.0, "allocated_peak_mb": 2.0})
    cand = run_dir(tmp_path / "cand", BASE_OPS, seed=2, fields={"alloc_mb_per_step": 60.0, "allocated_peak_mb": 2.0})
    rc, records = as_json(capsys, base, cand)
    assert rc == 0
    alloc = row(records, "alloc_mb_per_step")
    assert alloc["record"] == "figure" and alloc["change_percent"] == pytest.approx(200.0)
    assert alloc["worse"] and not alloc["regression"]
    assert not any(r.get("name") == "allocs_per_step" for r in records)  # NaN on both sides: left out
    rc, records = as_json(capsys, run_dir(tmp_path / "plain", BASE_OPS, seed=3), cand)
    assert not any(r.get("name") == "alloc_mb_per_step" for r in records)  # one side only: left out


def test_a_step_slowed_alike_names_no_operator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every operator 1.5x slower (a busier machine): the step time regresses, but no operator's share of the step
    grew, so none is named a regression; the same growth in one operator alone is one."""
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    alike = run_dir(tmp_path / "alike", {k: 1.5 * v for k, v in BASE_OPS.items()}, seed=2, input_ms=1.5 * INPUT_MS)
    rc, records = as_json(capsys, base, alike)
    assert rc == 1 and row(records, "step_time_ms")["regression"]
    addmm = row(records, "aten::addmm")
    assert addmm["change_percent"] > 40 and addmm["share_held"] and not addmm["regression"]
    assert not any(r["regression"] for r in records if r["record"] == "operator")
    alone = run_dir(tmp_path / "alone", slower("aten::addmm", 1.5 * BASE_OPS["aten::addmm"]), seed=2)
    rc, records = as_json(capsys, base, alone)
    assert rc == 1 and row(records, "aten::addmm")["regression"]


def test_an_operator_slow_in_one_window_only_is_no_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A thread preempted inside one operator lifts it in one window: ranked in most windows, it regresses;
    in one of three, it does not (its verdict says so)."""
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    once = run_dir(tmp_path / "once", BASE_OPS, seed=2, per_epoch={1: slower("aten::stall", 3.0)})
    twice = run_dir(tmp_path / "twice", BASE_OPS, seed=2, per_epoch={e: slower("aten::stall", 3.0) for e in (0, 1)})
    rc, records = as_json(capsys, base, once, "--fail-over", "50")  # the step time grows too: gate operators only
    op = row(records, "aten::stall")
    assert op["status"] == "new" and op["candidate_windows"] == 1
    assert op["change"] > 2.5 and op["sporadic"] and not op["regression"]
    assert rc == 0
    rc, out, _ = run_cli(capsys, base, once, "--fail-over", "50")
    assert "worse in 1 window only" in out
    rc, records = as_json(capsys, base, twice, "--fail-over", "50")
    assert rc == 1 and row(records, "aten::stall")["regression"]


def test_a_spike_in_one_window_moves_no_median(tmp_path: Path) -> None:
    """Nine candidate windows as the baseline's and one at +40% (a thread preempted in one window): the mean grows
    by 4%, the median (what is compared) does not, and nothing regresses; every window 12% slower does."""
    ops = {"aten::addmm": 9.0}
    base = run_dir(tmp_path / "base", ops, seed=1, jitter=0, epochs=10)
    spike = run_dir(tmp_path / "spike", ops, seed=2, jitter=0, epochs=10, per_epoch={9: {"aten::addmm": 13.0}})
    step = compare(load_side(base), load_side(spike), fail_over_percent=3).step_time()
    assert step is not None
    assert step.candidate.mean > 1.03 * step.baseline.mean  # the mean moved past the 3% threshold...
    assert step.change == 0 and not step.regression  # ...the median did not
    worse = run_dir(tmp_path / "worse", {"aten::addmm": 10.2}, seed=2, jitter=0, epochs=10)
    step = compare(load_side(base), load_side(worse)).step_time()
    assert step is not None and step.significant and step.regression
    assert step.ratio_lo == pytest.approx(step.ratio_hi) == pytest.approx(11.2 / 10.0)


def test_new_and_gone_operators(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An operator ranked on the candidate side only is compared with the most it can have had in the baseline
    (its smallest ranked time); one ranked in the baseline only never fails."""
    ops = {k: v for k, v in BASE_OPS.items() if k != "aten::tiny"}  # 4 operators: all ranked (top 5)
    base = run_dir(tmp_path / "base", {**ops, "aten::gone": 0.2}, seed=1, jitter=0)
    cand = run_dir(tmp_path / "cand", {**ops, "aten::new_op": 3.0}, seed=1, jitter=0)
    rc, records = as_json(capsys, base, cand)
    assert rc == 1
    new, gone = row(records, "aten::new_op"), row(records, "aten::gone")
    assert new["status"] == "new" and new["regression"]
    assert new["baseline"] == pytest.approx(0.2)  # the smallest ranked baseline operator
    assert new["change"] == pytest.approx(2.8)
    assert gone["status"] == "gone" and not gone["regression"]
    assert "aten::new_op" in records[0]["headline"]


def test_triggered_windows_are_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    cand = run_dir(tmp_path / "cand", BASE_OPS, seed=2, triggered=slower("aten::cumsum", 20.0))
    rc, records = as_json(capsys, base, cand)
    assert rc == 0
    assert records[0]["candidate_windows"] == 3
    assert any("slowdown trigger" in n for n in records[0]["notes"])


# --------------------------------------------------------------------------------- the always-on step timing


def log_epochs(run: Path, p50s: list[float]) -> Path:
    """The always-on step timing of each epoch in an event file of the run, written as the Keras callback writes
    its own (tensorboard's ``EventFileWriter`` and ``scalar_pb``, a float tensor per value; the slow Lightning test
    covers torch's ``SummaryWriter``): ``fitprof/epoch/step_time_ms_p50`` and ``fitprof/epoch/input_percent`` at
    step ``epoch``."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(os.fspath(run), filename_suffix=".fitprof")
    for epoch, p50 in enumerate(p50s):
        for tag, value in ((EPOCH_STEP_TIME_MS_P50.key, p50), (EPOCH_INPUT_PERCENT.key, 10.0 + epoch)):
            writer.add_event(event_pb2.Event(summary=scalar_pb(tag, value), step=epoch, wall_time=1.0 + epoch))
    writer.close()
    return run


def test_the_always_on_step_timing_is_read_and_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tensorboard")
    base = log_epochs(run_dir(tmp_path / "base", BASE_OPS, seed=1), [8.0, 8.5, 8.25])
    cand = log_epochs(run_dir(tmp_path / "cand", BASE_OPS, seed=2), [8.1, 8.4, 8.3])
    assert load_side(base).epochs[EPOCH_STEP_TIME_MS_P50.key] == pytest.approx([8.0, 8.5, 8.25])
    rc, records = as_json(capsys, base, cand)
    assert rc == 0
    every = row(records, EPOCH_STEP_TIME_MS_P50.key)
    assert every["baseline"] == pytest.approx(8.25)  # the median
    assert every["baseline_mean"] == pytest.approx(np.mean([8.0, 8.5, 8.25]))
    assert every["baseline_spread"] == pytest.approx(np.std([8.0, 8.5, 8.25], ddof=1))
    assert every["candidate_windows"] == 3
    assert row(records, EPOCH_INPUT_PERCENT.key)["candidate"] == pytest.approx(11.0)
    assert "step time, every step (median)" in records[0]["headline"]
    assert records[0]["baseline_runs"] == 1 and records[0]["baseline_epochs"] == 3


def test_a_window_regression_needs_the_always_on_timing_to_confirm_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The windows (a few steps) say +30%; where the every-step median of the same runs did not move, the step
    time is not counted a regression (a note says why); where it moved as much, it is."""
    pytest.importorskip("tensorboard")
    slow_ops = {k: 1.3 * v for k, v in BASE_OPS.items()}
    base = log_epochs(run_dir(tmp_path / "base", BASE_OPS, seed=1), [8.0, 8.2, 8.1])
    steady = log_epochs(run_dir(tmp_path / "steady", slow_ops, seed=2, input_ms=1.3), [8.1, 8.0, 8.2])
    slower_too = log_epochs(run_dir(tmp_path / "slower", slow_ops, seed=2, input_ms=1.3), [10.5, 10.6, 10.4])
    rc, records = as_json(capsys, base, steady)
    step = row(records, "step_time_ms")
    assert step["change_percent"] > 25 and step["significant"]
    assert rc == 0 and not step["regression"]
    assert any("does not confirm" in n for n in records[0]["notes"])
    rc, records = as_json(capsys, base, slower_too)
    assert rc == 1 and row(records, EPOCH_STEP_TIME_MS_P50.key)["regression"]


# ------------------------------------------------------------------------------------- every kind of input


def _sides(root: Path, ops: dict[str, float], seed: int) -> dict[str, Path]:
    """The same run as a run directory, one of its report files (in its run and copied elsewhere, as a baseline
    kept in a repository) and one of its traces."""
    run = run_dir(root / "run", ops, seed=seed, jitter=0)
    report = find_report_files(run)[0]
    kept = root / "kept" / "baseline.json"
    kept.parent.mkdir(parents=True)
    shutil.copy(report, kept)
    (trace,) = (run / "plugins" / "profile").glob("*epoch0/host.pt.trace.json")
    return {"run": run, "report": report, "kept report": kept, "trace": trace}


KINDS = ("run", "report", "kept report", "trace")


@pytest.mark.parametrize("candidate_kind", KINDS)
@pytest.mark.parametrize("baseline_kind", KINDS)
def test_every_kind_of_input_on_either_side(
    baseline_kind: str, candidate_kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _sides(tmp_path / "b", BASE_OPS, seed=1)[baseline_kind]
    same = _sides(tmp_path / "s", BASE_OPS, seed=1)[candidate_kind]
    worse = _sides(tmp_path / "w", slower("aten::cumsum", 2.5), seed=1)[candidate_kind]
    rc, records = as_json(capsys, base, same)
    assert rc == 0, records
    assert row(records, "step_time_ms")["change"] == pytest.approx(0, abs=1e-9)
    expected_kind = {"run": "run directory", "trace": "trace file"}.get(baseline_kind, "report file")
    assert records[0]["baseline_kind"] == expected_kind
    rc, records = as_json(capsys, base, worse)
    assert rc == 1
    assert row(records, "aten::cumsum")["regression"]
    assert row(records, "aten::cumsum")["change"] == pytest.approx(2.0)


def test_an_xspace_trace_is_a_side(capsys: pytest.CaptureFixture[str]) -> None:
    rc, records = as_json(capsys, KERAS_XSPACE, KERAS_XSPACE)
    assert rc == 0
    assert records[0]["baseline_kind"] == "trace file"
    assert row(records, "step_time_ms")["baseline"] == pytest.approx(fitprof.analyze(KERAS_XSPACE).step_time_ms)


# ----------------------------------------------------------------------------------------- not comparable


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"samples_per_step": 64.0}, "samples per step (batch size) 32 vs 64"),
        ({"world_size": 4}, "world size 2 vs 4"),
        ({"fields": {"compute_dtype": "bfloat16"}}, "precision float32 vs bfloat16"),
    ],
)
def test_sides_that_are_not_comparable(
    change: dict[str, Any], reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kwargs: dict[str, Any] = {"world_size": 2, "fields": {"compute_dtype": "float32"}}
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1, **kwargs)
    kwargs.update(change)
    ops = kwargs.pop("ops", BASE_OPS)
    cand = run_dir(tmp_path / "cand", ops, seed=2, **kwargs)
    rc, out, err = run_cli(capsys, base, cand)
    assert rc == 2
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith("fitprof: error: ")
    assert "not comparable" in err and reason in err, err


def test_another_framework_is_not_comparable(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, LIGHTNING_CPU, KERAS_XSPACE)
    assert rc == 2 and out == ""
    assert "framework pytorch vs tensorflow" in err


def test_comparable_raises_in_the_core(tmp_path: Path) -> None:
    base = load_side(run_dir(tmp_path / "base", BASE_OPS, seed=1))
    cand = load_side(run_dir(tmp_path / "cand", BASE_OPS, seed=2, samples_per_step=16))
    with pytest.raises(ValueError, match="batch size"):
        compare(base, cand)
    assert compare(base, cand, check_comparable=False).figures  # on request, compared all the same


# ---------------------------------------------------------------------------------------------- bad input


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = run_dir(tmp_path / "good", BASE_OPS, seed=1)
    empty = tmp_path / "empty"
    empty.mkdir()
    corrupt = tmp_path / "corrupt.pt.trace.json"
    corrupt.write_text('{"traceEvents": [')
    bad_report = tmp_path / "bad" / "plugins" / "fitprof" / "x.rank0.json"
    bad_report.parent.mkdir(parents=True)
    bad_report.write_text('{"report": {"step_time_ms": "fast"}}')
    for bad, words in (
        (tmp_path / "missing", "no such file or folder"),
        (empty, "no fitprof report file below this folder"),
        (corrupt, "corrupt.pt.trace.json"),
        (bad_report, "not a fitprof report"),
        ("memory://fitprof-test-compare-missing/run", "memory://fitprof-test-compare-missing/run: no such file"),
    ):
        for argv in ((good, bad), (bad, good)):
            rc, out, err = run_cli(capsys, *argv)
            assert rc == 2, (bad, rc)
            assert out == ""
            assert len(err.splitlines()) == 1 and err.startswith("fitprof: error: "), err
            assert words in err, err
            assert "Traceback" not in err
    rc, out, err = run_cli(capsys, good, good, "--fail-over", "-3")
    assert rc == 2 and "expected a number >= 0" in err


def test_a_side_at_a_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A baseline run directory at a ``memory://`` URL (fsspec's in-process filesystem): its report files are
    copied and compared as the local folder's are, and every line names the URL."""
    import fsspec

    base = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    cand = run_dir(tmp_path / "cand", slower("aten::cumsum", 2.5), seed=2)
    url = f"memory://fitprof-test-compare-{tmp_path.name}/base"
    fs = fsspec.filesystem("memory")
    fs.put(os.fspath(base), url.removeprefix("memory://"), recursive=True)
    try:
        _, local = as_json(capsys, base, cand)
        rc, remote = as_json(capsys, url, cand)
        assert rc == 1
        assert remote[0]["baseline"] == url and remote[0]["baseline_windows"] == 3
        for rec in remote[1:]:  # the same figures as from the local copy
            assert rec == next(r for r in local if r.get("name") == rec["name"])
        (report,) = [f for f in fs.find(url) if "/plugins/fitprof/" in f and f.endswith("epoch1.rank0.json")]
        fs.pipe(report, b"{")  # damaged: skipped, its warning line names the URL, not the local copy
        rc, out, err = run_cli(capsys, url, cand)
        assert rc == 1 and out
        assert err.startswith(f"fitprof: warning: {url}/plugins/fitprof/") and "not valid JSON" in err, err
        assert len(err.splitlines()) == 1 and "fitprof-compare-" not in err  # no temporary folder
        rc, out, err = run_cli(capsys, url, cand, "--strict")
        assert rc == 2
        assert err.startswith(f"fitprof: error: {url}/plugins/fitprof/") and "fitprof-compare-" not in err, err
    finally:
        fs.rm(url.removeprefix("memory://"), recursive=True)


# -------------------------------------------------------------------------------------------------- output


def test_markdown_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    cand = run_dir(tmp_path / "cand", slower("aten::cumsum", 2.5), seed=2)
    _, records = as_json(capsys, base, cand)
    rc, out, err = run_cli(capsys, base, cand, "--format", "markdown")
    assert rc == 1, err
    lines = out.splitlines()
    assert lines[0] == "### fitprof compare: REGRESSION"
    assert lines[2] == f"**{records[0]['headline']}**"
    tables = [ln for ln in lines if ln.startswith("|")]
    header = next(ln for ln in tables if ln.startswith("| operator |"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    rows = {}
    for ln in tables[tables.index(header) + 2 :]:
        values = [c.strip() for c in ln.strip("|").split("|")]
        assert len(values) == len(cells)  # a well-formed row: as many cells as the header
        rows[values[0]] = dict(zip(cells, values, strict=True))
    cumsum = rows["aten::cumsum"]
    assert cumsum["verdict"] == "REGRESSION"
    op = row(records, "aten::cumsum")
    assert float(cumsum["baseline ms/step"]) == pytest.approx(op["baseline"], rel=1e-3)
    assert float(cumsum["candidate ms/step"]) == pytest.approx(op["candidate"], rel=1e-3)
    assert float(cumsum["change %"]) == pytest.approx(op["change_percent"], abs=0.05)
    assert rows["aten::addmm"]["verdict"] != "REGRESSION"
    step_row = next(ln for ln in tables if ln.startswith("| step time |"))
    assert "REGRESSION" in step_row


def test_table_output_and_out_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    out_file = tmp_path / "cmp.txt"
    rc, out, err = run_cli(capsys, base, base, "--out", out_file)
    assert rc == 0 and out == "" and err == ""
    text = out_file.read_text()
    assert text.splitlines()[0] == "fitprof compare: no regression"
    assert text.splitlines()[1].startswith("ok: step time +0.0%")


# ---------------------------------------------------------------------------------------------- real runs


_SLOW_OP: Any = None


def _slow_op() -> Any:
    """``fitprof_test::slow(x, ms)``: sleeps ``ms`` and returns a copy of ``x`` (registered once a process)."""
    global _SLOW_OP
    if _SLOW_OP is None:
        import time

        import torch

        @torch.library.custom_op("fitprof_test::slow", mutates_args=(), schema="(Tensor x, float ms) -> Tensor")
        def slow(x: Any, ms: float) -> Any:
            if ms > 0:  # time.sleep(0) still gives up the core, which takes milliseconds to get back on a busy machine
                time.sleep(ms / 1000)
            return x.clone()

        slow.register_fake(lambda x, ms: torch.empty_like(x))
        slow.register_autograd(lambda ctx, grad: (grad, None))
        _SLOW_OP = slow
    return _SLOW_OP


def _lightning_run(root: Path, name: str, sleep_ms: float, **kwargs: Any) -> tuple[Path, Any]:
    """A tiny MLP for 5 epochs of 30 steps, a 10-step window each (5 windows: an operator must be ranked in 3 of
    them to regress, which a stall on a busy machine does not do), calling ``fitprof_test::slow`` every step,
    logged with a ``TensorBoardLogger`` whose run directory the callback writes into; returns it and the
    callback."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch.utils.data import DataLoader, TensorDataset

    from fitprof.lightning import FitProfiler

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    slow = _slow_op()

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(slow(x, sleep_ms)), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(30 * 16, 32, generator=g), torch.randint(0, 4, (30 * 16,), generator=g))
    profiler = FitProfiler(profile_batch=(6, 15), verbose=False, **kwargs)
    trainer = pl.Trainer(
        max_epochs=5,
        accelerator="cpu",
        devices=1,
        logger=TensorBoardLogger(root, name=name, version=0),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[profiler],
    )
    trainer.fit(Model(), DataLoader(data, batch_size=16))
    profiler.trainer = trainer  # for its callback_metrics
    return Path(trainer.log_dir or ""), profiler


@pytest.mark.slow
def test_real_lightning_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two runs of the same code pass; a run whose ``fitprof_test::slow`` sleeps 20 ms a step more fails and
    names it. Sleep-modelled: 20 ms is several times the ~1-3 ms steps of this model, and of the few ms a woken
    thread waits for a core on a machine at load 10-16 (2 cores). The operator floor is 2 ms a step, as a CI job
    on a shared runner would set it: on a loaded 2-core machine a small operator preempted inside its windows read
    0.96-2.2 ms a step against 0.02-0.07 ms in the other runs (benchmarks/compare_false_alarms.py)."""
    pytest.importorskip("lightning")
    base, base_profiler = _lightning_run(tmp_path, "base", 0.0)
    same, _ = _lightning_run(tmp_path, "same", 0.0)
    worse, _ = _lightning_run(tmp_path, "worse", 20.0)
    # On a busy machine the runs are CPU-contended: then the answer is "inconclusive" (3), naming the side, and the
    # figures are still computed; never a regression for the same code, never "ok" for the slower one.
    rc, records = as_json(capsys, base, same, "--min-ms", "2")
    assert rc == 0 or (rc == 3 and records[0]["contention"]), records[0]["headline"]
    assert not any(r.get("regression") for r in records), records[0]["headline"]
    # the always-on step timing, read back from the per-epoch file: what the callback measured
    logged = [base_profiler.epoch_steps[e].step_time_ms_p50 for e in range(5)]
    assert load_side(base).epochs[EPOCH_STEP_TIME_MS_P50.key] == pytest.approx(logged, rel=1e-6)
    # every clean step is kept beside its epoch's figures, and the setup the run was measured on
    (epoch_file,) = find_epoch_files(base)
    for rec in read_epoch_file(epoch_file):
        assert len(rec.step_ms) == rec.figures[EPOCH_STEPS_TIMED.key] > 0
        assert float(np.median(rec.step_ms)) == pytest.approx(rec.figures[EPOCH_STEP_TIME_MS_P50.key], abs=1e-3)
        assert rec.setup == {
            "backend": "torch",
            "parameters": str(32 * 64 + 64 + 64 * 4 + 4),
            "structure": structure_fingerprint(["Model", "Sequential", "Linear", "ReLU", "Linear"]),
            "precision": "32-true",
            "device": "cpu",
        }
    assert len(load_side(base).steps) == 1
    rc, records = as_json(capsys, base, worse, "--min-ms", "2")
    assert rc == 1 or (rc == 3 and records[0]["contention"]), records[0]["headline"]
    assert "fitprof_test::slow" in records[0]["headline"]
    op = row(records, "fitprof_test::slow")
    # contended, the operator's windows hold its wait for a core after each sleep, which the step's median need not
    # show as much: past its thresholds, it may be held by the step-relative rule; uncontended, it is a regression
    assert op["change"] > 15.0 and op["significant"], op
    assert op["regression"] or (rc == 3 and op["step_held"]), op
    # a side given as one report file, the other as a trace of the run
    trace = next(worse.glob("*.pt.trace.json.gz"))  # the Lightning callback writes its traces in the run directory
    # (one window a side: on a busy machine the baseline's window may have held a stall as long as the operator's
    # growth, and then the step did not grow by it; the operator is past its thresholds either way)
    rc, records = as_json(capsys, find_report_files(base)[0], trace, "--min-ms", "2")
    op = row(records, "fitprof_test::slow")
    assert op["change"] > 15.0 and (op["regression"] or op["step_held"]), op
    assert rc in (1, 3) or op["step_held"]


# ------------------------------------------------------------------------------ one window against a baseline


def test_one_window_against_a_baseline(tmp_path: Path) -> None:
    """What the callbacks' ``baseline=`` logs: the window's step time against the baseline's mean, in percent, the
    operator that grew most in the summary line, and whether it is a regression."""
    base = load_baseline(run_dir(tmp_path / "base", BASE_OPS, seed=1))
    slow_trace = kineto_window(tmp_path / "slow.pt.trace.json", slower("aten::cumsum", 2.5), seed=7, jitter=0.02)
    report = dataclasses.replace(fitprof.analyze(slow_trace), samples_per_step=32.0)
    vs = against_baseline(base, report, epoch=3)
    base_ms = np.mean([w.report.step_time_ms for w in base.windows])
    assert vs.step_time_percent == pytest.approx(100 * (report.step_time_ms / base_ms - 1), rel=1e-9)
    assert vs.step_time_percent > 20
    assert vs.regressed
    assert "the operator that grew most: aten::cumsum" in vs.line()
    same_trace = kineto_window(tmp_path / "same.pt.trace.json", BASE_OPS, seed=8, jitter=0.02)
    same = against_baseline(base, dataclasses.replace(fitprof.analyze(same_trace), samples_per_step=32.0))
    assert not same.regressed and abs(same.step_time_percent) < 5
    assert same.line().startswith(f"Against the baseline {base.path} (no regression): step time")
    other = against_baseline(base, dataclasses.replace(fitprof.analyze(same_trace), samples_per_step=64.0))
    assert other.comparison is None and math.isnan(other.step_time_percent) and not other.regressed
    assert "batch size" in other.line()


def test_a_baseline_is_a_run_directory_or_a_report_file(tmp_path: Path) -> None:
    run = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    assert load_baseline(run).kind == "run directory"
    assert load_baseline(find_report_files(run)[0]).kind == "report file"
    (trace,) = (run / "plugins" / "profile").glob("*epoch0/host.pt.trace.json")
    with pytest.raises(CompareInputError, match="not a trace file"):
        load_baseline(trace)
    with pytest.raises(CompareInputError, match="no such file or folder"):
        load_baseline(tmp_path / "missing")


@pytest.mark.slow
def test_baseline_in_the_lightning_callback(tmp_path: Path) -> None:
    """``FitProfiler(baseline=...)``: a run whose ``fitprof_test::slow`` sleeps 20 ms a step more than the baseline's
    logs a positive ``fitprof/vs_baseline/step_time_percent`` through Lightning's logging (``callback_metrics``)
    and warns once, naming the operator (the engine test reads the text summary)."""
    pytest.importorskip("lightning")
    base, _ = _lightning_run(tmp_path, "base", 0.0)
    with pytest.warns(fitprof.FitProfilerWarning, match="regressed") as caught:
        _, profiler = _lightning_run(tmp_path, "worse", 20.0, baseline=base)
    assert len([w for w in caught if "regressed" in str(w.message)]) == 1
    assert "fitprof_test::slow" in str(next(w for w in caught if "regressed" in str(w.message)).message)
    pct = float(profiler.trainer.callback_metrics[VS_BASELINE_STEP_TIME_PERCENT.key])
    base_ms = np.mean([load_side(f).windows[0].report.step_time_ms for f in find_report_files(base)])
    last = profiler.reports[max(profiler.reports)]
    assert pct == pytest.approx(100 * (last.step_time_ms / base_ms - 1), rel=1e-5)
    assert pct > 0


@pytest.mark.parametrize("adapter", ["lightning", "keras"])
def test_both_callbacks_take_a_baseline(adapter: str, tmp_path: Path) -> None:
    """The same ``baseline=`` in both callbacks, handed to the engine: read at construction, a missing one refused
    there with the path named."""
    module = pytest.importorskip(f"fitprof.{adapter}")
    run = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    profiler = module.FitProfiler(log_dir=tmp_path / "logs", baseline=run)
    assert profiler._engine.baseline is not None and len(profiler._engine.baseline.windows) == 3
    with pytest.raises(ValueError, match=f"{tmp_path / 'missing'}: no such file or folder"):
        module.FitProfiler(log_dir=tmp_path / "logs", baseline=tmp_path / "missing")


# ------------------------------------------------------------------------------ a run with one unreadable report


def _damaged(run: Path, dest: Path) -> tuple[Path, Path]:
    """A copy of ``run`` with one report file cut to 0 bytes (a run killed mid-write); the copy and that file."""
    shutil.copytree(run, dest)
    bad = find_report_files(dest)[1]
    bad.write_bytes(b"")
    return dest, bad


def test_compare_skips_an_unreadable_report_as_report_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One truncated report file beside good ones: ``compare`` prints the same warning line ``fitprof report``
    prints for it, compares the good windows and exits 0; ``--strict`` makes it an error (exit 2); a folder with
    no readable report at all is exit 2."""
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    damaged, bad = _damaged(run_dir(tmp_path / "cand", BASE_OPS, seed=2), tmp_path / "damaged")
    capsys.readouterr()
    assert main(["report", os.fspath(damaged)]) == 0
    report_err = capsys.readouterr().err.splitlines()
    assert len(report_err) == 1 and os.fspath(bad) in report_err[0], report_err
    for argv in ((base, damaged), (damaged, base)):
        rc, out, err = run_cli(capsys, *argv, "--format", "json")
        assert rc == 0, err
        assert err.splitlines() == report_err
        head = json.loads(out)[0]
        assert head["baseline_windows" if argv[0] == damaged else "candidate_windows"] == 2
        rc, out, err = run_cli(capsys, *argv, "--strict")
        assert rc == 2
        assert err.splitlines() == [
            report_err[0].replace("fitprof: warning:", "fitprof: error:").removesuffix(" (skipped)")
        ]
    for f in find_report_files(damaged):
        f.write_bytes(b"")
    rc, out, err = run_cli(capsys, base, damaged)
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and "no readable report file" in err and os.fspath(bad) in err, err


@pytest.mark.parametrize("adapter", ["lightning", "keras"])
def test_a_baseline_with_one_unreadable_report(adapter: str, tmp_path: Path) -> None:
    """``FitProfiler(baseline=DIR)`` with one truncated report file beside good ones reads the good ones and warns
    once naming the bad file; with none readable it raises, and a folder with no report names only what a baseline
    may be (no trace file)."""
    module = pytest.importorskip(f"fitprof.{adapter}")
    damaged, bad = _damaged(run_dir(tmp_path / "base", BASE_OPS, seed=1), tmp_path / "damaged")
    with pytest.warns(fitprof.FitProfilerWarning) as caught:
        profiler = module.FitProfiler(log_dir=tmp_path / "logs", baseline=damaged)
    assert profiler._engine.baseline is not None and len(profiler._engine.baseline.windows) == 2
    named = [w for w in caught if os.fspath(bad) in str(w.message)]
    assert len(named) == 1 and len(caught) == 1, [str(w.message) for w in caught]
    assert str(named[0].message).startswith("fitprof: ")
    for f in find_report_files(damaged):
        f.write_bytes(b"")
    with pytest.raises(ValueError, match="no readable report file"):
        module.FitProfiler(log_dir=tmp_path / "logs", baseline=damaged)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no fitprof report file") as raised:
        module.FitProfiler(log_dir=tmp_path / "logs", baseline=empty)
    assert "a baseline is a run directory or a report file" in str(raised.value)
    assert "trace" not in str(raised.value)


def test_the_operator_that_grew_most_is_chosen_by_ms_per_step(tmp_path: Path) -> None:
    """The headline names the operator whose time per step grew most in ms, not in percent: a 0.01 ms operator
    grown by 80% beside a 0.5 ms one grown by 80% names the larger; alone, a steady 0.01 -> 0.018 ms growth (beyond
    its noise, under ``min_ms``) names no operator."""
    base = load_side(run_dir(tmp_path / "base", BASE_OPS, seed=1))
    tiny = load_side(run_dir(tmp_path / "tiny", slower("aten::tiny", 0.018), seed=2))
    result = compare(base, tiny)
    grown = row(compare_records(result), "aten::tiny")
    assert grown["significant"] and grown["change_percent"] > 50, grown  # grown beyond its noise, by 80%
    assert result.grew_most() is None
    assert "grew most" not in result.headline() and "aten::tiny" not in result.headline()
    both = load_side(run_dir(tmp_path / "both", {**slower("aten::tiny", 0.03), "aten::cumsum": 0.9}, seed=3))
    result = compare(base, both, fail_over_percent=1000.0)  # no regression: the grown operator is named instead
    assert (
        row(compare_records(result), "aten::tiny")["change_percent"]
        > row(compare_records(result), "aten::cumsum")["change_percent"]
    )
    op = result.grew_most()
    assert op is not None and op.name == "aten::cumsum"
    assert "the operator that grew most: aten::cumsum +" in result.headline()


def test_every_verdict_printed_is_documented(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The verdicts a compare table prints (a run against itself: ``same``; against a slower run: ``REGRESSION``,
    ``worse``, ...) are each in docs/cli.md's list of verdicts."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    cand = run_dir(tmp_path / "cand", slower("aten::cumsum", 2.5), seed=2)
    verdicts = set()
    for argv in ((base, base), (base, cand)):
        _, out, _ = run_cli(capsys, *argv)
        table = False
        for line in out.splitlines():
            if line.startswith(("figure ", "operator ")) and line.rstrip().endswith("verdict"):
                table = True  # a table's header; its rows follow the dashes, up to a blank line
            elif not line.strip():
                table = False
            elif table and not line.startswith("-"):
                verdicts.add(re.split(r"\s{2,}", line.strip())[-1].removesuffix(" (new)"))
    assert "same" in verdicts and "REGRESSION" in verdicts, verdicts
    missing = [v for v in verdicts if f"`{v}`" not in docs]
    assert not missing, missing

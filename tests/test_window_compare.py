"""fitprof.fit.pipeline and fitprof.fit.epoch_end: the triggered-vs-normal window comparison and the "not representative" note of the epoch-end
summary, on a report of a real shipped trace (framework-free)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import fitprof
from fitprof import metrics
from fitprof._warn import WarnOnce
from fitprof.analysis import OpStat
from fitprof.fit.epoch_end import compare_windows
from fitprof.fit.pipeline import WindowPipeline
from fitprof.fit.result import EpochLog
from fitprof.fit.steps import EpochSteps

TRACE = Path(__file__).parent / "data" / "lightning_cpu.pt.trace.json.gz"


def _epoch(mean: float, input_pct: float, steps: int = 100) -> EpochSteps:
    return EpochSteps(steps, 3, mean, mean, mean, mean, input_pct, math.nan)


def test_compare_windows_names_what_changed() -> None:
    normal = fitprof.analyze(TRACE)
    top = normal.top_ops[0]
    grown = OpStat("aten::bmm", 3 * normal.step_time_ms, 75.0)
    slow = dataclasses.replace(
        normal,
        step_time_ms=4 * normal.step_time_ms,
        input_percent=normal.input_percent + 1.0,
        top_ops=[grown, *normal.top_ops],
    )
    said = compare_windows(slow, normal, 2)
    assert said.startswith(
        f"vs the normal window of epoch 2: step {normal.step_time_ms:.1f} -> {slow.step_time_ms:.1f} ms, "
        f"input {normal.input_percent:.1f}% -> {slow.input_percent:.1f}%, HtoD "
    )
    assert said.endswith(f"grew most: aten::bmm 0.00 -> {grown.self_ms_per_step:.2f} ms/step")
    # A wobble under 5% of the step names no operator.
    wobble = dataclasses.replace(top, self_ms_per_step=top.self_ms_per_step + 0.01 * normal.step_time_ms)
    same = dataclasses.replace(normal, top_ops=[wobble, *normal.top_ops[1:]])
    assert compare_windows(same, normal, 0).endswith("no operator grew by 5% of the step or more")
    assert compare_windows(slow, None, None) == "no normal window to compare with"


def test_the_summary_says_when_the_window_is_not_representative() -> None:
    report = fitprof.analyze(TRACE)
    logged: list[EpochLog] = []
    pipeline = WindowPipeline(top_k=3, max_trace_mb=None, keep_last_windows=None, warn=WarnOnce())
    like = _epoch(report.step_time_ms, report.input_percent)
    unlike = _epoch(report.step_time_ms / 3, report.input_percent + 30.0)
    for steps in (None, like, unlike, dataclasses.replace(unlike, steps_timed=9)):
        _, entry = pipeline.gather(0, report, rank=0, world_size=1, gather=None, epoch_steps=steps)
        assert entry is not None
        logged.append(entry)
    notes = ["not representative" in entry.line for entry in logged]
    assert notes == [False, False, True, False]  # no figures, agreeing figures, off figures, too few steps
    line, text = logged[2].line, logged[2].text
    scalars = logged[2].scalars
    assert line.endswith(
        f"; the window is not representative of its epoch (step time {scalars[metrics.STEP_TIME_MS.key]:.1f} ms vs "
        f"a median of {unlike.step_time_ms_p50:.1f} ms over the epoch's 100 timed steps; input "
        f"{scalars[metrics.INPUT_PERCENT.key]:.1f}% vs {unlike.input_percent:.1f}% for the epoch)"
    )
    assert text.startswith("Note: the window is not representative of its epoch (")

"""``fitprof/optimizer_ms_per_step``: the union of torch's ``Optimizer.step#...`` spans inside the analysed steps,
less validation, checkpoint saves and fitprof's own spans, per step; NaN where the trace has none. Read through the
real Kineto reader and analysis from planted traces, and logged under its key by ``BottleneckReport.scalars()``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import fitprof
from fitprof import metrics
from fitprof.traces._table import CHECKPOINT_ANNOTATION, OVERHEAD_ANNOTATION, VALIDATION_ANNOTATION


def _span(name: str, t0_ms: float, t1_ms: float, cat: str = "user_annotation", pid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": 1, "ts": t0_ms * 1e3, "dur": (t1_ms - t0_ms) * 1e3}


def _trace(tmp_path: Path, events: list[dict[str, Any]]) -> Path:
    steps = [_span("ProfilerStep#1", 0, 100), _span("ProfilerStep#2", 100, 200)]
    path = tmp_path / "planted.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": steps + events}))
    return path


def test_the_optimizer_steps_are_unioned_clipped_and_less_what_is_not_training(tmp_path: Path) -> None:
    trace = _trace(
        tmp_path,
        [
            _span("Optimizer.step#SGD.step", 50, 70),  # step 1: 20 ms ...
            _span(OVERHEAD_ANNOTATION, 60, 62),  # ... less 2 ms of fitprof's own
            _span("Optimizer.step#SGD.step", 150, 165),  # step 2: two overlapping spans, 25 ms together ...
            _span("Optimizer.step#Adam.step", 160, 175),
            _span(VALIDATION_ANNOTATION, 165, 170),  # ... less 5 ms of validation
            _span(CHECKPOINT_ANNOTATION, 172, 173),  # ... less a 1 ms save
            _span("Optimizer.step#SGD.step", 250, 260),  # outside the steps: not counted
        ],
    )
    report = fitprof.analyze(trace)
    assert report.steps_analyzed == 2
    want = ((20 - 2) + (25 - 5 - 1)) / 2  # ms per step
    assert report.optimizer_ms_per_step == pytest.approx(want, rel=1e-9)
    assert report.scalars()[metrics.OPTIMIZER_MS_PER_STEP.key] == pytest.approx(want, rel=1e-9)


def test_a_trace_without_optimizer_spans_gives_nan(tmp_path: Path) -> None:
    report = fitprof.analyze(_trace(tmp_path, [_span("aten::mm", 10, 20, cat="cpu_op")]))
    assert report.steps_analyzed == 2
    assert math.isnan(report.optimizer_ms_per_step)
    assert math.isnan(report.scalars()[metrics.OPTIMIZER_MS_PER_STEP.key])


def test_a_shipped_lightning_trace_has_its_optimizer_steps() -> None:
    report = fitprof.analyze(Path(__file__).parent / "data" / "lightning_cpu.pt.trace.json.gz")
    assert 0 < report.optimizer_ms_per_step < report.step_time_ms

"""The shipped Keras XSpace (``tests/data/keras_tf_cpu.xplane.pb``, a 3-step window of a real Keras 3 /
TensorFlow run, see ``tests/data/README.md``) read by fitprof, against two readers that share nothing with it:
``tests/handcount.py`` (the protobuf wire format, byte by byte) and xprof's own tools. The file never changes, so
these comparisons give the same answer on every run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import fitprof
import handcount
from shared_fixtures import KERAS_XSPACE

PREFIX = "StatefulPartitionedCall/"


@pytest.fixture(scope="module")
def report() -> fitprof.BottleneckReport:
    return fitprof.analyze(KERAS_XSPACE, top_k=10)


def test_figures_equal_the_hand_count(report: fitprof.BottleneckReport) -> None:
    counts = handcount.count_xspace(KERAS_XSPACE)
    assert counts["steps"] == [6, 7, 8]  # FitProfiler(profile_batch=(6, 8))
    assert counts["device_events"] == 0  # a CPU run
    assert report.framework == "tensorflow"
    assert report.steps_analyzed == 3
    assert report.step_time_ms == pytest.approx(counts["window_us"] / 3 / 1e3, rel=1e-9)
    assert report.input_ms_per_step == pytest.approx(counts["input_us"] / 3 / 1e3, rel=1e-9)
    assert report.input_percent == pytest.approx(100 * counts["input_us"] / counts["window_us"], rel=1e-9)
    assert (report.htod_ms_per_step, report.collective_ms_per_step) == (0.0, 0.0)
    assert report.op_time_source == "host"
    ops = {name.removeprefix(PREFIX) for name in counts["ops"]}
    assert {op.name for op in report.top_ops} <= ops
    # the recording is input-bound by construction (per-sample SciPy augmentation, no parallel map)
    assert report.verdict == "input-bound" and report.input_percent > 40


def _xprof_table(path: Path, tool: str) -> tuple[list[str], list[list[Any]]]:
    xprof = pytest.importorskip("xprof.convert.raw_to_tool_data")
    data = xprof.xspace_to_tool_data([str(path)], tool, {})
    doc = json.loads(data[0] if isinstance(data, tuple) else data)
    table = doc[1]
    cols = [c["id"] for c in table["cols"]]
    rows = [[c.get("v") if c else None for c in r["c"]] for r in table["rows"]]
    return cols, rows


def test_figures_agree_with_xprof(report: fitprof.BottleneckReport, tmp_path: Path) -> None:
    """Tolerances as in test_keras.py's live comparison (same definitions, different bookkeeping): step time 0.5%
    relative, input share 0.5 pp, op self time 2%."""
    path = Path(shutil.copy(KERAS_XSPACE, tmp_path / KERAS_XSPACE.name))  # xprof writes caches beside the file
    cols, rows = _xprof_table(path, "input_pipeline_analyzer")
    step_ms = [r[cols.index("stepTimeMs")] for r in rows]
    infeed_ms = [r[cols.index("infeedTimeMs")] for r in rows]
    assert len(rows) == report.steps_analyzed == 3
    assert report.step_time_ms == pytest.approx(sum(step_ms) / len(step_ms), rel=5e-3)
    assert report.input_percent == pytest.approx(100 * sum(infeed_ms) / sum(step_ms), abs=0.5)

    cols, rows = _xprof_table(path, "framework_op_stats")
    xprof_self = {
        str(r[cols.index("operation")]).removeprefix(PREFIX): r[cols.index("total_self_time")] / 1e3 / 3 for r in rows
    }
    for op in report.top_ops:
        assert op.self_ms_per_step == pytest.approx(xprof_self[op.name], rel=0.02), op.name

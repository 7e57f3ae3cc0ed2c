"""The metrics registry is the one list of a window's figures: each ``Metric`` names the report field it is read
from, and ``BottleneckReport.scalars()``, the logged keys and the CSV columns follow from it. A figure that is
registered but never filled (NaN from every trace and every count) fails here; so does one whose field is not read."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

import fitprof
from fitprof import metrics
from fitprof.analysis import BottleneckReport
from fitprof.fit.pipeline import logged_keys
from fitprof.throughput import StepWork, with_throughput

DATA = Path(__file__).parent / "data"
TRACES = ["lightning_cpu.pt.trace.json.gz", "keras_tf_cpu.xplane.pb", "ddp_gloo_rank0.pt.trace.json.gz"]
# What an adapter counts beside the trace (a 100-sample batch of 1 GFLOP on an A100 in bfloat16): the throughput
# figures are filled from it, as the callbacks fill them.
WORK = StepWork(
    samples_per_step=100.0, items_per_step=1000.0, flops_per_step=1e9, flops_samples=100.0, device_name="A100",
    dtype="bfloat16",
)  # fmt: skip
REPORT_FIELDS = {f.name for f in dataclasses.fields(BottleneckReport)}
NOT_REPORT_FIELDS = {metrics.TOP_OP_RANKED, metrics.TOP_OP, metrics.VS_BASELINE_STEP_TIME_PERCENT}
"""The window figures that are not one report field each: the operators by rank and by name, and the baseline
comparison (the engine's)."""


@pytest.fixture(scope="module")
def reports() -> list[BottleneckReport]:
    return [with_throughput(fitprof.analyze(DATA / name), WORK) for name in TRACES]


def test_every_window_figure_names_a_report_field() -> None:
    window = metrics.in_group("")
    assert set(window) - set(metrics.BASE_METRICS) == NOT_REPORT_FIELDS
    for m in (*metrics.BASE_METRICS, *metrics.CHURN_METRICS):
        assert m.field in REPORT_FIELDS, m
        assert m.key == metrics.PREFIX + m.field, m  # a figure is logged under its field's name
    assert tuple(m.key for m in metrics.BASE_METRICS) == metrics.BASE_KEYS
    assert set(metrics.BASE_KEYS) <= set(logged_keys(top_k=1))


def test_scalars_read_each_figure_from_the_field_it_names(reports: list[BottleneckReport]) -> None:
    """Every registered field set to its own value: ``scalars()`` gives back that value under the figure's key."""
    planted = {m.field: 1000.0 + i for i, m in enumerate(metrics.BASE_METRICS)}
    report = dataclasses.replace(reports[0], **planted)  # type: ignore[arg-type]
    scalars = report.scalars()
    assert {m.key: scalars[m.key] for m in metrics.BASE_METRICS} == {
        m.key: planted[m.field] for m in metrics.BASE_METRICS
    }


@pytest.mark.parametrize("metric", metrics.BASE_METRICS, ids=lambda m: m.key)
def test_every_registered_figure_is_filled_by_some_trace(
    metric: metrics.Metric, reports: list[BottleneckReport]
) -> None:
    """A figure logged as NaN whatever the trace is a figure nobody computes."""
    values = [r.scalars()[metric.key] for r in reports]
    assert any(math.isfinite(v) for v in values), (metric.key, values)


def test_the_csv_columns_carry_every_registered_figure() -> None:
    from fitprof.cli.render import _CSV_COLUMNS

    assert {m.field for m in (*metrics.BASE_METRICS, *metrics.CHURN_METRICS)} <= set(_CSV_COLUMNS)

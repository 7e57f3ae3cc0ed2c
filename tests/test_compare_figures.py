"""The figures ``fitprof compare`` compares come from the metrics registry: each is one :mod:`fitprof.metrics` row
with a ``compared``, and such a row is all it takes to compare a figure."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import fitprof
from fitprof import compare as cmp
from fitprof import metrics
from fitprof.analysis import BottleneckReport

TRACE = Path(__file__).resolve().parent / "data" / "lightning_cpu.pt.trace.json.gz"


def _read_by(m: metrics.Metric) -> str:
    """What a figure is read by: an every-step figure its ``fitprof/epoch/*`` key, a window figure its field."""
    assert m.compared is not None
    return m.key if m.compared.every_step else m.field


def test_every_compared_figure_is_one_registry_row() -> None:
    report_fields = {f.name for f in dataclasses.fields(BottleneckReport)}
    rows = metrics.compared_metrics()
    assert len(cmp.FIGURES) == len(rows)
    for fig in cmp.FIGURES:
        (m,) = [m for m in rows if _read_by(m) == fig.field]
        assert m.compared is not None
        c = m.compared
        assert (fig.label, fig.unit, fig.higher_is_worse, fig.gate, fig.every_step) == (
            c.label,
            c.unit,
            c.higher_is_worse,
            c.gate,
            c.every_step,
        ), fig.field
        if fig.every_step:
            assert fig.field.startswith(metrics.EPOCH_PREFIX)
        else:
            assert fig.field in report_fields
        assert fig.gate in ("", *cmp.GATES)
    assert [_read_by(m) for m in rows] == [f.field for f in cmp.FIGURES]  # the registry's order
    assert metrics.EPOCH_INPUT_MS_PER_STEP.key == cmp.EVERY_STEP_INPUT_MS


def test_figures_compared_but_not_logged_stay_out_of_the_logged_keys() -> None:
    logged = set(metrics.ALL)
    assert metrics.COMPARE_ONLY_METRICS
    for m in metrics.COMPARE_ONLY_METRICS:
        assert m.compared is not None
        assert m not in logged and m.key not in metrics.BASE_KEYS
    for m in metrics.compared_metrics():
        assert m in logged or m in metrics.COMPARE_ONLY_METRICS, m.key


def _side(name: str, report: BottleneckReport) -> cmp.Side:
    return cmp.Side(path=name, kind=cmp.KIND_REPORT, windows=[cmp.Window(report)])


def test_a_comparison_on_a_metric_row_is_enough_to_compare_it(monkeypatch: pytest.MonkeyPatch) -> None:
    report = fitprof.analyze(TRACE)
    base = _side("base", dataclasses.replace(report, htod_percent=1.0))
    cand = _side("cand", dataclasses.replace(report, htod_percent=3.0))
    assert "htod_percent" not in {c.name for c in cmp.compare(base, cand).figures}

    spec = metrics.Compared("host-to-device share", "%", 75)
    monkeypatch.setattr(metrics, "HTOD_PERCENT", dataclasses.replace(metrics.HTOD_PERCENT, compared=spec))
    monkeypatch.setattr(cmp, "FIGURES", cmp.figures_of(metrics.compared_metrics()))
    figures = cmp.compare(base, cand).figures
    (change,) = [c for c in figures if c.name == "htod_percent"]
    assert (change.label, change.unit, change.change) == ("host-to-device share", "%", pytest.approx(2.0))
    assert change.worse
    names = [f.field for f in cmp.FIGURES]
    assert names.index("htod_ms_per_step") + 1 == names.index("htod_percent") == names.index("dtoh_ms_per_step") - 1


def test_every_compared_figure_is_in_the_metrics_page() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    missing = [
        f.field for f in cmp.FIGURES if f"`{f.field}`" not in page and f"`{metrics.PREFIX}{f.field}`" not in page
    ]
    assert not missing, f"compared figures not in docs/metrics.md: {missing}"

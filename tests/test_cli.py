"""The ``fitprof`` command: ``analyze`` on real traces (the ones shipped in ``tests/data``, and the shared GPU
traces of ``../shared/fixtures`` when they are there) and on synthetic multi-rank traces, ``report`` on a real
Keras example run and on built log folders, the plot, and every kind of bad input (built from shipped files)."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import gzip
import io
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import fitprof
from fitprof import analyze_table, read_trace
from fitprof.analysis import one_line
from fitprof.cli import analyze as cli_analyze
from fitprof.cli import compare as cli_compare
from fitprof.cli import main
from fitprof.cli.arguments import NumberOption, non_negative_float, positive_float, positive_int
from fitprof.cli.command import COMMANDS, build_parser
from fitprof.metrics import top_op_key
from fitprof.report_files import clean_json as _clean
from fitprof.report_files import write_report_file
from planted import write_run_trace, xus
from shared_fixtures import DDP_RANKS, KERAS_XSPACE, LIGHTNING_CPU, SHARED_KINETO, shared_kineto

REPORT_FIELDS = tuple(fitprof.BottleneckReport.__dataclass_fields__)
NUMBER_KINDS = (positive_int, positive_float, non_negative_float)
DATALOADER_NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
# rank / world_size from each trace's distributedInfo (see tests/data/README.md, ../shared/fixtures/README.md)
FIXTURE_RANKS = {
    "lightning_cpu.pt.trace.json.gz": (None, None),
    "ddp_gloo_rank0.pt.trace.json.gz": (0, 2),
    "ddp_gloo_rank1.pt.trace.json.gz": (1, 2),
    "keras_tf_cpu.xplane.pb": (None, None),
    "a100_alexnet_pageable_htod.json.gz": (0, None),
    "a100_ddp8_rank3_dataloader.json.gz": (3, 8),
    "a100_sampled_rank0.json.gz": (0, 128),
    "cpu_only_rank34.pt.trace.json.gz": (34, 300),
    "mi250_rocm_minitoy_train.json.gz": (None, None),
}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str | os.PathLike[str]) -> tuple[int, str, str]:
    """``main(argv)`` in-process: exit status, stdout, stderr."""
    capsys.readouterr()
    rc = main([os.fspath(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def same(a: Any, b: Any) -> bool:
    """Equal, with floats compared to 1e-9 relative (JSON round trip) and None == None."""
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


# ----------------------------------------------------------------------------------------- synthetic traces


def write_kineto(
    path: Path,
    *,
    step_us: float,
    input_us: float,
    steps: int = 3,
    rank: int | None = None,
    world_size: int | None = None,
) -> Path:
    """A small Kineto trace: ``steps`` ``ProfilerStep#N`` of ``step_us``, each opening with a DataLoader wait of
    ``input_us`` and then one ``aten::addmm`` filling the rest; ``distributedInfo`` when ``rank`` is given."""

    events: list[dict[str, Any]] = []
    t = 1000.0
    for n in range(1, steps + 1):
        events.append(xus("user_annotation", f"ProfilerStep#{n}", t, step_us))
        events.append(xus("user_annotation", DATALOADER_NEXT, t, input_us))
        events.append(xus("cpu_op", "aten::addmm", t + input_us, step_us - input_us))
        t += step_us
    return write_run_trace(path, events, rank=rank, world_size=world_size)


@pytest.fixture()
def two_ranks(tmp_path: Path) -> list[Path]:
    """Rank 0: 10 ms steps, 1 ms input wait; rank 1: 25 ms steps, 10 ms input wait (world size 2)."""
    return [
        write_kineto(
            tmp_path / "ddp" / "host_rank0.pt.trace.json", step_us=10_000, input_us=1_000, rank=0, world_size=2
        ),
        write_kineto(
            tmp_path / "ddp" / "host_rank1.pt.trace.json", step_us=25_000, input_us=10_000, rank=1, world_size=2
        ),
    ]


def build_logdir(root: Path, runs: dict[str, dict[tuple[int, int], Path]]) -> Path:
    """A log folder with one fitprof run per key of ``runs``: ``{(epoch, rank): trace}`` analysed and written as
    ``<run>/plugins/profile/<session>/`` (the trace copied in) and ``<run>/plugins/fitprof/<session>.rank<r>.json``, as the
    callbacks lay them out."""
    for run, windows in runs.items():
        for (epoch, rank), trace in windows.items():
            session = root / run / "plugins" / "profile" / f"2026_01_01_00_00_0{epoch}_rank{rank}"
            session.mkdir(parents=True)
            copy = Path(shutil.copy(trace, session / trace.name))
            report = dataclasses.replace(fitprof.analyze(copy), rank=rank)
            write_report_file(root / run, session=session.name, epoch=epoch, report=report, trace=copy, rank=rank)
    return root


# --------------------------------------------------------------------------------- analyze: real fixtures


@functools.cache
def _reports(which: str) -> dict[str, dict[str, Any]]:
    """``fitprof.analyze(path).to_dict()`` (NaN -> None) of every shipped trace (a Lightning window, two gloo
    ranks, a Keras XSpace) or of every shared GPU trace (skipped without ``../shared``), by path."""
    if which == "shipped":
        paths = [LIGHTNING_CPU, *DDP_RANKS, KERAS_XSPACE]
    else:
        paths = [shared_kineto(name) for name in SHARED_KINETO]
    return {os.fspath(p): _clean(fitprof.analyze(p).to_dict()) for p in paths}


@pytest.fixture(params=["shipped", "shared"])
def trace_set(request: pytest.FixtureRequest) -> Any:
    """A function giving the reports of one set of traces: called in the test, so that without ``../shared`` the
    skip comes from one place (``shared_fixtures.shared_kineto``) and ``-ra`` shows one line for all of them."""
    return lambda: _reports(request.param)


def test_analyze_json_equals_core(trace_set: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fixture_reports = trace_set()
    rc, out, err = run_cli(capsys, "analyze", *fixture_reports, "--format", "json")
    assert rc == 0, err
    assert err == ""
    records = json.loads(out)
    traces = [r for r in records if r["record"] == "trace"]
    assert [r["run"] for r in traces] == list(fixture_reports)  # one record per file, in order
    spreads = [r for r in records if r["record"] == "spread"]
    # a spread only over the ranks of one world: the two shipped gloo ranks
    assert [s["ranks"] for s in spreads] == ([[0, 1]] if os.fspath(DDP_RANKS[0]) in fixture_reports else [])
    for rec in traces:
        expected = fixture_reports[rec["run"]]
        assert rec["record"] == "trace"
        assert rec["epoch"] is None
        for key in ("framework", "steps_analyzed", "step_time_ms", "input_percent", "htod_ms_per_step",
                    "htod_percent", "top_ops", "verdict", "advice", "source"):  # fmt: skip
            assert key in rec, key
        # every report field equals the core's, except the rank the CLI takes from the trace
        for key in REPORT_FIELDS:
            if key not in ("rank", "world_size", "host"):
                assert same(rec[key], expected[key]), (rec["run"], key, rec[key], expected[key])
        assert rec["top_ops"] and set(rec["top_ops"][0]) == {"name", "self_ms_per_step", "percent"}
        assert rec["headline"].startswith(rec["verdict"])
        assert (rec["rank"], rec["world_size"]) == FIXTURE_RANKS[Path(rec["run"]).name]
    # NaN is null, never NaN: the output is strict JSON
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_analyze_csv_one_row_per_file(trace_set: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fixture_reports = trace_set()
    rc, out, err = run_cli(capsys, "analyze", *fixture_reports, "--format", "csv")
    assert rc == 0, err
    frame = pd.read_csv(io.StringIO(out))
    frame = frame[frame["record"] == "trace"]
    assert list(frame["run"]) == list(fixture_reports)
    for _, row in frame.iterrows():
        expected = fixture_reports[row["run"]]
        assert row["step_time_ms"] == pytest.approx(expected["step_time_ms"], rel=1e-12)
        assert row["input_percent"] == pytest.approx(expected["input_percent"], rel=1e-12, abs=1e-12)
        assert row["htod_ms_per_step"] == pytest.approx(expected["htod_ms_per_step"], rel=1e-12, abs=1e-12)
        assert row["verdict"] == expected["verdict"]
        assert row["top_op"] == expected["top_ops"][0]["name"]
        assert row["top_op_percent"] == pytest.approx(expected["top_ops"][0]["percent"], rel=1e-12)
        assert int(row["steps_analyzed"]) == expected["steps_analyzed"]


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_analyze_text_formats(fmt: str, trace_set: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fixture_reports = trace_set()
    rc, out, err = run_cli(capsys, "analyze", *fixture_reports, "--format", fmt)
    assert rc == 0, err
    lines = out.splitlines()
    if fmt == "markdown":
        assert lines[0].startswith("| run |") and "| step ms |" in lines[0] and "| verdict |" in lines[0]
        assert set(lines[1]) <= set("|-:")
        table_rows = [line for line in lines[2:] if line.startswith("| ")]
    else:
        assert lines[0].split()[:2] == ["run", "rank"] and "verdict" in lines[0]
        assert set(lines[1]) <= {"-", " "}
        table_rows = lines[2 : 2 + len(fixture_reports)]
    assert len(table_rows) == len(fixture_reports)
    for path, expected in fixture_reports.items():
        row = next(r for r in table_rows if path in r)
        assert expected["verdict"] in row
        if fmt == "markdown" and expected["top_ops"]:  # read rendered and pasted: the whole operator name
            assert "| " + one_line(expected["top_ops"][0]["name"]).replace("|", "\\|") + " |" in row
        assert f"{expected['step_time_ms']:.2f}" in row
        report = fitprof.BottleneckReport(**{**expected, "top_ops": [fitprof.OpStat(**o) for o in expected["top_ops"]]})
        assert report.headline() in out  # the verdict line under the table
        for advice in expected["advice"]:
            assert advice in out


def test_analyze_top_k_and_out_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = LIGHTNING_CPU
    out_file = tmp_path / "out.json"
    rc, out, err = run_cli(capsys, "analyze", trace, "--top-k", "2", "--format", "json", "--out", out_file)
    assert (rc, out, err) == (0, "", "")
    (rec,) = json.loads(out_file.read_text())
    assert len(rec["top_ops"]) == 2
    assert same(rec["top_ops"], _clean(fitprof.analyze(trace, top_k=2).to_dict())["top_ops"])


# ------------------------------------------------------------------------------------ analyze: several ranks


def test_analyze_rank_spread_names_slowest(two_ranks: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, "analyze", *two_ranks, "--format", "json")
    assert rc == 0, err
    records = json.loads(out)
    traces = [r for r in records if r["record"] == "trace"]
    assert [(r["rank"], r["world_size"]) for r in traces] == [(0, 2), (1, 2)]
    assert [r["step_time_ms"] for r in traces] == pytest.approx([10.0, 25.0])
    assert [r["input_percent"] for r in traces] == pytest.approx([10.0, 40.0])
    assert [r["verdict"] for r in traces] == ["balanced", "input-bound"]
    (spread,) = [r for r in records if r["record"] == "spread"]
    assert spread["slowest_rank"] == 1 and spread["fastest_rank"] == 0
    assert spread["ranks"] == [0, 1] and spread["world_size"] == 2
    assert spread["step_time_ms_spread"] == pytest.approx(15.0)
    assert spread["input_percent_spread"] == pytest.approx(30.0)
    assert spread["slowest_source"] == os.fspath(two_ranks[1])

    rc, out, _ = run_cli(capsys, "analyze", *two_ranks)
    assert rc == 0
    assert "Rank spread" in out
    spread_line = next(line for line in out.splitlines() if "slowest: rank" in line)
    assert (
        "slowest: rank 1 (25.00 ms/step" in spread_line and "15.00 ms" in spread_line and "30.0 points" in spread_line
    )

    rc, out, _ = run_cli(capsys, "analyze", *two_ranks, "--format", "csv")
    frame = pd.read_csv(io.StringIO(out))
    assert list(frame["record"]) == ["trace", "trace", "spread"]
    assert frame.loc[2, "slowest_rank"] == 1


def test_analyze_one_rank_or_other_worlds_no_spread(
    two_ranks: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = write_kineto(tmp_path / "other.pt.trace.json", step_us=5_000, input_us=0, rank=1, world_size=4)
    rc, out, _ = run_cli(capsys, "analyze", two_ranks[0], other, "--format", "json")
    assert rc == 0
    assert [r["record"] for r in json.loads(out)] == ["trace", "trace"]  # ranks of different worlds


# ---------------------------------------------------------------------------------- report: built log folder


@pytest.fixture()
def built_logdir(tmp_path: Path, two_ranks: list[Path]) -> Path:
    """Two runs at different depths: ``exp/ddp`` (2 epochs x 2 ranks) and ``single`` (1 epoch, rank 0)."""
    single = write_kineto(tmp_path / "src" / "single.pt.trace.json", step_us=4_000, input_us=0)
    return build_logdir(
        tmp_path / "logs",
        {
            "exp/ddp": {(0, 0): two_ranks[0], (0, 1): two_ranks[1], (1, 0): two_ranks[0], (1, 1): two_ranks[1]},
            "single": {(0, 0): single},
        },
    )


def test_report_rows_per_run_epoch_rank(built_logdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, "report", built_logdir, "--format", "json")
    assert rc == 0, err
    records = json.loads(out)
    rows = [r for r in records if r["record"] == "window"]
    assert [(r["run"], r["epoch"], r["rank"]) for r in rows] == [
        ("exp/ddp", 0, 0), ("exp/ddp", 0, 1), ("exp/ddp", 1, 0), ("exp/ddp", 1, 1), ("single", 0, 0),
    ]  # fmt: skip
    for row in rows:
        doc = json.loads(Path(row["report_file"]).read_text())
        for key, value in doc["report"].items():
            if key not in ("rank", "source"):
                assert same(row[key], value), key
        assert row["source"] == os.path.normpath(Path(row["report_file"]).parents[2] / doc["trace"])
        assert Path(row["source"]).is_file()
    spreads = [r for r in records if r["record"] == "spread"]
    assert [(s["run"], s["epoch"], s["slowest_rank"]) for s in spreads] == [("exp/ddp", 0, 1), ("exp/ddp", 1, 1)]

    rc, out, _ = run_cli(capsys, "report", built_logdir)
    header = out.splitlines()[0].split()
    assert header[:3] == ["run", "epoch", "rank"]
    assert "epoch 0, rank 1: input-bound: the training loop waited for input 40.0% of step time." in out
    assert "exp/ddp, epoch 1: step time spread 15.00 ms, input share spread 30.0 points; slowest: rank 1" in out

    rc, out, _ = run_cli(capsys, "report", built_logdir / "single", "--format", "markdown")  # LOGDIR is the run
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("| run | epoch | framework |") and lines[2].startswith("| . | 0 | pytorch | 3 |")
    assert (
        "- epoch 0: compute-bound: operators cover 100.0% of step time; top operator aten::addmm takes 100.0%." in lines
    )


SEGMENT_COLORS = {"input wait": (255, 127, 14), "host-to-device": (44, 160, 44), "other/compute": (31, 119, 180)}
"""matplotlib's tab:orange, tab:green and tab:blue, the colours ``fitprof report --plot`` gives the segments."""
PIXEL_TOLERANCE = 2  # an anti-aliased edge can blur one pixel row at each end of a segment


def bar_segments(png: Path) -> list[list[dict[str, int]]]:
    """The stacked bars drawn in ``png``, decoded from its pixels: per panel (top to bottom), per bar (left to
    right), the height in pixels of each segment (by its colour; 0 when absent), in the bar's middle column.
    Legend patches are narrower than any bar and are left out."""
    import numpy as np
    from PIL import Image

    with Image.open(png) as img:
        assert img.format == "PNG"
        rgb = np.asarray(img.convert("RGB")).astype(int)
    masks = {k: np.abs(rgb - c).sum(axis=2) <= 6 for k, c in SEGMENT_COLORS.items()}
    bars = []
    for ys, xs in _regions(np.logical_or.reduce(list(masks.values()))):
        if xs.stop - xs.start < 40:  # legend patch
            continue
        mid = (xs.start + xs.stop) // 2
        heights = {k: int(m[ys, mid].sum()) for k, m in masks.items()}
        bars.append((ys.stop, xs.start, heights))
    panels: list[list[tuple[int, int, dict[str, int]]]] = []
    for bar in sorted(bars):  # bars of one panel stand on one baseline
        if panels and abs(panels[-1][0][0] - bar[0]) <= PIXEL_TOLERANCE:
            panels[-1].append(bar)
        else:
            panels.append([bar])
    return [[h for _, _, h in sorted(panel, key=lambda b: b[1])] for panel in panels]


def _runs(flags: Any) -> list[slice]:
    """The runs of True in a 1-D boolean array, as slices."""
    import numpy as np

    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(np.int8), [0]])))
    return [slice(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _regions(mask: Any) -> list[tuple[slice, slice]]:
    """Boxes (row slice, column slice) of the coloured blocks of a boolean image: bands of rows holding some
    colour, split into runs of columns holding some colour within the band (stacked bars are such blocks)."""
    return [(rows, cols) for rows in _runs(mask.any(axis=1)) for cols in _runs(mask[rows].any(axis=0))]


def assert_bars_show(png: Path, panels: list[list[tuple[float, float, float]]]) -> None:
    """``png`` shows ``panels`` of stacked bars, each bar ``(input ms, htod ms, other ms)``: every segment's height
    is its value at its panel's scale (pixels per ms, from the panel's tallest bar), to a pixel or two."""
    drawn = bar_segments(png)
    assert len(drawn) == len(panels), drawn
    for got, want in zip(drawn, panels, strict=True):
        assert len(got) == len(want), (got, want)
        tallest = max(range(len(want)), key=lambda i: sum(want[i]))
        tallest_px = sum(got[tallest].values())
        scale = tallest_px / sum(want[tallest])
        for heights, values in zip(got, want, strict=True):
            for name, value in zip(SEGMENT_COLORS, values, strict=True):
                # the scale is read off the tallest bar, itself drawn to a pixel or two: a segment of h pixels
                # carries that error too, in proportion h / tallest_px
                tolerance = PIXEL_TOLERANCE * (1 + value * scale / tallest_px)
                assert abs(heights[name] - value * scale) <= tolerance, (name, heights, values, scale)


def test_report_plot_one_panel_per_run(built_logdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "breakdown.png"
    rc, out, err = run_cli(capsys, "report", built_logdir, "--plot", png)
    assert rc == 0, err
    assert err == f"fitprof: plot saved to {png.resolve()}\n"  # where to look, whatever the working folder
    assert "exp/ddp" in out and "single" in out  # the table is still printed
    # exp/ddp: epochs 0 and 1 of rank 0 (10 ms steps, 1 ms input) and rank 1 (25 ms, 10 ms input);
    # single: one epoch of 4 ms steps, no input wait. No copies anywhere.
    ddp = [(1.0, 0.0, 9.0), (10.0, 0.0, 15.0)] * 2
    assert_bars_show(png, [ddp, [(0.0, 0.0, 4.0)]])
    # the bars are tall enough that a wrong segment could not hide within the tolerance
    assert sum(bar_segments(png)[0][1].values()) > 100


# -------------------------------------------------------------------------------- report: real Keras example


@pytest.fixture(scope="module")
def keras_logdir(tmp_path_factory: pytest.TempPathFactory, keras_digits_fast: tuple[Path, Any]) -> Path:
    """The Keras digits example, two epochs (the session's run), as run ``keras`` of a log folder of its own."""
    root = tmp_path_factory.mktemp("cli_logs")
    (root / "keras").symlink_to(keras_digits_fast[0], target_is_directory=True)
    return root


@pytest.mark.slow
def test_report_on_keras_example(keras_logdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, "report", keras_logdir, "--format", "json")
    assert rc == 0, err
    records = json.loads(out)
    rows = [r for r in records if r["record"] == "window"]
    assert [(r["run"], r["epoch"], r["rank"], r["framework"]) for r in rows] == [
        ("keras", 0, 0, "tensorflow"),
        ("keras", 1, 0, "tensorflow"),
    ]
    scalars = _event_scalars(keras_logdir / "keras")
    # the per-epoch records: one an epoch, their wall time the one the callback logged
    epochs = [r for r in records if r["record"] == "epoch"]
    assert [(r["run"], r["epoch"], r["rank"]) for r in epochs] == [("keras", 0, 0), ("keras", 1, 0)]
    for r in epochs:
        assert scalars["fitprof/epoch/wall_s"][r["epoch"]] == pytest.approx(r["wall_s"], rel=1e-6)
    for row in rows:
        doc = json.loads(Path(row["report_file"]).read_text())
        assert (doc["epoch"], doc["rank"], doc["framework"]) == (row["epoch"], row["rank"], row["framework"])
        for key, value in doc["report"].items():
            if key not in ("rank", "source"):
                assert same(row[key], value), key
        assert Path(row["source"]).samefile(doc["report"]["source"])
        assert row["steps_analyzed"] == 5  # the default window, steps 6-10 of 48
        # the scalars the callback logged at this epoch
        epoch = row["epoch"]
        assert scalars["fitprof/step_time_ms"][epoch] == pytest.approx(row["step_time_ms"], rel=1e-6)
        assert scalars["fitprof/input_percent"][epoch] == pytest.approx(row["input_percent"], rel=1e-6, abs=1e-6)
        assert scalars["fitprof/htod_ms_per_step"][epoch] == pytest.approx(row["htod_ms_per_step"], abs=1e-9)
        assert scalars["fitprof/steps_analyzed"][epoch] == row["steps_analyzed"]
        top = row["top_ops"][0]
        assert scalars[top_op_key(top["name"])][epoch] == pytest.approx(top["self_ms_per_step"], rel=1e-6)

    # the same trace through `analyze` gives the same figures
    session = Path(rows[1]["source"]).parent
    rc, out, err = run_cli(capsys, "analyze", session, "--format", "json")
    assert rc == 0, err
    (rec,) = json.loads(out)
    for key in ("steps_analyzed", "step_time_ms", "input_percent", "htod_ms_per_step", "top_ops"):
        assert same(rec[key], rows[1][key]), key
    # the trace's own verdict; a window the callback saw starved of cores says which one the trace alone gives
    if rows[1]["verdict"] == "cpu-contended":
        assert f"the trace alone says {rec['verdict']}" in rows[1]["headline"]
    else:
        assert rec["verdict"] == rows[1]["verdict"]

    rc, out, _ = run_cli(capsys, "report", keras_logdir)
    assert rc == 0
    assert out.splitlines()[0].split()[:3] == ["run", "epoch", "framework"]  # one rank: no rank column
    for row in rows:
        assert row["headline"] in out


@pytest.mark.slow
def test_report_plot_on_keras_example(keras_logdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:

    png = tmp_path / "plot.png"
    rc, out, err = run_cli(capsys, "report", keras_logdir, "--plot", png, "--format", "csv")
    assert rc == 0, err
    rows = pd.read_csv(io.StringIO(out))
    assert list(rows["record"]) == ["window", "window", "epoch", "epoch", "fit"]  # the fit's line last
    fit = rows[rows["record"] == "fit"].iloc[0]
    assert fit["wall_s"] == pytest.approx(fit["setup_s"] + fit["epochs_s"] + fit["teardown_s"], rel=1e-6)
    rows = rows[rows["record"] == "window"]
    assert list(rows["epoch"]) == [0, 1]
    bars = [
        (r.input_ms_per_step, r.htod_ms_per_step, r.step_time_ms - r.input_ms_per_step - r.htod_ms_per_step)
        for r in rows.itertuples()
    ]
    assert_bars_show(png, [bars])


def _event_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of the run's scalars, read with tensorboard's own event reader."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    out: dict[str, dict[int, float]] = {}
    for tag in acc.Tags()["tensors"]:
        if not tag.startswith("fitprof/") or tag in ("fitprof/summary", "fitprof/advice"):  # the text tags
            continue
        out[tag] = {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)}
    return out


# ---------------------------------------------------------------------------------------------- bad input


def _bad_inputs(tmp: Path, good_trace: Path) -> dict[str, tuple[list[str], Path, str]]:
    """``{case: (argv, the path the error must name, words the message must hold)}``."""
    from google.protobuf import descriptor_pb2

    tmp.mkdir(parents=True, exist_ok=True)
    gz = good_trace.read_bytes()
    (tmp / "truncated.json.gz").write_bytes(gz[: len(gz) // 2])
    (tmp / "corrupt.json.gz").write_bytes(gz[:10] + b"\x00" * 50 + gz[60:])
    (tmp / "not_trace.json").write_text(json.dumps({"hello": [1, 2, 3]}))
    (tmp / "truncated.pt.trace.json").write_text(gzip.decompress(gz).decode()[:500])
    (tmp / "other.xplane.pb").write_bytes(
        descriptor_pb2.FileDescriptorProto(name="x", package="y.z").SerializeToString()
    )
    (tmp / "random.xplane.pb").write_bytes(bytes(range(256)) * 4)
    (tmp / "empty.xplane.pb").write_bytes(b"")
    (tmp / "notes.txt").write_text("not a trace")
    (tmp / "empty_dir").mkdir()
    bad_run = tmp / "logs" / "run" / "plugins" / "fitprof"
    bad_run.mkdir(parents=True)
    (bad_run / "s1.rank0.json").write_text('{"epoch": 0, "report": {"steps_')
    odd_run = tmp / "logs2" / "run" / "plugins" / "fitprof"
    odd_run.mkdir(parents=True)
    (odd_run / "s1.rank0.json").write_text(json.dumps({"epoch": 0, "report": {"verdict": "x"}}))
    cases: dict[str, tuple[list[str], Path, str]] = {
        "missing file": (["analyze", str(tmp / "nope.pt.trace.json")], tmp / "nope.pt.trace.json", "no such"),
        "missing logdir": (["report", str(tmp / "nologs")], tmp / "nologs", "no such"),
        "empty dir (analyze)": (["analyze", str(tmp / "empty_dir")], tmp / "empty_dir", "no trace file"),
        "empty dir (report)": (["report", str(tmp / "empty_dir")], tmp / "empty_dir", "no fitprof run"),
        "file as logdir": (["report", str(tmp / "notes.txt")], tmp / "notes.txt", "not a folder"),
        "unknown type": (["analyze", str(tmp / "notes.txt")], tmp / "notes.txt", "not a trace file name"),
        "corrupt report file": (["report", str(tmp / "logs")], bad_run / "s1.rank0.json", "not a fitprof report"),
        "report file of another shape": (
            ["report", str(tmp / "logs2")],
            odd_run / "s1.rank0.json",
            "not a fitprof report",
        ),
    }
    for name, words in {
        "truncated.json.gz": "truncated or corrupt gzip",
        "corrupt.json.gz": "gzip",
        "not_trace.json": "not a Chrome trace",
        "truncated.pt.trace.json": "not valid JSON",
        "other.xplane.pb": "XSpace",
        "random.xplane.pb": "XSpace",
        "empty.xplane.pb": "empty file",
    }.items():
        cases[name] = (["analyze", str(tmp / name)], tmp / name, words)
    return cases


BAD_CASES = [
    "missing file",
    "missing logdir",
    "empty dir (analyze)",
    "empty dir (report)",
    "file as logdir",
    "unknown type",
    "corrupt report file",
    "report file of another shape",
    "truncated.json.gz",
    "corrupt.json.gz",
    "not_trace.json",
    "truncated.pt.trace.json",
    "other.xplane.pb",
    "random.xplane.pb",
    "empty.xplane.pb",
]


@pytest.mark.parametrize("case", BAD_CASES)
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_bad_input_one_line_exit_2_nothing_written(
    case: str, fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, named, words = _bad_inputs(tmp_path / "in", DDP_RANKS[0])[case]
    out_file = tmp_path / "out" / "result.txt"
    out_file.parent.mkdir()
    rc, out, err = run_cli(capsys, *argv, "--format", fmt, "--out", out_file)
    assert rc == 2
    assert out == ""
    assert not out_file.exists()
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fitprof: error: ")
    assert str(named) in lines[0]
    assert words in lines[0]
    assert "Traceback" not in err


def test_good_and_bad_files_report_the_good(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = LIGHTNING_CPU
    bad = tmp_path / "not_trace.json"
    bad.write_text("[]]")
    missing = tmp_path / "missing.xplane.pb"
    out_file = tmp_path / "out.json"
    rc, out, err = run_cli(capsys, "analyze", bad, good, missing, "--format", "json", "--out", out_file)
    assert rc == 0, err  # the good file is the answer; each bad one is named on one warning line
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2 and str(bad) in lines[0] and str(missing) in lines[1]
    assert all(line.startswith("fitprof: warning: ") and line.endswith("(skipped)") for line in lines), err
    (rec,) = json.loads(out_file.read_text())
    assert rec["run"] == os.fspath(good)

    out_file.unlink()
    rc, out, err = run_cli(capsys, "analyze", bad, good, missing, "--format", "json", "--out", out_file, "--strict")
    assert rc == 2
    lines = err.splitlines()
    assert len(lines) == 2 and all(line.startswith("fitprof: error: ") for line in lines), err
    (rec,) = json.loads(out_file.read_text())  # still written: --strict changes the status, not the answer
    assert rec["run"] == os.fspath(good)


def test_report_good_run_and_corrupt_report(built_logdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = built_logdir / "broken" / "plugins" / "fitprof"
    broken.mkdir(parents=True)
    (broken / "s1.rank0.json").write_bytes(b"\xff\xfe garbage")
    rc, out, err = run_cli(capsys, "report", built_logdir, "--format", "csv")
    assert rc == 0, err
    assert len(err.splitlines()) == 1 and str(broken / "s1.rank0.json") in err
    assert err.startswith("fitprof: warning: ")
    frame = pd.read_csv(io.StringIO(out))
    assert set(frame.loc[frame["record"] == "window", "run"]) == {"exp/ddp", "single"}
    rc, out2, err = run_cli(capsys, "report", built_logdir, "--format", "csv", "--strict")
    assert rc == 2 and out2 == out and err.startswith("fitprof: error: ")


def test_no_arguments_prints_help_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys)
    assert rc == 2
    assert out == ""
    assert "usage: fitprof" in err and "report" in err and "analyze" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(capsys, "--version")
    assert rc == 0
    assert out.strip() == f"fitprof {fitprof.__version__}"


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["analyze"], ["analyze", "x.json", "--top-k", "0"], ["report", "x", "--format", "yaml"], ["nope"]):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2, argv
        assert "usage:" in err and "Traceback" not in err


def test_each_command_is_wired_from_its_module(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``fitprof --help`` lists each subcommand of ``COMMANDS`` in order with its ``HELP``; its own ``--help`` says
    its ``DESCRIPTION``; and a call runs its ``run`` (a missing input is its own error, exit 2)."""
    rc, top, _ = run_cli(capsys, "--help")
    assert rc == 0
    flat_top = " ".join(top.split())
    places = [flat_top.index(f"{name} {command.HELP}") for name, command in COMMANDS.items()]
    assert places == sorted(places)
    for name, command in COMMANDS.items():
        rc, out, _ = run_cli(capsys, name, "--help")
        assert rc == 0 and out.startswith(f"usage: fitprof {name} ")
        assert " ".join(command.DESCRIPTION.split()) in " ".join(out.split())
    rc, _, err = run_cli(capsys, "report", tmp_path / "missing")
    assert rc == 2 and err.strip() == f"fitprof: error: {tmp_path / 'missing'}: no such folder"


@pytest.mark.parametrize(
    ("command", "options"),
    [("analyze", (*cli_analyze.LIMITS, cli_analyze.SCHEDULER_TIMEOUT)), ("compare", cli_compare.THRESHOLDS)],
)
def test_number_options_help_states_the_parsers_default(
    capsys: pytest.CaptureFixture[str], command: str, options: tuple[NumberOption, ...]
) -> None:
    """Each numeric option of a subcommand's table: ``--help`` ends its line with the default the parser fills in
    when the option is not given, and every numeric option the subcommand takes (``--jobs`` aside) is in its table."""
    rc, out, _ = run_cli(capsys, command, "--help")
    assert rc == 0
    flat = " ".join(out.split())  # argparse wraps the help to the terminal's width
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    given = {a.option_strings[0]: a for a in sub._actions if a.option_strings}
    numeric = {flag for flag, a in given.items() if a.type in NUMBER_KINDS and flag != "--jobs"}
    assert numeric == {o.usage.split()[0] for o in options}
    positionals = ["x"] * (2 if command == "compare" else 1)
    defaults = vars(sub.parse_args(positionals))
    for option in options:
        flag, metavar = option.usage.split()
        action = given[flag]
        assert (action.metavar, action.type) == (metavar, option.kind)
        assert defaults[action.dest] == option.default
        shown = f"{defaults[action.dest]:{option.shown}}"
        assert f"{flag} {metavar} {option.help} (default: {shown})" in flat, flag


# ------------------------------------------------------------------------------------- the console script


@pytest.mark.slow
def test_console_script(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("fitprof")
    if not script.exists():
        pytest.skip(f"the fitprof console script is not installed beside {sys.executable}")
    good = DDP_RANKS[0]
    bad = tmp_path / "random.xplane.pb"
    bad.write_bytes(bytes(range(256)) * 4)
    proc = subprocess.run(
        [str(script), "analyze", str(good), str(bad), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0  # the good file reported, the bad one named on one warning line
    # one line from fitprof, nothing from xprof's C++ parser, no traceback
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and str(bad) in proc.stderr, proc.stderr
    (rec,) = json.loads(proc.stdout)
    expected = read_trace(good)
    assert rec["rank"] == expected.attrs["rank"]
    assert rec["step_time_ms"] == pytest.approx(analyze_table(expected).step_time_ms)


def test_report_reads_files_written_before_the_renames(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A report file with the old names (``htod_gbps``, framework ``"torch"``) is read: its bandwidth comes out
    as ``htod_gb_per_s`` and its framework as ``"pytorch"``."""
    run = tmp_path / "run"
    trace = write_kineto(run / "h_rank0.s.pt.trace.json", step_us=10_000, input_us=1_000)
    path = write_report_file(run, session="s", epoch=0, report=fitprof.analyze(trace), trace=trace)
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["framework"] = doc["report"]["framework"] = "torch"
    doc["report"]["htod_gbps"] = 2.5
    del doc["report"]["htod_gb_per_s"]
    del doc["report"]["self_ms_per_step"]  # added later: older files lack it
    path.write_text(json.dumps(doc), encoding="utf-8")
    rc, out, err = run_cli(capsys, "report", tmp_path, "--format", "json")
    assert (rc, err) == (0, "")
    [rec] = json.loads(out)
    assert (rec["htod_gb_per_s"], rec["framework"], rec["step_time_ms"]) == (2.5, "pytorch", 10.0)
    assert rec["self_ms_per_step"] is None  # unknown in an old file: NaN, written as null
    rc, out, _ = run_cli(capsys, "report", tmp_path, "--format", "csv")
    header, row = out.splitlines()
    assert row.split(",")[header.split(",").index("htod_gb_per_s")] == "2.5"


def test_report_numbers_fits_with_triggered_windows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A window the slowdown trigger opened (session ``*_trigger_step<S>``) is written at its epoch's end after
    that epoch's scheduled window: it belongs to the same fit, is reported as triggered, and joins no cross-rank
    spread (each rank triggers at its own step). Two fits, in the order a fit writes its report files:
    fit 1: scheduled epoch 0 (ranks 0, 1), triggered epoch 0 (rank 0), scheduled epoch 1 (ranks 0, 1);
    fit 2: scheduled epoch 0 (ranks 0, 1), triggered epoch 0 (rank 1)."""
    run = tmp_path / "run"
    order = [  # (session, epoch, rank, step time in us)
        ("2026_11_30_10_00_00_epoch0", 0, 0, 10_000),
        ("2026_11_30_10_00_00_epoch0", 0, 1, 12_000),
        ("2026_11_30_10_00_01_epoch0_trigger_step49", 0, 0, 40_000),
        ("2026_11_30_10_00_02_epoch1", 1, 0, 11_000),
        ("2026_11_30_10_00_02_epoch1", 1, 1, 13_000),
        ("2026_11_30_10_00_05_epoch0", 0, 0, 10_500),
        ("2026_11_30_10_00_05_epoch0", 0, 1, 12_500),
        ("2026_11_30_10_00_06_epoch0_trigger_step7", 0, 1, 50_000),
    ]
    for i, (session, epoch, rank, step_us) in enumerate(order):
        trace = write_kineto(
            run / f"h_rank{rank}.{session}.pt.trace.json", step_us=step_us, input_us=1_000, rank=rank, world_size=2
        )
        path = write_report_file(
            run, session=session, epoch=epoch, report=fitprof.analyze(trace), trace=trace, rank=rank
        )
        doc = json.loads(path.read_text(encoding="utf-8"))
        doc["written"] = 1_000.0 + i  # the order a fit writes them (no two files within one clock tick)
        path.write_text(json.dumps(doc), encoding="utf-8")

    rc, out, err = run_cli(capsys, "report", tmp_path, "--format", "json")
    assert (rc, err) == (0, "")
    records = json.loads(out)
    rows = [r for r in records if r["record"] == "window"]
    # Before: the triggered window of epoch 0 (epoch not after the previous window's) started a new fit.
    assert [(r["fit"], r["epoch"], r["trigger_step"], r["rank"], r["step_time_ms"]) for r in rows] == [
        (1, 0, None, 0, 10.0),
        (1, 0, None, 1, 12.0),
        (1, 0, 49, 0, 40.0),
        (1, 1, None, 0, 11.0),
        (1, 1, None, 1, 13.0),
        (2, 0, None, 0, 10.5),
        (2, 0, None, 1, 12.5),
        (2, 0, 7, 1, 50.0),
    ]
    spreads = [r for r in records if r["record"] == "spread"]
    # one spread per scheduled window, over its two ranks only: the triggered windows' 40 and 50 ms are in none
    assert [(r["epoch"], r["ranks"], r["slowest_step_time_ms"]) for r in spreads] == [
        (0, [0, 1], 12.0),
        (1, [0, 1], 13.0),
        (0, [0, 1], 12.5),
    ]

    rc, out, _ = run_cli(capsys, "report", tmp_path, "--format", "csv")
    table = list(csv.DictReader(io.StringIO(out)))
    windows = [t for t in table if t["record"] == "window"]
    assert [t["trigger_step"] for t in windows] == ["", "", "49", "", "", "", "", "7"]

    rc, out, _ = run_cli(capsys, "report", tmp_path)
    assert "epoch 0, rank 0: " in out
    assert "epoch 0, window triggered by a slowdown after step 49, rank 0: " in out
    assert "epoch 0, window triggered by a slowdown after step 7, rank 1: " in out
    assert " 0 trig@49 " in out

"""``fitprof analyze`` on traces from elsewhere and ``fitprof report`` on run folders that several fits wrote.

* the legacy autograd-profiler layout (a bare JSON list, ``"pid": "CPU functions"``, no ``cat``), written by torch
  itself, its operator self times checked against torch's own ``key_averages()``;
* a trace without step markers: one span, said in the warning and the headline;
* two ``fit`` calls into one Keras run folder: every output format tells the fits apart.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fitprof
from fitprof.cli import main
from fitprof.traces import read_trace


def run_cli(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    rc = main([os.fspath(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------------------ legacy layout
def test_legacy_export_by_torch_is_analysed_with_its_operators(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.autograd.profiler import record_function

    x = torch.randn(64, 64)
    with torch.autograd.profiler.profile() as prof:
        for step in range(3):
            with record_function(f"ProfilerStep#{step}"):
                (x @ x).relu().sum()
    path = tmp_path / "legacy.json"
    prof.function_events.export_chrome_trace(str(path))
    raw = json.loads(path.read_text())
    assert isinstance(raw, list) and raw[0]["pid"] == "CPU functions" and "cat" not in raw[0]

    report = fitprof.analyze(path, top_k=100)
    assert report.steps_analyzed == 3
    ours = {o.name: o.self_ms_per_step * 3 * 1e3 for o in report.top_ops}  # us over the three steps
    theirs = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    for name in ("aten::mm", "aten::relu", "aten::sum"):
        assert name in ours, name
        assert ours[name] == pytest.approx(theirs[name], rel=0.02, abs=2.0), name
    assert report.verdict != "no-steps"


def test_legacy_device_rows_are_kernels(tmp_path: Path) -> None:
    """Kernels of the legacy layout sit on ``"CUDA functions"``: device time, not host operators, attributed to
    the operator its ``cpu_to_cuda`` flow arrow starts from."""
    events = [
        {"name": "ProfilerStep#1", "ph": "X", "ts": 0, "dur": 100, "tid": 1, "pid": "CPU functions", "args": {}},
        {"name": "aten::mm", "ph": "X", "ts": 10, "dur": 20, "tid": 1, "pid": "CPU functions", "args": {}},
        {"name": "aten::mm", "ph": "s", "ts": 10, "tid": 1, "pid": "CPU functions", "id": 0, "cat": "cpu_to_cuda"},
        {"name": "volta_sgemm", "ph": "f", "ts": 15, "tid": 0, "pid": "CUDA functions", "id": 0, "cat": "cpu_to_cuda"},
        {"name": "volta_sgemm", "ph": "X", "ts": 15, "dur": 50, "tid": 0, "pid": "CUDA functions", "args": {}},
        {"name": "Memcpy HtoD (Pageable -> Device)", "ph": "X", "ts": 70, "dur": 5, "tid": 0,
         "pid": "CUDA functions", "args": {}},
    ]  # fmt: skip
    path = tmp_path / "legacy_gpu.json"
    path.write_text(json.dumps(events))
    table = read_trace(path).set_index("name")
    assert table.loc["aten::mm", "kind"] == "op" and not table.loc["aten::mm", "on_device"]
    assert table.loc["volta_sgemm", "kind"] == "kernel" and table.loc["volta_sgemm", "on_device"]
    assert table.loc["volta_sgemm", "op"] == "aten::mm" and table.loc["volta_sgemm", "launch_us"] == 10  # flow
    memcpy = table.loc["Memcpy HtoD (Pageable -> Device)"]
    assert memcpy["kind"] == "memcpy" and memcpy["copy_kind"] == "htod_pageable"
    report = fitprof.analyze(path)
    assert report.htod_ms_per_step == pytest.approx(0.005)
    assert report.device_busy_percent == pytest.approx(55.0)
    assert [(o.name, o.self_ms_per_step) for o in report.top_ops][:1] == [("aten::mm", pytest.approx(0.05))]


def test_bare_list_without_steps_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The layout of pytorch/pytorch#95460: 100 ``aten::mul`` (54 us, then 7 us each, 3 us apart), no step."""
    events, ts = [], 633.0
    for i in range(100):
        dur = 54.0 if i == 0 else 7.0
        events.append({"name": "aten::mul", "ph": "X", "ts": ts, "dur": dur, "tid": 1, "pid": "CPU functions"})
        ts += dur + 3
    path = tmp_path / "legacy.pt.trace.json"
    path.write_text(json.dumps(events))
    rc, out, _ = run_cli(capsys, "analyze", path, "--format", "json")
    assert rc == 0
    rec = json.loads(out)[0]
    assert rec["top_ops"][0]["name"] == "aten::mul"
    assert rec["top_ops"][0]["self_ms_per_step"] == pytest.approx(0.747)
    assert rec["steps_analyzed"] == 0 and rec["step_time_ms"] == pytest.approx(1.044)
    assert rec["headline"].endswith("(no step markers: the whole trace, 1.04 ms, was analysed as one span)")
    assert any("No step markers" in w for w in rec["warnings"])
    rc, out, _ = run_cli(capsys, "analyze", path)
    assert "analysed as one span" in out


# --------------------------------------------------------------------------------- several fits, one run
@pytest.fixture(scope="module")
def two_fits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ``fit`` calls of two epochs each, one FitProfiler, one Keras run folder."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs KERAS_BACKEND=tensorflow")
    from fitprof.keras import FitProfiler

    root = tmp_path_factory.mktemp("fits")
    rng = np.random.default_rng(0)
    x, y = rng.random((48, 8), dtype=np.float32), rng.random((48, 1), dtype=np.float32)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    profiler = FitProfiler(root / "run", profile_batch=(2, 3))
    for _ in range(2):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[profiler])
    return root


@pytest.mark.slow
def test_report_tells_two_fits_apart(two_fits: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted((two_fits / "run" / "plugins" / "fitprof").glob("*.json"))
    sessions = {json.loads(p.read_text())["session"]: json.loads(p.read_text())["epoch"] for p in files}
    assert len(sessions) == 4 and sorted(sessions.values()) == [0, 0, 1, 1]

    rc, out, _ = run_cli(capsys, "report", two_fits, "--format", "json")
    assert rc == 0
    rows = [r for r in json.loads(out) if r["record"] == "window"]
    assert [(r["fit"], r["epoch"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert {r["session"]: r["epoch"] for r in rows} == sessions
    # The second fit's windows were written later (session names cannot say it within one second: they carry
    # the second and the epoch; each report file records when it was written).
    written = {json.loads(p.read_text())["session"]: json.loads(p.read_text())["written"] for p in files}
    first = [written[r["session"]] for r in rows if r["fit"] == 1]
    second = [written[r["session"]] for r in rows if r["fit"] == 2]
    assert max(first) < min(second)

    rc, out, _ = run_cli(capsys, "report", two_fits, "--format", "csv")
    table = [t for t in csv.DictReader(io.StringIO(out)) if t["record"] == "window"]
    assert [(t["fit"], t["epoch"], t["session"]) for t in table] == [
        (str(r["fit"]), str(r["epoch"]), r["session"]) for r in rows
    ]

    rc, out, _ = run_cli(capsys, "report", two_fits)
    header = out.splitlines()[0].split()
    assert header[:4] == ["run", "fit", "session", "epoch"]
    for r in rows:
        assert f"fit {r['fit']} ({r['session']}), epoch {r['epoch']}: " in out

    rc, out, _ = run_cli(capsys, "report", two_fits, "--format", "markdown")
    assert out.splitlines()[0].startswith("| run | fit | session | epoch |")
    for r in rows:
        assert f"| {r['session']} |" in out


@pytest.mark.slow
def test_report_of_one_fit_keeps_its_columns(
    two_fits: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run folder of one fit: no fit/session columns in the table; json and csv still carry both."""
    import shutil

    run = tmp_path / "one"
    written = {
        p: json.loads(p.read_text())["written"] for p in (two_fits / "run" / "plugins" / "fitprof").glob("*.json")
    }
    reports = sorted(written, key=written.__getitem__)[:2]  # the first fit's two windows
    (run / "plugins" / "fitprof").mkdir(parents=True)
    for p in reports:
        shutil.copy(p, run / "plugins" / "fitprof" / p.name)
    rc, out, _ = run_cli(capsys, "report", tmp_path)
    assert rc == 0 and out.splitlines()[0].split()[:2] == ["run", "epoch"]
    rc, out, _ = run_cli(capsys, "report", tmp_path, "--format", "json")
    assert [r["fit"] for r in json.loads(out)] == [1, 1]


def _trace_handler_folder(folder: Path) -> None:
    """Two workers, ``w0`` and ``w1`` (named as ``tensorboard_trace_handler(worker_name=...)`` takes them; its
    default is ``<host>_<pid>``), each recording two windows of 2 steps with torch's own scheduler and handler;
    ``w1``'s steps sleep 20 ms more."""
    import time

    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    model = torch.nn.Linear(8, 4)
    for worker, sleep_s in (("w0", 0.0), ("w1", 0.02)):
        handler = torch.profiler.tensorboard_trace_handler(str(folder), worker_name=worker, use_gzip=True)
        schedule = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=2)
        with torch.profiler.profile(schedule=schedule, on_trace_ready=handler) as prof:
            for _ in range(6):
                time.sleep(sleep_s)
                model(torch.randn(4, 8)).sum().backward()
                prof.step()


def test_analyze_takes_a_tensorboard_trace_handler_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "tb_traces"
    _trace_handler_folder(folder)
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) == 4 and all(f.endswith(".pt.trace.json.gz") for f in files), files

    rc, out, err = run_cli(capsys, "analyze", folder, "--format", "json")
    assert rc == 0, err
    records = json.loads(out)
    traces = [r for r in records if r["record"] == "trace"]
    assert [(r["worker"], r["window"], r["rank"], r["world_size"]) for r in traces] == [
        ("w0", 0, 0, 2), ("w0", 1, 0, 2), ("w1", 0, 1, 2), ("w1", 1, 1, 2),
    ]  # fmt: skip
    for r in traces:  # each file is its own record, with the figures fitprof.analyze gives it
        assert r["steps_analyzed"] == fitprof.analyze(r["run"]).steps_analyzed > 0
    spreads = [r for r in records if r["record"] == "spread"]
    assert len(spreads) == 2  # one per window, comparing the workers
    assert [s["run"].rsplit(", window ", 1)[1].split(":")[0] for s in spreads] == ["0", "1"]
    assert all(s["ranks"] == [0, 1] and s["slowest_rank"] == 1 for s in spreads)

    rc, _, err = run_cli(capsys, "report", tmp_path)  # report names the command that reads them
    assert rc == 2 and f"fitprof analyze {folder}" in err, err

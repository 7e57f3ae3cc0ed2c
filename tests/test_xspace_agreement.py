"""One PyTorch window read two ways gives one report, and xprof's own pages show fitprof's figures.

fitprof converts each torch window's Kineto trace into the ``.xplane.pb`` that TensorBoard's Profile tab and
``fitprof analyze <session folder>`` read. Here both files of a window go through ``fitprof.analyze`` and must give
the same report (:func:`agreement.assert_same_report`): a Lightning run with a slow DataLoader, a GPU-shaped trace
built in the test (:func:`agreement.gpu_shaped_trace`), and the real A100 / MI250 / CPU DDP traces of the shared
fixtures. Then a real TensorBoard serves the Profile tab's pages for the Lightning run and the GPU-shaped run, and
their numbers are read over its HTTP API: xprof's input-pipeline, overview and op-statistics pages, and the trace
viewer's event names.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import fitprof
from agreement import (
    GPU_HOST,
    GPU_STEP_US,
    GPU_STEPS,
    GPU_TRACE_NAME,
    assert_same_report,
    gpu_shaped_trace,
    input_pipeline_figures,
    op_stats,
    overview_figures,
    table_rows,
)
from fitprof.traces import _xplane_schema as xs
from fitprof.traces import read_trace
from fitprof.traces.kineto import trace_host
from fitprof.traces.xspace_write import kineto_to_xspace, write_xspace

FIXTURES = [
    "a100_alexnet_pageable_htod.json.gz",
    "a100_ddp8_rank3_dataloader.json.gz",
    "a100_sampled_rank0.json.gz",
    "cpu_only_rank34.pt.trace.json.gz",
    "mi250_rocm_minitoy_train.json.gz",
]
SLEEP_S = 0.02  # per batch, in collate_fn: the Lightning run is input-bound


# ---------------------------------------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A short Lightning fit whose DataLoader sleeps 20 ms per batch (default window: steps 6-10), written into
    ``<logs>/lightning``; its Kineto trace and converted ``.xplane.pb``."""
    pytest.importorskip("lightning.pytorch")
    import lightning.pytorch as pl
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from fitprof.lightning import FitProfiler

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(32, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def slow_collate(items: list[Any]) -> tuple[Any]:
        time.sleep(SLEEP_S)
        return (torch.stack([x for (x,) in items]),)

    logs = tmp_path_factory.mktemp("agreement") / "logs"
    run_dir = logs / "lightning"
    torch.manual_seed(0)
    profiler = FitProfiler(log_dir=str(run_dir))
    trainer = pl.Trainer(
        default_root_dir=str(run_dir),
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[profiler],
    )
    loader = DataLoader(TensorDataset(torch.randn(128, 32)), batch_size=8, collate_fn=slow_collate)
    trainer.fit(Model(), loader)
    return {"logs": logs, "trace": profiler.trace_paths[0], "xplane": profiler.xplane_paths[0]}


@pytest.fixture(scope="module")
def gpu_run(lightning_run: dict[str, Any]) -> dict[str, Any]:
    """The GPU-shaped trace, written beside the Lightning run as ``<logs>/gpu`` and converted there."""
    run_dir = lightning_run["logs"] / "gpu"
    run_dir.mkdir()
    trace = run_dir / GPU_TRACE_NAME
    trace.write_text(json.dumps(gpu_shaped_trace()))
    xplane = write_xspace(trace, run_dir, "2026_01_01_00_00_00_epoch0", host=f"{GPU_HOST}_rank1")
    return {"trace": trace, "xplane": xplane}


# --------------------------------------------------------------------------------- one window, two files
@pytest.mark.slow
def test_lightning_window_read_two_ways_gives_one_report(lightning_run: dict[str, Any]) -> None:
    kineto = fitprof.analyze(lightning_run["trace"])
    xspace = fitprof.analyze(lightning_run["xplane"])
    assert kineto.verdict == "input-bound" and kineto.input_percent > 50  # the sleep shows
    assert kineto.host and kineto.host == trace_host(lightning_run["trace"])  # from fitprof's file name
    assert_same_report(kineto, xspace)
    # The tables agree event by event, not just in the figures (times are relative to the profile start there).
    a, b = read_trace(lightning_run["trace"]), read_trace(lightning_run["xplane"])
    assert len(a) == len(b)
    assert sorted(a["kind"].value_counts().items()) == sorted(b["kind"].value_counts().items())
    assert sorted(a["name"]) == sorted(b["name"])


@pytest.mark.slow
def test_gpu_shaped_window_read_two_ways_gives_one_report(gpu_run: dict[str, Any]) -> None:
    kineto = fitprof.analyze(gpu_run["trace"], top_k=10)
    xspace = fitprof.analyze(gpu_run["xplane"], top_k=10)
    assert_same_report(kineto, xspace)
    # The values the trace was built with (agreement.GPU_STEP_US).
    assert (xspace.steps_analyzed, xspace.step_time_ms) == (GPU_STEPS, pytest.approx(GPU_STEP_US / 1e3))
    assert xspace.input_percent == pytest.approx(25.0)
    assert (xspace.htod_ms_per_step, xspace.htod_pinned_ms_per_step) == (pytest.approx(1.0), pytest.approx(1.0))
    assert xspace.htod_bytes_per_step == 4 * 2**20
    assert xspace.collective_ms_per_step == pytest.approx(1.0)
    assert [(o.name, round(o.self_ms_per_step, 6)) for o in xspace.top_ops] == [
        ("aten::addmm", 4.0),
        ("aten::copy_", 1.0),
        ("record_param_comms", 1.0),
        ("aten::relu", 0.5),
    ]
    assert (xspace.verdict, xspace.host, xspace.rank, xspace.world_size) == ("input-bound", GPU_HOST, 1, 2)


@pytest.mark.parametrize("name", FIXTURES)
def test_real_gpu_and_ddp_traces_read_two_ways_give_one_report(
    kineto_fixtures: Path, tmp_path: Path, name: str
) -> None:
    trace = kineto_fixtures / name
    if not trace.is_file():
        pytest.skip(f"{trace} not present")
    xplane = write_xspace(trace, tmp_path, "s", host="h")
    assert_same_report(fitprof.analyze(trace), fitprof.analyze(xplane))


@pytest.mark.parametrize("name", [n for n in FIXTURES if not n.startswith("cpu_only")])
def test_xprof_gives_real_gpu_traces_fitprofs_device_time_per_operator(
    kineto_fixtures: Path, tmp_path: Path, name: str
) -> None:
    """xprof's op statistics ("Device" rows) on the converted A100 / MI250 traces: fitprof's device top operators
    with their device time (syncs and memsets, which fitprof does not count, are not filed under any operator)."""
    trace = kineto_fixtures / name
    if not trace.is_file():
        pytest.skip(f"{trace} not present")
    raw = pytest.importorskip("xprof.convert.raw_to_tool_data")
    xplane = write_xspace(trace, tmp_path, "s", host="h")
    report = fitprof.analyze(xplane, top_k=5)
    assert report.op_time_source == "device"
    data, _ = raw.xspace_to_tool_data([str(xplane)], "framework_op_stats", {})
    ops = op_stats(json.loads(data))
    for op in report.top_ops:
        fitprof_us = op.self_ms_per_step * max(report.steps_analyzed, 1) * 1e3
        assert ops[("Device", op.name)] == pytest.approx(fitprof_us, rel=0.02), op.name


@pytest.mark.parametrize("name", [n for n in FIXTURES if not n.startswith("cpu_only")])
def test_xprof_steps_on_real_gpu_traces_are_the_profiler_steps(
    kineto_fixtures: Path, tmp_path: Path, name: str
) -> None:
    """Each step xprof's input-pipeline page lists on a converted A100 / MI250 trace lasts as long as fitprof's
    ``ProfilerStep#N`` (within 1%; xprof lists only steps that launched device work and may leave out the first and
    the last: its row ``k`` is the k-th step in time order)."""
    trace = kineto_fixtures / name
    if not trace.is_file():
        pytest.skip(f"{trace} not present")
    raw = pytest.importorskip("xprof.convert.raw_to_tool_data")
    xplane = write_xspace(trace, tmp_path, "s", host="h")
    data, _ = raw.xspace_to_tool_data([str(xplane)], "input_pipeline_analyzer", {})
    rows = table_rows(json.loads(data), 1)
    table = read_trace(trace)
    steps_ms = table[table["kind"] == "step"].sort_values("ts_us")["dur_us"].to_numpy() / 1e3
    if not len(steps_ms):
        assert not rows
        return
    assert rows
    for row in rows:
        assert float(row["stepTimeMs"]) == pytest.approx(steps_ms[int(row["stepnum"])], rel=0.01), row["stepnum"]


@pytest.mark.slow
def test_device_events_sit_on_gpu_planes_with_their_launching_op(gpu_run: dict[str, Any]) -> None:
    space = kineto_to_xspace(gpu_run["trace"])
    planes = {p.name: p for p in space.planes}
    assert set(planes) == {"/host:CPU", "/device:GPU:0", "Task Environment"}
    gpu = planes["/device:GPU:0"]
    assert [(line.name, line.display_name) for line in gpu.lines] == [("Stream #7", "stream 7"), ("Host steps", "")]
    metas = gpu.event_metadata
    stat_names = {k: v.name for k, v in gpu.stat_metadata.items()}
    # The host's step markers, repeated for xprof with the group id it gives each step (0, 1, ... in time order).
    markers = [
        (metas[ev.metadata_id].name, {stat_names[st.metadata_id]: st.int64_value for st in ev.stats})
        for ev in gpu.lines[1].events
    ]
    assert markers == [(f"ProfilerStep#{n}", {"group_id": n - 1}) for n in range(1, GPU_STEPS + 1)]
    seen = {}
    for ev in gpu.lines[0].events:
        stats = {stat_names[s.metadata_id]: xs.stat_value(s, stat_names) for s in ev.stats}
        meta = metas[ev.metadata_id]
        if stats["category"] == "gpu_user_annotation":  # the device-side mirror of a step: no marker for xprof
            assert not {"_r", "step_num", "correlation_id", "tf_op"} & set(stats), stats
            continue
        seen[meta.display_name or meta.name] = (meta.name, stats["tf_op"], stats["correlation_id"] > 0)
    assert seen == {
        "Memcpy HtoD (Pinned -> Device)": ("MemcpyHToD", "aten::copy_", True),  # xprof's name; the true one shown
        "ampere_sgemm_128x64_tn": ("ampere_sgemm_128x64_tn", "aten::addmm", True),
        "void at::native::vectorized_elementwise_kernel<4>": (
            "void at::native::vectorized_elementwise_kernel<4>",
            "aten::relu",
            True,
        ),
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL": (
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "record_param_comms",
            True,
        ),
    }


@pytest.mark.slow
def test_an_xspace_not_converted_by_fitprof_is_read_as_tensorflow(gpu_run: dict[str, Any], tmp_path: Path) -> None:
    """The Kineto reading is switched on by the converter's ``fitprof_source`` stat only; without it the file is
    classified by TensorFlow's line names, as any TensorFlow profile is."""
    space = kineto_to_xspace(gpu_run["trace"])
    env = next(p for p in space.planes if p.name == xs.TASK_ENV_PLANE)
    source_id = next(k for k, v in env.stat_metadata.items() if v.name == xs.STAT_SOURCE)
    kept = [s for s in env.stats if s.metadata_id != source_id]
    del env.stats[:]
    env.stats.extend(kept)
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(space.SerializeToString())
    report = fitprof.analyze(path)
    assert report.framework == "tensorflow" and report.host == "h"
    assert report.steps_analyzed == GPU_STEPS  # step_num/_r markers are TensorFlow's convention too
    assert report.input_percent == 0.0  # the DataLoader is not TensorFlow's IteratorGetNext


@pytest.mark.parametrize(
    ("name", "host"),
    [
        ("node-3.cluster_rank12.2026_11_30_09_00_00_epoch2.pt.trace.json.gz", "node-3.cluster"),  # fitprof's
        ("my_host_4711.1764493200123.pt.trace.json", "my_host"),  # torch's tensorboard_trace_handler
        ("trace.json.gz", ""),
        ("a100_ddp8_rank3_dataloader.json.gz", ""),
    ],
)
def test_trace_host_comes_from_the_file_name(name: str, host: str) -> None:
    assert trace_host(Path("/x") / name) == host


# --------------------------------------------------------------------------- xprof's pages, over HTTP
@pytest.fixture(scope="module")
def pages(lightning_run: dict[str, Any], gpu_run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each run's Profile-tab pages as TensorBoard serves them: ``{run: {tool: data}}``."""
    pytest.importorskip("xprof")
    from tbserver import get, tensorboard, wait_for

    out: dict[str, dict[str, Any]] = {}
    with tensorboard(lightning_run["logs"]) as base:
        runs = wait_for(
            lambda: len(get(base, "/data/plugin/profile/runs")) >= 2 and get(base, "/data/plugin/profile/runs")
        )
        assert runs and len(runs) == 2, runs
        for run in runs:
            name = run.split("/")[0]
            tools = {t.rstrip("@"): t for t in get(base, "/data/plugin/profile/run_tools", run=run)}
            out[name] = {}
            for tool in ("input_pipeline_analyzer", "overview_page", "framework_op_stats", "trace_viewer"):
                assert tool in tools, (run, sorted(tools))
                hosts = get(base, "/data/plugin/profile/hosts", run=run, tag=tools[tool])
                host = hosts[0]["hostname"] if isinstance(hosts[0], dict) else hosts[0]
                out[name][tool] = get(base, "/data/plugin/profile/data", run=run, tag=tools[tool], host=host)
    return out


@pytest.mark.slow
def test_xprof_pages_show_fitprofs_figures_for_the_lightning_run(
    lightning_run: dict[str, Any], pages: dict[str, dict[str, Any]]
) -> None:
    """Compared like with like: xprof's step is the whole ``ProfilerStep`` marker, fitprof's leaves its
    own ``fitprof/overhead`` spans out (``self_ms_per_step``); xprof's operator table counts the whole capture,
    which holds the window's warm-up step (recorded, not analysed), so fitprof's reader is summed over the whole
    capture for the operators."""
    report = fitprof.analyze(lightning_run["xplane"], top_k=5)
    marker_ms = report.step_time_ms + report.self_ms_per_step  # xprof's step: the whole marker
    ipa = input_pipeline_figures(pages["lightning"]["input_pipeline_analyzer"])
    assert ipa["steps"] == report.steps_analyzed == 5
    assert ipa["step_time_ms"] == pytest.approx(marker_ms, rel=0.01)
    # xprof's input share is of its step, the whole marker: fitprof's input time over the same marker
    marker_input_percent = 100 * report.input_ms_per_step / marker_ms
    assert abs(ipa["input_percent"] - marker_input_percent) <= 0.5
    assert ipa["summary"]["hardware_type"] == "CPU_ONLY"
    overview = overview_figures(pages["lightning"]["overview_page"])  # xprof rounds these to 0.1 ms
    assert overview["step_time_ms"] == pytest.approx(marker_ms, rel=0.01)
    assert abs(overview["input_percent"] - marker_input_percent) <= 0.5
    ops = op_stats(pages["lightning"]["framework_op_stats"])
    # torch's operators lead; an autograd node's own host time (AddmmBackward0) can rank among the first three on
    # a loaded machine: every ranked operator is checked against xprof's table below, whatever its name
    assert report.top_ops and report.top_ops[0].name.startswith("aten::")
    table = fitprof.read_trace(lightning_run["xplane"])
    host_ops = table[(table["kind"] == "op") & ~table["on_device"]]
    capture = host_ops.groupby("name")["self_us"].sum()  # fitprof's reader over the whole capture
    for op in report.top_ops:
        assert ops[("Host", op.name)] == pytest.approx(capture[op.name], rel=0.02), op.name
        # the analysed steps hold less than the capture: the warm-up step's occurrences are not analysed
        assert op.self_ms_per_step * report.steps_analyzed * 1e3 < capture[op.name], op.name


@pytest.mark.slow
def test_xprof_pages_show_device_compute_htod_and_ops_of_the_gpu_shaped_run(
    gpu_run: dict[str, Any], pages: dict[str, dict[str, Any]]
) -> None:
    """On a host with a GPU plane xprof analyses the device side only (README, "Open the result in TensorBoard"):
    step time (spanned by the converter's ``Host steps`` markers), device compute, host-to-device copies (its
    "Input" there), collectives and device time per operator agree."""
    report = fitprof.analyze(gpu_run["xplane"], top_k=10)
    ipa = input_pipeline_figures(pages["gpu"]["input_pipeline_analyzer"])
    assert ipa["summary"]["hardware_type"] == "GPU"
    assert ipa["steps"] == report.steps_analyzed
    assert ipa["step_time_ms"] == pytest.approx(report.step_time_ms, rel=0.01)  # the host step, not 7.1 ms of work
    overview = overview_figures(pages["gpu"]["overview_page"])
    assert overview["step_time_ms"] == pytest.approx(report.step_time_ms, rel=0.01)
    device_op_ms = sum(o.self_ms_per_step for o in report.top_ops)
    compute_ms = device_op_ms - report.htod_ms_per_step - report.collective_ms_per_step
    assert ipa["device_compute_ms"] == pytest.approx(compute_ms, rel=0.01)
    assert ipa["input_ms"] == pytest.approx(report.htod_ms_per_step, rel=0.01)
    assert ipa["device_collectives_ms"] == pytest.approx(report.collective_ms_per_step, rel=0.01)
    ops = op_stats(pages["gpu"]["framework_op_stats"])
    for op in report.top_ops:
        assert ops[("Device", op.name)] == pytest.approx(op.self_ms_per_step * report.steps_analyzed * 1e3, rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["lightning", "gpu"])
def test_trace_viewer_shows_the_true_event_names(
    run: str, lightning_run: dict[str, Any], gpu_run: dict[str, Any], pages: dict[str, dict[str, Any]]
) -> None:
    trace = {"lightning": lightning_run, "gpu": gpu_run}[run]["trace"]
    table = read_trace(trace)
    shown = {str(e.get("name", "")) for e in pages[run]["trace_viewer"]["traceEvents"] if e.get("ph") == "X"}
    steps = table[table["kind"] == "step"]
    # Every event of the trace under its own name; xprof appends the step number to the step markers it found
    # ("ProfilerStep#6 6"), as it does to TensorFlow's ("train 6").
    assert set(table["name"]) - set(steps["name"]) <= shown
    assert {f"{n} {int(s)}" for n, s in zip(steps["name"], steps["step_num"], strict=True)} <= shown
    assert not {"MemcpyHToD", "MemcpyDToH", "MemcpyDToD"} & shown  # xprof's copy names stay internal
    assert any(n.startswith("enumerate(DataLoader)#") for n in shown)

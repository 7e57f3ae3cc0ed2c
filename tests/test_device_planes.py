"""The converted XSpace's device planes carry the device's vendor and compute capability from Kineto's
``deviceProperties``, as TensorFlow's GPU tracer writes them, so that TensorBoard's Profile tab (xprof) names the
device instead of logging "Unknown device vendor". Read back through xprof's own overview page."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fitprof.traces import _xplane_schema as xs
from fitprof.traces.xspace_write import kineto_to_xspace, write_xspace


def _overview_device_type(xplane: Path) -> str:
    raw = pytest.importorskip("xprof.convert.raw_to_tool_data")
    data, _ = raw.xspace_to_tool_data([str(xplane)], "overview_page", {})
    text = data.decode() if isinstance(data, bytes) else data if isinstance(data, str) else json.dumps(data)
    start = text.index('"device_type"')
    return json.loads("{" + text[start : text.index(",", start)] + "}")["device_type"]


@pytest.mark.parametrize(
    ("name", "device_type"),
    [
        ("a100_ddp8_rank3_dataloader.json.gz", "Nvidia GPU (Ampere)"),  # computeMajor 8
        ("mi250_rocm_minitoy_train.json.gz", "AMD GPU - gfx-9XX series"),  # "AMD Radeon Graphics", warpSize 64
    ],
)
def test_xprof_names_the_device_of_a_converted_trace(
    kineto_fixtures: Path, tmp_path: Path, name: str, device_type: str
) -> None:
    xplane = write_xspace(kineto_fixtures / name, tmp_path, "s", host="h")
    assert _overview_device_type(xplane) == device_type


def test_device_plane_stats_come_from_device_properties(kineto_fixtures: Path) -> None:
    trace = json.loads(gzip.decompress((kineto_fixtures / "a100_ddp8_rank3_dataloader.json.gz").read_bytes()))
    props = {p["id"]: p for p in trace["deviceProperties"]}
    space = kineto_to_xspace(trace)
    planes = [p for p in space.planes if p.name.startswith(xs.DEVICE_PLANE_PREFIX)]
    assert planes
    for plane in planes:
        index = int(plane.name.removeprefix(xs.DEVICE_PLANE_PREFIX))
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        stats = {names[st.metadata_id]: xs.stat_value(st, names) for st in plane.stats}
        p = props[index]
        assert stats[xs.STAT_DEVICE_VENDOR] == "Nvidia"
        assert (stats[xs.STAT_COMPUTE_CAP_MAJOR], stats[xs.STAT_COMPUTE_CAP_MINOR]) == (
            p["computeMajor"],
            p["computeMinor"],
        )
        assert stats[xs.STAT_CORE_COUNT] == p["numSms"] and stats[xs.STAT_MEMORY_SIZE] == p["totalGlobalMem"]
        assert stats[xs.STAT_DEVICE_NAME] == p["name"]


def test_a_gpu_running_behind_the_host_lengthens_xprofs_steps_not_fitprofs(tmp_path: Path) -> None:
    """Each 10 ms host step launches a kernel that runs from 6 to 16 ms after the step's start: fitprof's step is
    the ``ProfilerStep#N`` marker (10 ms, the device work counted in the step that launched it); xprof's step runs
    from the marker's start to the end of the device work it launched (16 ms), so its rows overlap and differ from
    fitprof's, as docs/tensorboard.md says."""
    import fitprof
    from agreement import table_rows
    from test_exposed_verdicts import _planted

    raw = pytest.importorskip("xprof.convert.raw_to_tool_data")
    trace = _planted(tmp_path, compute=[(6000, 16000)], steps=5)
    report = fitprof.analyze(trace)
    assert (report.steps_analyzed, report.step_time_ms) == (5, 10.0)
    data, _ = raw.xspace_to_tool_data(
        [str(write_xspace(trace, tmp_path, "s", host="h"))], "input_pipeline_analyzer", {}
    )
    rows = table_rows(json.loads(data), 1)
    assert [float(r["stepTimeMs"]) for r in rows] == [16.0] * 5

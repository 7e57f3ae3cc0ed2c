"""Kineto -> XSpace conversion: no TensorFlow needed, wire-compatible with tsl's xplane.proto, xprof reads it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from fitprof import _session
from fitprof._session import session_name
from fitprof.traces.xspace_write import kineto_to_xspace, write_xspace

BASE_NS = 1_790_000_000_000_000_000
TRACE = {
    "baseTimeNanoseconds": BASE_NS,
    "host_name": "h1",
    "traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "thread 7 (python)"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#6", "pid": 7, "tid": 7, "ts": 100.0, "dur": 50.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 7, "tid": 7, "ts": 110.5, "dur": 20.25},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 7, "tid": 7, "ts": 150.0, "dur": 40.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 7, "tid": 9, "ts": 160.0, "dur": 5.0},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x", "ts": 90, "dur": 200},
    ],
}


def test_structure_and_times() -> None:
    space = kineto_to_xspace(TRACE)
    assert list(space.hostnames) == ["h1"]
    host, env = space.planes
    assert host.name == "/host:CPU" and env.name == "Task Environment"
    assert [line.name for line in host.lines] == ["thread 7 (python)", "7/9"]  # the "Trace" span is dropped
    stat_names = {k: v.name for k, v in host.stat_metadata.items()}
    event_names = {k: v.name for k, v in host.event_metadata.items()}
    main = host.lines[0]
    assert main.timestamp_ns == 0  # relative to the profile start, like TensorFlow's exports
    step = main.events[0]
    assert event_names[step.metadata_id] == "ProfilerStep#6"
    assert step.duration_ps == 50_000_000
    stats = {stat_names[s.metadata_id]: s for s in step.stats}
    assert stats["step_num"].int64_value == 6 and stats["_r"].int64_value == 1
    addmm = main.events[1]
    assert addmm.offset_ps == 10_500_000 and addmm.duration_ps == 20_250_000
    env_names = {k: v.name for k, v in env.stat_metadata.items()}
    env_stats = {env_names[s.metadata_id]: s for s in env.stats}
    assert env_stats["profile_start_time"].uint64_value == BASE_NS + 100_000
    assert env_stats["profile_stop_time"].uint64_value == BASE_NS + 190_000
    assert env_stats["fitprof_source"].str_value == "kineto"
    assert env_stats["fitprof_framework"].str_value == "pytorch"


def test_bytes_parse_with_tensorflows_own_classes() -> None:
    xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
    theirs = xplane_pb2.XSpace.FromString(kineto_to_xspace(TRACE).SerializeToString())
    assert [p.name for p in theirs.planes] == ["/host:CPU", "Task Environment"]
    assert len(theirs.planes[0].lines[0].events) == 3


def test_works_without_tensorflow_and_xprof_finds_the_steps(tmp_path: Path) -> None:
    """In a fresh interpreter where ``import tensorflow`` fails."""
    (tmp_path / "trace.json").write_text(json.dumps(TRACE))
    code = textwrap.dedent(
        f"""
        import json, sys
        sys.modules["tensorflow"] = None  # any import of TensorFlow now raises
        from fitprof.traces.xspace_write import write_xspace
        path = write_xspace({str(tmp_path / "trace.json")!r}, {str(tmp_path / "run")!r}, "s1", host="h1")
        from xprof.convert.raw_to_tool_data import xspace_to_tool_data
        data, _ = xspace_to_tool_data([str(path)], "trace_viewer", {{}})
        names = [e.get("name", "") for e in json.loads(data)["traceEvents"]]
        ipa, _ = xspace_to_tool_data([str(path)], "input_pipeline_analyzer", {{}})
        print(json.dumps({{"path": str(path), "names": names, "steps": len(json.loads(ipa)[1]["rows"])}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["path"] == str(tmp_path / "run" / "plugins" / "profile" / "s1" / "h1.xplane.pb")
    assert "aten::addmm" in result["names"]
    assert sum(n.startswith("ProfilerStep#") for n in result["names"]) == 2
    assert result["steps"] >= 1  # xprof found step markers (it keeps only steps with work grouped in them)


def test_write_and_unique_session_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both names in the same second, whenever the test runs (it failed when the clock ticked between the calls).
    monkeypatch.setattr(_session, "time", types.SimpleNamespace(strftime=lambda fmt: "2026_01_02_03_04_05"))
    first = session_name(tmp_path, epoch=0)
    assert first == "2026_01_02_03_04_05_epoch0"
    write_xspace(TRACE["traceEvents"], tmp_path, first, host="h1")  # a bare event list works too
    assert (tmp_path / "plugins" / "profile" / first / "h1.xplane.pb").is_file()
    assert session_name(tmp_path, epoch=0) == f"{first}_2"  # same second, same epoch: taken


def test_rejects_what_is_not_a_trace(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt.trace.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a readable Kineto trace"):
        kineto_to_xspace(bad)
    with pytest.raises(ValueError, match="traceEvents"):
        kineto_to_xspace({"foo": 1})

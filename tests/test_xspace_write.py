"""Kineto -> XSpace conversion: no TensorFlow needed, wire-compatible with tsl's xplane.proto, xprof reads it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from fitprof import _session
from fitprof._session import session_name
from fitprof.traces.xspace_write import kineto_to_xspace, write_xspace
from shared_fixtures import optional_shared_kineto

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


@pytest.mark.slow
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


# ------------------------------------------------------------------ the converter's fast reading of a trace file
def _trace_files(tmp_path: Path) -> list[Path]:
    """Kineto traces of every shape at hand: the project's own recordings, generated GPU traces (launches,
    copies, device planes), and the shared real A100 / MI250 / CPU fixtures where ``../shared`` is present."""
    from gputrace import kineto_trace, write_kineto

    files = sorted(Path(__file__).parent.joinpath("data").glob("*.pt.trace.json.gz"))
    for seed in range(3):
        doc, _ = kineto_trace(seed=seed)
        write_kineto(tmp_path / f"gen{seed}.pt.trace.json.gz", doc)
        files.append(tmp_path / f"gen{seed}.pt.trace.json.gz")
    files += optional_shared_kineto()  # an extra layer: the test stands without it
    return files


def test_a_file_is_loaded_and_classified_as_its_parsed_events_are(tmp_path: Path) -> None:
    """From a file the converter decodes with msgspec (json only where msgspec refuses): the same events as the
    stdlib parse, and so the same XSpace as converting the parsed dict. ``event_frame`` encodes a batch of events
    in one call: the same bytes as each event's encoding joined, which the reader's batches are."""
    import gzip

    import msgspec

    from fitprof.traces import xspace_write
    from fitprof.traces.kineto import _BATCH, complete_events

    files = _trace_files(tmp_path)
    assert len(files) >= 5
    for path in files:
        parsed = json.loads(gzip.decompress(path.read_bytes()))
        loaded = xspace_write.load_kineto(path)
        assert loaded == parsed, path
        complete = complete_events([e for e in loaded["traceEvents"] if isinstance(e, dict)])
        for start in range(0, len(complete), _BATCH):
            batch = complete[start : start + _BATCH]
            joined = b"[" + b",".join(msgspec.json.encode(e) for e in batch) + b"]"
            assert msgspec.json.encode(batch) == joined, path
        if len(complete) > 20_000:  # the A100 DDP fixture: its two conversions took 6 s of the suite
            continue
        from_file, from_dict = kineto_to_xspace(path, host="h"), kineto_to_xspace(parsed, host="h")
        # the file adds the host its name gives to the Task Environment plane; every other plane is the same
        assert [p.name for p in from_file.planes] == [p.name for p in from_dict.planes]
        for plane_a, plane_b in zip(from_file.planes[:-1], from_dict.planes[:-1], strict=True):
            assert plane_a == plane_b, (path, plane_a.name)
        assert from_file.planes[-1].name == "Task Environment"


@pytest.mark.parametrize(
    ("literal", "field", "value"),
    [
        ("NaN", "double_value", math.nan),  # msgspec refuses it: json reads it
        ("1e400", "double_value", math.inf),  # msgspec refuses it: json reads it
        ("123456789012345678901234567890", "uint64_value", 123456789012345678901234567890 % 2**64),  # msgspec reads
        ('"caf\\u00e9"', "str_value", "caf\u00e9"),  # msgspec reads it
    ],
)
def test_unusual_json_values_are_read_as_json_reads_them(tmp_path: Path, literal: str, field: str, value: Any) -> None:
    """An arg written as NaN or a number past float64 (torch has written NaN) is read as Python's json reads it:
    msgspec decodes the file, json where msgspec refuses it, and the file is not refused; the stat holds it."""
    text = json.dumps(TRACE).replace('"dur": 20.25', f'"dur": 20.25, "args": {{"odd": {literal}}}')
    path = tmp_path / "odd.pt.trace.json"
    path.write_text(text)
    from fitprof.traces.xspace_write import load_kineto

    (op,) = [e for e in load_kineto(path)["traceEvents"] if e.get("name") == "aten::addmm"]
    assert op["args"]["odd"] == json.loads(literal) or math.isnan(op["args"]["odd"])
    host = next(p for p in kineto_to_xspace(path).planes if p.name == "/host:CPU")
    odd = next(m.id for m in host.stat_metadata.values() if m.name == "odd")
    (stat,) = [s for line in host.lines for e in line.events for s in e.stats if s.metadata_id == odd]
    assert stat.WhichOneof("value") == field
    got = getattr(stat, field)
    assert got == value or (math.isnan(value) and math.isnan(got))


def test_a_lone_surrogate_or_an_infinite_correlation(tmp_path: Path) -> None:
    """A string no UTF-8 can hold is refused as the reader refuses it, one TraceError naming the file (a
    UnicodeEncodeError without the file's name before); a correlation of 1e400 is no correlation."""
    from fitprof.traces import TraceError

    path = tmp_path / "odd.pt.trace.json"
    path.write_text(json.dumps(TRACE).replace('"dur": 20.25', '"dur": 20.25, "args": {"odd": "\\ud800"}'))
    with pytest.raises(TraceError, match=r"odd\.pt\.trace\.json: not a Chrome trace"):
        kineto_to_xspace(path)
    path.write_text(json.dumps(TRACE).replace('"dur": 20.25', '"dur": 20.25, "args": {"correlation": 1e400}'))
    host = next(p for p in kineto_to_xspace(path).planes if p.name == "/host:CPU")
    names = {m.id: m.name for m in host.stat_metadata.values()}
    stats = [names[s.metadata_id] for line in host.lines for e in line.events for s in e.stats]
    assert "tf_op" in stats and "correlation_id" not in stats


def test_a_file_the_reader_refuses_still_converts_from_its_parsed_events(tmp_path: Path) -> None:
    """A number among the events: the Kineto reader refuses such a file; the converter skips the non-object and
    converts the rest as the trace without it."""
    doc = dict(TRACE, traceEvents=[1, *TRACE["traceEvents"]])
    path = tmp_path / "odd.pt.trace.json"
    path.write_text(json.dumps(doc))
    from fitprof.traces import TraceError, read_trace

    with pytest.raises(TraceError):
        read_trace(path)
    assert kineto_to_xspace(path, host="h").planes[0] == kineto_to_xspace(TRACE, host="h").planes[0]


def test_event_frame_takes_any_sequence_of_events() -> None:
    """``event_frame`` encodes a batch of events in one msgspec call, which takes lists and tuples only: any other
    sequence of events gives the same frame as the list."""
    import collections

    from fitprof.traces.kineto import complete_events, event_frame

    events = complete_events(TRACE["traceEvents"])
    want = event_frame(events, "p")
    assert len(want) == 4
    for other in (tuple(events), collections.UserList(events), collections.deque(events)):
        assert event_frame(other, "p").equals(want), type(other)  # type: ignore[arg-type]


def test_events_nested_past_the_encoders_limit_are_one_trace_error() -> None:
    """An event nested deeper than msgspec can encode gives the reader's TraceError, not a bare RecursionError."""
    from fitprof.traces import TraceError
    from fitprof.traces.kineto import event_frame

    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    event = {"ph": "X", "cat": "cpu_op", "name": "n", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"deep": deep}}
    with pytest.raises(TraceError, match="nested deeper than the parser's limit"):
        event_frame([event], "deep.pt.trace.json")

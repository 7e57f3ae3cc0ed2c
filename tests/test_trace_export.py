"""The torch trace export's own steps: a cut-short step dropped from the plain JSON, and the fast gzip."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec

from fitprof.profilers.torch import GZIP_LEVEL, _drop_events, _gzip_file

EVENTS = [
    {"ph": "M", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "args": {"name": "kept: not a complete event"}},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 1.5, "dur": 10.25},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 12.0, "dur": 3.0},
    {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": "Spans",
        "tid": 1,
        "ts": 13.000001,
        "dur": 1e-3,
        "args": {"correlation": 7, "big": 2**60},
    },
]


def test_drop_events_keeps_everything_else_exactly(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    doc = {"schemaVersion": 1, "traceEvents": EVENTS, "baseTimeNanoseconds": 1790000000000000000}
    path.write_text(json.dumps(doc))
    _drop_events(path, "ProfilerStep#3")
    back = json.loads(path.read_text())
    assert back == {**doc, "traceEvents": [EVENTS[0], EVENTS[1], EVENTS[3]]}
    assert list(back) == list(doc)  # the document's keys in their order


def test_drop_events_on_a_large_window(tmp_path: Path) -> None:
    """A window of 200k events, read back whole without the dropped ones."""
    n = 200_000
    events = [{"ph": "X", "name": f"op{i % 50}", "pid": 1, "tid": 1, "ts": float(i), "dur": 1.0} for i in range(n)]
    path = tmp_path / "t.json"
    path.write_bytes(msgspec.json.encode({"traceEvents": events}))
    _drop_events(path, "op7")
    back = msgspec.json.decode(path.read_bytes())["traceEvents"]
    assert len(back) == n - n // 50 and all(e["name"] != "op7" for e in back)


def test_gzip_file_is_a_gzip_stream_at_the_fast_level(tmp_path: Path) -> None:
    src, dst = tmp_path / "t.json", tmp_path / "t.json.gz"
    text = json.dumps({"traceEvents": EVENTS * 1000}).encode()
    src.write_bytes(text)
    _gzip_file(src, dst)
    assert gzip.decompress(dst.read_bytes()) == text  # readable by the standard library
    assert GZIP_LEVEL == 1
    assert [p.name for p in tmp_path.iterdir() if "fitprof-tmp" in p.name] == []

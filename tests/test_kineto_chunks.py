"""The Kineto reader's one-pass path: its tables are the three-pass reader's, bit for bit, or it steps aside.

:func:`fitprof.traces.kineto._load_in_chunks` decodes the ``traceEvents`` array a few MB of text at a time, cutting
at ``}`` + ``,``; it must give exactly the table of the three-pass reader (validate, raw slices, batches) that it
replaced as the default, built by :func:`fitprof.traces.make_table`, on every trace: real GPU traces, the shipped
traces, generated ones, names full of ``},`` cut into one-byte chunks. Where it cannot prove its reading (a key
spelled with escapes, a trailing comma, a nested ``traceEvents``) it returns ``None`` and the three-pass reader
reads the file, errors and all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import gputrace
from fitprof.traces import TraceError, kineto, make_table
from fitprof.traces import _kineto_rules as kineto_rules
from fitprof.traces._limits import Limits, read_bounded
from fuzz_traces import kineto_seed
from shared_fixtures import SHARED_KINETO, SHIPPED_KINETO, shared_kineto


def _three_pass_table(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The table of the three-pass reader and :func:`make_table`, the one-pass path switched off."""
    with monkeypatch.context() as m:
        m.setattr(kineto, "_load_in_chunks", lambda data, path, objects: None)
        meta, cols = kineto._load(path, Limits.of())
        return make_table(kineto_rules.frame(cols, path)), meta


def _assert_same(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = read_bounded(path, Limits.of(), TraceError)
    assert kineto._load_in_chunks(data, path, data.count(b"{")) is not None, (
        f"{path.name}: the one-pass path stepped aside"
    )
    table = kineto.read_kineto(path)
    expected, meta = _three_pass_table(path, monkeypatch)
    assert table.equals(expected), path.name
    assert table.dtypes.equals(expected.dtypes) and list(table.columns) == list(expected.columns)
    for col in ("name", "kind", "pid", "tid", "op", "copy_kind"):  # the same Python types too (Kind members)
        assert list(map(type, table[col])) == list(map(type, expected[col])), (path.name, col)
    dist = meta.get("distributedInfo", {})
    assert (table.attrs["rank"], table.attrs["world_size"]) == (dist.get("rank"), dist.get("world_size"))


def _adversarial(path: Path) -> Path:
    """The fuzz seed trace with names full of would-be cuts, args holding lists of objects, and ``]`` after the
    events (``deviceProperties`` written last), indented as Kineto writes."""
    doc = kineto_seed(steps=6)
    tricks = ['},{"ph":"X"', "}, ]", "}\n,{", '\\"},', "}]", '"traceEvents": [']
    for i, event in enumerate(doc["traceEvents"]):
        event["name"] = f"{event.get('name', '')}{tricks[i % len(tricks)]}"
        if i % 5 == 0:
            event.setdefault("args", {})["nested"] = [{"a": 1}, {"b": [{"c": "},"}]}]
    doc["deviceProperties"] = [{"id": 0}, {"id": 1, "name": "]"}]
    doc["distributedInfo"] = {"rank": 3, "world_size": 8}
    path.write_text(json.dumps(doc, indent=1))
    return path


@pytest.mark.parametrize("name", SHARED_KINETO)
def test_one_pass_table_is_the_three_pass_table_on_real_gpu_traces(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _assert_same(shared_kineto(name), monkeypatch)


@pytest.mark.parametrize("chunk", [1, 97, 1 << 22])
def test_one_pass_table_is_the_three_pass_table_in_any_chunk_size(
    tmp_path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut after every event (1 byte: the next ``}`` + ``,``), every few events, or not at all; cuts inside names
    and nested args are tried, refused and passed over."""
    gpu_doc, _ = gputrace.kineto_trace(steps=3)
    paths = [gputrace.write_kineto(tmp_path / "gpu.pt.trace.json.gz", gpu_doc), _adversarial(tmp_path / "t.json")]
    bare = tmp_path / "bare.json"  # the legacy layout: a bare list of events
    bare.write_text(json.dumps(kineto_seed(steps=4)["traceEvents"]))
    paths.append(bare)
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", chunk)
    for path in paths:
        _assert_same(path, monkeypatch)


def test_one_pass_table_is_the_three_pass_table_on_the_shipped_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The traces fitprof's own callbacks wrote (Lightning, two gloo DDP ranks), cut every 16 KB."""
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 1 << 14)
    for path in SHIPPED_KINETO:
        _assert_same(path, monkeypatch)


def test_what_the_one_pass_path_cannot_prove_goes_to_the_three_pass_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second ``traceEvents`` key spelled with an escape, a nested one, a trailing comma, a bad ``ts``: the
    one-pass path steps aside and the three-pass reader gives its table or its error."""
    seed = kineto_seed(steps=3)
    events = json.dumps(seed["traceEvents"])
    decoy = '[{"ph": "X", "cat": "cpu_op", "name": "decoy", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]'
    cases = {
        "escaped_key": f'{{"meta": {{"traceEvents": {decoy}}}, "trace\\u0045vents": {events}}}',
        "nested_only": f'{{"meta": {{"traceEvents": {events}}}}}',
        "trailing_comma": f'{{"traceEvents": {events[:-1]},]}}',
        "bad_ts": json.dumps({"traceEvents": [*seed["traceEvents"][:5], {"ph": "X", "ts": "soon", "dur": 1}]}),
    }
    for case, text in cases.items():
        path = tmp_path / f"{case}.pt.trace.json"
        path.write_text(text)
        data = read_bounded(path, Limits.of(), TraceError)
        assert kineto._load_in_chunks(data, path, data.count(b"{")) is None, case
        try:
            expected, _ = _three_pass_table(path, monkeypatch)
        except TraceError as err:
            with pytest.raises(TraceError) as got:
                kineto.read_kineto(path)
            assert str(got.value) == str(err), case
            continue
        assert kineto.read_kineto(path).equals(expected), case
    assert not kineto.read_kineto(tmp_path / "escaped_key.pt.trace.json")["name"].eq("decoy").any()
    with pytest.raises(TraceError, match="not a Chrome trace"):
        kineto.read_kineto(tmp_path / "nested_only.pt.trace.json")
    with pytest.raises(TraceError, match="not valid JSON"):
        kineto.read_kineto(tmp_path / "trailing_comma.pt.trace.json")

"""Trace and report files written by someone else: bounded memory, one clear error, no path outside the log folder.

The fuzz test runs a seeded mutator (``fuzz_traces.py``) over small seed traces: every mutant must give a report
or a :class:`~fitprof.traces.TraceError`, with the memory Python allocates for it (``tracemalloc``) under a bound.
The decompression bombs run in a child process whose peak RSS (Linux's ``VmHWM``) is read back. A longer run
of the same mutator is ``benchmarks/fuzz_traces.py``.
"""

from __future__ import annotations

import builtins
import gzip
import io
import json
import os
import random
import subprocess
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import fitprof
import gputrace
from fitprof import cli
from fitprof._session import check_session
from fitprof.report_files import write_report_file
from fitprof.traces import TraceError, _limits, read_trace
from fitprof.traces._limits import DEFAULT_MAX_EVENTS, DEFAULT_MAX_TRACE_MB
from fitprof.traces.xspace_write import xplane_classes
from fuzz_traces import PEAK_RSS_SOURCE, bomb, byte_mutation, json_mutation, kineto_seed, xspace_seed
from shared_fixtures import KINETO_DIR, LIGHTNING_CPU, optional_shared_kineto

ROOT = Path(__file__).resolve().parents[1]
FUZZ_INPUTS = 250
FUZZ_SEED = 20
FUZZ_BOUNDS = {"max_trace_mb": 4.0, "max_events": 200_000}
FUZZ_RSS_GROWTH_MB = 64
"""Peak RSS growth allowed over the whole fuzz run (inputs below 1 MB under a 4 MB bound)."""

_FUZZ_CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import fuzz_traces
bounds = json.loads(sys.argv[6])
print(json.dumps(fuzz_traces.run(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]).parent,
                                 Path(sys.argv[7]), **bounds)))
"""


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.slow
def test_fuzzed_traces_give_a_report_or_trace_error(tmp_path: Path) -> None:
    """Every mutant gives a report or a TraceError naming the file; the process's peak RSS barely grows."""
    args = [
        str(ROOT / "tests"),
        str(FUZZ_INPUTS),
        str(FUZZ_SEED),
        str(tmp_path),
        str(ROOT / "tests"),
        json.dumps(FUZZ_BOUNDS),
        str(KINETO_DIR if optional_shared_kineto() else tmp_path / "no-shared-fixtures"),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", _FUZZ_CHILD, *args],
        capture_output=True,
        text=True,
        env=_child_env(),
        timeout=600,  # a hang detector, not a timing: the run takes seconds
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["failures"] == []
    outcomes = result["outcomes"]
    assert sum(outcomes.values()) == FUZZ_INPUTS
    # Both outcomes occur: the mutator neither only breaks files nor leaves them all readable.
    assert outcomes["report"] > FUZZ_INPUTS // 10 and outcomes["TraceError"] > FUZZ_INPUTS // 10, outcomes
    assert (result["peak_kb"] - result["baseline_kb"]) / 1024 < FUZZ_RSS_GROWTH_MB, result


def test_fuzzed_report_files_give_a_row_or_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seed_trace = tmp_path / "seed.pt.trace.json"
    seed_trace.write_text(json.dumps(kineto_seed()))
    report = fitprof.analyze(seed_trace)
    run = tmp_path / "logs" / "run"
    path = write_report_file(run, session="s", epoch=1, report=report, trace=seed_trace, rank=0)
    doc = json.loads(path.read_text())
    rng = random.Random(FUZZ_SEED)
    statuses: Counter[int] = Counter()
    for _ in range(60):
        label, data = json_mutation(doc, rng) if rng.random() < 0.7 else byte_mutation(json.dumps(doc).encode(), rng)
        path.write_bytes(data)
        status = cli.main(["report", str(tmp_path / "logs"), "--format", "json"])
        out, err = capsys.readouterr()
        statuses[status] += 1
        assert status in (0, 2), label
        assert all(line.startswith("fitprof: error: ") for line in err.splitlines()), (label, err)
        if status == 0:
            assert json.loads(out)[0]["run"] == "run", label
        else:
            assert len(err.splitlines()) == 1 and str(path) in err, (label, err)
    assert statuses[0] and statuses[2], statuses


# ------------------------------------------------------------------------------------------------ bombs

_CHILD = (
    PEAK_RSS_SOURCE
    + """
import json, sys
import fitprof
from fitprof.traces import TraceError
fitprof.analyze(sys.argv[1])  # imports and first-call costs are paid before the baseline
before = peak_rss_kb()
try:
    fitprof.analyze(sys.argv[2], max_trace_mb=float(sys.argv[3]), max_events=int(sys.argv[4]))
    error = None
except TraceError as err:
    error = str(err)
after = peak_rss_kb()
print(json.dumps({"before_kb": before, "after_kb": after, "error": error}))
"""
)


def _read_in_child(seed: Path, path: Path, max_trace_mb: float, max_events: int) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(seed), str(path), str(max_trace_mb), str(max_events)],
        capture_output=True,
        text=True,
        env=_child_env(),
        timeout=300,
        check=True,
    )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "plain_mb", "what"),
    [
        ("whitespace", 64, "inflates to more than"),  # the bomb: whitespace inside traceEvents
        ("events", 15, "more than the bound of 1,000,000 events"),  # 1.4 million events: over this bound only
        ("numbers", 8, "event 0"),  # the first value that is not an event stops the decoder
        ("deep", 8, "nested deeper"),
    ],
)
def test_bomb_fails_fast_with_peak_rss_near_the_bound(tmp_path: Path, kind: str, plain_mb: int, what: str) -> None:
    seed = tmp_path / "seed.pt.trace.json"
    seed.write_text(json.dumps(kineto_seed()))
    path = tmp_path / f"bomb_{kind}.pt.trace.json.gz"
    path.write_bytes(bomb(kind, plain_mb))
    assert path.stat().st_size < plain_mb * 2**20 / 500  # it is a bomb: the file is far smaller than it inflates
    bound_mb, max_events = 16.0, 1_000_000
    result = _read_in_child(seed, path, bound_mb, max_events)
    assert result["error"] is not None and str(path) in result["error"] and what in result["error"], result
    if kind == "whitespace":
        assert "more than 16 MB, the bound" in result["error"] and "--max-trace-mb" in result["error"]
    if kind == "events":
        assert "--max-events" in result["error"]
    grown_mb = (result["after_kb"] - result["before_kb"]) / 1024
    # The bytes held are the bound at most (plus one 1 MB step); the inflated size is never reached.
    assert grown_mb < bound_mb + 8, result


def test_cli_bound_error_is_one_line_and_raising_the_bound_reads_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.pt.trace.json.gz"
    path.write_bytes(bomb("whitespace", 24))
    assert cli.main(["analyze", str(path), "--max-trace-mb", "10"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"fitprof: error: {path}: it inflates to more than 10 MB")
    assert "--max-trace-mb" in err
    assert cli.main(["analyze", str(path), "--max-trace-mb", "30", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)[0]["verdict"] == "no-steps"  # whitespace only: a trace without steps

    events = tmp_path / "many.pt.trace.json"
    seed = kineto_seed(steps=40)
    events.write_text(json.dumps(seed))
    n = len(seed["traceEvents"])
    assert events.read_bytes().count(b"{") > n  # the events' args are objects too: they are not counted
    assert cli.main(["analyze", str(events), "--max-events", str(n - 1)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"at least {n:,} events" in err and "raise it with --max-events" in err
    assert cli.main(["analyze", str(events), "--max-events", str(n), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["steps_analyzed"] > 0

    for bad in (["--max-trace-mb", "0"], ["--max-trace-mb", "nan"], ["--max-events", "-3"]):
        assert cli.main(["analyze", str(events), *bad]) == 2
        assert "expected" in capsys.readouterr().err


def test_default_bounds_and_bad_bounds(tmp_path: Path) -> None:
    assert (DEFAULT_MAX_TRACE_MB, DEFAULT_MAX_EVENTS) == (512.0, 10_000_000)
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps(kineto_seed()))
    for bad in ({"max_trace_mb": 0}, {"max_trace_mb": -1.0}, {"max_events": 0}, {"max_events": 1.5}):
        with pytest.raises(ValueError, match="must be"):
            read_trace(path, **bad)
    plain_size = path.stat().st_size
    with pytest.raises(TraceError, match=r"the file is .* MB, more than .* MB, the bound on one trace"):
        read_trace(path, max_trace_mb=plain_size / 1e6 / 2)
    assert len(read_trace(path, max_trace_mb=plain_size / 1e6)) > 0  # the bound itself is allowed


@pytest.fixture(params=[m.__name__ for m in _limits.INFLATERS])
def inflater(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each module a gzip file may be inflated with (``isal.isal_zlib`` where installed, and ``zlib``) in turn."""
    monkeypatch.setattr(_limits, "INFLATERS", tuple(m for m in _limits.INFLATERS if m.__name__ == request.param))
    return str(request.param)


def test_gzip_streaming_matches_gzip_decompress(tmp_path: Path, inflater: str) -> None:
    doc = kineto_seed(steps=200)
    plain = json.dumps(doc).encode()
    path = tmp_path / "t.pt.trace.json.gz"
    reference = read_trace(_write(tmp_path / "t.pt.trace.json", plain))
    # One member, two concatenated members (gzip.decompress reads both), every compression level.
    half = len(plain) // 2
    for data in (
        gzip.compress(plain, 1),
        gzip.compress(plain, 9),
        gzip.compress(plain[:half]) + gzip.compress(plain[half:]),
    ):
        table = read_trace(_write(path, data))
        assert table.equals(reference)
    good = gzip.compress(plain)
    for broken, what in [(good[:-5], "gzip"), (good + b"junk", "after the end"), (good[:-8] + b"\0" * 8, "gzip")]:
        with pytest.raises(TraceError, match=what):
            read_trace(_write(path, broken))


def test_each_inflater_reads_members_and_stops_at_the_bound(tmp_path: Path, inflater: str) -> None:
    """``isal.isal_zlib`` and ``zlib`` give ``gzip.decompress``'s bytes for one member, several, a file that
    inflates 1,000-fold, an empty one; and both stop at the bound."""
    plain = json.dumps(kineto_seed(steps=300)).encode()
    third = len(plain) // 3
    path = tmp_path / "t.json.gz"
    cases = {
        "one member": gzip.compress(plain),
        "a short last member": gzip.compress(plain[:-third]) + gzip.compress(plain[-third:]),
        "three members": gzip.compress(plain[:third]) + gzip.compress(b"") + gzip.compress(plain[third:]),
        "whitespace": gzip.compress(plain + b" " * (4 << 20)),
        "empty": gzip.compress(b""),
    }
    for what, data in cases.items():
        got = _limits.read_bounded(_write(path, data), _limits.Limits.of(max_trace_mb=64), TraceError)
        assert got == gzip.decompress(data), (inflater, what)
    small = _limits.Limits.of(max_trace_mb=len(plain) / 1e6 - 1e-6)
    with pytest.raises(TraceError, match="inflates to more than"):
        _limits.read_bounded(_write(path, gzip.compress(plain)), small, TraceError)


def test_reserved_gzip_flags_are_refused_by_each_inflater(tmp_path: Path, inflater: str) -> None:
    """RFC 1952's reserved FLG bits: zlib refuses them and ISA-L ignores them; fitprof refuses them with either, in
    the first member and in a later one, so a file reads the same whichever inflater is installed."""
    plain = json.dumps(kineto_seed(steps=3)).encode()
    flagged = bytearray(gzip.compress(plain))
    flagged[3] |= 0xE0
    for data in (bytes(flagged), gzip.compress(plain[:10]) + bytes(flagged)):
        with pytest.raises(TraceError, match=r"truncated or corrupt gzip \(unknown header flags set\)"):
            _limits.read_bounded(_write(tmp_path / "f.json.gz", data), _limits.Limits.of(), TraceError)


@pytest.mark.parametrize("field", ["ts", "dur"])
def test_an_integer_past_float64s_range_is_a_trace_error(tmp_path: Path, field: str) -> None:
    """msgspec keeps a 400-digit integer exact; turning it into float64 overflows: one TraceError naming the event."""
    event = {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 5, "dur": 1}
    text = json.dumps({"traceEvents": [event, event]}).replace(
        f'"{field}": 1' if field == "dur" else '"ts": 5', f'"{field}": 1{"0" * 400}', 1
    )
    with pytest.raises(TraceError, match=f"complete event 0 has {field} 10000"):
        read_trace(_write(tmp_path / "big.pt.trace.json", text.encode()))


def test_counting_objects_in_steps_is_bytes_count(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(11)
    for step in (1, 7, 64, 1 << 20):
        monkeypatch.setattr(_limits, "_COUNT_STEP", step)
        for size in (0, 1, 7, 8, 63, 64, 65, 1000):
            data = bytearray(rng.choice(b'{}[]," a') for _ in range(size))
            want = bytes(data).count(b"{")
            assert _limits.count_objects(data, "t.json", _limits.Limits.of(), TraceError) == want
            data += b"x"  # the buffer is not held by the count: it can grow again
            if want > 1:
                with pytest.raises(TraceError, match=f"up to {want:,} events .* it holds {want:,} JSON objects"):
                    _limits.count_objects(data, "t.json", _limits.Limits.of(max_events=want - 1), TraceError)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# ----------------------------------------------------------------------------------------------- XSpace


def test_xspace_bounds(tmp_path: Path) -> None:
    data = xspace_seed(kineto_seed())
    path = _write(tmp_path / "h.xplane.pb", data)
    n_events = len(read_trace(path))
    with pytest.raises(TraceError, match=r"h\.xplane\.pb: the file is .*--max-trace-mb"):
        read_trace(path, max_trace_mb=len(data) / 1e6 / 2)
    with pytest.raises(TraceError, match=r"more than the bound of 5 events.*--max-events"):
        read_trace(path, max_events=5)
    assert len(read_trace(path, max_events=n_events + 100)) == n_events  # every event counted, Task Env included

    space = xplane_classes()["XSpace"].FromString(data)
    host = next(p for p in space.planes if p.name.startswith("/host:"))
    meta = host.event_metadata[next(iter(host.event_metadata))]
    meta.name = "x" * 1_000_001
    with pytest.raises(TraceError, match=r"1,000,001 characters, more than the bound of 1,000,000"):
        read_trace(_write(path, space.SerializeToString()))
    meta.name = "x" * 1_000_000  # at the bound: read, and one str shared by the events that name it
    table = read_trace(_write(path, space.SerializeToString()))
    long_names = table["name"][table["name"].str.len() == 1_000_000]
    assert len(long_names) >= 1 and len({id(n) for n in long_names}) == 1


# ------------------------------------------------------------------------------------- report files


def _run_with_report(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    seed = tmp_path / "logs" / "run" / "plugins" / "profile" / "s" / "h.pt.trace.json"
    seed.parent.mkdir(parents=True)
    seed.write_text(json.dumps(kineto_seed()))
    path = write_report_file(tmp_path / "logs" / "run", session="s", epoch=2, report=fitprof.analyze(seed), trace=seed)
    return tmp_path / "logs", path, json.loads(path.read_text())


class _OpenedFiles:
    """Every path opened through ``open`` / ``io.open`` / ``os.open`` while it is installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[Path] = []
        real_open, real_os_open = builtins.open, os.open

        def spy(file: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, (str, os.PathLike)):
                self.paths.append(Path(os.fspath(file)).resolve())
            return real_open(file, *args, **kwargs)

        def os_spy(file: Any, *args: Any, **kwargs: Any) -> Any:
            self.paths.append(Path(os.fspath(file)).resolve())
            return real_os_open(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", spy)
        monkeypatch.setattr(io, "open", spy)
        monkeypatch.setattr(os, "open", os_spy)


@pytest.mark.parametrize(
    "trace",
    ["../../../../../../etc/passwd", "/etc/passwd", "../../outside.pt.trace.json", "../..", "a/../../../../x"],
)
def test_tampered_trace_field_never_leads_outside_the_logdir(
    tmp_path: Path, trace: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    logdir, path, doc = _run_with_report(tmp_path)
    (tmp_path / "outside.pt.trace.json").write_text("secret")
    doc.update(trace=trace, run="../../elsewhere")  # a "run" key is not one the reader uses: it stays ignored
    doc["report"]["source"] = "recorded/at/write/time.pt.trace.json"
    path.write_text(json.dumps(doc))
    opened = _OpenedFiles(monkeypatch)
    assert cli.main(["report", str(logdir), "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    monkeypatch.undo()
    assert row["run"] == "run"
    # The trace path is kept only where it stays inside the log folder; else the report's own source is shown.
    assert row["source"] == "recorded/at/write/time.pt.trace.json"
    assert opened.paths and all(p.is_relative_to(logdir.resolve()) for p in opened.paths), opened.paths


def test_trace_field_inside_the_run_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logdir, _, _ = _run_with_report(tmp_path)
    assert cli.main(["report", str(logdir), "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["source"] == str(logdir / "run" / "plugins" / "profile" / "s" / "h.pt.trace.json")


@pytest.mark.parametrize("session", ["../../../evil", "/tmp/evil", "a/b", "..", ".", "", "a\\b", " s", "a\0b", 7])
def test_session_names_that_leave_the_folder_are_refused(
    tmp_path: Path, session: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="not a plain folder name"):
        check_session(session)
    logdir, path, doc = _run_with_report(tmp_path)
    if isinstance(session, str):
        deep_run = logdir / "a" / "b" / "run"
        with pytest.raises(ValueError, match="not a plain folder name"):
            write_report_file(
                deep_run,
                session=session,
                epoch=0,
                report=fitprof.analyze(path.parent.parent / "profile" / "s" / "h.pt.trace.json"),
                trace=path,
            )
        assert not (logdir / "a").exists() and not any("evil" in p.name for p in tmp_path.rglob("*"))
    doc["session"] = session
    path.write_text(json.dumps(doc))
    assert cli.main(["report", str(logdir)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and f"{path}: not a fitprof report (session" in err


def test_report_file_links_outside_the_logdir_are_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    logdir, path, doc = _run_with_report(tmp_path)
    outside = tmp_path / "elsewhere"
    (outside / "plugins" / "fitprof").mkdir(parents=True)
    foreign = outside / "plugins" / "fitprof" / "x.rank0.json"
    foreign.write_text(json.dumps({**doc, "epoch": 99}))
    link = path.parent / "linked.rank1.json"
    link.symlink_to(foreign)
    opened = _OpenedFiles(monkeypatch)
    assert cli.main(["report", str(logdir), "--format", "json"]) == 0  # the good file reported, the link skipped
    out, err = capsys.readouterr()
    monkeypatch.undo()
    assert [r["epoch"] for r in json.loads(out)] == [2]
    assert err.count("\n") == 1 and f"{link}: a link to {foreign.resolve()}, outside the log folder" in err
    assert foreign.resolve() not in opened.paths


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),  # crashed `fitprof report` with a RecursionError
        (b'{"report": ' + b" " * 4_000_000 + b"{}}", "bigger than 4 MB"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[1, 2]", "not a JSON object"),
    ],
)
def test_hostile_report_file_gives_one_error_line(
    tmp_path: Path, content: bytes, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    logdir, path, _ = _run_with_report(tmp_path)
    path.write_bytes(content)
    assert cli.main(["report", str(logdir)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"fitprof: error: {path}: ") and what in err


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_batched_decoding_gives_the_same_table(tmp_path: Path, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The events are decoded a batch at a time (to bound memory); names, threads and launch links that span
    batches come out as in one batch."""
    from fitprof.traces import kineto

    seed = _write(tmp_path / "seed.pt.trace.json", json.dumps(kineto_seed(steps=20)).encode())
    gpu_doc, _ = gputrace.kineto_trace(steps=12)  # kernels and copies linked to their launches across batches
    paths = [seed, gputrace.write_kineto(tmp_path / "gpu.pt.trace.json.gz", gpu_doc), LIGHTNING_CPU]
    whole = [kineto.read_kineto(p) for p in paths]
    monkeypatch.setattr(kineto, "_BATCH", batch)
    for path, expected in zip(paths, whole, strict=True):
        table = kineto.read_kineto(path)
        assert table.equals(expected) and table.attrs == expected.attrs
    bad = json.loads(seed.read_text())
    bad["traceEvents"][30]["ts"] = "soon"
    n_complete = sum(1 for e in bad["traceEvents"][:30] if e["ph"] == "X" and e["cat"] != "Trace")
    with pytest.raises(TraceError, match=f"complete event {n_complete} has ts 'soon'"):
        kineto.read_kineto(_write(seed, json.dumps(bad).encode()))
    bad["traceEvents"][30] = 5
    with pytest.raises(TraceError, match="event 30: Expected `object`, got `int`"):
        kineto.read_kineto(_write(seed, json.dumps(bad).encode()))


def test_events_are_counted_as_their_keys_whatever_the_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(12)
    tokens = (b'"ph":1', b"{}", b" ", b'"a"', b"x", b",")  # no token begins with what another's end could complete
    for step in (1, 3, 64, 1 << 20):
        monkeypatch.setattr(_limits, "_COUNT_STEP", step)
        for size in (0, 1, 5, 40, 300):
            data = bytearray(b"".join(rng.choice(tokens) for _ in range(size)))
            want = bytes(data).count(b'"ph"')
            counter = _limits.EventCounter("t.json", _limits.Limits.of(), TraceError)
            ends = sorted(rng.randrange(len(data) + 1) for _ in range(4))
            for end in [*ends, len(data)]:  # fed as a reader grows its text
                counter.feed(data, end)
            assert counter.n == want
            data += b"x"  # no buffer is held by the count: the text can grow again
            if want > 1:
                counter = _limits.EventCounter("t.json", _limits.Limits.of(max_events=want - 1), TraceError)
                with pytest.raises(
                    TraceError, match=f"at least {want:,} events.*the bound of {want - 1:,}.*--max-events"
                ):
                    counter.feed(data)


def test_an_events_bound_refuses_before_the_rest_is_inflated(tmp_path: Path) -> None:
    path = tmp_path / "many.pt.trace.json.gz"
    path.write_bytes(bomb("events", 24))  # 2.3 million events, 25 MB inflated
    tracemalloc.start()
    try:
        with pytest.raises(
            TraceError,
            match=r"at least [5-6]\d\d,\d{3} events \(in its first [6-7]\.\d+ MB of text\), more than the bound of 500,000 .*--max-events",
        ):
            read_trace(path, max_trace_mb=100, max_events=500_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12e6  # 500,000 events of 11 bytes and one inflated step: not the 25 MB of the whole file


def test_objects_that_are_no_events_cost_no_more_than_events(tmp_path: Path) -> None:
    """``{},`` repeated: not events, so under the events bound; decoded a few at a time, not 4 MB of them at once."""
    path = tmp_path / "objects.pt.trace.json.gz"
    path.write_bytes(bomb("objects", 8))  # 2.8 million empty objects, 8 MB
    tracemalloc.start()
    try:
        table = read_trace(path, max_trace_mb=100)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(table) == 0
    assert peak < 64e6  # 40 MB measured; 169 MB when each 4 MB chunk decoded its 1.4 million objects at once

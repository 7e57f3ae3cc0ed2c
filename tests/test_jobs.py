"""``--jobs N``: the files are read in parallel processes and the output is identical to ``--jobs 1``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fitprof
from fitprof import cli
from fitprof.cli._parallel import PARALLEL_MIN_BYTES, auto_jobs, default_jobs, ordered_map
from fitprof.report_files import write_report_file
from fuzz_traces import kineto_seed
from shared_fixtures import SHIPPED_KINETO


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def _ranks(tmp_path: Path, n: int) -> list[Path]:
    """``n`` rank traces of one job whose step times differ (the seed's steps stretched per rank)."""
    paths = []
    for rank in range(n):
        doc = kineto_seed(steps=3 + rank)
        doc["distributedInfo"] = {"rank": rank, "world_size": n}
        for event in doc["traceEvents"]:
            if event.get("name", "").startswith("enumerate(DataLoader)"):
                event["dur"] = 10.0 * (rank + 1)
        path = tmp_path / f"r{rank}.pt.trace.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    return paths


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_analyze_jobs_output_is_identical(tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(p) for p in _ranks(tmp_path, 4)]
    bad = tmp_path / "bad.pt.trace.json"
    bad.write_text("{")
    fixtures = [str(p) for p in SHIPPED_KINETO]  # real traces shipped in tests/data
    argv = ["analyze", files[0], str(bad), *files[1:], str(tmp_path / "missing.json"), *fixtures, "--format", fmt]
    one = _run([*argv, "--jobs", "1"], capsys)
    assert one[0] == 0 and one[2].count("fitprof: warning:") == 2
    assert one[1].count("r3.pt.trace.json") >= 1 and all(f in one[1] for f in fixtures)
    for jobs in ("3",):
        assert _run([*argv, "--jobs", jobs], capsys) == one


@pytest.mark.slow
def test_report_jobs_output_is_identical(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logdir = tmp_path / "logs"
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        for rank, trace in enumerate(_ranks(tmp_path / run, 3)):
            report = fitprof.analyze(trace)
            write_report_file(logdir / run, session="s1", epoch=0, report=report, trace=trace, rank=rank)
    (logdir / "a" / "plugins" / "fitprof" / "s2.rank0.json").write_text("[" * 5000)
    one = _run(["report", str(logdir), "--format", "json", "--jobs", "1"], capsys)
    assert one[0] == 0 and one[2].count("\n") == 1
    rows = json.loads(one[1])
    assert [(r["run"], r["rank"]) for r in rows if r["record"] == "window"] == [(r, k) for r in "ab" for k in range(3)]
    assert _run(["report", str(logdir), "--format", "json", "--jobs", "4"], capsys) == one


def test_ordered_map_keeps_the_order() -> None:
    items = list(range(50))
    assert ordered_map(str, items, 3) == [str(i) for i in items] == ordered_map(str, items, 1)
    assert default_jobs() >= 1
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        ordered_map(str, items, 0)


def test_jobs_default_is_serial_for_small_files(tmp_path: Path) -> None:
    small = tmp_path / "small.json"
    small.write_bytes(b"x" * 1000)
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:  # sparse: 32 MB of size without writing them
        fh.truncate(PARALLEL_MIN_BYTES)
    assert auto_jobs([small, tmp_path / "missing.json"]) == 1
    assert auto_jobs([small, big]) == default_jobs()

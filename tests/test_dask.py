"""``fitprof analyze --scheduler ADDRESS``: the files analysed on a Dask cluster whose workers are separate
processes (a ``distributed.LocalCluster`` started here, one for the module), output identical to ``--jobs 1``;
and its errors (``--jobs`` with it, an unreachable or malformed address, dask missing)."""

from __future__ import annotations

import csv
import io
import json
import socket
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import gputrace
from fitprof import cli
from shared_fixtures import DDP_RANKS, KERAS_XSPACE, LIGHTNING_CPU

# An optional extra (fitprof[dask]); the device image, for one, has no dask.
distributed = pytest.importorskip("distributed", reason="needs fitprof[dask] (pip install 'fitprof[dask]')")


@pytest.fixture(scope="module")
def cluster() -> Iterator[distributed.LocalCluster]:
    """A local Dask cluster: its scheduler in this process, two worker processes (spawned, so they import
    fitprof afresh and share nothing with this process but the files), one thread each."""
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def scheduler(cluster: distributed.LocalCluster) -> str:
    return str(cluster.scheduler_address)


def _tasks_done(cluster: distributed.LocalCluster) -> int:
    """How many tasks the cluster's workers have computed so far (the scheduler's own count)."""
    return sum(prefix.state_counts["memory"] for prefix in cluster.scheduler.task_prefixes.values())


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, sorted(err.splitlines())


def _traces(tmp_path: Path) -> list[str]:
    """Relative names (to ``tmp_path``) of generated rank traces (plain and gzipped Kineto, an XSpace), a zip
    archive's members as ``zip://`` URLs (fsspec reads them on the workers), a corrupt and a missing file."""
    names = []
    for rank in range(4):
        doc, _ = gputrace.kineto_trace(seed=20 + rank, steps=3 + rank, rank=rank, world_size=4)
        name = f"r{rank}.pt.trace.json" + (".gz" if rank % 2 else "")
        gputrace.write_kineto(tmp_path / name, doc)
        names.append(name)
    data, _ = gputrace.xspace_trace(seed=3, steps=4)
    (tmp_path / "gpuhost.xplane.pb").write_bytes(data)
    (tmp_path / "bad.pt.trace.json").write_text('{"traceEvents": [')
    with zipfile.ZipFile(tmp_path / "ranks.zip", "w") as zf:
        for path in DDP_RANKS:
            zf.write(path, path.name)
    urls = [f"zip://{p.name}::file://{tmp_path / 'ranks.zip'}" for p in DDP_RANKS]
    return [*names, "gpuhost.xplane.pb", "bad.pt.trace.json", "missing.pt.trace.json", *urls]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["json", "table"])
def test_scheduler_output_is_identical_to_jobs_1(
    cluster: distributed.LocalCluster,
    scheduler: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
) -> None:
    # Relative paths from a folder the workers were not started in: they must get absolute ones.
    monkeypatch.chdir(tmp_path)
    argv = ["analyze", *_traces(tmp_path), str(LIGHTNING_CPU), str(KERAS_XSPACE), "--format", fmt]
    one = _run([*argv, "--jobs", "1"], capsys)
    status, out, err = one
    assert status == 0 and len(err) == 2 and all(line.startswith("fitprof: warning:") for line in err)
    assert "bad.pt.trace.json" in err[0] + err[1] and "missing.pt.trace.json" in err[0] + err[1]
    if fmt == "json":
        rows = json.loads(out)
        traces = [r for r in rows if r["record"] == "trace"]
        assert len(traces) == 9 and [r["rank"] for r in traces[:4]] == [0, 1, 2, 3]
        assert [(r["source"][:6], r["rank"]) for r in traces[5:7]] == [("zip://", 0), ("zip://", 1)]
        spreads = {r["world_size"]: r for r in rows if r["record"] == "spread"}
        assert spreads[4]["ranks"] == [0, 1, 2, 3] and spreads[2]["ranks"] == [0, 1]
    before = _tasks_done(cluster)
    assert _run([*argv, "--scheduler", scheduler], capsys) == one
    assert _tasks_done(cluster) - before == 10  # every file but the missing one, read by the workers


@pytest.mark.slow
def test_scheduler_errors(scheduler: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(LIGHTNING_CPU)
    status, out, err = _run(["analyze", trace, "--scheduler", scheduler, "--jobs", "2"], capsys)
    assert (status, out) == (2, "") and len(err) == 1
    assert "--scheduler" in err[0] and "--jobs" in err[0] and scheduler in err[0]

    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nowhere = f"tcp://127.0.0.1:{port}"
    status, out, err = _run(["analyze", trace, "--scheduler", nowhere, "--scheduler-timeout", "0.5"], capsys)
    assert (status, out) == (2, "") and len(err) == 1
    assert err[0].startswith(f"fitprof: error: cannot reach the Dask scheduler at {nowhere} (")
    assert "connect timeout 0.5 s" in err[0]

    status, out, err = _run(["analyze", trace, "--scheduler", "no-such-scheme://x:1"], capsys)
    assert (status, out) == (2, "") and len(err) == 1
    assert "no-such-scheme://x:1" in err[0] and "unknown address scheme" in err[0]

    monkeypatch.setitem(sys.modules, "distributed", None)  # as if it were not installed
    status, out, err = _run(["analyze", trace, "--scheduler", scheduler], capsys)
    assert (status, out) == (2, "") and len(err) == 1
    assert "needs `distributed`" in err[0] and "pip install 'fitprof[dask]'" in err[0]

    monkeypatch.undo()  # and the cluster still answers after all of that
    status, out, err = _run(["analyze", trace, "--scheduler", scheduler, "--format", "csv"], capsys)
    assert (status, err) == (0, []) and out.count("\n") == 2 and str(LIGHTNING_CPU) in out


@pytest.mark.slow
def test_scheduler_workers_read_the_files_themselves(
    scheduler: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A session folder at a ``memory://`` URL: this process lists it, but the files live in this process's
    memory only, so the workers (other processes) cannot read them, and say so per file; without --scheduler
    the command copies them here and reads them."""
    import fsspec

    fs = fsspec.filesystem("memory")
    data, _ = gputrace.xspace_trace(seed=1, steps=3)
    folder = f"memory://fitprof-test-dask-{tmp_path.name}/plugins/profile/s1"
    for name in ("h_rank0.xplane.pb", "h_rank1.xplane.pb"):
        fs.pipe(f"{folder}/{name}", data)
    try:
        status, out, err = _run(["analyze", folder, "--jobs", "1", "--format", "csv"], capsys)
        rows = list(csv.DictReader(io.StringIO(out)))
        assert (status, err) == (0, [])
        assert [(r["record"], r["run"]) for r in rows[:2]] == [
            ("trace", f"{folder}/h_rank{k}.xplane.pb") for k in (0, 1)
        ]
        status, out, err = _run(["analyze", folder, "--scheduler", scheduler, "--format", "csv"], capsys)
        assert (status, out) == (2, "")
        assert err == [f"fitprof: error: {folder}/h_rank{r}.xplane.pb: no such file or folder" for r in (0, 1)]
    finally:
        fs.rm(folder.partition("://")[2].partition("/plugins")[0], recursive=True)

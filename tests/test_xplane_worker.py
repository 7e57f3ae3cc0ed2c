"""The background ``.xplane.pb`` writer (fitprof.fit.xplane_worker): same bytes as the synchronous writer, a killed
worker loses only its file, the end of a fit waits at most its timeout, and the bounded queue's policy.

The worker is a separate process, so every test here is marked slow. Where a conversion must last (to be killed, to
time out, to be queued behind), the worker's command is a small script that models the conversion by a sleep and
answers as the real worker does; the byte-identity test runs the real worker.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import fitprof
from fitprof._warn import WarnOnce
from fitprof.fit.pipeline import WindowPipeline
from fitprof.fit.xplane_worker import Job, XplaneWorker
from fitprof.traces.xspace_write import write_xspace

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
TRACE = DATA / "lightning_cpu.pt.trace.json.gz"

SLOW_WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    delay = float(sys.argv[1])
    for raw in sys.stdin:
        job = json.loads(raw)
        time.sleep(delay)  # the conversion, modelled
        target = Path(job["run_dir"]) / "plugins" / "profile" / job["session"] / (job["host"] + ".xplane.pb")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"x")
        print(json.dumps({"id": job["id"], "ok": True, "path": str(target)}), flush=True)
    """
)


def slow_worker(warn: WarnOnce, delay_s: float, timeout_s: float = 60.0) -> XplaneWorker:
    """A worker whose process models each conversion by a sleep; every window goes to that process, however small."""
    command = [sys.executable, "-c", SLOW_WORKER, str(delay_s)]
    return XplaneWorker(warn, timeout_s=timeout_s, command=command, in_thread_below=0)


def messages(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught]


def wait_for(predicate, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def copy_trace(tmp_path: Path, name: str = "h_rank0.s1.pt.trace.json.gz") -> Path:
    path = tmp_path / name
    shutil.copyfile(TRACE, path)
    return path


@pytest.mark.parametrize("in_thread_below", [None, 0], ids=["thread", "process"])
def test_background_file_is_byte_identical(tmp_path: Path, in_thread_below: int | None) -> None:
    trace = copy_trace(tmp_path)
    sync = write_xspace(trace, tmp_path / "sync", "s1", host="h1_rank0")
    worker = XplaneWorker(WarnOnce(), in_thread_below=in_thread_below)
    done: list[Path | None] = []
    worker.submit(Job(0, trace, str(tmp_path / "bg"), "s1", "h1_rank0", on_done=lambda p, why: done.append(p)))
    assert worker.finish(120.0) == []
    assert done == [tmp_path / "bg" / "plugins" / "profile" / "s1" / "h1_rank0.xplane.pb"]
    assert done[0] is not None and done[0].read_bytes() == sync.read_bytes()
    assert (
        fitprof.analyze(done[0]).steps_analyzed == fitprof.analyze(trace).steps_analyzed
    )  # the figures read back agree
    assert not list((tmp_path / "bg").rglob("*fitprof-tmp*"))
    # the 2,008-event trace is small: converted by this process's thread, unless every window goes to the process
    if in_thread_below is None:
        assert worker.in_thread == [0] and worker.starts == 0
    else:
        assert worker.in_thread == [] and worker.starts == 1


def test_killed_worker_loses_only_its_xplane(tmp_path: Path) -> None:
    trace = copy_trace(tmp_path)
    before = trace.read_bytes()
    warn = WarnOnce()
    worker = slow_worker(warn, delay_s=60.0)
    pipe = WindowPipeline(top_k=3, max_trace_mb=None, keep_last_windows=None, warn=warn, converter=lambda: worker)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = pipe.analyze(0, trace, log_dir=tmp_path, session="s1", rank=0, world_size=1)
        assert report is not None and report.steps_analyzed > 0
        wait_for(lambda: worker.pid is not None)
        pid = worker.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not worker.pending())
        worker.poll()
        assert worker.lost == [0]
        assert pipe.xplane_paths == {}
        assert trace.read_bytes() == before  # the trace is whole
        reports = list((tmp_path / "plugins" / "fitprof").glob("*.json"))
        assert (
            len(reports) == 1
            and json.loads(reports[0].read_text())["report"]["steps_analyzed"] == report.steps_analyzed
        )
        assert not (tmp_path / "plugins" / "profile" / "s1").exists()  # no empty session in the Profile tab
        # the next window gets a new process
        trace2 = copy_trace(tmp_path, "h_rank0.s2.pt.trace.json.gz")
        worker.command = [sys.executable, "-m", "fitprof.fit.xplane_worker"]
        pipe.analyze(1, trace2, log_dir=tmp_path, session="s2", rank=0, world_size=1)
        assert worker.finish(120.0) == []
        assert worker.pid is None
    said = [m for m in messages(caught) if ".xplane.pb" in m]
    assert len(said) == 1 and "epoch 0" in said[0] and "exit code -9" in said[0] and "kept" in said[0]
    assert set(pipe.xplane_paths) == {1} and pipe.xplane_paths[1].is_file()


def test_end_of_fit_waits_at_most_its_timeout(tmp_path: Path) -> None:
    trace = copy_trace(tmp_path)
    worker = slow_worker(WarnOnce(), delay_s=60.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        worker.submit(Job(4, trace, str(tmp_path), "s1", "h1"))
        wait_for(lambda: worker.pid is not None)
        t0 = time.monotonic()
        undone = worker.finish(0.5)
        elapsed = time.monotonic() - t0
    assert undone == [4]
    assert 0.5 <= elapsed < 0.5 + 1.0  # the stop itself is a kill and a reap
    said = [m for m in messages(caught) if "unfinished" in m]
    assert len(said) == 1 and "epoch(s) 4" in said[0] and "after 0.5 s" in said[0]
    assert trace.is_file()


def test_queue_policy_newest_push_out_the_oldest_waiting(tmp_path: Path) -> None:
    worker = slow_worker(WarnOnce(), delay_s=1.0)
    outcome: dict[int, str] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.monotonic()
        for epoch in range(5):
            trace = copy_trace(tmp_path, f"h.s{epoch}.pt.trace.json.gz")
            worker.submit(
                Job(
                    epoch,
                    trace,
                    str(tmp_path),
                    f"s{epoch}",
                    "h",
                    on_done=lambda p, why, e=epoch: outcome.__setitem__(e, "written" if p else why),
                )
            )
        submitted = time.monotonic() - t0
        assert len(worker.pending()) == 3  # one runs, two wait: never more
        assert worker.finish(60.0) == []
    assert submitted < 1.0  # handing over never waited for the 1 s conversions
    assert outcome == {0: "written", 1: "skipped", 2: "skipped", 3: "written", 4: "written"}
    assert worker.skipped == [1, 2]
    said = [m for m in messages(caught) if "skipped" in m]
    assert len(said) == 1 and "epoch 1" in said[0]  # once a fit
    for epoch in range(5):
        assert (tmp_path / f"h.s{epoch}.pt.trace.json.gz").is_file()  # every trace is kept


def test_retention_never_deletes_what_the_worker_reads(tmp_path: Path) -> None:
    warn = WarnOnce()
    worker = slow_worker(warn, delay_s=1.5)
    pipe = WindowPipeline(top_k=3, max_trace_mb=None, keep_last_windows=1, warn=warn, converter=lambda: worker)
    traces = [copy_trace(tmp_path, f"h.s{e}.pt.trace.json.gz") for e in range(3)]
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        pipe.analyze(0, traces[0], log_dir=tmp_path, session="s0", rank=0, world_size=1)
        pipe.analyze(1, traces[1], log_dir=tmp_path, session="s1", rank=0, world_size=1)
        # window 0 is beyond keep_last_windows=1, but its conversion runs: kept for now
        assert traces[0].is_file() and worker.reading(traces[0])
        pipe.analyze(2, traces[2], log_dir=tmp_path, session="s2", rank=0, world_size=1)
        # window 1's conversion only waited: dropped with its window, never run
        assert not traces[1].exists()
        assert worker.finish(60.0) == []
    assert not traces[0].exists() and not (tmp_path / "plugins" / "profile" / "s0").exists()
    assert traces[2].is_file() and set(pipe.xplane_paths) == {0, 2}
    assert pipe.xplane_paths[2].is_file() and pipe.xplane_paths[2].parent.name == "s2"


def test_mirror_never_copies_a_file_being_written(tmp_path: Path) -> None:
    from fitprof import _fs

    class Recorder:
        url = "memory://run"

        def __init__(self) -> None:
            self.put_names: list[str] = []

        def put(self, local: Path, rel: str) -> None:
            self.put_names.append(rel)

        def remove(self, rel: str) -> None:
            pass

    store = Recorder()
    mirror = _fs.Mirror("memory://run", lambda key, message: None, store=lambda url: store)
    try:
        session = mirror.local / "plugins" / "profile" / "s1"
        session.mkdir(parents=True)
        (session / ".h.xplane.pb.fitprof-tmp-123").write_bytes(b"half")
        (mirror.local / "h.s1.pt.trace.json.gz").write_bytes(b"whole")
        assert mirror.sync()
        assert store.put_names == ["h.s1.pt.trace.json.gz"]
        (session / ".h.xplane.pb.fitprof-tmp-123").rename(session / "h.xplane.pb")
        assert mirror.sync()
        assert store.put_names == ["h.s1.pt.trace.json.gz", "plugins/profile/s1/h.xplane.pb"]
    finally:
        mirror.close()  # the staging folder is deleted whatever the assertions say

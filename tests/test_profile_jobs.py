"""The ``.xplane.pb`` conversions a fit does not wait for (fitprof.fit.xplane_worker, fitprof._profile_jobs).

A script that exits right after ``fit`` still gets its ``.xplane.pb`` (written by the converter process, which
outlives it); :func:`fitprof.wait_for_profiles` waits for the files; a conversion left over (its process killed) is
finished and named by the next fit, by ``fitprof report`` and by the wait. The conversion is slowed where it must
still run when something happens (a wrapper that holds the real converter back once its first job arrives); every
file is read back through fitprof's own XSpace reader.

Each test starts processes, so the file is marked slow; ``FITPROF_WAIT_FOR_PROFILES`` (set for the rest of the
suite) is cleared here: these are the fits that do not wait.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import fitprof
from fitprof import _profile_jobs
from fitprof._warn import WarnOnce
from fitprof.cli import main as cli_main
from fitprof.fit import xplane_worker
from fitprof.fit.xplane_worker import Job, XplaneWorker
from keras_child import child_env, result_of

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
TRACE = DATA / "lightning_cpu.pt.trace.json.gz"
TESTS = Path(__file__).parent

HELD_BACK = textwrap.dedent(
    """
    import runpy, select, sys, time
    delay, path = float(sys.argv.pop(1)), sys.argv.pop(1)
    select.select([sys.stdin], [], [])  # the first job has arrived
    time.sleep(delay)  # the conversion is still to do when whatever the test plans happens
    runpy.run_path(path, run_name="__main__")
    """
)
"""The real converter, held back ``delay`` seconds once its first job arrives."""


def held_back(delay_s: float) -> list[str]:
    """The held-back converter's command (given with ``in_thread_below=0``: every window goes to the process)."""
    return [sys.executable, "-c", HELD_BACK, str(delay_s), xplane_worker.__file__]


@pytest.fixture(autouse=True)
def fit_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(xplane_worker.WAIT_ENV, raising=False)


def steps_in(xplane: Path) -> int:
    """The steps fitprof's XSpace reader finds in the file."""
    return fitprof.analyze(xplane).steps_analyzed


def plant_left_over(run_dir: Path, session: str = "s1", host: str = "h") -> Path:
    """A conversion whose process is gone: the trace and its job file, owned by a process that has exited."""
    trace = run_dir / f"{host}.{session}.pt.trace.json.gz"
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(TRACE, trace)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    target = run_dir / "plugins" / "profile" / session / f"{host}.xplane.pb"
    target.parent.mkdir(parents=True)
    fields = {"trace": str(trace), "run_dir": str(run_dir), "session": session, "host": host}
    _profile_jobs.write_job(target, fields, gone.pid)
    return target


# ------------------------------------------------------------------------------------------ the script that exits
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    sys.path.insert(0, sys.argv[3])
    import lightning_tiny
    from fitprof.fit import xplane_worker
    from fitprof.lightning import FitProfiler

    HELD_BACK = sys.argv[2]
    init = xplane_worker.XplaneWorker.__init__

    def held(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.command = [sys.executable, "-c", HELD_BACK, "8", xplane_worker.__file__]
        self.in_thread_below = 0  # the process converts it, however small (this process's thread would be done)

    xplane_worker.XplaneWorker.__init__ = held
    log_dir = sys.argv[1]
    profiler = FitProfiler(log_dir=log_dir, profile_batch=(2, 4), verbose=False)
    trainer = lightning_tiny.trainer(log_dir, [profiler], max_epochs=1)
    trainer.fit(lightning_tiny.Tiny(), lightning_tiny.loader(12))
    (target,) = profiler.xplane_paths.values()
    jobs = [str(p) for p in xplane_worker.Path(log_dir).rglob("*.fitprof-tmp-job")]
    print("RESULT " + json.dumps({"target": str(target), "there": target.exists(), "jobs": jobs}), flush=True)
    os.killpg(0, signal.SIGKILL)  # the script's whole process group ends at once, as a job runner may end it
    """
)


def test_a_script_that_exits_right_after_fit_still_gets_its_xplane(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    log_dir = tmp_path / "logs"
    env = child_env()
    env.pop(xplane_worker.WAIT_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(log_dir), HELD_BACK, str(TESTS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        start_new_session=True,  # its killpg ends its own group, not this one
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    result = result_of(proc.stdout)
    target = Path(result["target"])
    # fit returned before the conversion was done: it waited for nothing the Profile tab alone reads
    assert not result["there"]
    assert result["jobs"] == [str(_profile_jobs.job_path(target))]
    # the converter, in a session of its own, outlived the killed group and writes the file by itself
    end = time.monotonic() + 180
    while not target.is_file():
        assert time.monotonic() < end, "the converter did not outlive the script"
        time.sleep(0.1)
    assert fitprof.wait_for_profiles(log_dir, timeout=120) in ([], [target])
    assert steps_in(target) == 3
    assert not _profile_jobs.find_jobs(log_dir)  # nothing left pending


# ---------------------------------------------------------------------------------------- the wait, in process
def test_detach_returns_before_the_file_and_wait_for_profiles_waits_for_it(tmp_path: Path) -> None:
    trace = tmp_path / "h.s1.pt.trace.json.gz"
    shutil.copyfile(TRACE, trace)
    worker = XplaneWorker(WarnOnce(), command=held_back(5.0), in_thread_below=0)
    done: list[tuple[Path | None, str]] = []
    worker.submit(Job(0, trace, str(tmp_path), "s1", "h", on_done=lambda p, why: done.append((p, why))))
    pid = worker.pid
    target = tmp_path / "plugins" / "profile" / "s1" / "h.xplane.pb"
    assert worker.detach() == [target]
    assert not target.exists()  # handed over, not waited for
    assert done == [(target, "handed over")]
    doc = _profile_jobs.read_job(_profile_jobs.job_path(target))
    assert doc is not None and doc["owner"] == pid  # the process owns it now
    assert fitprof.wait_for_profiles(tmp_path, timeout=120) == [target]
    assert steps_in(target) == fitprof.analyze(trace).steps_analyzed
    assert not _profile_jobs.find_jobs(tmp_path)


def test_a_worker_killed_after_the_fit_leaves_its_job_to_the_wait(tmp_path: Path) -> None:
    trace = tmp_path / "h.s1.pt.trace.json.gz"
    shutil.copyfile(TRACE, trace)
    worker = XplaneWorker(WarnOnce(), command=held_back(60.0), in_thread_below=0)
    worker.submit(Job(0, trace, str(tmp_path), "s1", "h"))
    pid = worker.pid
    assert pid is not None
    (target,) = worker.detach()
    os.kill(pid, signal.SIGKILL)
    assert _profile_jobs.job_path(target).is_file()  # the killed process leaves its job written down
    assert fitprof.wait_for_profiles(tmp_path, timeout=120) == [target]  # finished here, the owner being gone
    assert steps_in(target) == fitprof.analyze(trace).steps_analyzed


def test_wait_for_profiles_rejects_bad_input_and_times_out(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0, got -1"):
        fitprof.wait_for_profiles(tmp_path, timeout=-1)
    with pytest.raises(FileNotFoundError, match="no such log folder"):
        fitprof.wait_for_profiles(tmp_path / "missing")
    assert fitprof.wait_for_profiles("memory://somewhere") == []
    assert fitprof.wait_for_profiles(tmp_path) == []
    trace = tmp_path / "h.s1.pt.trace.json.gz"
    shutil.copyfile(TRACE, trace)
    worker = XplaneWorker(WarnOnce(), command=held_back(60.0), in_thread_below=0)
    worker.submit(Job(0, trace, str(tmp_path), "s1", "h"))
    try:
        worker.detach()
        with pytest.raises(TimeoutError, match=r"1 \.xplane\.pb conversion\(s\) .* after 0\.2 s: .*h\.xplane\.pb"):
            fitprof.wait_for_profiles(tmp_path, timeout=0.2)
    finally:
        doc = _profile_jobs.read_job(_profile_jobs.job_path(tmp_path / "plugins/profile/s1/h.xplane.pb"))
        if doc is not None:
            os.kill(doc["owner"], signal.SIGKILL)  # the held-back process this test started


# ------------------------------------------------------------------------------------------------- left over
def test_left_over_is_finished_by_wait_for_profiles(tmp_path: Path) -> None:
    target = plant_left_over(tmp_path / "run")
    assert fitprof.wait_for_profiles(tmp_path, timeout=120) == [target]
    assert steps_in(target) == fitprof.analyze(TRACE).steps_analyzed
    assert not _profile_jobs.find_jobs(tmp_path)


def test_left_over_is_finished_and_named_by_fitprof_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = plant_left_over(tmp_path / "runs" / "version_0")
    cli_main(["report", str(tmp_path / "runs")])  # no report file here: the command still finishes the job
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if ".xplane.pb" in line]
    assert said == [f"fitprof: report wrote 1 .xplane.pb left unconverted by an earlier fit: {target}"]
    assert steps_in(target) == fitprof.analyze(TRACE).steps_analyzed
    assert not _profile_jobs.find_jobs(tmp_path)
    cli_main(["report", str(tmp_path / "runs")])
    assert ".xplane.pb" not in capsys.readouterr().err  # said once: nothing left the second time


def test_left_over_is_finished_and_named_by_the_next_fit(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    import lightning_tiny
    from fitprof.lightning import FitProfiler

    run = tmp_path / "run"
    target = plant_left_over(run, session="earlier")
    profiler = FitProfiler(log_dir=str(run), profile_batch=(2, 4), verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = lightning_tiny.trainer(run, [profiler], max_epochs=1)
        trainer.fit(lightning_tiny.Tiny(), lightning_tiny.loader(12))
    said = [str(w.message) for w in caught if "left unconverted" in str(w.message)]
    assert said == [f"fitprof: writing in the background 1 .xplane.pb an earlier fit left unconverted: {target}"]
    (own,) = profiler.xplane_paths.values()
    assert set(fitprof.wait_for_profiles(run, timeout=120)) <= {target, own}
    assert steps_in(target) == fitprof.analyze(TRACE).steps_analyzed
    assert steps_in(own) == 3
    assert not _profile_jobs.find_jobs(run)


def test_a_job_file_is_never_copied_nor_read() -> None:
    name = _profile_jobs.job_path("plugins/profile/s1/h.xplane.pb").as_posix()
    from fitprof._atomic import is_temporary

    assert is_temporary(name)
    assert _profile_jobs.target_of(Path(name)) == Path("plugins/profile/s1/h.xplane.pb")


def test_json_of_a_job_names_its_trace(tmp_path: Path) -> None:
    target = plant_left_over(tmp_path)
    doc = json.loads(_profile_jobs.job_path(target).read_text())
    assert doc["trace"].endswith("h.s1.pt.trace.json.gz") and doc["session"] == "s1" and doc["host"] == "h"
    assert not _profile_jobs.owner_alive(doc)


def test_a_url_log_dir_still_gets_the_xplane_the_fit_did_not_wait_for(tmp_path: Path) -> None:
    """The staging folder's mirror waits for the conversion before its last copy (fitprof._fs.Mirror.close)."""
    pytest.importorskip("lightning.pytorch")
    pytest.importorskip("fsspec")
    import uuid

    import lightning_tiny
    from fitprof import _fs
    from fitprof.lightning import FitProfiler

    url = f"memory://fitprof-jobs-{uuid.uuid4().hex[:8]}"
    profiler = FitProfiler(log_dir=url, profile_batch=(2, 4), verbose=False)
    trainer = lightning_tiny.trainer(tmp_path, [profiler], max_epochs=1)
    trainer.fit(lightning_tiny.Tiny(), lightning_tiny.loader(12))
    fs, root = _fs.open_fsspec(url)
    names = [p[len(root) + 1 :] for p in fs.find(root)]
    (xplane,) = [n for n in names if n.endswith(".xplane.pb")]
    assert not [n for n in names if "fitprof-tmp" in n]  # no job file copied
    local = tmp_path / "copy.xplane.pb"
    fs.get_file(f"{root}/{xplane}", str(local))
    assert steps_in(local) == 3


def test_a_run_deleted_after_fit_is_not_written_again(tmp_path: Path) -> None:
    """The run's folder is deleted while its conversion waits: the converter writes nothing (it would create the
    folder again)."""
    run = tmp_path / "run"
    run.mkdir()
    trace = tmp_path / "h.s1.pt.trace.json.gz"
    shutil.copyfile(TRACE, trace)
    worker = XplaneWorker(WarnOnce(), command=held_back(3.0), in_thread_below=0)
    worker.submit(Job(0, trace, str(run), "s1", "h"))
    proc = worker._proc
    assert proc is not None
    worker.detach()
    shutil.rmtree(run)
    proc.wait(120)  # the converter ends once its input is done
    assert not run.exists()
    assert trace.is_file()


def test_an_exited_owner_not_yet_reaped_is_gone(tmp_path: Path) -> None:
    """A killed converter whose parent has not reaped it (a zombie) owns nothing: its job is left over."""
    target = plant_left_over(tmp_path)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    end = time.monotonic() + 60
    while Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < end
        time.sleep(0.02)
    fields = {"trace": str(tmp_path / "h.s1.pt.trace.json.gz"), "run_dir": str(tmp_path), "session": "s1", "host": "h"}
    _profile_jobs.write_job(target, fields, zombie.pid)
    doc = _profile_jobs.read_job(_profile_jobs.job_path(target))
    assert doc is not None and not _profile_jobs.owner_alive(doc)
    zombie.wait()
    doc["owner"] = os.getpid()
    doc["started"] = ""
    assert _profile_jobs.owner_alive(doc)  # this process runs


# ----------------------------------------------------------------------------- small windows in a thread, one process
def counted_spawns(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids of the converter processes started from now on (``xplane_worker._spawn`` counted)."""
    pids: list[int] = []
    real = xplane_worker._spawn

    def spawn(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real(*args, **kwargs)
        pids.append(proc.pid)
        return proc

    monkeypatch.setattr(xplane_worker, "_spawn", spawn)
    return pids


def kineto_trace(path: Path, ops: int, steps: int = 5) -> Path:
    """A gzipped Kineto trace of ``steps`` 1 ms steps holding ``ops`` short ``aten::add`` events between them."""
    step_events = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1, "ts": s * 1000.0}
        | {"dur": 1000.0}
        for s in range(1, steps + 1)
    ]
    gap = steps * 1000.0 / ops
    op_events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1000.0 + i * gap, "dur": gap / 2}
        for i in range(ops)
    ]
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump({"schemaVersion": 1, "traceEvents": step_events + op_events}, fh)
    return path


def test_a_window_that_ends_mid_fit_is_written_when_fit_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fit does not wait for the Profile tab (no FITPROF_WAIT_FOR_PROFILES), yet a small window that stopped
    before the fit's last steps has its .xplane.pb as soon as ``fit`` returns: converted from its stop by a thread of
    the training process, with no process started."""
    pytest.importorskip("lightning.pytorch")
    import lightning_tiny
    from fitprof.lightning import FitProfiler

    spawns = counted_spawns(monkeypatch)
    run = tmp_path / "run"
    profiler = FitProfiler(log_dir=str(run), profile_batch=(2, 4), verbose=False)
    lightning_tiny.trainer(run, [profiler], max_epochs=1).fit(lightning_tiny.Tiny(), lightning_tiny.loader(12))
    (target,) = profiler.xplane_paths.values()
    assert target.is_file()  # at once: nothing waited for after fit
    assert not _profile_jobs.find_jobs(run)  # nothing pending
    assert spawns == []  # no process for a small window
    assert steps_in(target) == 3


def test_one_process_converts_every_large_window_of_a_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows the thread does not take (here every window: IN_THREAD_BELOW 0) go to one process, started at the
    first of them and fed the others; it outlives the fit for the last."""
    pytest.importorskip("lightning.pytorch")
    import lightning_tiny
    from fitprof.lightning import FitProfiler

    monkeypatch.setattr(xplane_worker, "IN_THREAD_BELOW", 0)
    spawns = counted_spawns(monkeypatch)
    run = tmp_path / "run"
    profiler = FitProfiler(log_dir=str(run), profile_batch=(2, 4), every_n_epochs=1, verbose=False)
    trainer = lightning_tiny.trainer(run, [profiler], max_epochs=3)
    trainer.fit(lightning_tiny.Tiny(), lightning_tiny.loader(12))
    assert len(spawns) == 1
    targets = sorted(profiler.xplane_paths.values())
    assert len(targets) == 3 and len({t.parent for t in targets}) == 3  # one session a window
    fitprof.wait_for_profiles(run, timeout=120)
    assert [steps_in(t) for t in targets] == [3, 3, 3]
    assert len(spawns) == 1  # the wait found nothing left over to start another for


def test_small_windows_in_the_thread_large_ones_in_one_process(tmp_path: Path) -> None:
    """The route by size, with the real converter: a 2,008-event window in this process's thread; three of 12,000
    events (over IN_THREAD_BELOW) in one process, never in the thread; every file read back."""
    assert xplane_worker.IN_THREAD_BELOW < 12_000
    small = tmp_path / "h.s0.pt.trace.json.gz"
    shutil.copyfile(TRACE, small)
    jobs = [Job(0, small, str(tmp_path), "s0", "h")]
    for epoch in (1, 2, 3):
        trace = kineto_trace(tmp_path / f"h.s{epoch}.pt.trace.json.gz", ops=12_000)
        jobs.append(Job(epoch, trace, str(tmp_path), f"s{epoch}", "h"))
    worker = XplaneWorker(WarnOnce())
    for job in jobs:
        worker.submit(job)
    assert worker.finish(120.0) == []
    assert worker.in_thread == [0] and worker.starts == 1 and worker.skipped == []
    assert jobs[0].written_by == os.getpid()
    (process,) = {job.written_by for job in jobs[1:]}
    assert process is not None and process != os.getpid()
    assert steps_in(jobs[0].target) == fitprof.analyze(small).steps_analyzed
    assert [steps_in(job.target) for job in jobs[1:]] == [5, 5, 5]
    assert worker.thread_cpu_s > 0


def test_a_conversion_the_thread_has_not_finished_at_fit_end_goes_to_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread's conversion outlasts the end of the fit's grace: the process is given it too and owns its job
    file, so a script killed right after fit still gets the file."""
    from fitprof.traces import xspace_write

    real = xspace_write.write_xspace
    started = threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Path:
        started.set()
        time.sleep(3.0)  # a conversion still running when the fit ends
        return real(*args, **kwargs)

    monkeypatch.setattr(xspace_write, "write_xspace", slow)
    trace = tmp_path / "h.s1.pt.trace.json.gz"
    shutil.copyfile(TRACE, trace)
    worker = XplaneWorker(WarnOnce())
    worker.submit(Job(0, trace, str(tmp_path), "s1", "h"))
    assert started.wait(60)
    (target,) = worker.detach(grace_s=0.1)
    doc = _profile_jobs.read_job(_profile_jobs.job_path(target))
    assert worker.starts == 1 and doc is not None and doc["owner"] not in (os.getpid(), _profile_jobs.NOBODY)
    assert fitprof.wait_for_profiles(tmp_path, timeout=120) in ([], [target])
    assert steps_in(target) == fitprof.analyze(trace).steps_analyzed

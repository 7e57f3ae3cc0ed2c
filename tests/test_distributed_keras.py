"""Keras under tf.distribute: MirroredStrategy over 2 logical CPUs (model.fit), MultiWorkerMirroredStrategy with 2
workers on localhost, one of them a planted straggler. Keras 3's fit() itself fails under MultiWorkerMirroredStrategy
(tensorflow/tensorflow#72388), so there the callback is driven by a custom loop's CallbackList (see
keras_dist_worker.py). Each runs in child processes; the outputs are read back."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorflow")

from contention import measured, tolerates_load
from fitprof.cli import main as cli_main

pytestmark = pytest.mark.slow  # every test spawns TensorFlow workers

WORKER = Path(__file__).resolve().parent / "keras_dist_worker.py"


def _result(stdout: str) -> dict[str, Any]:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _fitprof_event_files(logdir: Path) -> list[Path]:
    return sorted(logdir.glob("events.out.tfevents.*.fitprof"))


def _scalars(logdir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        if tag not in ("fitprof/summary", "fitprof/advice"):  # the text tags
            out[tag] = [float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
    return out


def test_mirrored_strategy_two_logical_cpus(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(WORKER), "mirrored", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = _result(proc.stdout)
    assert (res["rank"], res["world"]) == (0, 1)  # one process: one rank, two replicas
    assert [res["reports"][e]["fitprof/steps_analyzed"] for e in ("0", "1")] == [4.0, 4.0]
    assert len(list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))) == 2
    assert _scalars(tmp_path)["fitprof/steps_analyzed"] == [4.0, 4.0]


def _tf_profiler_crash(returncode: int | None, stderr: str) -> bool:
    """A worker killed by a signal while TensorFlow's profiler was stopping (faulthandler names the frame).

    TensorFlow 2.21's ``TraceMeRecorder::Consume`` keeps raw pointers to "end" events of activities that start on
    one thread and end on another, and the vector holding every thread's events can reallocate before they are
    used (abort in ``SplitEventTracker::FindStartAndMerge``, "double free or corruption" or "free(): invalid
    pointer", seen in a core dump here). On a non-chief MultiWorkerMirroredStrategy worker every all-reduce makes
    such an activity (``CollectiveExecutor::CompleteParams`` ends on a gRPC thread), so its window stop can abort
    the process: in 7 of 46 worker pairs on this 2-core machine (3 of 24 under CPU load, 4 of 22 quiet), and in
    both tries of one CI run. It is a TensorFlow bug, not fitprof's; the README's distributed section says so.
    A worker aborted (SIGABRT) with no Python frame in its stderr is the same crash: glibc's "double free or
    corruption" abort, seen here with the second worker of a pair while another test process ran beside it. So is
    a segmentation fault of the non-chief worker (the one fitprof warns of this bug), with no Python frame either,
    after its window had stopped and its profile was written: the corrupted heap failing at a later allocation
    (seen once in a fresh-clone run of the whole suite).
    """
    if returncode is None or returncode >= 0:
        return False
    if returncode == -signal.SIGSEGV:
        return "non-chief TensorFlow worker" in stderr
    return ("profiler_v2.py" in stderr and " in stop" in stderr) or returncode == -signal.SIGABRT


def _run_mwms(
    logdir: Path, ranks: str | None = None, straggler: bool = True
) -> tuple[list[dict[str, Any]], list[str], bool]:
    """Both workers to the end (task 1 the planted straggler unless ``straggler`` is False; ``ranks`` passed on to
    ``FitProfiler``): their
    results in rank order, each with its ``stderr``; for a worker that failed, its stderr tail; and whether a
    worker died of TensorFlow's profiler crash (then its peer fails too, its collective aborted)."""
    ports = ",".join(str(p) for p in _free_ports(2))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # Output to files, not pipes: polling (below) must not leave a worker blocked on a full pipe.
    outs = [(logdir / f".worker{i}.out", logdir / f".worker{i}.err") for i in range(2)]
    procs = []
    for i, (out_path, err_path) in enumerate(outs):
        with open(out_path, "w") as out_f, open(err_path, "w") as err_f:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-X", "faulthandler", str(WORKER), "mwms", str(logdir), str(i), ports]
                    + ["1" if straggler else "-1"]
                    + ([ranks] if ranks else []),
                    stdout=out_f,
                    stderr=err_f,
                    env=env,
                )
            )
    # A worker whose peer died waits for it forever: once one fails, the other gets 30 s, then is killed.
    deadline = time.monotonic() + 300
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            deadline = min(deadline, time.monotonic() + 30)
        time.sleep(0.5)
    results, failures, tf_crash = [], [], False
    for i, p in enumerate(procs):
        if p.poll() is None:
            p.kill()
        p.wait()
        out, err = outs[i][0].read_text(), outs[i][1].read_text()
        if p.returncode == 0:
            results.append({**_result(out), "stderr": err})
        else:
            tf_crash = tf_crash or _tf_profiler_crash(p.returncode, err)
            err = "\n".join(ln for ln in err.splitlines() if not ln.startswith("Extension modules:"))
            failures.append(f"worker {i} exited {p.returncode}:\n{err[-3000:]}")
    return sorted(results, key=lambda r: r["rank"]), failures, tf_crash


MWMS_TRIES = 3
"""Tries of a pair, each about 60 s on a loaded machine: a crash in three tries in a row fails the test, with the
count, rather than holding the suite for ten minutes."""


def _mwms_pair(
    tmp_path_factory: pytest.TempPathFactory, name: str, ranks: str | None = None, straggler: bool = True
) -> dict[str, Any]:
    """Two MultiWorkerMirroredStrategy workers on localhost, run again (fresh folder, fresh ports) only when a
    worker died of TensorFlow's profiler crash (see ``_tf_profiler_crash``), up to ``MWMS_TRIES`` times. Any other
    failure fails at once; every try's failures are reported, and the crashes that were retried are named in a
    warning, so a CI log shows them. (An earlier fresh-clone failure, worker 0 reporting that worker 1 "stopped
    sending heartbeats", was most likely this crash: worker 1's stderr was not kept then.)"""
    all_failures: list[str] = []
    for attempt in range(1, MWMS_TRIES + 1):
        logdir = tmp_path_factory.mktemp(f"{name}{attempt}")
        with measured(__name__):  # a straggler named by its input share is a timing: weighed under load
            results, failures, tf_crash = _run_mwms(logdir, ranks, straggler)
        if not failures:
            if all_failures:
                warnings.warn(
                    f"MultiWorkerMirroredStrategy pair: TensorFlow's profiler crashed a worker in {attempt - 1} "
                    f"of {attempt} tries:\n" + "\n\n".join(f[:80] + " ... " + f[-400:] for f in all_failures),
                    stacklevel=1,
                )
            return {"logdir": logdir, "results": results, "tries": attempt}
        all_failures += [f"try {attempt}: {f}" for f in failures]
        if not tf_crash:
            break
        print(f"MultiWorkerMirroredStrategy pair {name}: TensorFlow's profiler crashed a worker in try {attempt}")
    crashed = f"TensorFlow's profiler crashed a worker in {attempt - (not tf_crash)} of {attempt} tries"
    pytest.fail(f"{crashed} (at most {MWMS_TRIES}):\n\n" + "\n\n".join(all_failures))


@pytest.fixture(scope="module")
def mwms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _mwms_pair(tmp_path_factory, "mwms")


@pytest.fixture(scope="module")
def mwms_chief_only(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # No straggler: these checks are who profiles and that the gather completes; rank 1's planted input sleep
    # (20 ms a sample) would only add to the pair's time.
    return _mwms_pair(tmp_path_factory, "mwms_chief", ranks="0", straggler=False)


def test_mwms_two_workers_write_distinct_profiles(mwms: dict[str, Any]) -> None:
    logdir: Path = mwms["logdir"]
    assert [(r["rank"], r["world"]) for r in mwms["results"]] == [(0, 2), (1, 2)]
    xplanes = sorted(logdir.glob("plugins/profile/*/*.xplane.pb"))
    assert len(xplanes) == 4  # 2 workers x 2 epochs, never overwriting each other
    names = {p.name for p in xplanes}
    assert any(n.endswith("_rank0.xplane.pb") for n in names) and any(n.endswith("_rank1.xplane.pb") for n in names)
    reports = sorted(logdir.glob("plugins/fitprof/*.json"))
    assert sorted(json.loads(p.read_text())["rank"] for p in reports) == [0, 0, 1, 1]


@tolerates_load
def test_mwms_rank0_logs_cross_rank_scalars_and_names_the_straggler(mwms: dict[str, Any]) -> None:
    logdir: Path = mwms["logdir"]
    assert len(_fitprof_event_files(logdir)) == 1  # only rank 0 writes scalars
    scalars = _scalars(logdir)
    for key in ("fitprof/step_time_ms_max", "fitprof/input_percent_max", "fitprof/collective_percent"):
        assert len(scalars[key]) == 2, key
    # Rank 1 sleeps in its input pipeline. The all-reduce makes rank 0 wait for it, so both ranks' step times
    # come out alike; the input share names the straggler, and the fast rank's wait shows as collective time.
    assert scalars["fitprof/input_percent_max_rank"] == [1.0, 1.0]
    r0, r1 = mwms["results"]
    for epoch in ("0", "1"):
        rep0, rep1 = r0["reports"][epoch], r1["reports"][epoch]
        assert rep1["fitprof/input_percent"] > rep0["fitprof/input_percent"] + 20
        assert rep0["fitprof/collective_percent"] > rep1["fitprof/collective_percent"] + 20
        assert rep0["fitprof/step_time_ms"] == pytest.approx(rep1["fitprof/step_time_ms"], rel=0.2)
    # Every rank's logs (History) hold the cross-rank figures.
    assert r1["history"]["fitprof/input_percent_max_rank"] == [1.0, 1.0]
    assert scalars["fitprof/ranks_reported"] == [2.0, 2.0]


@tolerates_load
def test_report_shows_one_row_per_rank_and_the_slowest(
    mwms: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli_main(["report", str(mwms["logdir"]), "--format", "json"])
    records = json.loads(capsys.readouterr().out)
    assert rc == 0
    windows = [r for r in records if r["record"] == "window"]
    assert sorted((r["epoch"], r["rank"]) for r in windows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    spreads = [r for r in records if r["record"] == "spread"]
    assert len(spreads) == 2
    assert [s["straggler_rank"] for s in spreads] == [1, 1]  # named by its input share, not by step time


def test_non_chief_worker_warns_of_the_tensorflow_profiler_bug(mwms: dict[str, Any]) -> None:
    r0, r1 = mwms["results"]
    assert "Pass ranks=[0]" in r1["stderr"] and "Pass ranks=[0]" not in r0["stderr"]


def test_ranks_0_profiles_the_chief_only_and_the_gather_completes(mwms_chief_only: dict[str, Any]) -> None:
    logdir: Path = mwms_chief_only["logdir"]
    r0, r1 = mwms_chief_only["results"]  # both workers finished: rank 1 joined every epoch-end gather
    assert (r0["rank"], r1["rank"]) == (0, 1) and r1["reports"] == {} and sorted(r0["reports"]) == ["0", "1"]
    xplanes = sorted(p.name for p in logdir.glob("plugins/profile/*/*.xplane.pb"))
    assert len(xplanes) == 2 and all(n.endswith("_rank0.xplane.pb") for n in xplanes)
    assert sorted(json.loads(p.read_text())["rank"] for p in logdir.glob("plugins/fitprof/*.json")) == [0, 0]
    assert _scalars(logdir)["fitprof/ranks_reported"] == [1.0, 1.0]
    assert r1["history"]["fitprof/ranks_reported"] == [1.0, 1.0]  # rank 1's logs still get the cross-rank figures
    assert "Pass ranks=[0]" not in r1["stderr"]  # a rank that does not profile has nothing to warn about

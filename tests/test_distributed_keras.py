"""Keras under tf.distribute: MirroredStrategy over 2 logical CPUs (model.fit), MultiWorkerMirroredStrategy with 2
workers on localhost, one of them a planted straggler. Keras 3's fit() itself fails under MultiWorkerMirroredStrategy
(tensorflow/tensorflow#72388), so there the callback is driven by a custom loop's CallbackList (see
keras_dist_worker.py). Each runs in child processes; the outputs are read back."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorflow")

from fitprof.cli import main as cli_main

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
        if tag != "fitprof/summary":
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


def _run_mwms(logdir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Both workers to the end; their results (rank order) and, for a worker that failed, its stderr tail."""
    ports = ",".join(str(p) for p in _free_ports(2))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # Output to files, not pipes: polling (below) must not leave a worker blocked on a full pipe.
    outs = [(logdir / f".worker{i}.out", logdir / f".worker{i}.err") for i in range(2)]
    procs = []
    for i, (out_path, err_path) in enumerate(outs):
        with open(out_path, "w") as out_f, open(err_path, "w") as err_f:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), "mwms", str(logdir), str(i), ports, "1"],
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
    results, failures = [], []
    for i, p in enumerate(procs):
        if p.poll() is None:
            p.kill()
        p.wait()
        out, err = outs[i][0].read_text(), outs[i][1].read_text()
        if p.returncode == 0:
            results.append(_result(out))
        else:
            failures.append(f"worker {i} exited {p.returncode}:\n{err[-3000:]}")
    return sorted(results, key=lambda r: r["rank"]), failures


@pytest.fixture(scope="module")
def mwms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two MultiWorkerMirroredStrategy workers on localhost. TensorFlow's cluster set-up on 2 shared cores can
    fail on its own (once in a fresh-clone CI check: a worker "stopped sending heartbeats" while both were
    starting); then the pair is run once more, in a fresh folder, and both failures are reported if it fails
    again."""
    logdir = tmp_path_factory.mktemp("mwms")
    results, failures = _run_mwms(logdir)
    if failures:
        logdir = tmp_path_factory.mktemp("mwms_retry")
        results, failures_again = _run_mwms(logdir)
        assert not failures_again, "\n\n".join(failures + failures_again)
    return {"logdir": logdir, "results": results}


def test_mwms_two_workers_write_distinct_profiles(mwms: dict[str, Any]) -> None:
    logdir: Path = mwms["logdir"]
    assert [(r["rank"], r["world"]) for r in mwms["results"]] == [(0, 2), (1, 2)]
    xplanes = sorted(logdir.glob("plugins/profile/*/*.xplane.pb"))
    assert len(xplanes) == 4  # 2 workers x 2 epochs, never overwriting each other
    names = {p.name for p in xplanes}
    assert any(n.endswith("_rank0.xplane.pb") for n in names) and any(n.endswith("_rank1.xplane.pb") for n in names)
    reports = sorted(logdir.glob("plugins/fitprof/*.json"))
    assert sorted(json.loads(p.read_text())["rank"] for p in reports) == [0, 0, 1, 1]


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

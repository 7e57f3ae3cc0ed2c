"""Lightning FitProfiler under DDP (2 CPU processes, gloo): per-rank traces and report files, one session folder
shared by the ranks, one set of cross-rank scalars from rank 0, a planted slow rank named, a rank whose analysis
fails, ``fitprof report`` on the run, ``trigger="slowdown"`` across the ranks, and a world of one.

One real DDP launch per module: this file is also the training script. Lightning's ``ddp`` strategy re-launches
the script it runs in (``sys.argv``) for every other rank, so the test starts
``python tests/test_distributed_lightning.py --logdir DIR --fits plain,trigger,one`` in a subprocess (its own
process group, killed on timeout, so a deadlock fails the test instead of hanging it). Each rank runs the fits in
order, each into its own folder ``DIR/<fit>``: the launched process group serves both two-rank fits (Lightning
starts the other rank once; a later ``Trainer`` in the same script joins the group already there), then rank 0
alone runs the world of one in a new process group of one.

The planted problems: rank 1's ``Dataset.__getitem__`` sleeps 20 ms per batch (the straggler; in the trigger fit
it slows down mid-epoch instead), and in epoch 1 rank 1's analysis raises (``fitprof.analyze`` patched in the
script), so that rank sends an empty vector to the all-gather while rank 0 sends its figures.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

SLOW_RANK = 1
SLEEP_PER_BATCH_S = 0.020
BATCH_SIZE = 8
BATCHES_PER_RANK = 8  # per epoch
PROFILE_BATCH = (3, 5)  # a 3-step window
EPOCHS = 2
FAILING = (1, 1)  # (rank, epoch) whose analysis raises
RUN = "ddp/version_0"  # TensorBoardLogger(save_dir=DIR, name="ddp", version=0)
TIMEOUT_S = 600  # the launch, all its fits
TRIGGER_BATCHES = 48  # per rank and epoch, in the run with trigger="slowdown"
TRIGGER_SLOW_FROM = 30  # rank 1 slower from this batch on; the trigger needs 16 clean steps, it gets 22
TRIGGER_SLEEP_S = [0.0]  # per batch on rank 1; sized in the run (3x the trigger's threshold from its own step times)
FITS = ("plain", "trigger", "one")  # the two-rank fit, the two-rank fit with trigger="slowdown", a world of one


# ---------------------------------------------------------------------------------------------- the training run
def _train(argv: list[str]) -> None:
    """The DDP training script (runs as every rank)."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch.utils.data import DataLoader

    import fitprof
    from fitprof.lightning import FitProfiler
    from lightning_tiny import Mlp as Model
    from lightning_tiny import RegressionData

    parser = argparse.ArgumentParser()
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument(
        "--fits",
        default="plain",
        help=f"comma-separated, run in this order, each into LOGDIR/<fit>: {', '.join(FITS)}",
    )
    parser.add_argument("--devices", type=int, default=2, help="ranks (on gpu: at most one per GPU)")
    args = parser.parse_args(argv)
    fits = args.fits.split(",")
    assert set(fits) <= set(FITS) and ("one" not in fits or fits[-1] == "one"), fits
    torch.set_num_threads(1)  # two ranks on two cores
    # gpu: NCCL, one rank per GPU (two at most; one GPU gives a world of one, which has no cross-rank figures)
    devices = args.devices if args.accelerator == "cpu" else min(args.devices, torch.cuda.device_count())

    real_analyze = fitprof.analyze

    def analyze(path: Any, **kwargs: Any) -> Any:
        name = Path(path).name
        if f"_rank{FAILING[0]}." in name and f"_epoch{FAILING[1]}." in name:
            raise RuntimeError("planted analysis failure")
        return real_analyze(path, **kwargs)

    fitprof.analyze = analyze  # the callback imports it at call time

    trigger = [False]  # whether the fit running now is the trigger fit

    class Data(RegressionData):
        def wait(self, i: int) -> None:
            if torch.distributed.is_initialized() and torch.distributed.get_rank() == SLOW_RANK:
                if not trigger[0]:
                    time.sleep(SLEEP_PER_BATCH_S / BATCH_SIZE)
                elif TRIGGER_SLEEP_S[0]:
                    # Every sample of every batch from the sizing on (set at the end of step TRIGGER_SLOW_FROM - 2,
                    # zero again from the next epoch): the slowdown must not depend on which samples a batch
                    # holds. Choosing them by index made it a varying share of each batch (steps of 42-120 ms for a
                    # 158 ms sleep, under load), and one step under the threshold breaks the trigger's run of 5.
                    time.sleep(TRIGGER_SLEEP_S[0] / BATCH_SIZE)

    class SizeTheSlowdown(pl.Callback):
        """Rank 1's slowdown, sized from its own step times before it: 3x median + 8 robust sigmas, >= 100 ms."""

        def __init__(self) -> None:
            self.ends: list[int] = []
            self.all_ends: list[int] = []  # epoch 0's step ends
            self.sleep_s = 0.0

        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.ends = []
            TRIGGER_SLEEP_S[0] = 0.0  # epoch 1 stays steady (and short)

        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
            self.ends.append(time.perf_counter_ns())
            if trainer.current_epoch == 0:
                self.all_ends.append(self.ends[-1])
            if i + 2 == TRIGGER_SLOW_FROM:
                ms = sorted((b - a) / 1e6 for a, b in zip(self.ends[2:], self.ends[3:], strict=False))
                median = ms[len(ms) // 2]
                mad = sorted(abs(x - median) for x in ms)[len(ms) // 2]
                if trainer.current_epoch == 0:
                    TRIGGER_SLEEP_S[0] = self.sleep_s = max(0.1, 3 * (median + 8 * 1.4826 * mad) / 1e3)

    def run(fit: str) -> None:
        """One fit into ``LOGDIR/<fit>``, and what the callback saw in ``callback_rank<R>.json`` there."""
        logdir = Path(args.logdir, fit)
        trigger[0] = fit == "trigger"
        profiler = FitProfiler(profile_batch=PROFILE_BATCH, trigger="slowdown" if trigger[0] else None)
        sizer = SizeTheSlowdown()
        trainer = pl.Trainer(
            accelerator=args.accelerator,
            devices=1 if fit == "one" else devices,
            strategy="ddp",
            max_epochs=EPOCHS,
            logger=TensorBoardLogger(logdir, name="ddp", version=0),
            callbacks=[sizer, profiler] if trigger[0] else [profiler],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            log_every_n_steps=1,
        )
        batches = TRIGGER_BATCHES if trigger[0] else BATCHES_PER_RANK
        data = DataLoader(Data(2 * batches * BATCH_SIZE), batch_size=BATCH_SIZE)
        trainer.fit(Model(), data)
        seen = {
            "rank": trainer.global_rank,
            "epochs_done": trainer.current_epoch,
            "reports": sorted(profiler.reports),
            "cross_rank": {str(e): v for e, v in profiler.cross_rank.items()},
            "world_size": trainer.world_size,
            "triggered": [[epoch, event.step] for epoch, event, _ in profiler.triggered],
        }
        if trigger[0]:  # what the trigger saw, for the message when it did not fire
            trig = profiler._engine.trigger
            seen["trigger_state"] = {
                "step_ms": [round((b - a) / 1e6, 2) for a, b in zip(sizer.all_ends, sizer.all_ends[1:], strict=False)],
                "sleep_s": sizer.sleep_s,
                "threshold_ms": None if trig is None else trig.threshold_ms,
                "baseline_ms": None if trig is None else trig.baseline_ms,
                "clean_steps": profiler._engine.triggers.steps_fed,
            }
        Path(logdir, f"callback_rank{trainer.global_rank}.json").write_text(json.dumps(seen))

    for fit in fits:
        if fit == "one" and torch.distributed.is_initialized():
            # A world of one after the two-rank fits: rank 0 alone, in a new process group of one on a new port
            # (Lightning joins a group already there, whatever its size).
            if torch.distributed.get_rank() != 0:
                break
            torch.distributed.destroy_process_group()
            with socket.socket() as free:
                free.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(free.getsockname()[1])
        run(fit)


# --------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the script once with 2 DDP ranks and every fit of :data:`FITS`; return its log dir, exit status, output
    and wall time."""
    pytest.importorskip("lightning.pytorch")
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    return _launch(tmp_path_factory.mktemp("ddp"), "--fits", ",".join(FITS))


def _fit(launch: dict[str, Any], fit: str) -> dict[str, Any]:
    """One fit of the launch: its own log dir and run folder, the launch's exit status and output."""
    assert launch["rc"] == 0, launch["out"][-4000:]
    return {**launch, "logdir": launch["logdir"] / fit, "run": launch["logdir"] / fit / RUN}


@pytest.fixture(scope="module")
def ddp_run(launch: dict[str, Any]) -> dict[str, Any]:
    """The two-rank fit with rank 1 slow throughout."""
    return _fit(launch, "plain")


def _launch(logdir: Path, *extra: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, os.fspath(Path(__file__).resolve()), "--logdir", os.fspath(logdir), *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the rank it started
        out, _ = proc.communicate()
        pytest.fail(f"the DDP run did not finish in {TIMEOUT_S} s (deadlock?); output:\n{out[-4000:]}")
    return {"logdir": logdir, "rc": proc.returncode, "out": out, "s": time.perf_counter() - t0}


@pytest.fixture(scope="module")
def run_dir(ddp_run: dict[str, Any]) -> Path:
    assert ddp_run["rc"] == 0, ddp_run["out"][-4000:]
    return Path(ddp_run["run"])


def _report_files(run_dir: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """(epoch, rank) -> the report file's record."""
    out = {}
    for path in (run_dir / "plugins" / "fitprof").glob("*.json"):
        doc = json.loads(path.read_text())
        out[doc["epoch"], doc["rank"]] = doc
    return out


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The fitprof scalars of the one event file that has any: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = {}
    for path in run_dir.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(os.fspath(path), size_guidance={"scalars": 0})
        acc.Reload()
        tags = [t for t in acc.Tags()["scalars"] if t.startswith("fitprof/")]
        if tags:
            found[path] = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags}
    assert len(found) == 1, f"fitprof scalars in {len(found)} event files: {sorted(map(str, found))}"
    return next(iter(found.values()))


# ------------------------------------------------------------------------------------------------------ tests
@pytest.mark.slow
def test_the_run_finishes_on_both_ranks(ddp_run: dict[str, Any], run_dir: Path) -> None:
    # The planted analysis failure on rank 1 (epoch 1) did not stop the all-gather: both ranks finished both
    # epochs and hold the same cross-rank figures.
    seen = [json.loads((ddp_run["logdir"] / f"callback_rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["epochs_done"] for s in seen] == [EPOCHS, EPOCHS]
    assert seen[0]["reports"] == [0, 1] and seen[1]["reports"] == [0]
    assert seen[0]["cross_rank"] == seen[1]["cross_rank"]
    assert seen[0]["cross_rank"]["0"]["fitprof/ranks_reported"] == 2
    assert seen[0]["cross_rank"]["1"]["fitprof/ranks_reported"] == 1
    # rank 1's problem is not swallowed (the trigger fit plants the same failure: the path says which fit's)
    assert f"[rank 1] fitprof: could not analyse {ddp_run['run']}{os.sep}" in ddp_run["out"], ddp_run["out"][-4000:]


@pytest.mark.slow
def test_each_rank_writes_its_trace_with_rank_and_world_size(run_dir: Path) -> None:
    traces = sorted(run_dir.glob("*.pt.trace.json.gz"))
    assert len(traces) == EPOCHS * 2
    sessions = set()
    for epoch in range(EPOCHS):
        mine = [p for p in traces if f"_epoch{epoch}." in p.name]
        assert len(mine) == 2 and len({p.name for p in mine}) == 2
        for rank in (0, 1):
            (path,) = [p for p in mine if f"_rank{rank}." in p.name]
            info = json.loads(gzip.decompress(path.read_bytes()))["distributedInfo"]
            assert (info["rank"], info["world_size"], info["backend"]) == (rank, 2, "gloo")
        sessions |= {p.name.split(".")[1] for p in mine}
    assert len(sessions) == EPOCHS  # the two ranks of a window share its session name


@pytest.mark.slow
def test_one_session_folder_per_window_lists_both_ranks(run_dir: Path) -> None:
    from tbserver import get, tensorboard, wait_for

    host = socket.gethostname()  # as the callback names the files
    folders = sorted((run_dir / "plugins" / "profile").iterdir())
    assert len(folders) == EPOCHS
    names = [sorted(p.name for p in folder.glob("*.xplane.pb")) for folder in folders]
    # Rank 1's epoch-1 analysis failed; its trace still reaches the Profile tab (nothing recorded is dropped).
    assert names == [[f"{host}_rank0.xplane.pb", f"{host}_rank1.xplane.pb"]] * EPOCHS
    with tensorboard(run_dir.parent.parent) as base:
        expected = sorted(f"{RUN}/{f.name}" for f in folders)
        runs = wait_for(
            lambda: get(base, "/data/plugin/profile/runs"), timeout_s=90, until=lambda r: sorted(r) == expected
        )
        assert sorted(runs) == expected
        hosts = get(base, "/data/plugin/profile/hosts", run=f"{RUN}/{folders[0].name}", tag="trace_viewer")
        names = {h["hostname"] if isinstance(h, dict) else h for h in hosts}
        assert {f"{host}_rank0", f"{host}_rank1"} <= names, hosts


@pytest.mark.slow
def test_each_ranks_xplane_gives_the_report_of_its_trace(run_dir: Path) -> None:
    """What the Profile tab and ``fitprof analyze <session folder>`` read is each rank's own window."""
    import fitprof
    from agreement import assert_same_report

    xplanes = sorted((run_dir / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(xplanes) == EPOCHS * 2  # every window of every rank, also the one whose analysis failed
    for xplane in xplanes:
        host_rank, session = xplane.name.removesuffix(".xplane.pb"), xplane.parent.name
        trace = run_dir / f"{host_rank}.{session}.pt.trace.json.gz"
        report = fitprof.analyze(xplane)
        assert_same_report(fitprof.analyze(trace), report)
        assert (report.host, report.rank, report.world_size) == (socket.gethostname(), int(host_rank[-1]), 2)


@pytest.mark.slow
def test_rank_zero_logs_one_set_of_cross_rank_scalars(run_dir: Path) -> None:
    scalars = _scalars(run_dir)
    reports = _report_files(run_dir)
    assert sorted(reports) == [(0, 0), (0, 1), (1, 0)]  # rank 1's epoch-1 analysis failed
    for key in (
        "fitprof/step_time_ms",
        "fitprof/input_percent",
        "fitprof/collective_percent",
        "fitprof/step_time_ms_max",
        "fitprof/step_time_ms_max_rank",
        "fitprof/input_percent_max",
        "fitprof/input_percent_max_rank",
        "fitprof/ranks_reported",
    ):
        assert len(scalars[key]) == EPOCHS, key  # once per epoch, from rank 0 only
    first = {k: v[0][1] for k, v in scalars.items() if len(v) == EPOCHS}
    second = {k: v[1][1] for k, v in scalars.items() if len(v) == EPOCHS}
    r0, r1 = reports[0, 0]["report"], reports[0, 1]["report"]

    # Epoch 0: means and maxima of the two ranks' report files.
    assert first["fitprof/ranks_reported"] == 2
    assert first["fitprof/step_time_ms"] == pytest.approx((r0["step_time_ms"] + r1["step_time_ms"]) / 2, rel=1e-5)
    assert first["fitprof/input_percent"] == pytest.approx((r0["input_percent"] + r1["input_percent"]) / 2, rel=1e-5)
    slow = 0 if r0["step_time_ms"] >= r1["step_time_ms"] else 1
    assert first["fitprof/step_time_ms_max_rank"] == slow
    assert first["fitprof/step_time_ms_max"] == pytest.approx(max(r0["step_time_ms"], r1["step_time_ms"]), rel=1e-5)
    assert first["fitprof/steps_analyzed"] == 2 * (PROFILE_BATCH[1] - PROFILE_BATCH[0] + 1)
    # gloo's all-reduce (gloo:all_reduce, c10d::allreduce_) is found in both ranks' traces.
    assert r0["collective_percent"] > 0 and r1["collective_percent"] > 0
    assert first["fitprof/collective_percent"] > 0

    # Epoch 1: rank 1 sent an empty vector, so the figures are rank 0's alone.
    r0e1 = reports[1, 0]["report"]
    assert second["fitprof/ranks_reported"] == 1
    assert second["fitprof/step_time_ms"] == pytest.approx(r0e1["step_time_ms"], rel=1e-5)
    assert second["fitprof/step_time_ms_max_rank"] == 0 and second["fitprof/input_percent_max_rank"] == 0


@pytest.mark.slow
def test_the_slow_rank_is_named_by_its_input_share(run_dir: Path) -> None:
    # Rank 1 waits 20 ms per batch for data. Under DDP the gradient all-reduce makes rank 0 wait for rank 1
    # inside every step, so both ranks' step times come out the same (which of the two is "max" is noise:
    # fitprof/step_time_ms_max_rank is not asserted). What differs is where each rank's step time goes:
    # rank 1 is blocked in its DataLoader, rank 0 in the all-reduce. The input share names the straggler.
    scalars = _scalars(run_dir)
    reports = _report_files(run_dir)
    r0, r1 = reports[0, 0]["report"], reports[0, 1]["report"]
    assert scalars["fitprof/input_percent_max_rank"][0][1] == SLOW_RANK
    assert scalars["fitprof/input_percent_max"][0][1] == pytest.approx(r1["input_percent"], rel=1e-5)
    # rank 0's own input share is not zero: 1.0% on a quiet machine, 11.4% seen at a load average of 14
    assert r1["input_percent"] > 40 and r1["input_percent"] > r0["input_percent"] + 30
    assert r0["collective_percent"] > r1["collective_percent"]  # the fast rank waits in the all-reduce
    assert r1["step_time_ms"] == pytest.approx(r0["step_time_ms"], rel=0.25)  # equalised by the all-reduce


@pytest.mark.slow
def test_summary_text_names_the_ranks(run_dir: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.fspath(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    texts = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("fitprof/summary/text_summary")]
    assert len(texts) == EPOCHS
    assert "**Across ranks** (2 of 2 reported" in texts[0]
    assert f"largest input share rank {SLOW_RANK} at" in texts[0]
    assert "(1 of 2 reported" in texts[1]


@pytest.mark.slow
def test_fitprof_report_gives_a_row_per_rank_and_the_spread(
    ddp_run: dict[str, Any], run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fitprof.cli import main

    capsys.readouterr()
    assert main(["report", os.fspath(ddp_run["logdir"]), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    rows = [r for r in records if r["record"] == "window"]
    assert sorted((r["epoch"], r["rank"]) for r in rows) == [(0, 0), (0, 1), (1, 0)]
    assert {r["run"] for r in rows} == {RUN}
    (spread,) = [r for r in records if r["record"] == "spread"]  # epoch 1 has one rank: no spread
    assert spread["epoch"] == 0 and spread["ranks"] == [0, 1]
    epoch0 = {r["rank"]: r for r in rows if r["epoch"] == 0}
    slowest = max(epoch0, key=lambda k: epoch0[k]["step_time_ms"])
    assert spread["slowest_rank"] == slowest  # the longer step time, as logged in step_time_ms_max_rank
    assert spread["input_percent_spread"] == pytest.approx(
        abs(epoch0[1]["input_percent"] - epoch0[0]["input_percent"]), rel=1e-6
    )
    assert spread["input_percent_spread"] > 30


def _check_world(logdir: Path, backend: str) -> int:
    """The checks of a run on any number of ranks; returns its world size. Two ranks or more: rank 0 holds the
    cross-rank figures of every rank that reported (the planted failure's rank left out in its epoch). A world of
    one has no other rank to compare: no cross-rank figures, as for a single process without a process group."""
    import fitprof

    seen = json.loads((logdir / "callback_rank0.json").read_text())
    world = seen["world_size"]
    assert seen["epochs_done"] == EPOCHS
    if world == 1:
        assert seen["cross_rank"] == {}
    else:
        failing_rank_exists = FAILING[0] < world
        assert seen["cross_rank"]["0"]["fitprof/ranks_reported"] == world
        assert seen["cross_rank"]["1"]["fitprof/ranks_reported"] == world - failing_rank_exists
    traces = sorted((logdir / RUN).glob("*_epoch0.pt.trace.json.gz"))
    assert len(traces) == world
    for trace in traces:
        doc = json.loads(gzip.decompress(trace.read_bytes()))
        assert (doc["distributedInfo"]["backend"], doc["distributedInfo"]["world_size"]) == (backend, world)
        report = fitprof.analyze(trace)
        assert report.steps_analyzed == PROFILE_BATCH[1] - PROFILE_BATCH[0] + 1
        if backend == "nccl":
            assert report.op_time_source == "device"  # kernels ran on the GPU
            if world > 1:
                names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel"]
                assert any("nccl" in n.lower() for n in names)
                assert report.collective_ms_per_step > 0
    return int(world)


@pytest.mark.slow
def test_a_world_of_one_runs_without_cross_rank_figures(launch: dict[str, Any]) -> None:
    """DDP with one rank (what one GPU gives the NCCL run below), on the CPU: a process group of one (rank 0's,
    after the two-rank fits)."""
    one = _fit(launch, "one")
    assert _check_world(one["logdir"], "gloo") == 1


@pytest.mark.gpu
@pytest.mark.slow
def test_nccl_gather_on_gpus(tmp_path: Path) -> None:
    """The same run on GPUs: NCCL for the training and for fitprof's all-gather (a float64 tensor on each rank's
    device), one rank per GPU (two at most). Each rank's trace says NCCL; with two ranks the gather completes and
    rank 0 holds the cross-rank figures of every rank that reported, and the gradient all-reduce shows as NCCL
    kernels on the device and in ``collective_percent``; one GPU gives a world of one (no cross-rank figures)."""
    run = _launch(tmp_path, "--accelerator", "gpu")
    assert run["rc"] == 0, run["out"][-4000:]
    _check_world(tmp_path / "plain", "nccl")


if __name__ == "__main__":
    _train(sys.argv[1:])


# ------------------------------------------------------------------------------- trigger="slowdown" under DDP
@pytest.fixture(scope="module")
def trigger_run(launch: dict[str, Any]) -> dict[str, Any]:
    """The two-rank fit with ``trigger="slowdown"``: rank 1's input slows down from batch ``TRIGGER_SLOW_FROM`` of
    epoch 0 (rank 0 waits for it in the gradient all-reduce, so it may trigger too, at its own step), plus rank 1's
    planted analysis failure in epoch 1."""
    return _fit(launch, "trigger")


@pytest.mark.slow
def test_triggered_windows_ride_the_epoch_end_gather(trigger_run: dict[str, Any]) -> None:
    assert trigger_run["rc"] == 0, trigger_run["out"][-4000:]
    seen = [json.loads((trigger_run["logdir"] / f"callback_rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["epochs_done"] for s in seen] == [EPOCHS, EPOCHS]  # no deadlock whatever each rank captured
    assert seen[0]["cross_rank"] == seen[1]["cross_rank"] and sorted(seen[0]["cross_rank"]) == ["0", "1"]
    assert seen[SLOW_RANK]["triggered"], (seen[SLOW_RANK].get("trigger_state"), trigger_run["out"][-3000:])
    epoch, step = seen[SLOW_RANK]["triggered"][0]
    assert epoch == 0 and TRIGGER_SLOW_FROM < step <= TRIGGER_SLOW_FROM + 10
    session = next(Path(trigger_run["run"], "plugins", "profile").glob(f"*_epoch0_trigger_step{step}"))
    assert [p.name for p in session.glob(f"*_rank{SLOW_RANK}.xplane.pb")]

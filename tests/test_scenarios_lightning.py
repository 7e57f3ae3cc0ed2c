"""Lightning's own profiler scenarios, re-made with fitprof's ``FitProfiler`` in place of the profiler: one row each.

The conditions come from the scenarios of Lightning's ``tests/tests_pytorch/profilers/test_profiler.py`` and its DDP,
CLI and trainer-flag tests (written here from each scenario's condition; no code copied). Each row of ``ROWS`` is
one scenario: the callback's arguments, the Trainer's, what else runs, and the outcome read back from the callback
and the warnings: the steps analysed per profiled epoch and each fitprof warning (a tuple of substrings that one
warning holds; the number of fitprof warnings must match). The next scenario is one more row.

The distributed rows (``ddp_spawn``, ``ddp``, 2 CPU processes, gloo) are marked ``slow``; the ``ddp`` row starts this
file as a script (Lightning's ``ddp`` re-launches ``sys.argv`` for each other rank), as ``test_distributed_lightning``.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import signal
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from fitprof.lightning import FitProfiler  # noqa: E402
from fitprof.report_files import read_report_file  # noqa: E402
from lightning_tiny import Tiny as _Tiny  # noqa: E402

BATCH = 4


class _Manual(_Tiny):
    """Manual optimization: the module steps its optimizer itself."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        opt = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


class _PathLike:
    """An ``os.PathLike`` that is not a ``pathlib.Path`` and whose ``str`` is not the path."""

    def __init__(self, path: Path) -> None:
        self._path = str(path)

    def __fspath__(self) -> str:
        return self._path

    def __str__(self) -> str:
        return f"<path {self._path}>"


class _Stream(torch.utils.data.IterableDataset):
    """An iterable dataset of ``n`` batches: the DataLoader has no length, so Lightning reports no step count."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        g = torch.Generator().manual_seed(0)
        for _ in range(self.n * BATCH):
            yield torch.randn(8, generator=g), torch.randint(0, 2, (), generator=g)


def _loader(batches: int, iterable: bool = False) -> Any:
    if iterable:
        return torch.utils.data.DataLoader(_Stream(batches), batch_size=BATCH)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(batches * BATCH, 8, generator=g), torch.randint(0, 2, (batches * BATCH,), generator=g)
    )
    return torch.utils.data.DataLoader(data, batch_size=BATCH)


@dataclass(frozen=True)
class Row:
    """One scenario: its conditions and the outcome fitprof must give.

    Attributes:
        id: the scenario's name.
        cb: ``FitProfiler`` arguments (``log_dir`` is the test's folder).
        trainer: ``Trainer`` arguments on top of a quiet 1-epoch CPU Trainer.
        batches: training batches per epoch in the data (``iterable``: an ``IterableDataset``, no length).
        stages: Trainer calls after the fit (``validate``, ``test``, ``predict``), or instead of it (``fit`` absent).
        other: another profiler in the same fit: ``fitprof-after`` / ``fitprof-before`` (a second FitProfiler listed
            after / before), ``torch-profiler`` (the user's ``torch.profiler.profile`` around the fit), or
            ``Trainer(profiler=...)`` names: ``pytorch``, ``simple``, ``advanced``.
        copy: ``deepcopy-before`` / ``pickle-before`` (the copy is the callback that fits) or ``deepcopy-after`` /
            ``pickle-after`` (the copy made after the fit keeps the reports and fits again).
        resume: the fit resumes from a checkpoint saved after this many epochs of a fit without the callback.
        extra: ``swa`` (``StochasticWeightAveraging``), ``early-stopping`` (stops after the first validation),
            ``two-loggers`` (TensorBoard and CSV loggers, no ``log_dir``: the first logger's folder),
            ``pathlike`` (``log_dir`` an ``os.PathLike`` that is not a ``Path``).
        manual: the module uses manual optimization.
        reports: expected steps analysed per profiled epoch.
        warns: one tuple of substrings per expected fitprof warning.
    """

    id: str
    cb: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] = field(default_factory=dict)
    batches: int = 8
    iterable: bool = False
    stages: tuple[str, ...] = ("fit",)
    other: str | None = None
    copy: str | None = None
    resume: int | None = None
    extra: str | None = None
    manual: bool = False
    reports: dict[int, int] = field(default_factory=dict)
    warns: tuple[tuple[str, ...], ...] = ()


NOTHING = "nothing was profiled"
ROWS = [
    # argument forms
    Row("int", cb={"profile_batch": 2}, reports={0: 1}),
    Row("tuple", cb={"profile_batch": (2, 3)}, reports={0: 2}),
    Row("list", cb={"profile_batch": [2, 3]}, reports={0: 2}),
    Row("string", cb={"profile_batch": "2,3"}, reports={0: 2}),
    Row("zero-is-off", cb={"profile_batch": 0}, trainer={"max_epochs": 2}),
    Row("string-zero-is-off", cb={"profile_batch": "0"}),
    Row(
        "every-n-epochs",
        cb={"profile_batch": (2, 3), "every_n_epochs": 2},
        trainer={"max_epochs": 3},
        reports={0: 2, 2: 2},
    ),
    # the window's last step is the epoch's last: a complete window, no warning
    Row("window-ends-with-epoch", batches=10, reports={0: 5}),
    # which stages profile: fit only
    Row(
        "stages-after-fit", cb={"profile_batch": (2, 3)}, stages=("fit", "validate", "test", "predict"), reports={0: 2}
    ),
    Row("stages-without-fit", cb={"profile_batch": (2, 3)}, stages=("validate", "test", "predict")),
    # epochs shorter than the window: the warning names the real count, its cause and a window that fits
    Row(
        "fast-dev-run",
        trainer={"fast_dev_run": True},
        warns=((NOTHING, "1 training step ", "fast_dev_run=True", "profile_batch=1."),),
    ),
    Row("fast-dev-run-suggestion-followed", cb={"profile_batch": 1}, trainer={"fast_dev_run": True}, reports={0: 1}),
    Row(
        "limit-train-batches",
        trainer={"limit_train_batches": 3},
        warns=((NOTHING, "3 training steps", "limit_train_batches=3", "profile_batch=(2, 3)"),),
    ),
    Row(
        "limit-train-batches-suggestion-followed",
        cb={"profile_batch": (2, 3)},
        trainer={"limit_train_batches": 3},
        reports={0: 2},
    ),
    Row(
        "limit-train-batches-fraction",
        trainer={"limit_train_batches": 0.5},
        warns=((NOTHING, "4 training steps", "limit_train_batches=0.5", "profile_batch=(3, 4)"),),
    ),
    Row("iterable-dataset", batches=3, iterable=True, warns=((NOTHING, "3 training steps", "profile_batch=(2, 3)"),)),
    Row("iterable-dataset-window-fits", cb={"profile_batch": (2, 3)}, batches=3, iterable=True, reports={0: 2}),
    # the epoch ends on the window's warm-up step: that recorded step is dropped, nothing is written
    Row(
        "iterable-dataset-ends-on-warm-up-step",
        batches=5,
        iterable=True,
        warns=((NOTHING, "5 training steps", "profile_batch=(3, 5)"),),
    ),
    # max_steps across epochs: the window of the epoch it cuts short holds the steps that ran
    Row(
        "max-steps-across-epochs",
        cb={"profile_batch": (2, 4)},
        batches=4,
        trainer={"max_epochs": 3, "max_steps": 6},
        reports={0: 3, 1: 1},
        warns=(("epoch 1 ended after step 2",),),
    ),
    Row("max-steps-before-window", trainer={"max_steps": 3}, warns=((NOTHING, "3 training steps", "max_steps=3"),)),
    # every_n_epochs skipped every epoch of a resumed fit
    Row(
        "resume-skips-every-profiled-epoch",
        cb={"every_n_epochs": 2},
        trainer={"max_epochs": 2},
        resume=1,
        warns=((NOTHING, "every_n_epochs=2", "epoch 1"),),
    ),
    Row(
        "resume-profiles-its-epochs", cb={"profile_batch": (2, 3)}, trainer={"max_epochs": 2}, resume=1, reports={1: 2}
    ),
    # two profilers in one fit, both orders
    Row(
        "second-fitprof-after",
        cb={"profile_batch": (2, 3)},
        other="fitprof-after",
        reports={0: 2},
        warns=(("does not start a second one",), (NOTHING, "another torch profiler was running")),
    ),
    Row(
        "second-fitprof-before",
        cb={"profile_batch": (2, 3)},
        other="fitprof-before",
        warns=(("does not start a second one",), (NOTHING, "another torch profiler was running")),
    ),
    Row(
        "user-torch-profiler-around-fit",
        cb={"profile_batch": (2, 3)},
        other="torch-profiler",
        warns=(("does not start a second one",), (NOTHING, "another torch profiler was running")),
    ),
    Row("trainer-pytorch-profiler", cb={"profile_batch": (2, 3)}, other="pytorch", warns=(("is off for this run",),)),
    Row("trainer-simple-profiler", cb={"profile_batch": (2, 3)}, other="simple", reports={0: 2}),
    Row("trainer-advanced-profiler", cb={"profile_batch": (2, 3)}, other="advanced", reports={0: 2}),
    # other callbacks, loggers and modules
    Row(
        "stochastic-weight-averaging",
        cb={"profile_batch": (2, 3)},
        trainer={"max_epochs": 2},
        extra="swa",
        reports={0: 2, 1: 2},
    ),
    Row(
        "early-stopping",
        cb={"profile_batch": (2, 3)},
        trainer={"max_epochs": 3},
        extra="early-stopping",
        reports={0: 2},
    ),
    Row("two-loggers-log-dir-from-the-first", cb={"profile_batch": (2, 3)}, extra="two-loggers", reports={0: 2}),
    Row("pathlike-log-dir", cb={"profile_batch": (2, 3)}, extra="pathlike", reports={0: 2}),
    Row("manual-optimization", cb={"profile_batch": (2, 3)}, manual=True, reports={0: 2}),
    # copies (checkpointing and SWA copy callbacks): before and after a fit
    Row("deepcopy-before-fit", cb={"profile_batch": (2, 3)}, copy="deepcopy-before", reports={0: 2}),
    Row("pickle-before-fit", cb={"profile_batch": (2, 3)}, copy="pickle-before", reports={0: 2}),
    Row("deepcopy-after-fit", cb={"profile_batch": (2, 3)}, copy="deepcopy-after", reports={0: 2}),
    Row("pickle-after-fit", cb={"profile_batch": (2, 3)}, copy="pickle-after", reports={0: 2}),
]


def _trainer(tmp: Path, callbacks: list[Any], **kwargs: Any) -> Any:
    opts: dict[str, Any] = dict(
        max_epochs=1,
        default_root_dir=tmp,
        logger=False,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=2,
        num_sanity_val_steps=0,
    )
    opts.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **opts)


def _fp_dir(row: Row, tmp: Path) -> Path:
    """Where the row's traces go: its ``log_dir``, or the first logger's folder."""
    return tmp / "lightning_logs" / "version_0" if row.extra == "two-loggers" else tmp / "fp"


def _run(row: Row, tmp: Path) -> tuple[FitProfiler, list[str]]:
    """Run the row's scenario; return the callback whose reports count and the fitprof warnings."""
    log_dir: Any = None if row.extra == "two-loggers" else tmp / "fp"
    if row.extra == "pathlike":
        log_dir = _PathLike(tmp / "fp")
    cb = FitProfiler(log_dir=log_dir, **row.cb)
    if row.copy in ("deepcopy-before", "pickle-before"):
        cb = copy.deepcopy(cb) if row.copy == "deepcopy-before" else pickle.loads(pickle.dumps(cb))
    callbacks: list[Any] = [cb]
    if row.other in ("fitprof-after", "fitprof-before"):
        second = FitProfiler(log_dir=tmp / "fp2", **row.cb)
        callbacks = [cb, second] if row.other == "fitprof-after" else [second, cb]
    trainer_kwargs = dict(row.trainer)
    if row.extra == "swa":
        callbacks.append(pl.callbacks.StochasticWeightAveraging(swa_lrs=1e-2, swa_epoch_start=1))
    if row.extra == "early-stopping":
        callbacks.append(pl.callbacks.EarlyStopping(monitor="val_loss", stopping_threshold=1e9))
    if row.extra == "two-loggers":
        trainer_kwargs["logger"] = [pl.loggers.TensorBoardLogger(tmp), pl.loggers.CSVLogger(tmp)]
    if row.other in ("pytorch", "simple", "advanced"):
        trainer_kwargs["profiler"] = row.other
    train = _loader(row.batches, row.iterable)
    ckpt = None
    if row.resume:
        first = _trainer(tmp, [], max_epochs=row.resume)
        first.fit(_Tiny(), train)
        ckpt = tmp / "resume.ckpt"
        first.save_checkpoint(ckpt)
    trainer = _trainer(tmp, callbacks, **trainer_kwargs)
    module = _Manual() if row.manual else _Tiny()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if "fit" in row.stages:
            if row.other == "torch-profiler":
                with torch.profiler.profile():
                    trainer.fit(module, train, _loader(2), ckpt_path=ckpt)
            else:
                trainer.fit(module, train, _loader(2), ckpt_path=ckpt)
        for stage in row.stages:
            if stage != "fit":
                getattr(trainer, stage)(_Tiny(), _loader(2))
    if row.copy in ("deepcopy-after", "pickle-after"):
        copied = copy.deepcopy(cb) if row.copy == "deepcopy-after" else pickle.loads(pickle.dumps(cb))
        assert {e: r.steps_analyzed for e, r in copied.reports.items()} == row.reports  # the reports survive
        _trainer(tmp, [copied], **trainer_kwargs).fit(_Tiny(), _loader(row.batches))  # and the copy fits again
        assert {e: r.steps_analyzed for e, r in copied.reports.items()} == row.reports
    return cb, [str(w.message) for w in caught if "fitprof" in str(w.message).lower()]


def _check_warnings(msgs: list[str], expected: tuple[tuple[str, ...], ...]) -> None:
    assert len(msgs) == len(expected), msgs
    for parts in expected:
        assert sum(all(p in m for p in parts) for m in msgs) == 1, (parts, msgs)


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_scenario(row: Row, tmp_path: Path) -> None:
    cb, msgs = _run(row, tmp_path)
    assert {e: r.steps_analyzed for e, r in cb.reports.items()} == row.reports
    _check_warnings(msgs, row.warns)
    # what is on disk agrees: one trace and one report file per profiled epoch, nothing for a stage that never profiles
    fits = 2 if row.copy in ("deepcopy-after", "pickle-after") else 1  # the copy fitted again into the same folder
    fp = _fp_dir(row, tmp_path)
    assert len(list(fp.glob("*.pt.trace.json.gz"))) == fits * len(row.reports)
    reports = [read_report_file(p) for p in fp.glob("plugins/fitprof/*.json")]
    assert sorted(r.report.steps_analyzed for r in reports) == sorted(fits * list(row.reports.values()))


# ------------------------------------------------------------------------------------------------- LightningCLI
@pytest.mark.slow
def test_lightning_cli_appends_the_callback_by_its_import_path(tmp_path: Path) -> None:
    """``--trainer.callbacks+=fitprof.lightning.FitProfiler`` and its arguments as ``--trainer.callbacks.<arg>``."""
    pytest.importorskip("jsonargparse")
    from lightning.pytorch.cli import LightningCLI

    class Data(pl.LightningDataModule):
        def train_dataloader(self) -> Any:
            return _loader(6)

    args = [
        "fit",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_epochs=1",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.accelerator=cpu",
        "--trainer.callbacks+=fitprof.lightning.FitProfiler",
        "--trainer.callbacks.profile_batch=2,4",
        f"--trainer.callbacks.log_dir={tmp_path / 'fp'}",
    ]
    # LightningCLI seeds with ``workers=True``, which sets these for the whole process: later fits in this process
    # would get Lightning's own ``worker_init_fn`` on their loaders.
    seed_env = {name: os.environ.get(name) for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")}
    try:
        cli = LightningCLI(_Tiny, Data, args=args, save_config_callback=None)
    finally:
        for name, value in seed_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    (cb,) = [c for c in cli.trainer.callbacks if isinstance(c, FitProfiler)]
    assert cb.profile_batch == (2, 4)
    assert {e: r.steps_analyzed for e, r in cb.reports.items()} == {0: 3}
    assert len(list((tmp_path / "fp").glob("plugins/fitprof/*.json"))) == 1


# --------------------------------------------------------------------------------------------------- distributed
def _ddp_fit(strategy: str, logdir: Path) -> None:
    """A 2-process CPU fit (gloo) with FitProfiler(profile_batch=(2, 3)); each rank writes what its callback saw."""
    torch.set_num_threads(1)
    cb = FitProfiler(log_dir=logdir, profile_batch=(2, 3))
    trainer = _trainer(logdir, [cb], devices=2, strategy=strategy, max_epochs=1)
    trainer.fit(_Tiny(), _loader(8))
    if strategy == "ddp":  # under ddp_spawn the ranks' callbacks die with their processes: the files tell
        seen = {"reports": {str(e): r.steps_analyzed for e, r in cb.reports.items()}, "cross": cb.cross_rank}
        Path(logdir, f"rank{trainer.global_rank}.json").write_text(json.dumps(seen))


def _gloo() -> None:
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")


def _check_ranks(logdir: Path) -> None:
    files = map(read_report_file, logdir.glob("plugins/fitprof/*.json"))
    reports = sorted((f.rank, f.report.world_size, f.report.steps_analyzed) for f in files)
    assert reports == [(0, 2, 2), (1, 2, 2)]
    assert (
        len(list(logdir.glob("*_rank0.*.pt.trace.json.gz")))
        == len(list(logdir.glob("*_rank1.*.pt.trace.json.gz")))
        == 1
    )


@pytest.mark.slow
def test_ddp_spawn_two_cpu_processes(tmp_path: Path) -> None:
    """``ddp_spawn`` pickles the callback into each process: every rank profiles and writes its files."""
    _gloo()
    env_before = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _ddp_fit("ddp_spawn", tmp_path)
    finally:
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
    _check_ranks(tmp_path)


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path: Path) -> None:
    """``ddp`` re-launches this file per rank; both callbacks report and share one set of cross-rank figures."""
    _gloo()
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, os.fspath(Path(__file__).resolve()), "ddp", os.fspath(tmp_path)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the ddp run did not finish in 300 s; output:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-4000:]
    _check_ranks(tmp_path)
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["reports"] for s in seen] == [{"0": 2}, {"0": 2}]
    assert seen[0]["cross"] == seen[1]["cross"] and seen[0]["cross"]["0"]["fitprof/ranks_reported"] == 2


if __name__ == "__main__":  # the ddp row's training script (every rank runs it)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    _ddp_fit(sys.argv[1], Path(sys.argv[2]))

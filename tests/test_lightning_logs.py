"""Lightning: fitprof's figures reach ``callback_metrics`` / ``logged_metrics``, the progress bar, a monitoring
callback and ``metrics.csv`` with their epoch; the one-line summary; the torch profiler options read back from
the trace."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger  # noqa: E402

import lightning_tiny  # noqa: E402
from fitprof import metrics as fitprof_metrics  # noqa: E402
from fitprof.lightning import FitProfiler  # noqa: E402
from lightning_tiny import Tiny as _Tiny  # noqa: E402


def _loader(batches: int = 12) -> Any:
    return lightning_tiny.loader(batches)


def _fit(tmp_path: Path, callbacks: list[Any], **kwargs: Any) -> Any:
    trainer = lightning_tiny.trainer(tmp_path, callbacks, **kwargs)
    trainer.fit(_Tiny(), _loader())
    return trainer


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, FitProfiler, ModelCheckpoint]:
    tmp = tmp_path_factory.mktemp("lightning_logs")
    fp = FitProfiler(profile_batch=(3, 5), every_n_epochs=2, top_k=3, verbose=False)
    ckpt = ModelCheckpoint(dirpath=tmp / "ckpt", monitor="fitprof/input_percent", mode="min", save_top_k=1)
    loggers = [CSVLogger(tmp, name="csv"), TensorBoardLogger(tmp, name="tb")]
    trainer = _fit(tmp, [fp, ckpt], max_epochs=3, logger=loggers, enable_checkpointing=True)
    return tmp, trainer, fp, ckpt


@pytest.mark.slow
def test_figures_reach_callback_metrics_progress_bar_and_a_monitor(run: tuple[Path, Any, Any, Any]) -> None:
    _, trainer, fp, ckpt = run
    assert sorted(fp.reports) == [0, 2]
    last = fp.reports[2]
    for metrics in (trainer.callback_metrics, trainer.logged_metrics):
        assert float(metrics["fitprof/step_time_ms"]) == pytest.approx(last.step_time_ms, rel=1e-6)
        assert float(metrics["fitprof/top_op_1_ms"]) == pytest.approx(last.top_ops[0].self_ms_per_step, rel=1e-6)
        assert not [k for k in metrics if k.startswith("fitprof/top_ops/")]
    assert float(trainer.progress_bar_metrics["fitprof/input_percent"]) == pytest.approx(last.input_percent, rel=1e-6)
    # ModelCheckpoint(monitor="fitprof/input_percent") saw the figures: its best score is the lower of the two.
    best = min(fp.reports[0].input_percent, last.input_percent)
    assert float(ckpt.best_model_score) == pytest.approx(best, rel=1e-6)


@pytest.mark.slow
def test_metrics_csv_rows_carry_their_epoch(run: tuple[Path, Any, Any, Any]) -> None:
    tmp, _, fp, _ = run
    (path,) = tmp.glob("csv/version_*/metrics.csv")
    with open(path, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("fitprof/step_time_ms")]
    assert [int(r["epoch"]) for r in rows] == [0, 2]
    for row in rows:
        report = fp.reports[int(row["epoch"])]
        assert float(row["fitprof/step_time_ms"]) == pytest.approx(report.step_time_ms, rel=1e-6)
        for i, op in enumerate(report.top_ops, start=1):
            assert float(row[f"fitprof/top_op_{i}_ms"]) == pytest.approx(op.self_ms_per_step, rel=1e-6)


@pytest.mark.slow
def test_each_epoch_end_is_one_csv_row_at_lightnings_epoch_end_step(run: tuple[Path, Any, Any, Any]) -> None:
    """The step timing and the window's figures share one row per epoch (as Lightning's own epoch-end values), at
    the epoch's last batch (12 batches an epoch: steps 11, 23, 35), with the values the callback measured, read back
    from the file; the epoch's parts, final at its close, are one more row at the same step."""
    tmp, _, fp, _ = run
    (path,) = tmp.glob("csv/version_*/metrics.csv")
    with open(path, newline="") as fh:
        every = list(csv.DictReader(fh))
    p50 = fitprof_metrics.EPOCH_STEP_TIME_MS_P50.key
    wall = fitprof_metrics.EPOCH_WALL_S.key
    rows = [r for r in every if r.get(p50)]
    assert [(int(r["epoch"]), int(r["step"])) for r in rows] == [(0, 11), (1, 23), (2, 35)]
    parts = [r for r in every if r.get(wall)]
    assert [(int(r["epoch"]), int(r["step"])) for r in parts] == [(0, 11), (1, 23), (2, 35)]
    for row in rows:
        epoch = int(row["epoch"])
        assert float(row[p50]) == pytest.approx(fp.epoch_steps[epoch].step_time_ms_p50, rel=1e-9)
        assert bool(row["fitprof/step_time_ms"]) == (epoch in fp.reports)


@pytest.mark.slow
def test_early_stopping_monitors_a_fitprof_figure(tmp_path: Path) -> None:
    """``EarlyStopping`` on a figure of every epoch reads it from ``callback_metrics`` at the epoch's end (Lightning
    runs monitors after fitprof's hook); a missing key would raise in its strict check. Any finite step count is
    below the threshold, so the fit stops after epoch 0 of 3."""
    key = fitprof_metrics.EPOCH_STEPS_TIMED.key
    stop = EarlyStopping(monitor=key, mode="min", stopping_threshold=1e9, check_on_train_epoch_end=True)
    fp = FitProfiler(profile_batch=(3, 5), verbose=False)
    trainer = _fit(tmp_path, [fp, stop], max_epochs=3)
    assert stop.stopped_epoch == 0 and trainer.current_epoch == 1
    assert float(trainer.callback_metrics[key]) == fp.epoch_steps[0].steps_timed


class _Refusing(CSVLogger):
    """A logger whose ``log_metrics`` raises (a remote tracker gone away)."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        raise ConnectionError("tracker unreachable")


@pytest.mark.slow
def test_a_failing_logger_warns_once_and_the_others_still_get_the_figures(tmp_path: Path) -> None:
    fp = FitProfiler(profile_batch=(3, 5), verbose=False)
    good = CSVLogger(tmp_path, name="good", version=0)
    with pytest.warns(Warning) as caught:
        trainer = _fit(tmp_path, [fp], max_epochs=2, logger=[_Refusing(tmp_path, name="bad"), good])
    failed = [str(w.message) for w in caught if "logging to _Refusing failed" in str(w.message)]
    assert len(failed) == 1 and "tracker unreachable" in failed[0]
    assert trainer.current_epoch == 2 and "fitprof/epoch/steps_timed" in trainer.callback_metrics
    with open(Path(good.log_dir) / "metrics.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("fitprof/epoch/steps_timed")]
    assert [int(r["epoch"]) for r in rows] == [0, 1]


@pytest.mark.slow
def test_tensorboard_gets_the_operators_by_name_too(run: tuple[Path, Any, Any, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tmp, _, fp, _ = run
    (run_dir,) = tmp.glob("tb/version_*")
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    # Every top operator of each profiled epoch, under its name with spaces made underscores (whichever operators
    # win: a Lightning run's first is aten::mm or "autograd::engine::evaluate_function: AddmmBackward0").
    steps = [e.step for e in acc.Scalars("fitprof/step_time_ms")]  # each profiled epoch's last batch (global_step - 1)
    for step, (_, report) in zip(steps, sorted(fp.reports.items()), strict=True):
        for op in report.top_ops:
            tag = "fitprof/top_ops/" + op.name.strip().replace(" ", "_")
            values = {e.step: e.value for e in acc.Scalars(tag)}
            assert values[step] == pytest.approx(op.self_ms_per_step, rel=1e-5), tag
    # the Markdown summary of each profiled epoch (Text tab) sits at the same steps
    assert [e.step for e in acc.Tensors("fitprof/summary/text_summary")] == steps
    assert [e.value for e in acc.Scalars("fitprof/step_time_ms")] == pytest.approx(
        [fp.reports[0].step_time_ms, fp.reports[2].step_time_ms], rel=1e-5
    )


@pytest.mark.slow
def test_one_line_summary_on_rank_zero_unless_turned_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    fp = FitProfiler(profile_batch=(3, 5))
    _fit(tmp_path / "on", [fp])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fitprof epoch")]
    r = fp.reports[0]
    head = (
        f"fitprof epoch 0: {r.step_time_ms:.2f} ms/step, input {r.input_percent:.1f}% of the window's steps, "
        f"HtoD {r.htod_percent:.1f}%, top op {r.top_ops[0].name} {r.top_ops[0].self_ms_per_step:.2f} ms -> {r.verdict}"
    )
    (line,) = lines
    assert line.startswith(head + "; profile in ")  # the place of the profile, its session folder
    assert Path(line.split("; profile in ")[1]).is_dir()
    fp = FitProfiler(profile_batch=(3, 5), verbose=False)
    _fit(tmp_path / "off", [fp])
    assert sorted(fp.reports) == [0]
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("fitprof epoch")]


def _events(path: Path) -> list[dict[str, Any]]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


@pytest.mark.slow
def test_torch_profiler_options_reach_the_trace(tmp_path: Path) -> None:
    plain = FitProfiler(profile_batch=(3, 5), verbose=False)
    _fit(tmp_path / "plain", [plain])
    rich = FitProfiler(profile_batch=(3, 5), verbose=False, record_shapes=True, profile_memory=True, with_stack=True)
    _fit(tmp_path / "rich", [rich])
    flops = FitProfiler(profile_batch=(3, 5), verbose=False, with_flops=True)
    _fit(tmp_path / "flops", [flops])

    def features(events: list[dict[str, Any]]) -> dict[str, bool]:
        ops = [e for e in events if e.get("cat") == "cpu_op"]
        return {
            "record_shapes": any("Input Dims" in e.get("args", {}) for e in ops),
            "profile_memory": any(e.get("name") == "[memory]" for e in events),
            "with_stack": any(e.get("cat") == "python_function" for e in events),
        }

    assert features(_events(plain.trace_paths[0])) == dict.fromkeys(
        ("record_shapes", "profile_memory", "with_stack"), False
    )
    assert all(features(_events(rich.trace_paths[0])).values())
    # torch 2.13 keeps FLOP counts in memory (key_averages) and writes none to the trace; with_flops records the
    # operator shapes it counts from, and those reach the trace.
    assert features(_events(flops.trace_paths[0])) == {
        "record_shapes": True,
        "profile_memory": False,
        "with_stack": False,
    }
    # The figures come from the same kind of window either way.
    assert rich.reports[0].steps_analyzed == plain.reports[0].steps_analyzed == flops.reports[0].steps_analyzed == 3


class _Logs(_Tiny):
    """Logs its loss every batch; ``fail`` raises in a training or validation step, ``manual`` steps its optimizer
    twice a batch by hand (``global_step`` then counts optimizer steps, not batches)."""

    def __init__(self, fail: str = "", manual: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.automatic_optimization = not manual

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.fail == "training" and self.current_epoch == 1 and batch_idx == 7:
            raise RuntimeError("planted")
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss, on_step=True, on_epoch=False)
        if not self.automatic_optimization:
            opt = self.optimizers()
            for _ in range(2):
                opt.zero_grad()
                self.manual_backward(super().training_step(batch, batch_idx))
                opt.step()
            return None
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.fail == "validation" and self.current_epoch == 1:
            raise RuntimeError("planted")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["training raises", "validation raises", "manual optimization"])
def test_what_fitprof_writes_itself_sits_at_the_last_batchs_step(tmp_path: Path, case: str) -> None:
    """The operators by name, the summary and (after an exception, where fitprof writes its scalars itself) the
    scalars land at the step Lightning gives the epoch's last batch: that of the epoch-end ``self.log`` values, or
    after an exception that of the last ``on_step`` value. Two epochs of 12 batches, profiled steps 3-5 each."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    fp = FitProfiler(profile_batch=(3, 5), verbose=False)
    module = _Logs(fail=case.split()[0] if "raises" in case else "", manual=case == "manual optimization")
    opts: dict[str, Any] = {"max_epochs": 2, "log_every_n_steps": 1, "logger": TensorBoardLogger(tmp_path, name="tb")}
    trainer = pl.Trainer(callbacks=[fp], default_root_dir=tmp_path, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, **opts)  # fmt: skip
    val = _loader(2) if case == "validation raises" else None
    if "raises" in case:
        with pytest.raises(RuntimeError, match="planted"):
            trainer.fit(module, _loader(), val)
    else:
        trainer.fit(module, _loader(), val)
    assert sorted(fp.reports) == [0, 1]
    (run_dir,) = tmp_path.glob("tb/version_*")
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    loss_steps = [e.step for e in acc.Scalars("loss")]
    # epoch 0 ends at its 12th batch (step 11); epoch 1 at step 23, or where training stopped
    last = {"training raises": 18, "validation raises": 23, "manual optimization": 23}[case]
    assert loss_steps[11] == 11 and loss_steps[-1] == last
    expected = [11, last]
    assert [e.step for e in acc.Scalars("fitprof/step_time_ms")] == expected
    assert [e.step for e in acc.Tensors("fitprof/summary/text_summary")] == expected
    for epoch, step in zip((0, 1), expected, strict=True):
        for op in fp.reports[epoch].top_ops:
            tag = "fitprof/top_ops/" + op.name.strip().replace(" ", "_")
            assert step in [e.step for e in acc.Scalars(tag)], (tag, step)


def test_torch_options_must_be_bools() -> None:
    with pytest.raises(TypeError, match="with_flops must be True or False; got 'yes'"):
        FitProfiler(with_flops="yes")  # type: ignore[arg-type]


class _Rows(CSVLogger):
    """A CSV logger that also keeps each ``log_metrics`` call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[tuple[dict[str, float], int | None]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((dict(metrics), step))
        super().log_metrics(metrics, step)


def test_log_figures_writes_what_self_log_would_in_one_call(tmp_path: Path) -> None:
    """Without a fit: the figures exact (float64) in ``callback_metrics`` and ``logged_metrics``, the progress-bar key
    in ``progress_bar_metrics``, one row with ``epoch`` per logger, written to ``metrics.csv`` (``save``);
    ``loggers=False`` reaches ``callback_metrics`` and the progress bar only, as ``self.log(..., logger=False)``."""
    from fitprof.lightning._trainer import log_figures

    rows = _Rows(tmp_path, name="csv", version=0)
    trainer = pl.Trainer(logger=rows, **{k: v for k, v in lightning_tiny.QUIET.items() if k != "logger"})
    third = 1 / 3
    log_figures(trainer, {"fitprof/a": third, "fitprof/b": 2.0}, epoch=3, progress_bar={"fitprof/b", "other"})
    for held in (trainer.callback_metrics, trainer.logged_metrics):
        assert held["fitprof/a"].dtype == torch.float64 and float(held["fitprof/a"]) == third
    assert trainer.progress_bar_metrics == {"fitprof/b": 2.0}
    assert rows.rows == [({"fitprof/a": third, "fitprof/b": 2.0, "epoch": 3}, 0)]
    with open(Path(rows.log_dir) / "metrics.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert float(row["fitprof/a"]) == third and row["epoch"] == "3" and row["step"] == "0"

    log_figures(trainer, {"fitprof/c": 5.0}, epoch=3, progress_bar={"fitprof/c"}, loggers=False)
    assert float(trainer.callback_metrics["fitprof/c"]) == 5.0 and trainer.progress_bar_metrics["fitprof/c"] == 5.0
    assert "fitprof/c" not in trainer.logged_metrics and len(rows.rows) == 1

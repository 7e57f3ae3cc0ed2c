"""Lightning lifecycle cases that must never break a run (issue "never break a training run")."""

from __future__ import annotations

import csv
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from fitprof.lightning import FitProfiler  # noqa: E402
from fitprof.traces import read_trace  # noqa: E402
from host_memory import needs_statm, rss_mb  # noqa: E402
from test_lightning import _fit, _loader, _Tiny  # noqa: E402
from warned import fitprof_messages  # noqa: E402

_messages = fitprof_messages


@pytest.mark.slow
def test_keep_last_windows_and_trace_size_warning(tmp_path: Path) -> None:
    cb = FitProfiler(profile_batch=(2, 3), keep_last_windows=2, max_trace_mb=0.001)
    msgs = _messages(lambda: _fit(tmp_path, cb, max_epochs=4, limit_train_batches=5))
    assert sorted(cb.reports) == [0, 1, 2, 3]
    assert len(list(tmp_path.glob("*.pt.trace.json.gz"))) == 2  # the last two windows' traces
    assert len(list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))) == 2
    assert len(list(tmp_path.glob("plugins/profile/*"))) == 2  # no empty session left in the Profile tab
    assert len(list(tmp_path.glob("plugins/fitprof/*.json"))) == 4  # every window's report stays
    sized = [m for m in msgs if "max_trace_mb=0.001" in m]
    assert len(sized) == 1 and str(cb.trace_paths[0]) in sized[0]


@pytest.mark.slow
def test_a_rank_left_out_opens_no_window(tmp_path: Path) -> None:
    left_out = FitProfiler(profile_batch=(2, 3), ranks=[1])  # one process: rank 0 of 1
    msgs = _messages(lambda: _fit(tmp_path / "out", left_out, max_epochs=1, limit_train_batches=5))
    assert msgs == ["fitprof: ranks=[1] names no rank of this run (ranks 0-0); nothing is profiled."]
    assert (left_out.reports, left_out.trace_paths) == ({}, {})
    assert not list((tmp_path / "out").rglob("*.pt.trace.json.gz"))
    chosen = FitProfiler(profile_batch=(2, 3), ranks=(0, 1))
    _fit(tmp_path / "in", chosen, max_epochs=1, limit_train_batches=5)
    assert chosen.reports[0].steps_analyzed == 2


@pytest.mark.parametrize(("ranks", "error"), [([], ValueError), (-1, ValueError), ("all", TypeError), (1.0, TypeError)])
def test_bad_ranks(ranks: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="ranks must be None, an int >= 0 or a non-empty list"):
        FitProfiler(ranks=ranks)


@pytest.mark.slow
def test_unwritable_log_dir_still_logs_the_figures(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file, so nothing can be created under it, even by root")
    cb = FitProfiler(log_dir=blocker / "logs", profile_batch=(2, 3))
    logger = CSVLogger(tmp_path / "csv", name="run", version=0)
    msgs = _messages(lambda: _fit(tmp_path, cb, max_epochs=2, limit_train_batches=5, logger=logger))
    assert sorted(cb.reports) == [0, 1]
    with open(Path(logger.log_dir) / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [float(r["fitprof/steps_analyzed"]) for r in rows if r.get("fitprof/steps_analyzed")] == [2.0, 2.0]
    assert sum("could not write the trace" in m for m in msgs) == 1
    leftovers = [p for p in Path(tempfile.gettempdir()).glob("fitprof-*") if any(p.glob("*.pt.trace.json.gz"))]
    assert leftovers == []  # the temporary copies were deleted after their analysis


@pytest.mark.slow
def test_max_steps_inside_the_window_flushes_it(tmp_path: Path) -> None:
    cb = FitProfiler(profile_batch=(3, 8))
    _messages(lambda: _fit(tmp_path, cb, max_steps=5))
    assert cb.reports[0].steps_analyzed == 3  # steps 3-5
    assert not torch.autograd._profiler_enabled()


@pytest.mark.slow
def test_should_stop_inside_the_window_flushes_it(tmp_path: Path) -> None:
    class StopAt4(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 3:
                trainer.should_stop = True

    cb = FitProfiler(profile_batch=(3, 8))
    trainer = pl.Trainer(
        callbacks=[cb, StopAt4()], max_epochs=3, default_root_dir=tmp_path, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
    )  # fmt: skip
    _messages(lambda: trainer.fit(_Tiny(), _loader()))
    assert sorted(cb.reports) == [0]
    # StopAt4 runs after FitProfiler in the callback list: FitProfiler's on_train_batch_end of step 4 closes
    # ProfilerStep#4 and opens #5 before should_stop is set; the epoch then ends and the open #5 is dropped.
    assert cb.reports[0].steps_analyzed == 2
    steps = read_trace(cb.trace_paths[0]).query("kind == 'step'")
    assert sorted(steps["step_num"]) == [3.0, 4.0]
    assert not torch.autograd._profiler_enabled()


@pytest.mark.slow
def test_keyboard_interrupt_inside_the_window(tmp_path: Path) -> None:
    class Interrupt(_Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == 4:
                raise KeyboardInterrupt
            return super().training_step(batch, batch_idx)

    cb = FitProfiler(profile_batch=(3, 8))
    try:
        _messages(lambda: _fit(tmp_path, cb, module=Interrupt()))
    except (KeyboardInterrupt, SystemExit):
        pass  # Lightning shuts down gracefully or re-raises, depending on version
    assert not torch.autograd._profiler_enabled()
    assert cb.reports[0].steps_analyzed == 2  # steps 3 and 4 finished; step 5 was interrupted


@pytest.mark.slow
def test_advanced_profiler_alongside(tmp_path: Path) -> None:
    cb = FitProfiler(profile_batch=(2, 4))
    trainer = _fit(tmp_path, cb, max_epochs=1, profiler="advanced")
    assert trainer.state.finished and cb.reports[0].steps_analyzed == 3


@pytest.mark.slow
def test_fit_twice_then_validate_and_predict(tmp_path: Path) -> None:
    cb = FitProfiler(profile_batch=(2, 3))
    module = _Tiny()
    trainer = pl.Trainer(
        callbacks=[cb], max_epochs=1, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(module, _loader(6))
    trainer.validate(module, _loader(3), verbose=False)
    trainer2 = pl.Trainer(
        callbacks=[cb], max_epochs=2, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    trainer2.fit(module, _loader(6))
    assert sorted(cb.reports) == [0, 1]  # each fit counts from its own start; the second fit ran 2 epochs
    assert all(r.steps_analyzed == 2 for r in cb.reports.values())
    assert not torch.autograd._profiler_enabled()


@pytest.mark.slow
def test_gradient_accumulation_and_manual_optimization(tmp_path: Path) -> None:
    cb = FitProfiler(profile_batch=(2, 5))
    _fit(tmp_path / "acc", cb, accumulate_grad_batches=2)
    assert cb.reports[0].steps_analyzed == 4  # steps are batches, whether or not the optimizer stepped

    class TwoOptimizers(_Tiny):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.other = torch.nn.Linear(8, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            for opt, layer in zip(self.optimizers(), (self.layer, self.other), strict=True):
                loss = torch.nn.functional.cross_entropy(layer(x), y)
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()

        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(self.layer.parameters(), 0.1), torch.optim.SGD(self.other.parameters(), 0.1)]

    cb2 = FitProfiler(profile_batch=(2, 5))
    _fit(tmp_path / "manual", cb2, module=TwoOptimizers())
    assert cb2.reports[0].steps_analyzed == 4


@pytest.mark.slow
def test_windows_separators_spaces_and_non_ascii(tmp_path: Path) -> None:
    cb = FitProfiler(log_dir=str(tmp_path) + "\\runs\\première exécution", profile_batch=(2, 3))
    _fit(tmp_path, cb)
    target = tmp_path / "runs" / "première exécution"
    assert len(list(target.glob("plugins/profile/*/*.xplane.pb"))) == 1
    assert len(list(target.glob("*.pt.trace.json.gz"))) == 1


@pytest.mark.slow
@needs_statm
def test_host_memory_flat_with_a_window_every_epoch(tmp_path: Path) -> None:
    """RSS after epoch 4 and after epoch 14, a window every epoch: growth under 40 MB (measured far less)."""
    rss: dict[int, float] = {}

    class Rss(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            rss[trainer.current_epoch] = rss_mb()

    cb = FitProfiler(profile_batch=(2, 3), keep_last_windows=1)
    trainer = pl.Trainer(
        callbacks=[cb, Rss()], max_epochs=15, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(_Tiny(), _loader(5))
    assert len(cb.reports) == 15
    growth = rss[14] - rss[4]
    print(f"RSS epoch 4: {rss[4]:.1f} MB, epoch 14: {rss[14]:.1f} MB, growth {growth:.1f} MB")
    assert growth < 40, rss


def _mid_epoch_checkpoint(root: Path, after_steps: int) -> str:
    """A checkpoint saved after step ``after_steps`` of epoch 0 (16 steps an epoch)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    ck = ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=after_steps, save_top_k=-1)
    trainer = pl.Trainer(
        default_root_dir=root,
        max_steps=after_steps,
        callbacks=[ck],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(_Tiny(), _loader())
    (path,) = sorted((root / "ckpt").glob("*.ckpt"))
    return str(path)


def _resume(root: Path, cb: FitProfiler, ckpt: str, **kwargs: Any) -> list[str]:
    trainer = pl.Trainer(
        default_root_dir=root,
        callbacks=[cb],
        logger=CSVLogger(root, name="csv"),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        **kwargs,
    )
    return _messages(lambda: trainer.fit(_Tiny(), _loader(), ckpt_path=ckpt))


@pytest.mark.slow
@pytest.mark.parametrize("after_steps", [3, 5])
def test_resume_mid_epoch_profiles_the_resumed_epoch(tmp_path: Path, after_steps: int) -> None:
    """Lightning calls no on_train_epoch_start for an epoch resumed mid-way; its window (steps 6-9, numbered as
    Lightning's batch_idx + 1 after the resume) is still profiled, also when it starts at the first resumed step."""
    from fitprof.traces import read_trace
    from fitprof.traces._table import Kind

    ckpt = _mid_epoch_checkpoint(tmp_path, after_steps)
    cb = FitProfiler(tmp_path / "prof", profile_batch=(6, 9))
    msgs = _resume(tmp_path, cb, ckpt, max_epochs=2)
    assert msgs == []
    assert sorted(cb.reports) == [0, 1] and cb.reports[0].steps_analyzed == 4
    table = read_trace(cb.trace_paths[0])
    assert sorted(table.loc[table["kind"] == Kind.STEP, "step_num"].astype(int)) == [6, 7, 8, 9]
    with open(next((tmp_path / "csv").rglob("metrics.csv"))) as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("fitprof/steps_analyzed")]
    assert [float(r["fitprof/steps_analyzed"]) for r in rows] == [4.0, 4.0]


@pytest.mark.slow
def test_resume_past_the_window_start_says_so(tmp_path: Path) -> None:
    ckpt = _mid_epoch_checkpoint(tmp_path, 7)
    cb = FitProfiler(tmp_path / "prof", profile_batch=(6, 9))
    msgs = _resume(tmp_path, cb, ckpt, max_epochs=2)
    assert msgs == [
        "fitprof: epoch 0 was resumed at step 8, after the window's first step (profile_batch=6,9); "
        "that epoch is not profiled."
    ]
    assert sorted(cb.reports) == [1] and cb.reports[1].steps_analyzed == 4


@pytest.mark.slow
def test_warnings_one_category_at_user_code_again_each_fit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from fitprof import FitProfilerWarning

    cb = FitProfiler(profile_batch=(2, 3), ranks=[1])
    for i in range(2):  # a later fit warns again when the cause repeats
        with warnings.catch_warnings(record=True) as caught, caplog.at_level("WARNING"):
            warnings.simplefilter("always")
            _fit(tmp_path / str(i), cb, max_epochs=2, limit_train_batches=5)
        ours = [w for w in caught if "fitprof" in str(w.message)]
        assert [(w.category, str(w.message)) for w in ours] == [
            (FitProfilerWarning, "fitprof: ranks=[1] names no rank of this run (ranks 0-0); nothing is profiled.")
        ]
        assert Path(ours[0].filename).name == "test_lightning.py"  # the trainer.fit call, not Lightning's loop
        assert not [r for r in caplog.records if "fitprof" in r.getMessage()]  # one channel
        caplog.clear()


@pytest.mark.slow
def test_warnings_as_errors_never_break_training(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """python -W error (for fitprof's category: Lightning warns of its own here): the warning goes to logging."""
    from fitprof import FitProfilerWarning

    cb = FitProfiler(profile_batch=(3, 50))
    with warnings.catch_warnings(), caplog.at_level("WARNING"):
        warnings.simplefilter("error", FitProfilerWarning)
        _fit(tmp_path, cb, max_epochs=1, limit_train_batches=5)
    assert cb.reports[0].steps_analyzed == 3  # steps 3-5
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fitprof: ")]
    assert len(logged) == 1 and "ended after step 5" in logged[0]

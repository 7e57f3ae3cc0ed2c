"""A save belongs to the epoch whose end made it, whatever order the framework runs the callbacks in: the epoch
closes after fitprof's epoch-end hook (:mod:`fitprof.fit.epoch_close`), at the next epoch's start, the fit's end, or
on Keras just before ``History`` records the logs.

The engine test plants the saves on a fake clock (exact). The fit tests run ``tests/epoch_saves_child.py`` (one
child process per framework): three epochs, each with a save of its own length (0.20, 0.30, 0.25 s, a sleep) made
by a checkpoint callback whose hook runs after fitprof's (Lightning's ``ModelCheckpoint``, listed before fitprof and
moved last by Lightning; Keras's listed after fitprof, with another callback sleeping 50 ms in ``on_epoch_end``).
The figures are read back from what the callbacks wrote: Lightning's ``CSVLogger`` file and ``TensorBoardLogger``
events, Keras's ``History`` and fitprof's event file (tensorboard's reader), the per-epoch file of both. Each
epoch's ``checkpoint_s`` is held against the child's own clock around the checkpoint callback's hook (what fitprof
counts as checkpoint time: the save and the callback's work around it), the fit's against the timed saves (the
issue's bar, 15%, the one comparison whose spread grows with the load: ``@tolerates_load``). Tolerance of the
others: 15% plus 30 ms for a scheduler's delay (a sleep is a sleep under load, and fitprof and the child time the
same hook); measured at load 6-8 on 2 cores: Lightning 0.225 / 0.324 / 0.351 s against hooks of 0.224 / 0.323 / 0.351 s (saves 0.209 / 0.321 / 0.255 s,
the fit 0.900 s against 0.786 s of saves); Keras 0.267 / 0.394 / 0.333 s against saves of 0.266 / 0.394 / 0.332 s.
Again at load 10: Lightning 0.217 / 0.313 / 0.279 s against hooks of the same and saves of 0.210 / 0.302 / 0.271 s
(the fit 0.810 s against 0.783 s); Keras 0.215 / 0.317 / 0.265 s against saves of 0.214 / 0.316 / 0.265 s.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest

from contention import measured, tolerates_load
from engine_fakes import Rig
from fitprof import metrics
from fitprof.fit.epoch_parts import CHECKPOINT, PARTS
from fitprof.report_files import epoch_file_path, read_epoch_file

CHILD = Path(__file__).with_name("epoch_saves_child.py")
SAVE_MS = (200.0, 300.0, 250.0)
CHECKPOINT_S = metrics.EPOCH_CHECKPOINT_S.key
WALL_S = metrics.EPOCH_WALL_S.key


def _near(measured_s: float, truth_s: float) -> bool:
    return abs(measured_s - truth_s) <= 0.15 * truth_s + 0.030


def _adds_up(figures: dict[str, float]) -> bool:
    return math.isclose(sum(figures[f"fitprof/epoch/{p}_s"] for p in PARTS), figures[WALL_S], rel_tol=1e-6)


# ------------------------------------------------------------------------------------------------ planted clock
def test_engine_charges_each_save_to_the_epoch_that_made_it(tmp_path: Path) -> None:
    """Saves after fitprof's epoch-end event, of three lengths: each epoch's line in the per-epoch file holds its own
    save exactly and names it in its verdict; the last one is in the last epoch, not in the teardown."""
    rig = Rig(tmp_path, profile_batch=0)
    engine, clock = rig.engine, rig.clock
    engine.fit_start(log_dir=str(tmp_path))
    at_hook = []
    for epoch, save_ms in enumerate(SAVE_MS):
        engine.epoch_start(epoch)
        for step in range(1, 5):
            engine.step_start(step)
            clock.tick(25)
            engine.step_end(step)
        result = engine.epoch_end(epoch)
        at_hook.append(result.epoch[CHECKPOINT_S])
        path = epoch_file_path(tmp_path, 0)
        assert len(read_epoch_file(path)) == epoch if path.exists() else epoch == 0  # no line before the close
        engine.spans.enter(CHECKPOINT, "ModelCheckpoint", clock())  # a callback after fitprof's hook saves
        clock.tick(save_ms)
        engine.spans.leave(clock())
        clock.tick(5)
    engine.fit_end()
    fit = engine.fit_teardown()
    records = read_epoch_file(epoch_file_path(tmp_path, 0))
    assert [r.epoch for r in records] == [0, 1, 2]
    for record, save_ms in zip(records, SAVE_MS, strict=True):
        assert record.figures[CHECKPOINT_S] == pytest.approx(save_ms / 1e3)
        assert record.figures[WALL_S] == pytest.approx((4 * 25 + save_ms + 5) / 1e3)
        assert _adds_up(record.figures)
        assert any(v.startswith("checkpointing took") for v in record.verdicts), record.verdicts
    assert at_hook == [0.0, 0.0, 0.0]  # the hook gives the parts so far
    assert fit is not None
    assert fit.checkpoint_s == pytest.approx(sum(SAVE_MS) / 1e3)
    assert fit.teardown_s == pytest.approx(0.0)
    assert fit.setup_s + fit.epochs_s + fit.teardown_s == pytest.approx(fit.wall_s)


def test_close_epoch_gives_the_final_result_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path, profile_batch=0)
    engine, clock = rig.engine, rig.clock
    engine.fit_start(log_dir=str(tmp_path))
    engine.epoch_start(0)
    engine.step_start(1)
    clock.tick(10)
    engine.step_end(1)
    held = engine.epoch_end(0)
    engine.spans.enter(CHECKPOINT, "ModelCheckpoint", clock())
    clock.tick(40)
    engine.spans.leave(clock())
    closed = engine.close_epoch()
    assert closed is held and closed.epoch[CHECKPOINT_S] == pytest.approx(0.040)
    assert engine.close_epoch() is None
    assert len(read_epoch_file(epoch_file_path(tmp_path, 0))) == 1


# ------------------------------------------------------------------------------------------------ real fits
pytest.importorskip("torch")

from keras_child import child_env, run_result  # noqa: E402


def _child(framework: str, root: Path) -> tuple[dict[str, Any], Path]:
    logdir = root / framework
    with measured(__name__):
        run, _ = run_result([str(CHILD), framework, str(logdir)], env=child_env(KERAS_BACKEND="torch"))
    assert "error" not in run, run["error"]
    return run, logdir


@pytest.fixture(scope="module")
def lightning_fit(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    pytest.importorskip("lightning")
    return _child("lightning", tmp_path_factory.mktemp("epoch_saves"))


@pytest.fixture(scope="module")
def keras_fit(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    pytest.importorskip("keras")
    return _child("keras", tmp_path_factory.mktemp("epoch_saves"))


def _check_epochs(per_epoch: list[float], run: dict[str, Any], logdir: Path, where: str) -> None:
    """Each epoch's checkpoint seconds (as ``where`` holds them) against its hook's truth, the per-epoch file the
    same, each epoch's parts adding up."""
    hooks = run["hooks"]
    assert len(per_epoch) == 3 and len(hooks) == 3
    for epoch, got in enumerate(per_epoch):
        truth, save = hooks[str(epoch)], run["saves"][str(epoch)]
        print(f"{where} epoch {epoch}: checkpoint_s {got:.3f} s, hook {truth:.3f} s, save {save:.3f} s")
        assert _near(got, truth), (epoch, got, truth)
        assert got >= save - 0.005, (epoch, got, save)  # the save itself is in its own epoch
    records = read_epoch_file(epoch_file_path(logdir, 0))
    assert [r.epoch for r in records] == [0, 1, 2]
    for record, got in zip(records, per_epoch, strict=True):
        assert record.figures[CHECKPOINT_S] == pytest.approx(got, rel=1e-5)
        assert _adds_up(record.figures), record.figures
        assert any(v.startswith("checkpointing took") for v in record.verdicts), record.verdicts


def _check_fit(run: dict[str, Any], per_epoch: list[float]) -> None:
    """The fit's checkpoint seconds are the epochs' (none left in the teardown), and its parts add up."""
    fit = run["fit"]
    assert fit["checkpoint"] == pytest.approx(sum(per_epoch), rel=1e-4)  # no save is left in the teardown
    assert fit["setup"] + fit["epochs"] + fit["teardown"] == pytest.approx(fit["wall"], rel=1e-6)


def _fit_near_the_saves(run: dict[str, Any]) -> None:
    """The issue's bar: the fit's checkpoint seconds within 15% of the timed saves. The checkpoint callback's own
    work around its save (Lightning's ``ModelCheckpoint``: the file names, the top-k bookkeeping) is checkpoint time
    too, and grows with the machine's load: measured 3% over the saves at load 6, 15% at load 8."""
    fit = run["fit"]
    saves = sum(run["saves"].values())
    print(f"fit: checkpoint {fit['checkpoint']:.3f} s, timed saves {saves:.3f} s, teardown {fit['teardown']:.3f} s")
    assert abs(fit["checkpoint"] - saves) <= 0.15 * saves, (fit["checkpoint"], saves)


def _csv_rows(logdir: Path) -> list[dict[str, str]]:
    with open(logdir / "csv" / "version_0" / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_lightning_each_epoch_holds_its_own_save(lightning_fit: tuple[dict[str, Any], Path]) -> None:
    """Lightning moves ``ModelCheckpoint`` after fitprof: its save is still in its epoch, in the loggers' row at the
    epoch's step (the CSV file and TensorBoard), and the per-epoch file."""
    run, logdir = lightning_fit
    rows = _csv_rows(logdir)
    parts = [r for r in rows if r.get(CHECKPOINT_S)]
    steps = {r["epoch"]: r["step"] for r in rows if r.get(metrics.EPOCH_STEPS_TIMED.key)}  # the epoch's own row
    assert [r["epoch"] for r in parts] == ["0", "1", "2"]
    assert all(r["step"] == steps[r["epoch"]] for r in parts)  # the same step as the epoch's other figures
    per_epoch = [float(r[CHECKPOINT_S]) for r in parts]
    _check_epochs(per_epoch, run, logdir, "lightning")
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(logdir / "tb" / "version_0"))
    acc.Reload()
    tb = [e.value for e in acc.Scalars(CHECKPOINT_S)]
    assert tb == pytest.approx(per_epoch, rel=1e-5)
    _check_fit(run, per_epoch)
    # The monitors' view (trainer.callback_metrics) after the fit: the close wrote the last epoch's final parts
    # there too, its save included (at fitprof's hook they were the parts so far, before the save ran).
    final = run["callback_metrics"]
    assert set(final) >= {m.key for m in metrics.EPOCH_PARTS_METRICS}
    assert final[CHECKPOINT_S] == pytest.approx(per_epoch[-1], rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["lightning", "keras"])
@tolerates_load
def test_saves_over_the_fit_within_15_percent(framework: str, request: pytest.FixtureRequest) -> None:
    run, _ = request.getfixturevalue(f"{framework}_fit")
    _fit_near_the_saves(run)


@pytest.mark.slow
def test_keras_each_epoch_holds_its_own_save(keras_fit: tuple[dict[str, Any], Path]) -> None:
    """A ``ModelCheckpoint`` and another callback listed after fitprof: their time is in their epoch, in ``History``
    (the close comes before it records the logs), the event file and the per-epoch file."""
    run, logdir = keras_fit
    history = run["history"]
    per_epoch = history[CHECKPOINT_S]
    _check_epochs(per_epoch, run, logdir, "keras")
    for epoch, got in enumerate(history[metrics.EPOCH_CALLBACKS_S.key]):  # the other callback's sleep
        assert _near(got, run["other"][str(epoch)]), (epoch, got, run["other"])
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    events = [float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(CHECKPOINT_S)]
    assert events == pytest.approx(per_epoch, rel=1e-5)
    _check_fit(run, per_epoch)

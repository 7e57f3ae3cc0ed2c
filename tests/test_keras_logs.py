"""Keras: fitprof's figures follow Keras's conventions, read back from History, a CSVLogger file, stdout and the
event file."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")
pytest.importorskip("tensorflow")
pd = pytest.importorskip("pandas")

from expected_keys import EPOCH_KEYS, TRIGGER_KEYS, WINDOW_KEYS  # noqa: E402
from fitprof import metrics  # noqa: E402
from fitprof.keras import FitProfiler  # noqa: E402
from fitprof.metrics import top_op_key  # noqa: E402

pytestmark = [
    pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="needs KERAS_BACKEND=tensorflow"),
    pytest.mark.slow,  # each test trains (a tiny model, but a real fit)
]

TOP_K = 3  # the expected keys hold top_op_1_ms ... top_op_3_ms


def _fit(logdir: Path, *, validation: bool, fit_verbose: int = 0, **kwargs: Any) -> tuple[Any, FitProfiler, Path]:
    """A tiny model, 20 steps an epoch, epochs 1-3 (``initial_epoch=1``), FitProfiler then CSVLogger."""
    import numpy as np

    logdir.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(320, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    fp = FitProfiler(log_dir=logdir, profile_batch=(3, 5), every_n_epochs=2, top_k=TOP_K, **kwargs)
    csv_path = logdir / "log.csv"
    history = model.fit(
        x,
        y,
        batch_size=16,
        initial_epoch=1,
        epochs=4,
        verbose=fit_verbose,
        validation_data=(x[:64], y[:64]) if validation else None,
        callbacks=[fp, keras.callbacks.CSVLogger(str(csv_path))],
    )
    return history, fp, csv_path


def _csv(path: Path) -> tuple[list[str], dict[int, dict[str, str]]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        rows = {int(r["epoch"]): r for r in reader}
        return list(reader.fieldnames or []), rows


@pytest.fixture(scope="module")
def no_validation(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, FitProfiler, Path]:
    return _fit(tmp_path_factory.mktemp("keras_logs"), validation=False)


def test_history_has_every_key_every_epoch_nan_where_not_profiled(no_validation: tuple[Any, Any, Path]) -> None:
    history, fp, _ = no_validation
    assert sorted(fp.reports) == [2]  # every_n_epochs=2 from initial_epoch=1: epochs 1, 2, 3 ran, 2 profiled
    assert history.epoch == [1, 2, 3]
    assert sorted(history.history) == sorted(["loss", *WINDOW_KEYS, *EPOCH_KEYS, *TRIGGER_KEYS])
    # one value per epoch under every key (a DataFrame would silently spread a one-entry list over every epoch)
    assert {k: len(v) for k, v in history.history.items()} == {k: 3 for k in history.history}
    frame = pd.DataFrame(history.history, index=history.epoch)
    keys = WINDOW_KEYS
    assert not [c for c in frame.columns if c.startswith("fitprof/top_ops/")]  # names go to TensorBoard only
    report = fp.reports[2]
    assert frame.loc[2, "fitprof/step_time_ms"] == pytest.approx(report.step_time_ms, rel=1e-6)
    assert frame.loc[2, "fitprof/input_percent"] == pytest.approx(report.input_percent, rel=1e-6, abs=1e-9)
    assert frame.loc[2, "fitprof/steps_analyzed"] == 3
    for i, op in enumerate(report.top_ops, start=1):
        assert frame.loc[2, f"fitprof/top_op_{i}_ms"] == pytest.approx(op.self_ms_per_step, rel=1e-6)
    for epoch in (1, 3):
        assert all(math.isnan(frame.loc[epoch, k]) for k in keys), epoch
    # The memory probe's window keys come every epoch too, NaN where no window closed.
    memory = [m.key for m in metrics.MEMORY_METRICS]
    assert all(math.isnan(frame.loc[epoch, k]) for epoch in (1, 3) for k in memory)
    assert frame.loc[2, metrics.MEMORY_PEAK_MB.key] > 0


def test_csvlogger_keeps_every_fitprof_column_and_no_val_fitprof(no_validation: tuple[Any, Any, Path]) -> None:
    _, fp, csv_path = no_validation
    columns, rows = _csv(csv_path)
    assert columns == ["epoch", *sorted(["loss", "val_loss", *WINDOW_KEYS, *EPOCH_KEYS, *TRIGGER_KEYS])]
    assert not [c for c in columns if c.startswith("val_fitprof/")], columns
    assert "val_loss" in columns  # CSVLogger's own rule for Keras's keys is kept
    assert float(rows[2]["fitprof/step_time_ms"]) == pytest.approx(fp.reports[2].step_time_ms, rel=1e-6)
    assert float(rows[2]["fitprof/top_op_1_ms"]) == pytest.approx(fp.reports[2].top_ops[0].self_ms_per_step, rel=1e-6)
    assert rows[1]["fitprof/step_time_ms"] == rows[3]["fitprof/step_time_ms"] == "nan"


def test_with_validation_no_val_fitprof_anywhere(tmp_path: Path) -> None:
    history, fp, csv_path = _fit(tmp_path, validation=True)
    assert "val_loss" in history.history
    assert not [k for k in history.history if k.startswith("val_fitprof")]
    columns, rows = _csv(csv_path)
    assert not [c for c in columns if c.startswith("val_fitprof")]
    assert float(rows[2]["fitprof/step_time_ms"]) == pytest.approx(fp.reports[2].step_time_ms, rel=1e-6)


def test_event_file_has_operators_by_rank_and_by_name(no_validation: tuple[Any, Any, Path]) -> None:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    _, fp, csv_path = no_validation
    acc = event_accumulator.EventAccumulator(str(csv_path.parent), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = set(acc.Tags()["tensors"])
    top = fp.reports[2].top_ops[0]
    for tag in ("fitprof/top_op_1_ms", top_op_key(top.name)):
        events = acc.Tensors(tag)
        assert [e.step for e in events] == [2], tag
        assert float(tensor_util.make_ndarray(events[0].tensor_proto)) == pytest.approx(top.self_ms_per_step, rel=1e-6)
    assert "fitprof/step_time_ms" in tags
    texts = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("fitprof/summary")]
    assert f"| 1 | {top.name} |" in texts[0]  # the summary names what fitprof/top_op_1_ms is


def test_one_line_summary_follows_fit_verbose_and_can_be_turned_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def summary_lines() -> list[str]:
        return [line for line in capsys.readouterr().out.splitlines() if line.startswith("fitprof epoch")]

    capsys.readouterr()
    _, fp, _ = _fit(tmp_path / "loud", validation=False, fit_verbose=2)
    report = fp.reports[2]
    head = (
        f"fitprof epoch 2: {report.step_time_ms:.2f} ms/step, "
        f"input {report.input_percent:.1f}% of the window's steps, HtoD {report.htod_percent:.1f}%, "
        f"top op {report.top_ops[0].name} {report.top_ops[0].self_ms_per_step:.2f} ms -> {report.verdict}"
    )
    (line,) = summary_lines()
    # the window-vs-epoch note follows when the window's figures are off the epoch's always-on ones, then the place
    # of the profile
    assert line.startswith(head) and "; profile in " in line
    note = line[len(head) : line.index("; profile in ")]
    assert note == "" or note.startswith("; the window is not representative of its epoch (")
    assert Path(line.split("; profile in ")[1]).is_dir()
    _, fp, _ = _fit(tmp_path / "off", validation=False, fit_verbose=2, verbose=False)
    assert sorted(fp.reports) == [2] and summary_lines() == []
    _, fp, _ = _fit(tmp_path / "fit_quiet", validation=False, fit_verbose=0)
    assert sorted(fp.reports) == [2] and summary_lines() == []


def test_torch_options_are_refused_unless_bool() -> None:
    with pytest.raises(TypeError, match="record_shapes must be True or False; got 1"):
        FitProfiler(record_shapes=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="verbose must be True or False"):
        FitProfiler(verbose="yes")  # type: ignore[arg-type]


def test_the_progress_bar_shows_a_handful_of_keys_and_history_has_them_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fitprof.keras._logs import PROGBAR_KEYS

    capsys.readouterr()
    history, fp, csv_path = _fit(tmp_path, validation=False, fit_verbose=2, verbose=False)
    bar_lines = [line for line in capsys.readouterr().out.splitlines() if " - loss: " in line]
    assert len(bar_lines) == 3, bar_lines  # epochs 1-3, one line each (verbose=2)
    for line in bar_lines:
        shown = {part.split(":")[0].strip() for part in line.split(" - ") if part.strip().startswith("fitprof/")}
        assert shown <= set(PROGBAR_KEYS), line
        assert "nan" not in line, line
    profiled = bar_lines[1]  # epoch 2 (every_n_epochs=2 from initial_epoch=1)
    assert "fitprof/step_time_ms: " in profiled and "fitprof/input_percent: " in profiled, profiled
    assert set(WINDOW_KEYS) | set(EPOCH_KEYS) <= set(history.history)  # every figure still in History
    header, _ = _csv(csv_path)
    assert set(WINDOW_KEYS) <= set(header)  # and in the CSV
    assert fp.reports[2].steps_analyzed == 3

"""The per-epoch file and the per-epoch table of ``fitprof report``: parts written by a probe on a fake clock,
read back through the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitprof import metrics
from fitprof.cli import main
from fitprof.fit.epoch_parts import CHECKPOINT, EpochParts
from fitprof.report_files import append_epoch_record, epoch_file_path, find_epoch_files, read_epoch_file

MS = 1_000_000


def _write_fit(run: Path, epochs: int, *, rank: int = 0, save_ms: float = 400.0) -> list[EpochParts]:
    t = [10**12]
    probe = EpochParts("lightning", clock=lambda: t[0], rusage=lambda: (0.0, 0), schedstat=lambda: 0, cores=2)
    probe.fit_start()
    for epoch in range(epochs):
        probe.epoch_start(epoch)
        for n in range(1, 11):
            probe.step_start(n)
            t[0] += 60 * MS
            probe.step_end(n)
        probe.enter(CHECKPOINT, "ModelCheckpoint")
        t[0] += int(save_ms * MS)
        probe.leave()
        probe.epoch_end(epoch)
        append_epoch_record(
            run, epoch=epoch, rank=rank, framework="lightning", figures=probe.epoch_figures(), verdicts=probe.verdicts()
        )
    return [probe]


def test_report_prints_the_epoch_table_and_verdicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run_a"
    _write_fit(run, 2)
    assert find_epoch_files(tmp_path) == [epoch_file_path(run, 0)]
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("Epochs: where the wall time went")
    header = lines[1].split()
    row = dict(zip(header[: len(lines[3].split())], lines[3].split(), strict=False))
    assert row["run"] == "run_a" and row["epoch"] == "0"
    assert row["wall"] == "1.00"  # 10 steps of 60 ms and a 400 ms save
    assert "checkpointing took 40% of epoch 0 (0.40 s of 1.00 s): save less often" in out
    assert "AsyncCheckpointIO" in out


def test_report_json_and_csv_carry_the_epoch_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_fit(tmp_path / "r", 1)
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    (row,) = rows
    assert row["record"] == "epoch" and row["wall_s"] == pytest.approx(1.0)
    assert row["checkpoint_s"] == pytest.approx(0.4) and row["train_steps_s"] == pytest.approx(0.6)
    assert row["input_s"] is None  # no fetch measured: NaN written as null
    assert row["verdicts"][0].startswith("checkpointing took 40%")
    assert main(["report", str(tmp_path), "--format", "csv"]) == 0
    csv = capsys.readouterr().out.splitlines()
    head = csv[0].split(",")
    assert "checkpoint_s" in head and "own_threads_cpu_percent" in head and "epoch_verdicts" in head
    assert csv[1].split(",")[head.index("checkpoint_s")] == "0.4"


def test_a_second_fit_is_numbered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "r"
    _write_fit(run, 2)
    _write_fit(run, 1, save_ms=10)
    records = read_epoch_file(epoch_file_path(run))
    assert [(r.fit, r.epoch) for r in records] == [(1, 0), (1, 1), (2, 0)]
    assert records[2].figures[metrics.EPOCH_CHECKPOINT_S.key] == pytest.approx(0.010)
    assert records[2].verdicts == []
    assert main(["report", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:3] == ["run", "fit", "epoch"]


def test_a_damaged_epoch_file_is_named_and_the_rest_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_fit(tmp_path / "good", 1)
    bad = epoch_file_path(tmp_path / "bad", 3)
    bad.parent.mkdir(parents=True)
    bad.write_text('{"epoch": 0, "rank": 3, "figures": {"fitprof/epoch/wall_s": "x"}}\n', encoding="utf-8")
    assert main(["report", str(tmp_path)]) == 0  # skipped with a warning: the good files are reported
    captured = capsys.readouterr()
    said = f"{bad}, line 1: not a fitprof epoch record ('fitprof/epoch/wall_s' is 'x', not a number) (skipped)"
    assert f"fitprof: warning: {said}" in captured.err
    assert "good" in captured.out
    assert main(["report", str(tmp_path), "--strict"]) == 2


def test_no_fitprof_file_at_all_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "epochs.rank<r>.jsonl" in capsys.readouterr().err

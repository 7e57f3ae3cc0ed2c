"""Per-epoch files a writer left torn (killed mid-line, or a full disk): every whole line is read back, the torn
part is left out with one warning, and the writer never leaves a torn line of its own."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from fitprof.cli import main
from fitprof.report_files import append_epoch_record, epoch_file_path, read_epoch_file

FIGURES = {"fitprof/epoch/wall_s": 1.5, "fitprof/epoch/train_steps_s": 1.0}


def _append(run: Path, epoch: int) -> Path:
    return append_epoch_record(run, epoch=epoch, rank=0, framework="lightning", figures=FIGURES, verdicts=["v"])


def _torn_run(tmp_path: Path, whole: int = 2) -> Path:
    """A run whose per-epoch file holds ``whole`` whole lines, then the first half of the next one."""
    run = tmp_path / "run"
    for epoch in range(whole):
        path = _append(run, epoch)
    line = path.read_bytes().splitlines(keepends=True)[-1]
    with open(path, "ab") as fh:
        fh.write(line[: len(line) // 2])
    return run


def test_a_torn_last_line_keeps_every_whole_line_and_warns_once(tmp_path: Path) -> None:
    run = _torn_run(tmp_path)
    notes: list[str] = []
    records = read_epoch_file(epoch_file_path(run), warn=notes.append)
    assert [(r.epoch, r.fit) for r in records] == [(0, 1), (1, 1)]
    assert records[1].figures["fitprof/epoch/wall_s"] == 1.5
    assert len(notes) == 1 and "its last line (line 3" in notes[0] and "cut while it was written" in notes[0]
    with pytest.warns(UserWarning, match="cut while it was written"):  # no ``warn``: Python's warnings
        assert len(read_epoch_file(epoch_file_path(run))) == 2


def test_report_reads_the_whole_lines_of_a_torn_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _torn_run(tmp_path)
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert [(r["record"], r["epoch"]) for r in json.loads(out)] == [("epoch", 0), ("epoch", 1)]
    warned = err.splitlines()
    assert len(warned) == 1 and warned[0].startswith("fitprof: warning: ") and str(epoch_file_path(run)) in warned[0]


def test_a_line_appended_after_a_torn_one_starts_a_line_of_its_own(tmp_path: Path) -> None:
    run = _torn_run(tmp_path)
    _append(run, 2)  # the next fit's first epoch, after a killed one
    notes: list[str] = []
    records = read_epoch_file(epoch_file_path(run), warn=notes.append)
    assert [r.epoch for r in records] == [0, 1, 2]
    assert len(notes) == 1 and "1 line(s) are not whole fitprof epoch records" in notes[0]


def test_a_file_of_nothing_but_other_text_is_still_refused(tmp_path: Path) -> None:
    path = epoch_file_path(tmp_path / "run")
    path.parent.mkdir(parents=True)
    path.write_text("hello\nworld\n")
    with pytest.raises(ValueError, match=r"line 1: not a fitprof epoch record \(not valid JSON"):
        read_epoch_file(path, warn=pytest.fail)


def test_report_on_an_empty_epoch_file_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = epoch_file_path(tmp_path / "run")
    path.parent.mkdir(parents=True)
    path.touch()
    assert main(["report", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"fitprof: error: {tmp_path}: nothing readable: 1 per-epoch file(s) found")


class _DiskFull:
    """``os.write`` that writes ``room`` bytes in all, then fails with ENOSPC (a disk that fills mid-line)."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.real = os.write

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = self.real(fd, bytes(data[: self.room]))
        self.room -= n
        return n


def test_a_line_the_disk_cannot_hold_is_cut_back_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    path = _append(run, 0)
    before = path.read_bytes()
    monkeypatch.setattr(os, "write", _DiskFull(100))
    with pytest.raises(OSError, match="No space left"):
        _append(run, 1)
    assert path.read_bytes() == before  # not the first 100 bytes of the line
    monkeypatch.undo()
    _append(run, 1)  # the disk has room again
    assert [r.epoch for r in read_epoch_file(path, warn=pytest.fail)] == [0, 1]


def test_a_file_the_disk_cannot_hold_a_line_of_is_not_left_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "write", _DiskFull(0))
    with pytest.raises(OSError, match="No space left"):
        _append(tmp_path / "run", 0)
    assert not epoch_file_path(tmp_path / "run").exists()

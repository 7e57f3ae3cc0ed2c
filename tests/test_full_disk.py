"""A full log disk under a PyTorch window: torch's C++ trace writer logs "Failed to write to log file!", raises
nothing and leaves the trace cut under ``<name>.tmp``. The window must still be analysed (from a temporary copy),
say once what was lost, and leave no file behind, open or not.

The writer's failure is planted deterministically (an ``export_chrome_trace`` that leaves what torch 2.13 leaves on
a full disk); the real thing runs on a 4 MB tmpfs where this machine lets a test mount one (root), and skips with
its reason elsewhere.
"""

from __future__ import annotations

import csv
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from fitprof._warn import WarnOnce  # noqa: E402
from fitprof.cli import main  # noqa: E402
from fitprof.profilers.torch import TorchProfiler, _check_written  # noqa: E402
from fitprof.traces import read_trace  # noqa: E402
from fitprof.traces._limits import wait_written  # noqa: E402
from small_disk import nearly_full_disk, open_below  # noqa: E402
from warned import fitprof_messages  # noqa: E402

_REAL_EXPORT = torch.profiler.profile.export_chrome_trace


def _full_disk_export(self: Any, path: str, use_python_export: bool = False) -> None:
    """torch 2.13's C++ writer on a full disk: part of the trace under ``<path>.tmp``, ``path`` untouched, nothing
    raised; its Python writer, asked for, writes as usual (the disk of the temporary copy has room)."""
    if use_python_export:
        _REAL_EXPORT(self, path, use_python_export=True)
        return
    with open(path + ".tmp", "w") as fh:
        fh.write('{\n"schemaVersion": 1,\n"traceEvents": [\n{"ph": "X", "na')


def _window(log_dir: Path, profiler: TorchProfiler) -> Path | None:
    assert profiler.start(log_dir, "s", rank=0)
    x = torch.randn(32, 32)
    for step in range(1, 4):
        profiler.begin_step(step)
        x = (x @ x).tanh()
    return profiler.stop()


def _left_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file())


def test_a_trace_the_cxx_writer_cut_is_analysed_from_a_temporary_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", _full_disk_export)
    msgs: list[str] = []
    profiler = TorchProfiler(warn=WarnOnce(msgs.append))
    path = _window(tmp_path, profiler)
    assert path is not None and profiler.temporary and path.parent != tmp_path
    try:
        table = read_trace(path)
        assert sorted(set(table.loc[table["name"].str.startswith("ProfilerStep#"), "name"])) == [
            f"ProfilerStep#{n}" for n in (1, 2, 3)
        ]
    finally:
        wait_written(path)
        shutil.rmtree(path.parent)
    assert len(msgs) == 1 and "could not write the trace" in msgs[0] and "cut" in msgs[0], msgs
    assert _left_in(tmp_path) == []  # neither torch's cut part nor fitprof's plain file


def test_the_check_reads_the_size_and_the_last_byte(tmp_path: Path) -> None:
    whole = tmp_path / "whole.json"
    whole.write_text('{"traceEvents": []}\n')
    _check_written(whole)
    for text, said in (("", "an empty file"), ('{"traceEvents": [{"ph": "X"', "a file cut at 27 bytes")):
        whole.write_text(text)
        with pytest.raises(OSError, match=said):
            _check_written(whole)
    whole.write_text('{"traceEvents": []}')
    (tmp_path / "whole.json.tmp").write_text("{")
    with pytest.raises(OSError, match=r"left whole\.json\.tmp cut"):
        _check_written(whole)


# ------------------------------------------------------------------------------------------- a real full disk
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with nearly_full_disk(tmp_path / "disk") as disk:
        yield disk


@pytest.mark.slow
def test_lightning_on_a_full_disk_logs_every_window(small_disk: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.loggers import CSVLogger

    from fitprof.lightning import FitProfiler
    from test_lightning import _fit

    log_dir = small_disk / "logs"
    cb = FitProfiler(log_dir=log_dir, profile_batch=(2, 3))
    logger = CSVLogger(tempfile.gettempdir(), name=f"fitprof-full-disk-{uuid.uuid4().hex}", version=0)
    try:
        msgs = fitprof_messages(
            lambda: _fit(small_disk / "root", cb, max_epochs=4, limit_train_batches=5, logger=logger)
        )
        with open(Path(logger.log_dir) / "metrics.csv") as fh:
            rows = list(csv.DictReader(fh))
    finally:
        shutil.rmtree(Path(logger.log_dir).parent, ignore_errors=True)
    assert sorted(cb.reports) == [0, 1, 2, 3]
    assert [float(r["fitprof/steps_analyzed"]) for r in rows if r.get("fitprof/steps_analyzed")] == [2.0] * 4
    assert sum("could not write the trace" in m for m in msgs) == 1, msgs
    left = [n for n in _left_in(log_dir) if n.startswith("fitprof-") or n.endswith(".tmp")]
    assert left == []  # no trace part torch or fitprof began
    assert open_below(small_disk) == []
    capsys.readouterr()
    status = main(["report", str(log_dir)])
    out, err = capsys.readouterr()
    if status == 2:  # no line fitted on the disk: one line says so
        assert out == "" and len(err.splitlines()) == 1 and "nothing readable" in err
    else:
        assert status == 0 and "Epochs" in out

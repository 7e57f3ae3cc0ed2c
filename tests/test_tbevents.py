"""fitprof's own TensorBoard event file (:mod:`fitprof.keras._tbevents`): read back through tensorboard's reader,
which checks every record's CRC; written without importing TensorFlow, installed or not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("keras")  # the module lives in fitprof.keras, whose import needs keras

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from fitprof.keras import _tbevents


def _read(run: Path) -> EventAccumulator:
    (path,) = run.glob("events.out.tfevents.*.fitprof")
    acc = EventAccumulator(str(path), size_guidance={"tensors": 0})
    acc.Reload()
    return acc


def test_scalars_and_text_read_back(tmp_path: Path) -> None:
    events = _tbevents.TBEventFile(tmp_path / "run")
    events.warm_up()
    assert not (tmp_path / "run").exists()  # nothing written yet: no empty event file
    for epoch in (0, 2):
        events.scalars({"fitprof/step_time_ms": 12.5 + epoch, "fitprof/top_ops/aten::mm": 0.25}, step=epoch)
        events.text("fitprof/summary", f"**epoch {epoch}** données", step=epoch)
        events.flush()
    events.close()
    acc = _read(tmp_path / "run")
    steps = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors("fitprof/step_time_ms")]
    assert steps == [(0, 12.5), (2, 14.5)]
    assert [float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors("fitprof/top_ops/aten::mm")] == [
        0.25,
        0.25,
    ]
    texts = [tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in acc.Tensors("fitprof/summary")]
    assert texts == ["**epoch 0** données", "**epoch 2** données"]


def test_no_file_is_held_open_between_flushes(tmp_path: Path) -> None:
    """A fit that an exception ends where no hook of fitprof's runs again (another callback raising at an epoch's
    start) never reaches ``close``: each epoch end's write closes the file, the next appends to it, and a new fit's
    first write after ``close`` starts a new file."""
    run = tmp_path / "run"
    events = _tbevents.TBEventFile(run)
    fds = "/proc/self/fd"
    if not os.path.isdir(fds):
        pytest.skip("needs /proc/self/fd to see the process's open files")

    def open_here() -> list[str]:
        targets = []
        for fd in os.listdir(fds):
            try:
                targets.append(os.readlink(f"{fds}/{fd}"))
            except OSError:  # the listing's own descriptor, closed by now
                pass
        return [t for t in targets if t.startswith(str(run))]

    for epoch in (0, 1):
        events.scalars({"fitprof/step_time_ms": float(epoch)}, step=epoch)
        assert len(open_here()) == 1
        events.flush()
        assert open_here() == []
    acc = _read(run)  # one file holding both epochs
    assert [e.step for e in acc.Tensors("fitprof/step_time_ms")] == [0, 1]
    events.close()
    events.scalars({"fitprof/step_time_ms": 5.0}, step=0)
    events.close()
    assert len(list(run.glob("events.out.tfevents.*.fitprof"))) == 2


@pytest.mark.slow
def test_writing_imports_no_tensorflow(tmp_path: Path) -> None:
    """Keras on torch with TensorFlow installed: writing the figures never loads TensorFlow (seconds of the
    training thread at the first profiled epoch's end)."""
    pytest.importorskip("tensorflow")
    # The module is loaded from its file, without the fitprof.keras package (which imports Keras and its backend,
    # seconds of the test for nothing it checks): what is checked is what the module and tensorboard import.
    code = (
        "import sys, importlib.util as u; s = u.spec_from_file_location('tbevents', sys.argv[2]); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); e = m.TBEventFile(sys.argv[1]); "
        "e.scalars({'fitprof/a': 1.0}, step=0); e.text('fitprof/summary', 'x', step=0); e.close(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow')[:3])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), _tbevents.__file__], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
    assert list(tmp_path.glob("events.out.tfevents.*.fitprof"))

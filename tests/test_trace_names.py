"""A window is never lost because of a name: ``record_function`` names holding quotes, backslashes, tabs,
newlines, control and non-ASCII characters survive fitprof's own export (Lightning and the torch window), and
traces that torch's writers made invalid JSON with such a name are still read (``fitprof analyze``).

torch 2.13's C++ Chrome-trace writer leaves ``"`` unescaped, writes ``\\`` as ``/``, drops newlines and writes
``unknown`` for tabs, control and non-ASCII characters (pytorch/pytorch#146900); every test below reads the
file back through json and the core.
"""

from __future__ import annotations

import gzip
import json
import mmap
import os
import warnings
from pathlib import Path

import pytest

import fitprof
from fitprof.traces import _limits, read_trace

torch = pytest.importorskip("torch")

from torch.autograd.profiler import record_function  # noqa: E402

from fitprof._warn import WarnOnce  # noqa: E402
from fitprof.profilers import torch as _torch  # noqa: E402
from fitprof.profilers.torch import TorchProfiler as TorchProfileWindow  # noqa: E402

ODD_NAMES = (
    'load "train"',
    "C:\\data\\shard",
    "tab\there",
    "two\nlines",
    "bell\x07",
    "données 数据",
    "end\\",
    'a", "pid": 3, "x": "',
)
"""Names torch's C++ writer cannot write as they are (the last one mimics the next JSON fields)."""
STEPS = 3


def _profile_window(directory: Path, names: tuple[str, ...] = ODD_NAMES) -> tuple[Path | None, list[str]]:
    """A real torch window of ``STEPS`` steps, each running every name as a ``record_function`` around a matmul;
    returns the exported trace and the warnings the window gave."""
    messages: list[str] = []
    window = TorchProfileWindow(warn=WarnOnce(messages.append))
    assert window.start(directory, "s", rank=0)
    x = torch.randn(32, 32)
    for step in range(1, STEPS + 1):
        window.begin_step(step)
        for name in names:
            with record_function(name):
                (x @ x).relu_()
    path = window.stop()
    if path is not None:  # compressed in the background: the file appears once it is whole
        assert _limits.wait_written(path) is None
    return path, messages


def _handed_text(path: Path) -> _limits.Text | None:
    """The text handed over for ``path``: its background write's while it runs, else a written file's."""
    job = _limits._writing.get(os.path.abspath(path))
    if job is not None and job.text is not None:
        return job.text
    handed = _limits._handed
    return handed[2] if handed is not None and handed[0] == os.path.abspath(path) else None


def test_a_trace_is_compressed_on_the_training_thread_when_no_thread_can_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process at its thread limit (``RLIMIT_NPROC``, a container's pids limit) still gets its window: the
    trace is compressed on the calling thread, whole when ``stop`` returns, with no warning."""
    import threading

    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name == "fitprof-trace-write":
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    path, messages = _profile_window(tmp_path, ("step work",))
    assert path is not None and messages == []
    assert os.path.abspath(path) not in _limits._writing and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    assert _annotation_names(path).count("step work") == STEPS
    assert fitprof.analyze(path).steps_analyzed == STEPS


def _annotation_names(path: Path) -> list[str]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return [e["name"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation"]


def test_every_name_is_exported_exactly(tmp_path: Path) -> None:
    path, messages = _profile_window(tmp_path)
    assert path is not None and path.is_file()
    names = _annotation_names(path)  # json.loads: the file is valid JSON
    for name in ODD_NAMES:
        assert names.count(name) == STEPS, name
    assert messages == []  # nothing had to be repaired
    report = fitprof.analyze(path)
    assert report.steps_analyzed == STEPS
    table = read_trace(path)
    assert set(ODD_NAMES) <= set(table.loc[table["kind"] == "annotation", "name"])


def test_plain_names_keep_the_fast_writer(tmp_path: Path) -> None:
    """Without an odd name, the trace comes from torch's C++ writer (its multi-line layout), as before."""
    path, messages = _profile_window(tmp_path, names=("load train", "model/forward"))
    assert path is not None and messages == []
    text = gzip.decompress(path.read_bytes()).decode()
    assert '\n    "name": "load train",\n' in text
    assert fitprof.analyze(path).steps_analyzed == STEPS


def test_without_the_python_writer_the_quote_is_repaired_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torch without ``use_python_export``: its C++ writer's file is repaired, the window kept, one warning
    names the names it could not write."""
    monkeypatch.setattr(_torch, "_python_export_available", lambda prof: False)
    path, messages = _profile_window(tmp_path)
    assert path is not None
    names = _annotation_names(path)
    assert names.count('load "train"') == STEPS and names.count('a", "pid": 3, "x": "') == STEPS
    assert names.count("C:/data/shard") == STEPS  # what torch's C++ writer made of the backslashes
    assert len(messages) == 1
    assert repr('load "train"') in messages[0] and repr("données 数据") in messages[0]
    assert str(len(ODD_NAMES)) in messages[0]
    assert fitprof.analyze(path).steps_analyzed == STEPS


def test_analyze_reads_a_trace_torch_wrote_invalid(tmp_path: Path) -> None:
    """``fitprof analyze`` on a trace torch's own C++ writer exported (e.g. Lightning's PyTorchProfiler)."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(STEPS):
            with record_function(f"ProfilerStep#{step}"), record_function('load "train"'):
                (x @ x).relu_()
    path = tmp_path / "torch.pt.trace.json"
    prof.export_chrome_trace(str(path))
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    report = fitprof.analyze(path)
    assert report.steps_analyzed == STEPS
    assert any(repr('load "train"') in w and "repaired" in w for w in report.warnings)
    table = read_trace(path)
    assert (table["name"] == 'load "train"').sum() == STEPS


def test_legacy_writer_with_a_quote_is_read(tmp_path: Path) -> None:
    """The legacy autograd-profiler writer (``EventList.export_chrome_trace``) escapes no name either."""
    x = torch.randn(32, 32)
    with torch.autograd.profiler.profile() as prof:
        for step in range(STEPS):
            with record_function(f"ProfilerStep#{step}"), record_function('load "x"'):
                (x @ x).relu_()
    path = tmp_path / "legacy.json"
    prof.function_events.export_chrome_trace(str(path))
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    report = fitprof.analyze(path)
    assert report.steps_analyzed == STEPS
    assert any(repr('load "x"') in w for w in report.warnings)
    assert "aten::matmul" in {o.name for o in fitprof.analyze(path, top_k=50).top_ops}


@pytest.mark.slow
def test_lightning_window_with_a_quoted_record_function(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import lightning_tiny
    from fitprof.lightning import FitProfiler

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
            with record_function('load "train"\t\\ étape'):
                return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    profiler = FitProfiler(log_dir=tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lightning_tiny.trainer(tmp_path, [profiler]).fit(
            Model(), DataLoader(TensorDataset(torch.randn(160, 4)), batch_size=8)
        )
    assert profiler.reports[0].steps_analyzed == 5
    # the 5 analysed steps and the warm-up step before them: the profiler records that step too
    assert _annotation_names(profiler.trace_paths[0]).count('load "train"\t\\ étape') == 5 + 1
    assert profiler.xplane_paths[0].is_file()
    assert not [w for w in caught if "fitprof" in str(w.message)], [str(w.message) for w in caught]


def test_odd_operator_names_keep_every_output_on_its_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """In the legacy layout ``record_function`` spans are operators: names with a tab, a newline, a ``|`` and a
    backslash reach the top operators exactly (json) and one escaped line per row (table, Markdown)."""
    from fitprof.cli import main

    names = ("tab\tname", "two\nlines", "pipe|name", "C:\\data")
    x = torch.randn(64, 64)
    with torch.autograd.profiler.profile() as prof:
        for step in range(STEPS):
            with record_function(f"ProfilerStep#{step}"):
                for name in names:
                    with record_function(name):
                        for _ in range(20):
                            (x @ x).relu_()
    path = tmp_path / "legacy.json"
    prof.function_events.export_chrome_trace(str(path))
    report = fitprof.analyze(path, top_k=200)
    assert set(names) <= {o.name for o in report.top_ops}
    repaired = [n for n in names if n != "pipe|name"]  # a "|" is valid JSON: nothing to repair
    assert report.warnings and all(repr(n) in report.warnings[0] for n in repaired)

    assert main(["analyze", str(path), "--format", "json"]) == 0
    rec = json.loads(capsys.readouterr().out)[0]
    assert rec["steps_analyzed"] == STEPS
    assert main(["analyze", str(path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) > 2 and table[2].split()[-1] == rec["verdict"]  # the row is one line
    markdown = fitprof.analyze(path, top_k=200).summary_markdown().splitlines()
    rows = [line for line in markdown if line.startswith("| ") and "ms/step" not in line]
    assert len(rows) == len(report.top_ops)
    assert "| pipe\\|name |" in "\n".join(rows) and "| two\\nlines |" in "\n".join(rows)
    assert "| tab\\tname |" in "\n".join(rows)


def test_the_name_check_asks_torch_for_every_event_only_with_stacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``with_stack`` only ``record_function`` names can be odd: the export checks the names entered while
    the window ran and never builds torch's activity list; torch's own ``record_function`` is as it was after the
    window. With ``with_stack`` every recorded name is checked."""
    original = record_function.__enter__
    calls: list[bool] = []
    real = _torch._odd_names

    def spy(prof: object, names: object = None) -> list[str]:
        calls.append(names is None)
        return real(prof, names)

    monkeypatch.setattr(_torch, "_odd_names", spy)
    window = TorchProfileWindow(warn=WarnOnce(print))
    assert window.start(tmp_path, "s", rank=0)
    x = torch.randn(32, 32)
    for step in range(1, STEPS + 1):
        window.begin_step(step)
        with record_function('load "train"'):
            (x @ x).relu_()
    path = window.stop()
    assert path is not None and calls == [False]
    assert record_function.__enter__ is original
    # the plain text is handed to the reader, which the epoch's analysis calls next: the same text as the file's,
    # which is compressed in the background meanwhile (kept with the write while it runs, then as a written file's)
    text = _handed_text(path)
    assert isinstance(text, mmap.mmap)  # a map of the plain file, deleted once compressed, not a copy of it
    _limits.wait_all_written()
    assert bytes(text) == gzip.decompress(path.read_bytes())
    assert _annotation_names(path).count('load "train"') == STEPS
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    assert fitprof.analyze(path).steps_analyzed == STEPS and _handed_text(path) is None
    assert _limits.wait_written(path) is None

    stacked = TorchProfileWindow(warn=WarnOnce(print), with_stack=True)
    assert stacked.start(tmp_path, "t", rank=0)
    assert record_function.__enter__ is original  # nothing to watch: every name is checked
    stacked.begin_step(1)
    with record_function("C:\\data"):
        (x @ x).relu_()
    path = stacked.stop()
    assert path is not None and calls == [False, True]
    assert _limits.wait_written(path) is None
    assert _annotation_names(path).count("C:\\data") == 1


def test_a_window_is_recorded_for_its_trace_only_unless_stacks_need_the_events(tmp_path: Path) -> None:
    """Where torch has ``trace_only`` (2.13 does) a window asks for it: the window is only ever exported, so torch
    can skip at the stop what ``events()`` would need. The trace is still whole (every step, every name, the odd
    ones through torch's Python writer). With ``with_stack`` it is not asked for: torch would turn it off with a
    warning, stacks needing those events."""
    if _torch.trace_only_config() is None:
        pytest.skip(f"torch {torch.__version__} has no trace_only")
    window = TorchProfileWindow(warn=WarnOnce(print))
    assert window.start(tmp_path, "s", rank=0)
    prof = window._prof
    assert prof is not None and prof.experimental_config.trace_only
    x = torch.randn(32, 32)
    for step in range(1, STEPS + 1):
        window.begin_step(step)
        with record_function('load "train"'):
            (x @ x).relu_()
    path = window.stop()
    assert path is not None and _limits.wait_written(path) is None
    assert _annotation_names(path).count('load "train"') == STEPS
    assert fitprof.analyze(path).steps_analyzed == STEPS

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "Disabling trace_only" would raise here
        stacked = TorchProfileWindow(warn=WarnOnce(print), with_stack=True)
        assert stacked.start(tmp_path, "t", rank=0)
        config = stacked._prof.experimental_config if stacked._prof is not None else None
        assert config is None or not config.trace_only
        stacked.begin_step(1)
        (x @ x).relu_()
        assert stacked.stop() is not None


def test_a_torch_without_trace_only_records_the_window_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.11's config refuses the argument (TypeError, as seen on a CUDA 13 machine): the window starts without
    it, no warning, and the trace is whole."""

    def refuse(**kwargs: object) -> None:
        raise TypeError(f"__init__(): incompatible constructor arguments. Invoked with: kwargs: {kwargs}")

    monkeypatch.setattr(torch._C._profiler, "_ExperimentalConfig", refuse)
    assert _torch.trace_only_config() is None
    path, messages = _profile_window(tmp_path, ("step work",))
    assert path is not None and messages == []
    assert _annotation_names(path).count("step work") == STEPS
    assert fitprof.analyze(path).steps_analyzed == STEPS

"""A run killed mid-write (the OOM killer, a preempted node) leaves no half file under a final name: every file
fitprof leaves is written under a temporary name and renamed into place, here and through the remote mirror; and
``fitprof report`` / ``analyze`` over many files report the good ones, naming each bad one on a warning line."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import fitprof
from fitprof import _atomic, _fs
from fitprof.cli import main
from fitprof.report_files import find_report_files, write_report_file
from fitprof.traces import _limits
from shared_fixtures import DDP_RANKS, LIGHTNING_CPU

SRC = Path(__file__).resolve().parents[1] / "src"

# The child writes one whole report file, then a second one through an ``open`` whose first write sends half
# its text, flushes it to disk and SIGKILLs the process: a kill in the middle of the write, as the OOM killer's.
_CHILD = textwrap.dedent(
    """
    import io, os, signal, sys
    import fitprof
    from fitprof.report_files import write_report_file

    logdir, trace = sys.argv[1], sys.argv[2]
    report = fitprof.analyze(trace)
    write_report_file(logdir, session="s1", epoch=0, report=report, trace=trace)
    real_open = io.open

    class Killing:
        def __init__(self, fh):
            self._fh = fh
        def write(self, text):
            self._fh.write(text[: len(text) // 2])
            self._fh.flush()
            os.fsync(self._fh.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        def __getattr__(self, name):
            return getattr(self._fh, name)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            self._fh.close()

    def killing_open(file, mode="r", *args, **kwargs):
        fh = real_open(file, mode, *args, **kwargs)
        return Killing(fh) if "w" in mode and str(file).endswith(("json", str(os.getpid()))) else fh

    io.open = killing_open
    import builtins
    builtins.open = killing_open
    write_report_file(logdir, session="s2", epoch=1, report=report, trace=trace)
    print("not killed")
    """
)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str | os.PathLike[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([os.fspath(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.slow
def test_a_report_file_killed_mid_write_is_not_left_under_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logdir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(logdir), str(LIGHTNING_CPU)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    reports = logdir / "plugins" / "fitprof"
    half = [p for p in reports.iterdir() if p.name != "s1.rank0.json"]
    assert len(half) == 1 and _atomic.is_temporary(half[0].name), sorted(reports.iterdir())  # the cut write
    assert half[0].stat().st_size > 0 and not (reports / "s2.rank0.json").exists()
    assert find_report_files(tmp_path) == [reports / "s1.rank0.json"]
    rc, out, err = _cli(capsys, "report", tmp_path, "--format", "json")
    assert (rc, err) == (0, ""), err
    assert [r["epoch"] for r in json.loads(out)] == [0]


def test_a_failed_write_leaves_the_previous_file_or_none(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    _atomic.write_text(path, "old")
    with pytest.raises(KeyboardInterrupt), _atomic.open_atomic(path) as fh:
        fh.write("new, half")
        raise KeyboardInterrupt  # the write stops here
    assert path.read_text() == "old" and sorted(tmp_path.iterdir()) == [path]


def test_a_torch_trace_cut_while_compressing_is_not_left_under_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    import shutil

    from fitprof.profilers import torch as torch_window

    events = json.loads(gzip.decompress(LIGHTNING_CPU.read_bytes()))

    class Prof:  # torch.profiler.profile's export, writing a real trace
        profiler = None

        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text(json.dumps(events))

    def cut(fin: Any, fout: Any, length: int = 0) -> None:
        fout.write(fin.read(1000))
        raise KeyboardInterrupt  # stands in for the kill: the compressed file is half written

    target = tmp_path / "h_rank0.s.pt.trace.json.gz"
    monkeypatch.setattr(shutil, "copyfileobj", cut)
    torch_window._export_gzipped(Prof(), target)  # compressed in a thread of its own: the cut is its error
    assert isinstance(_limits.wait_written(target), KeyboardInterrupt)
    assert sorted(tmp_path.iterdir()) == []  # neither the half-written file nor the plain trace is left
    monkeypatch.undo()
    assert torch_window._export_gzipped(Prof(), target) == []
    assert _limits.wait_written(target) is None and target.exists()
    assert fitprof.analyze(target).steps_analyzed == fitprof.analyze(LIGHTNING_CPU).steps_analyzed


def test_a_move_from_another_filesystem_is_whole_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "tmpfs" / "h.xplane.pb"
    src.parent.mkdir()
    src.write_bytes(b"x" * 10_000)
    dst = tmp_path / "logs" / "h.xplane.pb"
    dst.parent.mkdir()

    real_replace = os.replace

    def cross_device(a: Any, b: Any) -> None:  # rename() across filesystems; within one folder it works
        if Path(a).parent != Path(b).parent:
            raise OSError(18, "Invalid cross-device link")
        real_replace(a, b)

    def cut(a: Any, b: Any) -> None:
        Path(b).write_bytes(Path(a).read_bytes()[:5000])
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", cross_device)
    monkeypatch.setattr("shutil.copyfile", cut)
    with pytest.raises(KeyboardInterrupt):
        _atomic.move_into_place(src, dst)
    monkeypatch.undo()
    assert list(dst.parent.iterdir()) == [] and src.exists()
    monkeypatch.setattr(os, "replace", cross_device)
    _atomic.move_into_place(src, dst)
    assert dst.read_bytes() == b"x" * 10_000 and not src.exists()


def test_the_mirror_copies_whole_files_and_never_a_temporary_one(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://fitprof-killed-{os.getpid()}/run"
    fs = fsspec.filesystem("memory")
    store = _fs.FsspecStore(url)
    local = tmp_path / "r.json"
    local.write_bytes(b"{" + b" " * 100_000 + b"}")
    real_put = fs.put_file

    def cut(lpath: str, rpath: str, **kw: Any) -> None:
        fs.pipe_file(rpath, Path(lpath).read_bytes()[:500])
        raise ConnectionError("connection reset")

    fs.put_file = cut
    try:
        with pytest.raises(ConnectionError):
            store.put(local, "plugins/fitprof/r.json")
        assert not fs.exists(f"{url.removeprefix('memory://')}/plugins/fitprof/r.json")
        fs.put_file = real_put
        store.put(local, "plugins/fitprof/r.json")
        assert fs.cat_file(f"{url.removeprefix('memory://')}/plugins/fitprof/r.json") == local.read_bytes()

        mirror = _fs.Mirror(url + "/m", warn=lambda key, msg: pytest.fail(msg))
        (mirror.local / "a.json").write_text("{}")
        (mirror.local / _atomic.temporary_name("b.json").name).write_text("{")  # a write in progress
        assert mirror.sync()
        assert sorted(p.rpartition("/")[2] for p in fs.find(url.removeprefix("memory://") + "/m")) == ["a.json"]
        mirror.close()
    finally:
        fs.put_file = real_put
        fs.rm(url.removeprefix("memory://").partition("/")[0], recursive=True)


def test_analyze_over_many_files_reports_the_good_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    half = tmp_path / "h_rank1.s.pt.trace.json.gz"
    half.write_bytes(DDP_RANKS[1].read_bytes()[:2000])  # what a kill while gzipping left before
    rc, out, err = _cli(capsys, "analyze", DDP_RANKS[0], half, "--format", "json")
    assert rc == 0
    ((line),) = err.splitlines()
    assert line.startswith(f"fitprof: warning: {half}: ") and line.endswith("(skipped)")
    assert [r["run"] for r in json.loads(out)] == [os.fspath(DDP_RANKS[0])]
    assert _cli(capsys, "analyze", DDP_RANKS[0], half, "--strict")[0] == 2
    rc, out, err = _cli(capsys, "analyze", half)
    assert (rc, out) == (2, "") and err.startswith("fitprof: error: ")


def test_report_plugins_never_list_a_temporary_file(tmp_path: Path) -> None:
    report = fitprof.analyze(LIGHTNING_CPU)
    path = write_report_file(tmp_path, session="s", epoch=0, report=report, trace=LIGHTNING_CPU)
    _atomic.temporary_name(path.with_name("t.rank0.json")).write_text("{")
    assert find_report_files(tmp_path) == [path]


def test_a_trace_whose_background_write_failed_keeps_its_figures_and_says_so_once(tmp_path: Path) -> None:
    """The window's trace is compressed in the background while the epoch's analysis reads its handed-over text:
    when that write fails (a full disk), the figures and the report file are kept, one warning names the trace,
    and no Profile-tab copy is attempted from the missing file."""
    from fitprof._warn import WarnOnce
    from fitprof.fit.pipeline import WindowPipeline

    text = gzip.decompress(LIGHTNING_CPU.read_bytes())
    trace = tmp_path / "h_rank0.s1.pt.trace.json.gz"

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    _limits.write_in_background(trace, full_disk)
    _limits.hand_over(trace, bytearray(text))
    pipe = WindowPipeline(top_k=3, max_trace_mb=1.0, keep_last_windows=None, warn=WarnOnce(), converter=None)
    with pytest.warns(UserWarning) as caught:
        report = pipe.analyze(0, trace, log_dir=tmp_path, session="s1", rank=0, world_size=1)
    assert report is not None and report.steps_analyzed == fitprof.analyze(LIGHTNING_CPU).steps_analyzed
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and str(trace) in said[0] and "No space left" in said[0] and "kept" in said[0]
    assert pipe.xplane_paths == {} and not trace.exists()
    assert len(find_report_files(tmp_path)) == 1


def test_windows_whose_background_writes_failed_each_keep_their_figures_with_one_warning(tmp_path: Path) -> None:
    """Two windows waiting for their analysis at once (a triggered one and the scheduled one), each trace's write
    failed on a full disk before its text was handed over, the first trace with memory events (which the analysis
    reads a second time): both windows keep their figures, and the run is told once, by the write's own error."""
    from fitprof._warn import WarnOnce
    from fitprof.fit.pipeline import WindowPipeline

    doc = json.loads(gzip.decompress(LIGHTNING_CPU.read_bytes()))
    with_memory = json.dumps({**doc, "profile_memory": 1}).encode()
    plain = json.dumps(doc).encode()
    traces = [tmp_path / "h_rank0.trig.pt.trace.json.gz", tmp_path / "h_rank0.sched.pt.trace.json.gz"]

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    for trace, text in zip(traces, (with_memory, plain), strict=True):
        _limits.write_in_background(trace, full_disk)
        _limits.wait_all_written()  # the write has failed before its text is handed over
        _limits.hand_over(trace, bytearray(text))
    pipe = WindowPipeline(top_k=3, max_trace_mb=1.0, keep_last_windows=None, warn=WarnOnce(), converter=None)
    steps = fitprof.analyze(LIGHTNING_CPU).steps_analyzed
    with pytest.warns(UserWarning) as caught:
        reports = [
            pipe.analyze(i, t, log_dir=tmp_path, session=t.name.split(".")[1], rank=0, world_size=1)
            for i, t in enumerate(traces)
        ]
    assert [r.steps_analyzed if r is not None else None for r in reports] == [steps, steps]
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and str(traces[0]) in said[0] and "No space left" in said[0], said
    assert "figures of epoch 0 are kept" in said[0]
    assert len(find_report_files(tmp_path)) == 2 and not any(t.exists() for t in traces)


def test_a_window_whose_failed_write_left_no_text_is_told_once_without_figures(tmp_path: Path) -> None:
    """A write that failed where no text could be handed over (the plain file could not be mapped): the analysis
    cannot read the trace, and the one warning is the write's, saying that the epoch has no figures."""
    from fitprof._warn import WarnOnce
    from fitprof.fit.pipeline import WindowPipeline

    trace = tmp_path / "h_rank0.s1.pt.trace.json.gz"

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    _limits.write_in_background(trace, full_disk)
    pipe = WindowPipeline(top_k=3, max_trace_mb=1.0, keep_last_windows=None, warn=WarnOnce(), converter=None)
    with pytest.warns(UserWarning) as caught:
        report = pipe.analyze(0, trace, log_dir=tmp_path, session="s1", rank=0, world_size=1)
    said = [str(w.message) for w in caught]
    assert report is None and len(said) == 1, said
    assert str(trace) in said[0] and "No space left" in said[0] and "epoch 0 has no figures" in said[0]
    assert find_report_files(tmp_path) == []


def test_an_analysis_that_fails_on_its_own_is_told_beside_the_failed_write_and_holds_no_text(
    tmp_path: Path,
) -> None:
    """The handed-over text itself is unreadable and the write failed too: both causes are told, each once.
    The failed analysis keeps nothing of the trace alive once the window is done (no reference cycle through the
    exception's traceback: checked with the garbage collector off)."""
    import gc
    import weakref

    from fitprof._warn import WarnOnce
    from fitprof.fit.pipeline import WindowPipeline

    class Text(bytearray):  # a bytearray that can be watched
        pass

    trace = tmp_path / "h_rank0.s1.pt.trace.json.gz"

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    pipe = WindowPipeline(top_k=3, max_trace_mb=1.0, keep_last_windows=None, warn=WarnOnce(), converter=None)
    gc.disable()
    try:
        _limits.write_in_background(trace, full_disk)
        text = Text(b"not json")
        alive = weakref.ref(text)
        _limits.hand_over(trace, text)
        del text
        with pytest.warns(UserWarning) as caught:
            report = pipe.analyze(0, trace, log_dir=tmp_path, session="s1", rank=0, world_size=1)
        assert alive() is None
    finally:
        gc.enable()
    said = [str(w.message) for w in caught]
    assert report is None and len(said) == 2, said
    assert "could not analyse" in said[0] and "not valid JSON" in said[0]
    assert "could not write" in said[1] and "No space left" in said[1] and "epoch 0 has no figures" in said[1]

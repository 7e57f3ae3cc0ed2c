"""The profilers' own start/stop log lines are held back around fitprof's profiler calls; every other line on fd 2
(warnings, errors) still reaches it.

Fast tests plant C-level writes (``os.write(2, ...)``) inside :func:`~fitprof.profilers.quiet.quiet_profiler_lines`
and read fd 2 back through pytest's ``capfd``; one opens a real torch window in this process. The slow tests run
real fits in a child process (``quiet_child.py``), once quieted and once with ``FITPROF_QUIET_PROFILER=0``, and read
the child's stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from fitprof.profilers import quiet
from fitprof.profilers.quiet import ENV_VAR, quiet_profiler_lines

TESTS = Path(__file__).resolve().parent

# The lines as TensorFlow 2.21 and torch 2.13 print them (copied from a run of each window).
KINETO_START = b"USDT:2026-12-01 06:05:10 29894:29894 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
KINETO_STOP = b"USDT:2026-12-01 06:05:10 29894:29894 SyncActivityProfilerHandler.cpp:59] profiler_stop\n"
TF_NOISE = [
    b"I0000 00:00:1796105124.832954   30119 profiler_session.cc:117] Profiler session initializing.\n",
    b"I0000 00:00:1796105124.832990   30119 profiler_session.cc:132] Profiler session started.\n",
    b"I0000 00:00:1796105124.899426   30119 profiler_session.cc:81] Profiler session collecting data.\n",
    b"I0000 00:00:1796105124.899758   30119 profiler_session.cc:150] Profiler session tear down.\n",
    b"I0000 00:00:1796105124.904303   30119 save_profile.cc:150] Collecting XSpace to repository: "
    b"/tmp/fitprof-tf-7euqkdki/plugins/profile/2026_12_01_06_05_24/vm.xplane.pb\n",
]
NOISE = [KINETO_START, *TF_NOISE, KINETO_STOP]
# Lines that look like the noise but are not it: they must come through.
KEPT = [
    b"E0000 00:00:1796105124.899426   30119 profiler_session.cc:81] Profiler session failed: out of memory.\n",
    b"W0000 00:00:1796105124.832990   30119 profiler_session.cc:132] Profiler session started.\n",
    b"[W1201 06:05:10.000000 29894 CuptiActivityProfiler.cpp:1000] profiler_start failed: CUPTI busy\n",
    b"USDT:2026-12-01 06:05:10 29894:29894 SyncActivityProfilerHandler.cpp:52] profiler_start failed\n",
    b"Traceback (most recent call last):\n",
]
UNTERMINATED = b"a last line without its line end"


def _planted(lines: list[bytes]) -> None:
    for line in lines:
        os.write(2, line)


def _interleaved() -> list[bytes]:
    out: list[bytes] = []
    for noise, kept in zip(NOISE, KEPT, strict=False):
        out += [noise, kept]
    return [*out, *NOISE[len(KEPT) :], *KEPT[len(NOISE) :], UNTERMINATED]


def test_only_noise_lines_are_held_back(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    os.write(2, b"before\n")
    with quiet_profiler_lines():
        _planted(_interleaved())
    os.write(2, b"after\n")
    err = capfd.readouterr().err.encode()
    assert err == b"before\n" + b"".join(KEPT) + UNTERMINATED + b"after\n"


@pytest.mark.parametrize("value", ["0", "false", "OFF", " no "])
def test_env_var_turns_quieting_off(
    value: str, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, value)
    with quiet_profiler_lines():
        _planted(_interleaved())
    assert capfd.readouterr().err.encode() == b"".join(_interleaved())


def test_lines_come_back_when_the_call_raises(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(RuntimeError, match="stop failed"), quiet_profiler_lines():
        _planted([KINETO_STOP, KEPT[0]])
        raise RuntimeError("stop failed")
    os.write(2, b"fd 2 is back\n")
    assert capfd.readouterr().err.encode() == KEPT[0] + b"fd 2 is back\n"


def test_capture_file_is_deleted(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with quiet_profiler_lines():
        assert [p.name.startswith("fitprof-stderr-") for p in tmp.iterdir()] == [True]
        _planted([KINETO_START])
    assert list(tmp.iterdir()) == []
    assert capfd.readouterr().err == ""


def test_closed_fd2_runs_the_call_unquieted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    saved = os.dup(2)
    ran = []
    try:
        os.close(2)
        with quiet_profiler_lines():
            ran.append(True)
        with pytest.raises(OSError):
            os.fstat(2)  # left as it was: closed
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    assert ran == [True]


def test_a_second_thread_is_not_quieted(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # fd 2 is one per process: while one call holds it, another thread's call runs with fd 2 as it is, and its
    # lines land in the first call's capture (held back if noise, written back if not).
    monkeypatch.delenv(ENV_VAR, raising=False)
    entered, done = threading.Event(), threading.Event()
    nested: list[bool] = []

    def other() -> None:
        entered.wait()
        with quiet_profiler_lines():
            nested.append(quiet._lock.locked())
            _planted([KINETO_START, KEPT[0]])
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with quiet_profiler_lines():
        entered.set()
        done.wait(10)
    thread.join()
    assert nested == [True]
    assert capfd.readouterr().err.encode() == KEPT[0]


def test_real_torch_window(tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from fitprof.profilers.torch import TorchProfileWindow

    seen = {}
    for value in ("1", "0"):
        monkeypatch.setenv(ENV_VAR, value)
        window = TorchProfileWindow(tmp_path / value, epoch=0)
        window.start()
        window.begin_step(1)
        window.end_step()
        window.stop()
        window.cleanup()
        seen[value] = capfd.readouterr().err
    assert "profiler_start" not in seen["1"] and "profiler_stop" not in seen["1"]
    assert "SyncActivityProfilerHandler.cpp:52] profiler_start\n" in seen["0"]
    assert "SyncActivityProfilerHandler.cpp:59] profiler_stop\n" in seen["0"]


def _child(kind: str, out: Path, **env: str) -> tuple[list[str], dict[str, str]]:
    """Run ``quiet_child.py KIND OUT``; return its result lines and its stderr split by run."""
    child_env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "KINETO_LOG_LEVEL")}
    child_env.update(env)
    src = str(TESTS.parent / "src")
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (src, str(TESTS), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(TESTS / "quiet_child.py"), kind, str(out)],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    _, quiet_part = proc.stderr.split("=== run quiet\n", 1)
    quiet_part, loud_part = quiet_part.split("=== run loud\n", 1)
    return results, {"quiet": quiet_part, "loud": loud_part}


@pytest.mark.slow
def test_lightning_fit_keeps_kineto_lines_out(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    results, err = _child("lightning", tmp_path)
    assert results == ['RESULT {"run": "quiet", "windows": 2}', 'RESULT {"run": "loud", "windows": 2}']
    assert "profiler_start" not in err["quiet"] and "profiler_stop" not in err["quiet"], err["quiet"]
    assert err["loud"].count("SyncActivityProfilerHandler.cpp:52] profiler_start\n") == 2, err["loud"]
    assert err["loud"].count("SyncActivityProfilerHandler.cpp:59] profiler_stop\n") == 2, err["loud"]


@pytest.mark.slow
def test_keras_tensorflow_fit_keeps_profiler_lines_out(tmp_path: Path) -> None:
    pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    results, err = _child("keras", tmp_path, KERAS_BACKEND="tensorflow")
    assert results == ['RESULT {"run": "quiet", "windows": 2}', 'RESULT {"run": "loud", "windows": 2}']
    for text in ("Profiler session", "profiler_session.cc", "Collecting XSpace"):
        assert text not in err["quiet"], err["quiet"]
    for text in (
        "Profiler session initializing.",
        "Profiler session started.",
        "Profiler session collecting data.",
        "Profiler session tear down.",
        "Collecting XSpace to repository: ",
    ):
        assert err["loud"].count(text) == 2, err["loud"]

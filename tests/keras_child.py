"""Run test code in a child Python (Keras picks its backend at import, once per process; a fresh interpreter is
the only way to test another backend, an import failure or a process-wide setting) and read its result back.

* :func:`run_result`: ``python ARGS`` with this checkout's ``src`` first on the path; returns the JSON the child
  printed on its line starting with ``RESULT``;
* :func:`run_backend_child`: a Keras test file run as a script on one backend, read back from the
  ``results.json`` it wrote into its output folder with :func:`write_results`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
RESULT = "RESULT"
"""The prefix of the child's one stdout line of JSON."""


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with ``extra`` set and this checkout's ``src`` first on ``PYTHONPATH`` (as an
    absolute path: the child may run in another working directory)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    return env


def result_of(stdout: str) -> dict[str, Any]:
    """The JSON after :data:`RESULT` on the first stdout line that starts with it."""
    line = next(ln for ln in stdout.splitlines() if ln.startswith(RESULT))
    result: dict[str, Any] = json.loads(line[len(RESULT) :])
    return result


def run_result(
    args: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, timeout_s: float = 600
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """``python ARGS`` (``env`` from :func:`child_env` unless given); asserts it exited 0 (the assertion shows the
    end of its stderr); returns its result (:func:`result_of`) and the finished process."""
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env or child_env(),
        cwd=cwd,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return result_of(proc.stdout), proc


def write_results(out: Path, runs: dict[str, Callable[[Path], Any]]) -> None:
    """The child's side of :func:`run_backend_child`: call each run with its own folder ``out / name`` and write
    every result to ``out / "results.json"``; a run that raises records ``{"error": ...}`` instead, so one broken
    run never hides the others."""
    results: dict[str, Any] = {}
    for name, run in runs.items():
        try:
            results[name] = run(out / name)
        except BaseException as err:
            results[name] = {"error": f"{type(err).__name__}: {err}"}
    (out / "results.json").write_text(json.dumps(results))


def run_backend_child(test_file: str, backend: str, out: Path, timeout_s: float = 600) -> dict[str, Any]:
    """``python <test_file> <out>`` with ``KERAS_BACKEND=backend`` and this checkout's ``src`` first on the path;
    skips when Keras or the backend's framework is not installed; asserts the script exited 0; returns the JSON
    it wrote to ``out / "results.json"``."""
    pytest.importorskip("keras")
    pytest.importorskip("tensorflow" if backend == "tensorflow" else "torch")
    proc = subprocess.run(
        [sys.executable, os.fspath(Path(test_file).resolve()), os.fspath(out)],
        capture_output=True,
        text=True,
        env=child_env(KERAS_BACKEND=backend),
        timeout=timeout_s,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads((out / "results.json").read_text())
    return result

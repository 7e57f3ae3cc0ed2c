"""Run a Keras test file as a script in a child process on one backend (Keras picks its backend at import, once
per process), and read back the ``results.json`` the script wrote into its output folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def run_backend_child(test_file: str, backend: str, out: Path, timeout_s: float = 600) -> dict[str, Any]:
    """``python <test_file> <out>`` with ``KERAS_BACKEND=backend`` and this checkout's ``src`` first on the path;
    skips when Keras or the backend's framework is not installed; asserts the script exited 0; returns the JSON
    it wrote to ``out / "results.json"``."""
    pytest.importorskip("keras")
    pytest.importorskip("tensorflow" if backend == "tensorflow" else "torch")
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, os.fspath(Path(test_file).resolve()), os.fspath(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads((out / "results.json").read_text())
    return result

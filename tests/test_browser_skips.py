"""Without Chromium, every browser test is skipped on its own line with the reason, never the module at once (a
module-level skip shows as one line and hides how many checks a run did not make)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_missing_chromium_skips_each_browser_test_with_its_reason(tmp_path: Path) -> None:
    pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    pytest.importorskip("lightning.pytorch")
    nowhere = tmp_path / "no-chromium"
    paths = [ROOT / "src", ROOT / "tests", ROOT / "examples", os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "FITPROF_CHROMIUM": str(nowhere),
        "KERAS_BACKEND": "tensorflow",
        "PYTHONPATH": os.pathsep.join(map(str, paths)),
    }

    # One child: -vv gives each test's own line with its outcome and its whole reason (COLUMNS: on one line), -rs
    # the summary's reasons, and the header "collected N items" (a module-level skip collects none).
    env["COLUMNS"] = "1000"
    command = [sys.executable, "-m", "pytest", "-vv", "-rs", "-p", "no:cacheprovider", "tests/test_browser.py"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collected = re.search(r"collected (\d+) items?", proc.stdout)
    assert collected and int(collected.group(1)) >= 5, proc.stdout
    tests = [line for line in proc.stdout.splitlines() if line.startswith("tests/test_browser.py::test_")]
    assert len(tests) == int(collected.group(1)), proc.stdout
    reason = f"FITPROF_CHROMIUM={nowhere} is not an executable Chromium"
    assert all(f" SKIPPED ({reason})" in line for line in tests), proc.stdout
    skipped = re.search(r"(\d+) skipped", proc.stdout)
    assert skipped and int(skipped.group(1)) == len(tests), proc.stdout
    reasons = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert reasons and all(reason in r for r in reasons), proc.stdout

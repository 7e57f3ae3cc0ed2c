"""``make test``'s two workers (``pytest -n 2 --dist loadgroup``): each test module runs in one worker, so its
module-scoped child process runs once (:func:`conftest.pytest_xdist_make_scheduler`). Checked on two fast modules in
a child pytest, whose ``-v`` lines name the worker of each test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("xdist")

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("tests/test_steps.py", "tests/test_verdict_boundaries.py")


@pytest.mark.slow
def test_each_module_runs_in_one_worker() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", *MODULES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, module in re.findall(r"\[(gw\d+)\] .*?PASSED (tests/\S+?\.py)::", run.stdout):
        workers[module].add(worker)
    assert sorted(workers) == sorted(MODULES), run.stdout[-3000:]
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
    assert len(set().union(*workers.values())) == 2  # both workers got work: the units were not all put on one

"""When the shared GPU traces of ``../shared/fixtures/kineto`` are missing: a plain clone (and a fork's hosted CI,
where ``CI=true``) skips their tests and passes; only ``FITPROF_REQUIRE_FIXTURES=1`` (the project's own CI,
``.ci/run``) fails the run. Each case runs pytest in a child process on a real fixture-using test, with
``FITPROF_SHARED_DIR`` pointing at a folder that does not exist, as a fresh clone without ``../shared`` has."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared_fixtures import REQUIRE_VAR, ROOT

pytestmark = pytest.mark.slow  # starts a child pytest

# One test that reads a shared fixture, and one that does not: the run's status must follow the rule, not the luck
# of which tests were selected.
SELECTED = (
    "tests/test_kineto_reader.py::test_rocm_trace_details",
    "tests/test_kineto_reader.py::test_empty_trace_gives_an_empty_table",
)


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if k not in ("CI", REQUIRE_VAR, "PYTEST_XDIST_WORKER")}
    child_env.update(FITPROF_SHARED_DIR=str(tmp_path / "no-shared-here"), PYTHONPATH=str(ROOT / "src"), **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-n", "0", "-p", "no:cacheprovider", *SELECTED],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("ci", ["", "true"])
def test_without_the_shared_fixtures_a_clone_skips_their_tests_and_passes(tmp_path: Path, ci: str) -> None:
    run = _pytest(tmp_path, CI=ci)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 1 skipped" in run.stdout, run.stdout
    assert "are not beside this checkout" in run.stdout, run.stdout


def test_the_projects_own_ci_requires_them(tmp_path: Path) -> None:
    run = _pytest(tmp_path, CI="true", **{REQUIRE_VAR: "1"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"{REQUIRE_VAR}=1 and shared fixtures are missing" in run.stdout, run.stdout
    assert "mi250_rocm_minitoy_train.json.gz" in run.stdout, run.stdout
    assert 'FITPROF_REQUIRE_FIXTURES="${FITPROF_REQUIRE_FIXTURES:-1}"' in (ROOT / ".ci" / "run").read_text("utf-8")

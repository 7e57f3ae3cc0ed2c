"""Shared test settings: quiet TensorFlow, the examples on sys.path, the shared fixtures, the ``gpu`` marker.

* The real GPU traces of ``../shared/fixtures/kineto`` (see ``tests/shared_fixtures.py``): their tests skip with
  one reason when the folder is not beside the checkout; with ``FITPROF_REQUIRE_FIXTURES=1`` (set by the project's
  own CI, ``.ci/run``) the run fails instead, naming the missing files (:func:`pytest_sessionfinish`), so that CI
  never goes green without them. A plain ``CI=true`` (a contributor's fork on GitHub Actions) only skips them.
* Tests marked ``gpu`` need CUDA: they skip with a reason on a machine without it; ``pytest -m gpu`` runs only them.
  They need nothing beyond torch, lightning, tensorboard, pandas and fitprof's core dependencies; where one of those
  core dependencies is missing (a GPU image without msgspec), every module that imports it and every ``gpu`` test
  skips with the ``pip install`` line, so ``pytest -m gpu`` still collects.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The tests that read a fit's .xplane.pb right after it returns have the fit wait for its conversions
# (fitprof.fit.xplane_worker.WAIT_ENV); tests/test_profile_jobs.py clears it and tests the fit that does not wait.
os.environ.setdefault("FITPROF_WAIT_FOR_PROFILES", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Under ``pytest -n N`` each worker (and every process it starts) gets a temporary folder of its own: tests check
    # that fitprof left nothing in the system's temporary folder, which the other workers' fits would race.
    _tmp = Path(tempfile.gettempdir()) / f"pytest-{os.environ['PYTEST_XDIST_WORKER']}-{os.getpid()}"
    _tmp.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(_tmp)
    tempfile.tempdir = str(_tmp)
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TESTS = ROOT / "tests"
for p in (EXAMPLES, TESTS):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from shared_fixtures import KINETO_DIR, REQUIRE_VAR, fixtures_required, missing_shared, shared_kineto  # noqa: E402


@pytest.fixture
def kineto_fixtures() -> Path:
    """The folder of the real GPU traces of ``../shared/fixtures/kineto``: skips with the one shared reason when
    they are missing, fails where they are required (:func:`shared_fixtures.shared_kineto`)."""
    return shared_kineto()


CORE = ("msgspec", "numpy", "pandas", "google.protobuf", "fsspec")
"""fitprof's core dependencies (pyproject's ``dependencies``), as imported."""


def _missing_core() -> str | None:
    """The install hint for fitprof's core dependencies missing here, or None."""
    missing = []
    for name in CORE:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a dotted name whose parent is missing
            found = False
        if not found:
            missing.append(name)
    if not missing:
        return None
    return f"needs fitprof's core dependencies ({', '.join(missing)} missing: pip install fitprof, or pip install -e .)"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """A test module that cannot be imported because a core dependency is missing is skipped with the install
    hint (as ``pytest.importorskip`` at its top would), not a collection error that stops ``pytest -m gpu``."""
    outcome = yield
    report = outcome.get_result()
    hint = _missing_core() if report.failed and isinstance(collector, pytest.Module) else None
    if hint is not None:
        text = str(report.longrepr)
        if any(f"No module named '{name.split('.')[0]}'" in text for name in CORE):
            report.outcome = "skipped"
            report.longrepr = (str(collector.path), 0, f"Skipped: {hint}")


@pytest.fixture(scope="session")
def keras_digits_fast(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, Any]]:
    """The Keras digits example with its defaults for two epochs, run once for the session (it trains: only slow
    tests use it): its run folder ``<root>/fast`` and its reports by epoch. A test that wants it in a log folder of
    its own links to it (``fitprof report`` and TensorBoard's walk follow folder links); nothing writes into it."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    keras = pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs KERAS_BACKEND=tensorflow")
    import keras_digits

    run = tmp_path_factory.mktemp("keras_digits") / "fast"
    return run, keras_digits.main(["--logdir", str(run), "--epochs", "2"])


def _shared_runs() -> dict[str, str]:
    """The modules that use the session's Keras digits run (:func:`keras_digits_fast`), by name: one unit of work,
    so the run is made once. Read from the test files' text, since xdist's controller collects no tests."""
    here = Path(__file__).resolve().parent
    return {
        path.stem: "keras_digits" for path in here.glob("test_*.py") if "keras_digits_fast" in path.read_text("utf-8")
    }


FIRST = (
    "test_scenarios_lightning",
    "test_epoch_parts_fit",
    "test_browser",
    "test_distributed_keras",
    "test_keras_jax",
    "test_scenarios_keras",
    "test_loader_pydataset",
    "test_distributed_lightning",
    "test_trigger_keras",
    "test_remote_logdir",
    "test_memory_fit",
    "test_keras_torch",
    "test_lightning_lifecycle",
    "keras_digits",
    "test_xspace_agreement",
    "test_loader_torch",
    "test_loader_lightning",
    "test_keras_lifecycle",
    "test_quiet_profiler",
    "test_lightning",
    "test_loader_keras",
    "test_gpu_collection",
)
"""The units that take longest, longest first (measured in one worker of ``make test``: 23-105 s each),
started first so that no worker is left with a long one at the end while the others idle; the rest follow in
xdist's order. A stale entry costs time only."""


@pytest.hookimpl(optionalhook=True)  # xdist's hook: without xdist installed (a GPU image) it is never called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``pytest -n N --dist loadgroup`` (``make test``): each test module is one unit of work, run in one worker, so
    its module-scoped child process or launch runs once. Not through ``xdist_group`` marks: with pytest 9 the node
    id xdist reads no longer carries the group it appends, so every test was its own unit and a module split across
    both workers ran its child twice (seen in 5 modules, 20-33 s each)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    shared = _shared_runs()

    class ModuleUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            stem = Path(nodeid.split("::", 1)[0]).stem
            return shared.get(stem, stem)

        def _assign_work_unit(self, node: Any) -> None:
            if not getattr(self, "_slow_first", False):  # the queue is full by the first assignment
                self._slow_first = True
                first = {name: i for i, name in enumerate(FIRST)}
                units = sorted(self.workqueue.items(), key=lambda unit: first.get(unit[0], len(first)))  # stable
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return ModuleUnits(config, log)


def _cuda_reason() -> str | None:
    """Why the ``gpu`` tests cannot run here, or None when they can."""
    try:
        import torch
    except ImportError:
        return "needs torch with CUDA (torch is not installed)"
    if not torch.cuda.is_available():
        return f"needs a CUDA device (torch {torch.__version__} sees none)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = _cuda_reason() or _missing_core()
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_report_header(config: pytest.Config) -> str:
    missing = missing_shared()
    state = "all present" if not missing else f"{len(missing)} missing"
    required = "required" if fixtures_required() else f"optional ({REQUIRE_VAR}=1 requires them)"
    return f"fitprof: shared Kineto fixtures in {KINETO_DIR}: {state}; {required}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: Any) -> None:
    """Where the shared fixtures are required, their absence fails the run even when no selected test asked for them. A worker of
    ``pytest -n N`` removes its temporary folder."""
    if os.environ.get("PYTEST_XDIST_WORKER") and tempfile.tempdir and Path(tempfile.tempdir).name.startswith("pytest-"):
        shutil.rmtree(tempfile.tempdir, ignore_errors=True)
    if fixtures_required() and missing_shared() and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Names each failure (and each error in a fixture) on its own line as it happens, with its duration, so a long
    run's failures are known before its end. Under ``pytest -n N`` the controller gets every worker's reports; the
    workers print nothing themselves."""
    terminal = _CONFIG[0].pluginmanager.get_plugin("terminalreporter") if _CONFIG else None
    if os.environ.get("PYTEST_XDIST_WORKER") or not report.failed or terminal is None:
        return
    what = "FAILED" if report.when == "call" else f"ERROR at {report.when}"
    terminal.write("\n")  # after the progress characters of -q
    terminal.write_line(f"{what} {report.nodeid} ({report.duration:.1f} s)", red=True)


_CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG[:] = [config]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: Any, config: pytest.Config) -> None:
    missing = missing_shared()
    if fixtures_required() and missing:
        terminalreporter.section(f"missing shared fixtures ({REQUIRE_VAR}=1)", red=True)
        for path in missing:
            terminalreporter.line(f"missing: {path}", red=True)
        terminalreporter.line(
            f"{REQUIRE_VAR}=1 needs ../shared/fixtures beside the checkout (or FITPROF_SHARED_DIR pointing to it).",
            red=True,
        )

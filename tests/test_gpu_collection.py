"""``pytest -m gpu`` on a GPU image that has torch, lightning, tensorboard, pandas and fitprof's core dependencies,
and nothing else (no TensorFlow, Keras, JAX, dask, xprof): it collects every ``gpu`` test, and the modules it
cannot import skip with the ``pip install`` line instead of stopping the run. On an image that lacks msgspec too
(a core dependency, which ``import fitprof`` needs), collection still succeeds: the modules that import fitprof skip
with the line that installs it.

The image is a throwaway virtual environment whose site-packages links to this interpreter's, minus the packages
the image lacks: ``importlib.util.find_spec`` and ``importlib.metadata`` see them as not installed, as there.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_ON_THE_IMAGE = (
    "tensorflow*",
    "_tensorflow*",
    "tf_keras*",
    "keras*",
    "jax*",
    "dask*",
    "distributed*",
    "xprof*",
    "isal*",
    "matplotlib*",
    "scikit_learn*",
    "sklearn*",
    "playwright*",
    "jsonargparse*",
    "traceml*",
    "xdist*",  # pytest-xdist: the suite's conftest must not need it
    "pytest_xdist*",
    "*fitprof*",  # this checkout's source comes first on PYTHONPATH
)
GPU_TESTS = (
    "tests/test_gpu.py::test_pinned_and_pageable_copies_and_device_time",
    "tests/test_distributed_lightning.py::test_nccl_gather_on_gpus",
    "tests/test_mfu_precision.py::test_on_the_device_a_float32_conv_step_reads_an_mfu_in_0_1",
)


def _image(where: Path, *also_missing: str) -> Path:
    """A virtual environment with this one's packages minus :data:`NOT_ON_THE_IMAGE` and ``also_missing``; its
    python."""
    venv.create(where, with_pip=False)
    python = where / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    ours = {Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    hidden = NOT_ON_THE_IMAGE + also_missing
    for folder in ours:
        for entry in folder.iterdir():
            if not any(fnmatch.fnmatch(entry.name, pattern) for pattern in hidden) and not (site / entry.name).exists():
                (site / entry.name).symlink_to(entry)
    return python


def _collect(python: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(ROOT / "src")
    # --assert=plain: nothing runs, so no module needs its asserts rewritten (without bytecode caches that rewrite
    # is about a third of the collection's CPU time).
    command = ["-m", "pytest", "-m", "gpu", "--collect-only", "--assert=plain", "-q", "-rs", "-p", "no:cacheprovider"]
    return subprocess.run(
        [python, *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="symlinked site-packages")
@pytest.mark.parametrize("missing", [(), ("msgspec*",)], ids=["core-deps", "no-msgspec"])
def test_gpu_tests_collect_with_torch_and_lightning_only(tmp_path: Path, missing: tuple[str, ...]) -> None:
    python = _image(tmp_path / "image", *missing)
    check = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util as u; print([m for m in ('tensorflow', 'distributed', 'msgspec', "
            "'torch', 'lightning') if u.find_spec(m)])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    expected = ["torch", "lightning"] if missing else ["msgspec", "torch", "lightning"]
    assert check.stdout.strip() == str(expected)
    run = _collect(python)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "tests/test_dask.py" in out  # skipped with its install line: fitprof's first when it cannot be imported
    assert "needs fitprof[dask]" in out or (missing and "tests/test_dask.py:0: needs fitprof's core" in out)
    for test in GPU_TESTS:
        if missing:  # `import fitprof` needs its core dependencies: the module is skipped with the install line
            module = test.split("::")[0]
            assert test in out or f"{module}:0: needs fitprof's core dependencies (msgspec missing" in out, out[-4000:]
        else:
            assert test in out, out[-4000:]
    if missing:
        assert "msgspec missing: pip install fitprof" in out

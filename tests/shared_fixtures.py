"""Where the tests find their trace files: ``tests/data/`` (shipped) and ``../shared/fixtures/kineto/`` (not shipped).

The real GPU traces (A100, MI250, a CPU-only gloo rank; see ``../shared/fixtures/README.md``) are an extra layer
of checks, read from beside the checkout and never copied in. A clone without them still runs every other test;
the tests that need them skip with one reason (:data:`SKIP_REASON`). Only where the project's own CI asks for them
(``FITPROF_REQUIRE_FIXTURES=1``, set by ``.ci/run``) does their absence fail the run instead (see
``tests/conftest.py``); a plain ``CI=true``, which every hosted CI sets, does not, so an outside contributor's
fork goes green without them. ``FITPROF_SHARED_DIR`` points elsewhere (a path that does not exist simulates a clone
without them).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SHARED_DIR = Path(os.environ.get("FITPROF_SHARED_DIR") or ROOT.parent / "shared")
KINETO_DIR = SHARED_DIR / "fixtures" / "kineto"
SHARED_KINETO = (
    "a100_alexnet_pageable_htod.json.gz",
    "a100_sampled_rank0.json.gz",
    "a100_ddp8_rank3_dataloader.json.gz",
    "mi250_rocm_minitoy_train.json.gz",
    "cpu_only_rank34.pt.trace.json.gz",
)
"""The shared Kineto fixtures the tests use, by file name."""

SKIP_REASON = (
    f"the real GPU traces of ../shared/fixtures/kineto are not beside this checkout (looked in {KINETO_DIR}; "
    "FITPROF_SHARED_DIR moves it; FITPROF_REQUIRE_FIXTURES=1 makes their absence fail the run)"
)

# Shipped traces, recorded with fitprof's own callbacks by tests/data/record.py (see tests/data/README.md).
LIGHTNING_CPU = DATA / "lightning_cpu.pt.trace.json.gz"
KERAS_XSPACE = DATA / "keras_tf_cpu.xplane.pb"
DDP_RANKS = (DATA / "ddp_gloo_rank0.pt.trace.json.gz", DATA / "ddp_gloo_rank1.pt.trace.json.gz")
SHIPPED_KINETO = (LIGHTNING_CPU, *DDP_RANKS)


def optional_shared_kineto() -> list[Path]:
    """Every shared Kineto fixture, for a test to which they are an extra layer (it stands on the shipped and
    generated traces without them): [] when they are missing, except where they are required
    (:func:`fixtures_required`), where that fails the test."""
    if missing_shared():
        _fail_if_required()
        return []
    return [KINETO_DIR / name for name in SHARED_KINETO]


def _fail_if_required() -> None:
    missing = missing_shared()
    if missing and fixtures_required():
        names = ", ".join(p.name for p in missing)
        pytest.fail(f"{REQUIRE_VAR}=1 and shared fixtures are missing from {KINETO_DIR}: {names}")


def kineto_trace(name: str) -> Path:
    """The path of a Kineto trace by file name: a shipped one of :data:`SHIPPED_KINETO`, else a shared one through
    :func:`shared_kineto` (which skips, or fails where they are required, when the shared fixtures are missing)."""
    for path in SHIPPED_KINETO:
        if path.name == name:
            return path
    return shared_kineto(name)


REQUIRE_VAR = "FITPROF_REQUIRE_FIXTURES"
"""The variable with which the project's own CI (``.ci/run``) makes the shared fixtures required."""


def fixtures_required() -> bool:
    """Whether missing shared fixtures fail the run: ``FITPROF_REQUIRE_FIXTURES`` set to a true value (``1``,
    ``true``, ``yes``, ``on``). ``CI`` is not read: GitHub Actions sets it on every fork, where the fixtures are
    not beside the clone."""
    return os.environ.get(REQUIRE_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def missing_shared() -> list[Path]:
    """The shared Kineto fixtures that are not there (all of them when the folder is missing)."""
    return [KINETO_DIR / name for name in SHARED_KINETO if not (KINETO_DIR / name).is_file()]


def shared_kineto(name: str | None = None) -> Path:
    """The path of one shared Kineto fixture (or of their folder when ``name`` is None).

    Skips the calling test with :data:`SKIP_REASON` when any of them is missing (one reason, one place, so that
    ``pytest -ra`` folds every such skip into one line); fails it, naming the missing files, where they are required
    (:func:`fixtures_required`).
    """
    if missing_shared():
        _fail_if_required()
        pytest.skip(SKIP_REASON)
    if name is not None and name not in SHARED_KINETO:
        raise ValueError(f"{name!r} is not one of the shared Kineto fixtures {SHARED_KINETO}")
    return KINETO_DIR if name is None else KINETO_DIR / name

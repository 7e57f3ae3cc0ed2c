"""Shared test settings: quiet TensorFlow, the examples on sys.path, the shared fixtures folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TESTS = ROOT / "tests"
for p in (EXAMPLES, TESTS):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

FIXTURES = ROOT.parent / "shared" / "fixtures"


@pytest.fixture(scope="session")
def kineto_fixtures() -> Path:
    """``../shared/fixtures/kineto`` beside the checkout (CI lays it there)."""
    path = FIXTURES / "kineto"
    if not path.is_dir():
        pytest.skip(f"shared fixtures not found at {path}")
    return path

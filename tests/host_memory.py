"""The process's resident memory, for the tests that check a long profiled fit does not grow."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

needs_statm = pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
"""Skips a test where Linux's ``/proc/self/statm`` is missing."""


def rss_mb() -> float:
    """This process's resident set now, in MB (1e6 bytes): the second field of ``/proc/self/statm``, in pages."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

"""Warnings a test provokes, caught where they are raised."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


def fitprof_messages(fn: Callable[[], Any]) -> list[str]:
    """Call ``fn`` with every warning recorded (``"always"``: a repeat is not hidden by Python's once-per-place
    filter); returns the messages that mention fitprof, in order."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if "fitprof" in str(w.message).lower()]

"""Lazy availability checks for the optional frameworks, with the install line that fixes each."""

from __future__ import annotations

import importlib
from types import ModuleType

_HINTS = {
    "tensorflow": "pip install 'fitprof[keras]' tensorflow  (or tensorflow-cpu)",
    "keras": "pip install 'fitprof[keras]'",
    "torch": "pip install 'fitprof[lightning]'",
    "lightning": "pip install 'fitprof[lightning]'",
    "xprof": "pip install xprof",
}


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` or raise ``ModuleNotFoundError`` naming ``feature`` and the ``pip install`` that fixes it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        hint = _HINTS.get(module.split(".")[0], f"pip install {module}")
        raise ModuleNotFoundError(f"{feature} needs `{module}`, which is not installed: {hint}") from err

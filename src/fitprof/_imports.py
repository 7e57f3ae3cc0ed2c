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
    "tensorboard": "pip install tensorboard",
    "dask": "pip install 'fitprof[dask]'",
    "distributed": "pip install 'fitprof[dask]'",
    "mcp": "pip install 'fitprof[mcp]'",
    "mcp_types": "pip install 'fitprof[mcp]'",
}


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` or raise ``ModuleNotFoundError`` naming the package that is really missing and the
    ``pip install`` that fixes it.

    The missing package is the one the import failed on (``ModuleNotFoundError.name``), which is not always
    ``module``: Keras installed without its backend fails on ``tensorflow`` (or ``torch``), and the message
    says so rather than "keras is not installed".

    Raises:
        ModuleNotFoundError: ``"<feature> needs `<missing>`, which is not installed: <pip install ...>"``, with the
            original error as its cause and ``name`` set to the missing package.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        missing = (err.name or module).split(".")[0]
        hint = _HINTS.get(missing, f"pip install {missing}")
        via = "" if missing == module.split(".")[0] else f" (imported by `{module}`)"
        raise ModuleNotFoundError(
            f"{feature} needs `{missing}`{via}, which is not installed: {hint}", name=missing
        ) from err

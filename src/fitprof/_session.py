"""Where profile files go: ``<log_dir>/plugins/profile/<session>/``, one new session folder per window."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path


def hostname() -> str:
    """This machine's host name, as the profilers name their files."""
    return socket.gethostname() or "localhost"


def new_session_dir(log_dir: str | os.PathLike[str]) -> Path:
    """Create and return a fresh session folder under ``<log_dir>/plugins/profile/``.

    Named like TensorFlow's (``YYYY_MM_DD_HH_MM_SS``, which xprof sorts by), with ``_1``, ``_2``, ... added
    when a folder of that second exists already, so two windows never share a session folder.

    Raises:
        OSError: if the folder cannot be created.
    """
    root = Path(log_dir) / "plugins" / "profile"
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y_%m_%d_%H_%M_%S")
    for i in range(1000):
        candidate = root / (stamp if i == 0 else f"{stamp}_{i}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise OSError(f"could not create a new session folder under {root}")

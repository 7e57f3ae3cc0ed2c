"""Where profile files go: ``<log_dir>/plugins/profile/<session>/``, one new session folder per window."""

from __future__ import annotations

import datetime
import os
import socket
import time
from pathlib import Path


def hostname() -> str:
    """This machine's host name, as the profilers name their files."""
    return socket.gethostname() or "localhost"


def session_taken(log_dir: str | os.PathLike[str], name: str) -> bool:
    """Whether a window of ``log_dir`` already used session ``name``: its folder exists, or its report file
    does (the folder of an old window may have been removed by ``keep_last_windows``; its report stays)."""
    root = Path(log_dir)
    return (root / "plugins" / "profile" / name).exists() or any(
        (root / "plugins" / "fitprof").glob(f"{name}.rank*.json")
    )


def new_session_dir(log_dir: str | os.PathLike[str]) -> Path:
    """Create and return a fresh session folder under ``<log_dir>/plugins/profile/``.

    Named like TensorFlow's (``YYYY_MM_DD_HH_MM_SS``, which xprof sorts by), with ``_1``, ``_2``, ... added
    when that name is taken (:func:`session_taken`), so two windows never share a session folder or a report.

    Raises:
        OSError: if the folder cannot be created.
    """
    root = Path(log_dir) / "plugins" / "profile"
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y_%m_%d_%H_%M_%S")
    for i in range(1000):
        candidate = root / (stamp if i == 0 else f"{stamp}_{i}")
        if session_taken(log_dir, candidate.name):
            continue
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise OSError(f"could not create a new session folder under {root}")


def session_name(directory: str | os.PathLike[str] | None = None, suffix: str = "") -> str:
    """A session name ``YYYY_MM_DD_HH_MM_SS[_suffix]`` (TF's run-folder format), unique in ``directory``.

    Timestamps have one-second resolution, so when ``<directory>/<name>`` exists already ``_2``, ``_3``, ...
    is appended until it does not.
    """
    name = datetime.datetime.now().strftime("%Y_%m_%d_%H_%M_%S")
    if suffix:
        name = f"{name}_{suffix}"
    if directory is None:
        return name
    base, n = name, 2
    while (Path(directory) / name).exists():
        name = f"{base}_{n}"
        n += 1
    return name

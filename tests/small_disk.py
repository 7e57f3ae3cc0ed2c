"""A real full disk for a test: a 4 MB tmpfs, nearly full. Mounting needs root (this project's machines and CI run
tests as root); elsewhere the test skips and says why."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SIZE = 4 * 1024 * 1024
FREE = 40 * 1024
"""Bytes left free: less than one window's trace of the tests' tiny models, more than a few report lines."""


@contextlib.contextmanager
def nearly_full_disk(folder: Path) -> Iterator[Path]:
    """``folder``, a fresh tmpfs of :data:`SIZE` bytes with :data:`FREE` bytes free, unmounted afterwards; skips the
    test where a tmpfs cannot be mounted."""
    folder.mkdir(parents=True)
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("a full disk needs a tmpfs mount: mount(8) as root, which this process is not")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.decode(errors='replace').strip()}")
    try:
        with open(folder / "filler", "wb") as fh:
            fh.write(b"\0" * (SIZE - FREE))
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def open_below(folder: Path) -> list[str]:
    """The files below ``folder`` this process holds open (deleted ones too: their space is not given back)."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [n for n in names if n.startswith(str(folder))]

"""Files that appear whole or not at all.

A run can be killed at any instant (the OOM killer, a preempted node). A file written straight to its final name
is then left half written under that name, and every reader of the log folder trips over it. So every file
fitprof leaves is written to a temporary name in its own folder (:func:`temporary_name`) and renamed into place
(``os.replace``, atomic within one filesystem): a kill leaves the previous file or none, plus at worst a
temporary file that no reader picks up (:func:`is_temporary`; its name ends in neither ``.json`` nor ``.pb``).

Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

_TMP_MARK = ".fitprof-tmp-"


def temporary_name(path: str | os.PathLike[str]) -> Path:
    """A name beside ``path`` for writing it: ``.<name>.fitprof-tmp-<pid>`` (hidden, and unique per process)."""
    p = Path(path)
    return p.with_name(f".{p.name}{_TMP_MARK}{os.getpid()}")


def is_temporary(name: str) -> bool:
    """Whether the file name (or ``/``-separated path) ``name`` is a file still being written (or left by a
    killed writer): never read, never copied."""
    return _TMP_MARK in name.rpartition("/")[2]


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """The temporary path to write ``path``'s content to; renamed to ``path`` when the block ends without an
    exception, deleted when it raises.

    Raises:
        OSError: if the rename fails (the temporary file is deleted).
    """
    final = Path(path)
    tmp = temporary_name(final)
    try:
        yield tmp
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def open_atomic(path: str | os.PathLike[str], mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """``open(path, mode)`` whose content appears at ``path`` only once the block has ended and the file is
    closed (see :func:`writing`)."""
    with writing(path) as tmp, open(tmp, mode, **kwargs) as fh:
        yield fh


def write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """``Path(path).write_text(text)``, atomically (see :func:`writing`).

    Raises:
        OSError: if the file cannot be written.
    """
    with open_atomic(path, "w", encoding=encoding) as fh:
        fh.write(text)


def move_into_place(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Move the finished file ``src`` to ``dst``, atomically even across filesystems (``shutil.move`` copies
    to the final name there): renamed when it can be, else copied to a temporary name beside ``dst`` and renamed.

    Raises:
        OSError: if it can be neither renamed nor copied.
    """
    try:
        os.replace(src, dst)
        return
    except OSError:
        pass  # another filesystem (EXDEV), or a folder rename() refuses: copy, then rename
    with writing(dst) as tmp:
        shutil.copyfile(src, tmp)
    with contextlib.suppress(OSError):
        os.unlink(src)


__all__ = ["is_temporary", "move_into_place", "open_atomic", "temporary_name", "write_text", "writing"]

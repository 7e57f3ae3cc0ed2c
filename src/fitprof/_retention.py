"""Bounded disk use: a size warning per trace file and keeping only the last N windows' trace files."""

from __future__ import annotations

import logging
import os
import shutil
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MAX_TRACE_MB = 100.0
"""A window's trace file above this many MB gets a warning naming it (5 steps of a small model: ~20-60 KB)."""


def oversize_message(path: str | os.PathLike[str], max_trace_mb: float | None) -> str | None:
    """A warning naming ``path`` when it is larger than ``max_trace_mb`` MB, else None."""
    if max_trace_mb is None:
        return None
    try:
        size_mb = Path(path).stat().st_size / 1e6
    except OSError:
        return None
    if size_mb <= max_trace_mb:
        return None
    return (
        f"fitprof: the trace {path} is {size_mb:.1f} MB, over max_trace_mb={max_trace_mb:g}. Profile fewer "
        "steps (profile_batch) or fewer epochs (every_n_epochs), or raise max_trace_mb."
    )


class WindowFiles:
    """The trace files of the windows this process wrote, oldest first; keeps only the last ``keep`` windows.

    Report files (``plugins/fitprof/*.json``) and logged scalars are never removed, so ``fitprof report``
    and TensorBoard's Scalars tab still show every window. A session folder left with no ``.xplane.pb`` (only
    xprof's cache files) is removed with them, so the Profile tab lists no empty session.
    """

    def __init__(self, keep: int | None) -> None:
        self.keep = keep
        self._windows: deque[tuple[Path | None, list[Path]]] = deque()
        self._doomed: list[tuple[Path | None, list[Path]]] = []  # beyond keep, deleted once nothing holds them

    def add(
        self,
        session_dir: str | os.PathLike[str] | None,
        files: Iterable[str | os.PathLike[str]],
        *,
        busy: Callable[[Path], bool] | None = None,
    ) -> list[Path]:
        """Record one window's files; delete the oldest windows' files beyond ``keep``. Returns what was deleted.

        ``busy(path)``: whether a file must be kept for now (the background converter still reads it); such a
        window is deleted by a later :meth:`add` or :meth:`prune`, once nothing holds it.
        """
        self._windows.append((Path(session_dir) if session_dir else None, [Path(f) for f in files]))
        while self.keep is not None and len(self._windows) > self.keep:
            self._doomed.append(self._windows.popleft())
        return self.prune(busy)

    def prune(self, busy: Callable[[Path], bool] | None = None) -> list[Path]:
        """Delete the files of the windows beyond ``keep`` that nothing holds any more (see :meth:`add`)."""
        removed: list[Path] = []
        kept: list[tuple[Path | None, list[Path]]] = []
        for session, files_ in self._doomed:
            if busy is not None and any(busy(f) for f in files_):
                kept.append((session, files_))
                continue
            for f in files_:
                try:
                    f.unlink()
                    removed.append(f)
                except FileNotFoundError:
                    pass
                except OSError as err:
                    log.warning("fitprof: could not remove the old trace %s: %s", f, err)
            if session is not None and session.is_dir() and not any(session.glob("*.xplane.pb")):
                shutil.rmtree(session, ignore_errors=True)
                removed.append(session)
        self._doomed = kept
        return removed

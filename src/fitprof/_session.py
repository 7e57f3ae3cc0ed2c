"""Where fitprof's files go and what they are called, in one place (stdlib only).

Inside a run directory ``<log_dir>``:

* ``plugins/profile/<session>/<host>[_rank<r>].xplane.pb``: one session folder per window (TensorBoard's
  Profile tab); ``_rank<r>`` when the run has several ranks, so ranks on one host never collide;
* ``<host>_rank<r>.<session>.pt.trace.json.gz``: the Kineto trace of a torch window;
* ``plugins/fitprof/<session>.rank<r>.json``: the report of one window and rank (:mod:`fitprof.report_files`).

A session is named ``YYYY_MM_DD_HH_MM_SS_epoch<N>`` (TensorFlow's run-folder format, which xprof sorts by, and the
0-based epoch), with ``_2``, ``_3``, ... added when that name is taken (:func:`session_taken`).
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

PROFILE_DIR = ("plugins", "profile")
"""Where session folders live inside a run directory (where TensorBoard's Profile tab looks)."""
REPORTS_DIR = ("plugins", "fitprof")
"""Where report files live inside a run directory."""
KINETO_SUFFIX = ".pt.trace.json.gz"
XPLANE_SUFFIX = ".xplane.pb"
_RANK_SUFFIX = re.compile(r"^(.*)_rank(\d+)$")


def hostname() -> str:
    """This machine's host name, as the profilers name their files (``"localhost"`` when it has none)."""
    return socket.gethostname() or "localhost"


def with_rank(host: str, rank: int) -> str:
    """``<host>_rank<rank>``: the name of one rank's files."""
    return f"{host}_rank{int(rank)}"


def rank_host(host: str, rank: int, world_size: int) -> str:
    """The host name of one rank's ``.xplane.pb``: ``<host>_rank<rank>`` when ``world_size`` > 1, else ``host``."""
    return with_rank(host, rank) if world_size > 1 else host


def split_rank(name: str) -> tuple[str, int | None]:
    """``("host", 3)`` from ``"host_rank3"``; ``(name, None)`` when ``name`` has no ``_rank<N>`` suffix."""
    m = _RANK_SUFFIX.match(name)
    return (m.group(1), int(m.group(2))) if m else (name, None)


def check_session(session: object) -> str:
    """``session`` if it is a plain folder name (what a session is), else :class:`ValueError`.

    A plain name has no ``/``, ``\\`` or NUL, no leading or trailing space, and is not empty, ``.`` or ``..``,
    so that ``plugins/profile/<session>`` and ``plugins/fitprof/<session>.rank<r>.json`` stay inside the run
    folder, whoever chose the name (a report file read back may have been tampered with).
    """
    if (
        not isinstance(session, str)
        or session in ("", ".", "..")
        or any(c in session for c in "/\\\0")
        or session != session.strip()
        or os.path.isabs(session)
    ):
        raise ValueError(
            f"session {session!r} is not a plain folder name (allowed: a non-empty name without '/', '\\', NUL, "
            "leading or trailing spaces, other than '.' and '..')"
        )
    return session


def kineto_trace_name(session: str, rank: int, host: str | None = None) -> str:
    """``<host>_rank<rank>.<session>.pt.trace.json.gz`` (two nodes never collide).

    Raises:
        ValueError: if ``session`` is not a plain folder name (:func:`check_session`).
    """
    return f"{with_rank(host or hostname(), rank)}.{check_session(session)}{KINETO_SUFFIX}"


def report_file_name(session: str, rank: int) -> str:
    """``<session>.rank<rank>.json``.

    Raises:
        ValueError: if ``session`` is not a plain folder name (:func:`check_session`).
    """
    return f"{check_session(session)}.rank{int(rank)}.json"


def profile_root(log_dir: str | os.PathLike[str]) -> Path:
    """``<log_dir>/plugins/profile``."""
    return Path(log_dir).joinpath(*PROFILE_DIR)


def session_taken(log_dir: str | os.PathLike[str], name: str) -> bool:
    """Whether a window of ``log_dir`` already used session ``name``: its folder, a report file or a Kineto trace
    of it exists (the folder and trace of an old window may have been removed by ``keep_last_windows``; its
    report stays)."""
    root = Path(log_dir)
    return (
        (profile_root(root) / name).exists()
        or any(root.joinpath(*REPORTS_DIR).glob(f"{name}.rank*.json"))
        or any(root.glob(f"*.{name}.pt.trace.json*"))
    )


def session_name(log_dir: str | os.PathLike[str], epoch: int, suffix: str = "") -> str:
    """A session name no window of ``log_dir`` has used: ``YYYY_MM_DD_HH_MM_SS_epoch<epoch><suffix>[_<n>]``.

    ``suffix`` says why the window was taken (:func:`trigger_suffix`); empty for a scheduled window.

    Timestamps have one-second resolution, so when the name is taken (:func:`session_taken`) ``_2``, ``_3``, ...
    is appended until it is not. Nothing is created.
    """
    base = f"{time.strftime('%Y_%m_%d_%H_%M_%S')}_epoch{int(epoch)}{suffix}"
    name, n = base, 2
    while session_taken(log_dir, name):
        name = f"{base}_{n}"
        n += 1
    return name


def trigger_suffix(step: int) -> str:
    """``_trigger_step<step>``: the session-name suffix of a window the slowdown trigger opened after ``step``
    (1-based, in the epoch), so the Profile tab's session list says why the window was taken."""
    return f"_trigger_step{int(step)}"


_TRIGGER_SESSION = re.compile(r"_epoch\d+_trigger_step(\d+)(?:_\d+)?$")


def trigger_step(session: str) -> int | None:
    """The step ``S`` after which the slowdown trigger opened the window of session ``session``
    (``..._epoch<N>_trigger_step<S>[_<n>]``, see :func:`trigger_suffix`); None for a scheduled window."""
    m = _TRIGGER_SESSION.search(session)
    return int(m.group(1)) if m else None


def new_session_dir(log_dir: str | os.PathLike[str], epoch: int, suffix: str = "") -> Path:
    """Create and return a fresh session folder ``<log_dir>/plugins/profile/<session_name(...)>`` (``suffix``: as
    :func:`session_name`'s, e.g. :func:`trigger_suffix`).

    Raises:
        OSError: if the folder cannot be created.
    """
    root = profile_root(log_dir)
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(1000):
        candidate = root / session_name(log_dir, epoch, suffix)
        try:
            candidate.mkdir()
        except FileExistsError:  # another rank or process took it in between
            continue
        return candidate
    raise OSError(f"could not create a new session folder under {root}")

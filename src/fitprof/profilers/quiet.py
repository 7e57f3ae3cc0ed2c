"""Keep the profilers' own start/stop log lines out of the progress bar, and nothing else (stdlib only).

TensorFlow's profiler and Kineto (torch.profiler) write a few lines of their own from C++, straight to file
descriptor 2, every time a window starts and stops (seen on TensorFlow 2.21 and torch 2.13)::

    I0000 00:00:1796105124.832954   30119 profiler_session.cc:117] Profiler session initializing.
    I0000 00:00:1796105124.832990   30119 profiler_session.cc:132] Profiler session started.
    I0000 00:00:1796105124.899426   30119 profiler_session.cc:81] Profiler session collecting data.
    I0000 00:00:1796105124.899758   30119 profiler_session.cc:150] Profiler session tear down.
    I0000 00:00:1796105124.904303   30119 save_profile.cc:150] Collecting XSpace to repository: /tmp/.../vm.xplane.pb
    USDT:2026-12-01 06:05:10 29894:29894 SyncActivityProfilerHandler.cpp:52] profiler_start
    USDT:2026-12-01 06:05:10 29894:29894 SyncActivityProfilerHandler.cpp:59] profiler_stop

Python's ``logging`` and ``warnings`` never see them, and each framework reads its log level once per process
(``TF_CPP_MIN_LOG_LEVEL`` at import, ``KINETO_LOG_LEVEL`` at the first profile), so a level cannot hide them for
fitprof's windows alone. :func:`quiet_profiler_lines` therefore points fd 2 at a temporary file for the duration of
one profiler start or stop call, then puts fd 2 back and writes every captured line that is not one of the lines
above (:data:`NOISE`, matched line by line, informational severity only) back to fd 2: warnings and errors, the
profilers' or anyone else's, still reach the terminal, after the call instead of during it.

Set ``FITPROF_QUIET_PROFILER=0`` in the environment (read at every call) to leave fd 2 alone. Nothing is quieted
where fd 2 cannot be duplicated (closed, as under some notebook servers) or while another thread is inside a quieted
call. The temporary file is ``$TMPDIR/fitprof-stderr-*.txt``; it is deleted once its lines are written back, so if
the process dies inside a profiler call (a crash in the framework's C++), what it wrote is still in that file.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import IO

ENV_VAR = "FITPROF_QUIET_PROFILER"
"""The environment variable that turns quieting off: ``0``, ``false``, ``no`` or ``off`` (any case)."""

_OFF = frozenset({"0", "false", "no", "off"})

NOISE = re.compile(
    rb"(?:"
    # TensorFlow/absl informational lines: severity I, date, time, thread id, file:line] text.
    rb"I\d{4} [\d:.]+ +\d+ (?:"
    rb"profiler_session\.cc:\d+\] Profiler session (?:initializing|started|collecting data|tear down)\."
    rb"|save_profile\.cc:\d+\] Collecting XSpace to repository: [^\r\n]*"
    # logged by TensorFlow's C++ as it is imported, before it reads TF_CPP_MIN_LOG_LEVEL (once per library)
    rb"|port\.cc:\d+\] oneDNN custom operations are on\.[^\r\n]*"
    rb")"
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    # Kineto's USDT trace points around each profile.
    rb"|USDT:[\d: -]+ \d+:\d+ SyncActivityProfilerHandler\.cpp:\d+\] profiler_(?:start|stop)"
    rb")\r?\n?\Z"
)
"""One captured line (bytes, with its line end) that is profiler noise. Anything else is written back."""

_lock = threading.Lock()


def enabled() -> bool:
    """Whether quieting is on: ``$FITPROF_QUIET_PROFILER`` unset or anything but ``0``/``false``/``no``/``off``."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in _OFF


def kept(captured: bytes) -> bytes:
    """``captured`` without its :data:`NOISE` lines: every other line, in order, byte for byte (a last line without
    its line end included)."""
    return b"".join(line for line in captured.splitlines(keepends=True) if not NOISE.match(line))


def _flush_stderr() -> None:
    # Python's own buffered text goes out on the side of the redirect it was written on.
    with contextlib.suppress(Exception):
        if sys.stderr is not None:
            sys.stderr.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@contextlib.contextmanager
def quiet_profiler_lines() -> Iterator[None]:
    """Hold back the :data:`NOISE` lines written to fd 2 inside the ``with`` block; write back everything else.

    Wrap only a profiler's own start or stop call, or the first ``import tensorflow`` (whose C++ writes its
    oneDNN line, whatever ``TF_CPP_MIN_LOG_LEVEL`` says): other threads' writes to fd 2 during the block are delayed
    until it ends (never dropped unless they are noise lines). Exceptions raised in the block propagate unchanged,
    after fd 2 is restored and the captured lines are written back. When quieting is off (:func:`enabled`) or fd 2
    cannot be redirected, the block runs with fd 2 untouched.
    """
    if not enabled() or not _lock.acquire(blocking=False):
        yield
        return
    try:
        saved, sink = _redirect()
    except Exception:
        _lock.release()
        yield
        return
    try:
        yield
    finally:
        try:
            _flush_stderr()
            restored = _restore(saved)
            if restored:  # else fd 2 still points at the file: keep it, with everything in it
                _write_back(sink)
        finally:
            _lock.release()


def _restore(saved: int) -> bool:
    """Point fd 2 back where ``saved`` (a duplicate of it) points and close ``saved``; False if that failed."""
    try:
        os.dup2(saved, 2)
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.close(saved)
    return True


def _redirect() -> tuple[int, IO[bytes]]:
    """Point fd 2 at a new temporary file; return a duplicate of the old fd 2 and the file."""
    _flush_stderr()
    saved = os.dup(2)
    try:
        sink = tempfile.NamedTemporaryFile(prefix="fitprof-stderr-", suffix=".txt", delete=False)  # noqa: SIM115
    except Exception:
        os.close(saved)
        raise
    try:
        os.dup2(sink.fileno(), 2)
    except Exception:
        sink.close()
        with contextlib.suppress(OSError):
            os.unlink(sink.name)
        os.close(saved)
        raise
    return saved, sink


def _write_back(sink: IO[bytes]) -> None:
    """Write the captured lines that are not noise to the restored fd 2, then delete the file. If writing them
    fails, the file is kept (its lines are not lost)."""
    try:
        sink.seek(0)
        rest = kept(sink.read())
        sink.close()
        if rest:
            _write_all(2, rest)
    except Exception:
        with contextlib.suppress(Exception):
            sink.close()
        return
    with contextlib.suppress(OSError):
        os.unlink(sink.name)

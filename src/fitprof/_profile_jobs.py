"""The ``.xplane.pb`` conversions still to be done, as files on disk beside their targets, and the wait for them.

The end of a ``fit`` does not wait for the ``.xplane.pb`` of its last windows (only TensorBoard's Profile tab reads
them): the background converter (:mod:`fitprof.fit.xplane_worker`) finishes them after ``fit`` returns, in a
process of its own session that outlives the training process. So that no conversion is lost when that process is
killed or the machine restarts, each one is written down before it is handed over: a *job file*
``plugins/profile/<session>/.<host>.xplane.pb.fitprof-tmp-job`` beside its target, holding the trace, the target and
its *owner*, the process that will write it (the training process while the fit runs, the converter once the fit
has handed it over). The converter deletes the job file once the target is written (or could not be).

A job file whose owner is gone is *left over*. It is finished by:

* the next ``fit`` that profiles into the same log directory (in a background process; one warning names the files),
* ``fitprof report`` on a folder above it (one line on stderr names them),
* :func:`wait_for_profiles`.

The job file's name carries fitprof's temporary mark (:func:`fitprof._atomic.is_temporary`), so no reader picks it
up and a remote mirror never copies it.

Stdlib only at import (the converter is imported when a left-over job is finished in this process).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from fitprof._atomic import open_atomic

JOB_SUFFIX = ".fitprof-tmp-job"
"""The end of a job file's name: ``.<host>.xplane.pb`` + this."""

DEFAULT_TIMEOUT_S = 120.0
"""How long :func:`wait_for_profiles` waits by default (s)."""

POLL_S = 0.05
"""How often :func:`wait_for_profiles` looks at the job files (s)."""

NOBODY = 0
"""The owner of a job no process has taken: left over at once."""


def job_path(target: str | os.PathLike[str]) -> Path:
    """The job file of the ``.xplane.pb`` ``target``."""
    t = Path(target)
    return t.with_name(f".{t.name}{JOB_SUFFIX}")


def target_of(job: Path) -> Path:
    """The ``.xplane.pb`` a job file stands for."""
    return job.with_name(job.name[1 : -len(JOB_SUFFIX)])


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return ""


def _stat(pid: int) -> list[str]:
    """The fields of Linux's ``/proc/<pid>/stat`` after the command name (state first), [] where unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace").rpartition(")")[2].split()
    except OSError:
        return []


def _start_ticks(pid: int) -> str:
    """The process's start time since boot (``/proc/<pid>/stat``, field 22), "" where unknown: with the pid and the
    boot, it tells the owner from a later process given the same pid."""
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else ""


def owner_record(pid: int) -> dict[str, Any]:
    """Who owns a job: ``pid`` (:data:`NOBODY`: no one), the machine's boot and the process's start time."""
    return {"owner": pid, "boot": _boot_id(), "started": _start_ticks(pid) if pid != NOBODY else ""}


def write_job(target: str | os.PathLike[str], job: dict[str, Any], owner: int) -> Path:
    """Write (or rewrite) the job file of ``target``: ``job`` (``trace``, ``run_dir``, ``session``, ``host``) and its
    owner. Written whole or not at all.

    Raises:
        OSError: the file could not be written.
    """
    path = job_path(target)
    with open_atomic(path, "w", encoding="utf-8") as f:
        json.dump({**job, **owner_record(owner)}, f)
    return path


def read_job(path: Path) -> dict[str, Any] | None:
    """A job file's content, None when it is gone or unreadable."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def owner_alive(doc: dict[str, Any]) -> bool:
    """Whether the job's owner still runs (the same process: same boot, same start time where they are known)."""
    pid = doc.get("owner")
    if not isinstance(pid, int) or pid == NOBODY:
        return False
    if doc.get("boot") and doc.get("boot") != _boot_id():
        return False  # the machine restarted since
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process holds the pid
    except OSError:
        return False
    fields = _stat(pid)
    if fields and fields[0] in ("Z", "X"):
        return False  # it has exited; its parent has not reaped it yet
    started = doc.get("started")
    return not started or started == (fields[19] if len(fields) > 19 else "")


def find_jobs(root: str | os.PathLike[str]) -> list[Path]:
    """The job files below ``root`` (any depth), sorted."""
    found = []
    for folder, _, names in os.walk(root):
        found += [Path(folder, n) for n in names if n.endswith(JOB_SUFFIX) and n.startswith(".")]
    return sorted(found)


def left_over(root: str | os.PathLike[str]) -> list[tuple[Path, dict[str, Any]]]:
    """The job files below ``root`` whose owner is gone, with their content."""
    out = []
    for path in find_jobs(root):
        doc = read_job(path)
        if doc is None:
            continue
        if not owner_alive(doc):
            out.append((path, doc))
    return out


def remove_job(path: Path) -> None:
    """Delete a job file (gone already: nothing to do)."""
    with contextlib.suppress(OSError):
        path.unlink()


def finish_here(root: str | os.PathLike[str]) -> tuple[list[Path], list[str]]:
    """Convert, in this process, every left-over job below ``root``.

    Returns:
        ``(written, failed)``: the ``.xplane.pb`` written, and one ``"<target> (<why>)"`` per job that could not be
        (its job file is removed: its trace, report and figures are kept).
    """
    written: list[Path] = []
    failed: list[str] = []
    for path, doc in left_over(root):
        # take the job: a second finisher (another command, the next fit) now sees a live owner
        try:
            write_job(target_of(path), {k: doc[k] for k in ("trace", "run_dir", "session", "host")}, os.getpid())
        except (OSError, KeyError) as err:
            failed.append(f"{target_of(path)} ({err!r})")
            remove_job(path)
            continue
        try:
            from fitprof.traces.xspace_write import write_xspace

            written.append(write_xspace(doc["trace"], doc["run_dir"], doc["session"], host=doc["host"]))
        except Exception as err:  # a missing or broken trace: name it, never raise from a clean-up
            failed.append(f"{target_of(path)} ({err!r})")
        finally:
            remove_job(path)
    return written, failed


def leftover_line(written: list[Path], failed: list[str], *, by: str) -> str | None:
    """The one line that says which left-over conversions ``by`` finished, None when there were none."""
    if not written and not failed:
        return None
    parts = []
    if written:
        parts.append(
            f"wrote {len(written)} .xplane.pb left unconverted by an earlier fit: " + ", ".join(map(str, written))
        )
    if failed:
        parts.append(f"could not write {len(failed)}: " + ", ".join(failed))
    return f"fitprof: {by} " + "; ".join(parts)


def wait_for_profiles(log_dir: str | os.PathLike[str], timeout: float = DEFAULT_TIMEOUT_S) -> list[Path]:
    """Wait until every ``.xplane.pb`` conversion below ``log_dir`` is done.

    ``fit`` returns without waiting for the ``.xplane.pb`` of its last windows (TensorBoard's Profile tab reads them;
    the logged figures and report files are written before ``fit`` returns): a background process of its own writes
    them, and it outlives the training process. Call this in a test or a notebook before reading those files.
    Conversions that process was not there to finish (it was killed, the machine restarted) are done here, in this
    process.

    Args:
        log_dir: the callback's log directory, or any folder above it (searched at any depth). A URL log directory
            has nothing to wait for: ``fit`` copies the finished files there before it returns.
        timeout: the most seconds to wait (>= 0); left-over conversions done here count towards it only while
            they run.

    Returns:
        The ``.xplane.pb`` files that were pending when the call began and are now written, sorted (empty when none
        was pending). A conversion that failed is named in one warning of the converter and left out.

    Raises:
        ValueError: ``timeout`` is negative or not a number.
        FileNotFoundError: ``log_dir`` is a local path that does not exist.
        TimeoutError: conversions still run after ``timeout`` seconds; the message names their files.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    text = os.fspath(log_dir)
    if "://" in text and not text.startswith("file://"):
        return []
    if text.startswith("file://"):
        from urllib.parse import unquote, urlparse

        text = unquote(urlparse(text).path)
    root = Path(text)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such log folder")
    deadline = time.monotonic() + timeout
    targets = {target_of(p) for p in find_jobs(root)}
    while True:
        finish_here(root)
        pending = find_jobs(root)
        if not pending:
            break
        targets |= {target_of(p) for p in pending}
        if time.monotonic() >= deadline:
            names = ", ".join(str(target_of(p)) for p in pending)
            raise TimeoutError(
                f"{len(pending)} .xplane.pb conversion(s) below {root} still running after {timeout:g} s: {names}"
            )
        time.sleep(POLL_S)
    return sorted(t for t in targets if t.is_file())

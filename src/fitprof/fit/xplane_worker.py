"""The ``.xplane.pb`` of each Kineto window, written off the training path by one background process per rank.

Only TensorBoard's Profile tab reads the ``.xplane.pb``; the logged figures and the report file come from the trace
itself. Converting a 10^5-event window costs seconds of Python work, so the epoch-end pipeline hands it to a
:class:`XplaneWorker` and training goes on:

* **A process, not a thread:** the conversion is Python work that would hold the GIL against the training loop and
  its data loading. The process is a fresh interpreter running this file (:data:`_BOOT`), never a fork of the
  training process (forking a process that holds torch or TensorFlow threads is unsafe), and it does not import the
  user's ``__main__`` (``multiprocessing``'s ``spawn`` and ``forkserver`` do, and would run an unguarded training
  script a second time). It runs at low priority (``os.nice(10)``), is started when a fit that profiles Kineto
  windows starts (:meth:`XplaneWorker.start`: spawning it at an epoch's end would add the spawn, 7-25 ms of wall
  time measured on a busy 2-core machine, to the time the training loop waits there) or else at the first
  conversion, and is kept until the end of the ``fit``. It starts on the standard library alone (about 0.05 s of
  CPU) and loads the converter (fitprof and pandas, about 0.8 s) at its first job, so that loading never competes
  with the steps before the first window's end.
* **Bounded queue, never blocking:** one conversion runs and at most :data:`MAX_WAITING` wait. A window that ends
  while the queue is full pushes out the oldest waiting one (the newest windows are the ones worth seeing); the
  pushed-out window keeps its trace, report and figures, and one warning a fit names it. A waiting conversion whose
  window ``keep_last_windows`` deletes is dropped with it. Handing a job over never waits for the process.
* **The end of the fit waits for none of it** (:meth:`XplaneWorker.end_of_fit`): the waiting conversions are
  written into the process's input, its input is closed, and ``fit`` returns; the process finishes them and exits.
  It runs in a session of its own (``start_new_session``: a signal to the training process's group, such as a
  terminal's Ctrl-C or a job runner stopping a script, does not reach it), it is no daemon of the training process,
  and a closed pipe whose lines were all written still yields those lines, so a script that exits right after
  ``fit`` still gets its ``.xplane.pb``. :func:`fitprof.wait_for_profiles` waits for the files. With the environment
  variable :data:`WAIT_ENV` set (not ``0``), the end of the fit waits for them instead, up to ``timeout_s``
  (:data:`FINISH_TIMEOUT_S` by default), then stops the process.
* **Nothing is lost:** each conversion is written down in a job file beside its target before it is handed over
  (:mod:`fitprof._profile_jobs`), owned by the training process and, once sent to the process, by the process. A
  job whose owner is gone (the process was killed after the fit, the machine restarted) is finished by the next fit
  that profiles into the same log directory (:meth:`XplaneWorker.adopt`, in a background process, one warning
  naming the files), by ``fitprof report``, or by :func:`fitprof.wait_for_profiles`. A job whose job file is gone
  when its turn comes (its run folder was deleted) is skipped: writing it would create the folder again.
* **A crash or kill** of the process during the fit loses only the ``.xplane.pb`` it was writing (one warning); the
  trace, the report, the scalars and training are untouched, and the next window starts a new process. The file is
  written under a temporary name and renamed (:func:`fitprof.traces.xspace_write.write_xspace`), so a remote mirror
  never copies a half file. A URL log directory's mirror waits for the files before its last copy
  (:meth:`fitprof._fs.Mirror.close`), so they reach the URL.

Stdlib only at import (the conversion modules are imported in the worker process).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

FINISH_TIMEOUT_S = 120.0
"""How long the end of a ``fit`` waits for the pending ``.xplane.pb`` conversions when :data:`WAIT_ENV` is set (s)."""

WAIT_ENV = "FITPROF_WAIT_FOR_PROFILES"
"""An environment variable: set (and not ``0``), the end of a ``fit`` waits for its ``.xplane.pb`` conversions (up to
the timeout) as :func:`fitprof.wait_for_profiles` would, for scripts and test suites that read them right after."""

MAX_WAITING = 2
"""How many conversions may wait behind the running one (the last windows of a fit whose epochs are shorter than a
conversion, e.g. ``keep_last_windows=2``)."""

NICE = 10
"""The worker's ``os.nice`` increment: it yields the cores to training."""


@dataclass
class Job:
    """One conversion: the Kineto ``trace`` to ``<run_dir>/plugins/profile/<session>/<host>.xplane.pb``.

    Attributes:
        epoch: the window's epoch (for messages).
        trace: the gzipped Kineto trace (read, never changed).
        run_dir, session, host: where :func:`~fitprof.traces.xspace_write.write_xspace` writes.
        on_done: called in the training thread (:meth:`XplaneWorker.poll`) with the written path, or None when no
            file was written, and the reason.
    """

    epoch: int
    trace: Path
    run_dir: str
    session: str
    host: str
    on_done: Callable[[Path | None, str], None] | None = None
    ident: int = 0
    sent: bool = False
    job_file: Path | None = None

    @property
    def target(self) -> Path:
        """The ``.xplane.pb`` this job writes."""
        return Path(self.run_dir) / "plugins" / "profile" / self.session / f"{self.host}.xplane.pb"


class XplaneWorker:
    """One background conversion process per rank (module docstring), owned by the fit engine.

    Args:
        warn: the adapter's warn-once ``(key, message)``; called only from the training thread.
        timeout_s: how long :meth:`finish` waits (s).
        command: the worker's command line (default: this interpreter running this file, :data:`_BOOT`).

    Attributes:
        skipped: the epochs whose conversion was replaced by a newer window's.
        lost: the epochs whose conversion the process did not finish (it crashed, was killed, or the fit ended).
    """

    def __init__(
        self,
        warn: Callable[[str, str], None],
        *,
        timeout_s: float = FINISH_TIMEOUT_S,
        command: list[str] | None = None,
    ) -> None:
        self.warn = warn
        self.timeout_s = timeout_s
        self.command = command or [sys.executable, "-c", _BOOT, os.path.abspath(__file__)]
        self.skipped: list[int] = []
        self.lost: list[int] = []
        self._lock = threading.Condition()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._running: Job | None = None
        self._waiting: deque[Job] = deque()
        self._results: list[tuple[Job, Path | None, str]] = []
        self._next_id = 0
        self._detached = False  # the fit has ended: the process owns what it was given, and nobody polls

    # ----------------------------------------------------------------------------------------------- state
    @property
    def pid(self) -> int | None:
        """The worker process's id (None: not started)."""
        return None if self._proc is None else self._proc.pid

    def pending(self) -> list[Job]:
        """The running and the waiting conversion."""
        with self._lock:
            return ([self._running] if self._running is not None else []) + list(self._waiting)

    def reading(self, path: Path) -> bool:
        """Whether a pending conversion still reads ``path`` or writes beside it (retention must not delete it)."""
        return any(path in (job.trace, job.target) for job in self.pending())

    # ---------------------------------------------------------------------------------------------- submit
    def start(self) -> None:
        """Start the process now, if it is not running (a fit's start, before any window). Never raises: a process
        that cannot start is started again, and the failure reported, at the first conversion."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            with contextlib.suppress(OSError):
                self._start()

    def submit(self, job: Job) -> None:
        """Queue one conversion; never waits for the process (module docstring for the queue policy)."""
        self.poll()
        _write_job(job, os.getpid())  # owned by the fit until the process is given it
        replaced = None
        with self._lock:
            self._detached = False
            self._next_id += 1
            job.ident = self._next_id
            if self._running is None:
                self._running = job
            else:
                if len(self._waiting) >= MAX_WAITING:
                    replaced = self._waiting.popleft()
                self._waiting.append(job)
        if replaced is not None:
            self._skip(replaced)
        self._dispatch()
        self.poll()

    def cancel(self, trace: Path) -> bool:
        """Drop the waiting conversion of ``trace`` (its window is being deleted); True when one was dropped."""
        with self._lock:
            for job in self._waiting:
                if job.trace == trace:
                    self._waiting.remove(job)
                    _drop_job(job)
                    return True
        return False

    def _skip(self, job: Job) -> None:
        _drop_job(job)
        self.skipped.append(job.epoch)
        self.warn(
            "xspace-skipped",
            f"fitprof: the .xplane.pb of epoch {job.epoch} was skipped: the conversion of an earlier window was still "
            "running when newer windows ended, and only the newest wait. Its trace, report and figures are kept "
            "(`fitprof analyze` reads the trace).",
        )
        if job.on_done is not None:
            job.on_done(None, "skipped")

    def _dispatch(self) -> None:
        """Send the running job to the process (started when needed); in the training thread or the reader's."""
        with self._lock:
            if self._detached:
                return
            job = self._running
            if job is None or job.sent:
                return
            proc = self._proc
            if proc is None or proc.poll() is not None:
                try:
                    proc = self._start()
                except OSError as err:
                    self._running = None
                    _drop_job(job)
                    self._results.append((job, None, f"the converter process did not start ({err})"))
                    return
            self._dispatch_locked(proc)

    def _dispatch_locked(self, proc: subprocess.Popen[bytes]) -> None:
        """Send the running job to ``proc``; the lock is held."""
        job = self._running
        if job is not None and not job.sent:
            if job.job_file is not None:
                _write_job(job, proc.pid)  # not sent yet: nobody else writes this file now
            line = json.dumps(
                {
                    "id": job.ident,
                    "trace": str(job.trace),
                    "run_dir": job.run_dir,
                    "session": job.session,
                    "host": job.host,
                    "job_file": None if job.job_file is None else str(job.job_file),
                }
            )
            try:
                assert proc.stdin is not None
                proc.stdin.write(line.encode() + b"\n")
                proc.stdin.flush()  # one short line: the pipe's buffer holds it, so this never waits
                job.sent = True
            except OSError as err:
                self._running = None
                self._results.append((job, None, f"the converter process could not be reached ({err})"))

    def _start(self) -> subprocess.Popen[bytes]:
        proc = _spawn(self.command, stdout=subprocess.PIPE)
        self._proc = proc
        self._reader = threading.Thread(target=self._read, args=(proc,), name="fitprof-xplane-reader", daemon=True)
        self._reader.start()
        return proc

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        """The reader thread: collect the process's answers and hand it the waiting job (it sleeps in ``readline``
        and does a few lines of work per window, so it takes nothing from training)."""
        out: IO[bytes] | None = proc.stdout
        assert out is not None
        for raw in out:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            with self._lock:
                job = self._running
                if job is None or msg.get("id") != job.ident:
                    continue
                path = Path(msg["path"]) if msg.get("ok") else None
                self._results.append((job, path, msg.get("error", "")))
                self._running = self._waiting.popleft() if self._waiting else None
                self._lock.notify_all()
            self._dispatch()
        code = proc.wait()
        with self._lock:
            if self._proc is proc:
                self._proc = None
            job = self._running
            if self._detached:  # after the fit: what the process left is left over (its job files say so)
                self._lock.notify_all()
                return
            if job is not None and job.sent:
                _drop_job(job)
                _remove_partial(job.target)
                self.lost.append(job.epoch)
                self._results.append((job, None, f"the converter process ended while writing it (exit code {code})"))
                self._running = self._waiting.popleft() if self._waiting else None
            self._lock.notify_all()

    # ------------------------------------------------------------------------------------------------ poll
    def poll(self) -> None:
        """Report the finished conversions (their ``on_done``, and one warning for a failure); restart a process
        that died with a job waiting. Call it from the training thread."""
        with self._lock:
            results, self._results = self._results, []
            restart = self._running is not None and not self._running.sent
        for job, path, why in results:
            if path is None and why != "stopped":
                self.warn(
                    "xspace",
                    f"fitprof: could not write the .xplane.pb of epoch {job.epoch} ({why}); the trace, its report "
                    "and figures are kept (`fitprof analyze` reads the trace).",
                )
            if job.on_done is not None:
                job.on_done(path, why)
        if restart:
            self._dispatch()

    # ---------------------------------------------------------------------------------------------- finish
    def finish(self, timeout_s: float | None = None) -> list[int]:
        """Wait for the pending conversions up to ``timeout_s`` (default :attr:`timeout_s`), then stop the process.

        Returns:
            The epochs whose ``.xplane.pb`` was left unwritten because the wait ran out (one warning names them).
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._lock:
            while self._running is not None and self._proc is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(min(left, 0.5))
            undone = ([self._running] if self._running is not None else []) + list(self._waiting)
            self._running = None
            self._waiting.clear()
            proc, self._proc = self._proc, None
        self.poll()
        if proc is not None:  # a process that was never given a job holds nothing: no need to wait for its exit
            self._stop(proc, kill=bool(undone) or not self._next_id)
        for job in undone:
            _remove_partial(job.target)
            if job.job_file is not None:
                _write_job(job, 0)  # left over: the next fit, `fitprof report` or wait_for_profiles writes it
            if job.on_done is not None:
                job.on_done(None, "stopped")
        epochs = [job.epoch for job in undone]
        if epochs:
            self.lost.extend(epochs)
            self.warn(
                "xspace-unfinished",
                f"fitprof: the fit ended with {len(epochs)} .xplane.pb conversion(s) unfinished after {timeout:g} s "
                f"(epoch(s) {', '.join(map(str, epochs))}): the next fit in this log directory, `fitprof report` or "
                "`fitprof.wait_for_profiles` writes them; their traces, reports and figures are kept.",
            )
        return epochs

    def end_of_fit(self) -> list[int]:
        """The end of a ``fit``: :meth:`detach` (the default), or :meth:`finish` when :data:`WAIT_ENV` is set.

        Returns:
            :meth:`finish`'s epochs left unwritten; always empty for :meth:`detach`.
        """
        if os.environ.get(WAIT_ENV, "") not in ("", "0"):
            return self.finish()
        self.detach()
        return []

    def detach(self) -> list[Path]:
        """Hand every pending conversion to the process and return without waiting for it.

        The jobs not yet sent are written into the process's input (one short line each, which the pipe's buffer
        holds), the input is closed, and the process, in its own session, writes them and exits, whether or not the
        training process is still there. Their ``on_done`` is called at once with the path they will have
        (:func:`fitprof.wait_for_profiles` waits for it). A process that cannot be started leaves them to whoever
        finishes left-over jobs.

        Returns:
            The ``.xplane.pb`` files still to be written.
        """
        self.poll()
        with self._lock:
            self._detached = True
            jobs = ([self._running] if self._running is not None else []) + list(self._waiting)
            proc = self._proc if self._proc is not None and self._proc.poll() is None else None
            if jobs and proc is None:
                with contextlib.suppress(OSError):
                    proc = self._start()
            for job in jobs:
                if job.sent or proc is None:
                    continue
                self._running = job  # _dispatch sends the running job
                self._dispatch_locked(proc)
            for job in jobs:
                if not job.sent:  # no process took it: left over at once
                    _write_job(job, 0)
            self._running = None
            self._waiting.clear()
            self._results.clear()
            self._proc = None
        if proc is not None:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()  # the process exits at the end of its input, once the jobs are written
        for job in jobs:
            if job.on_done is not None:
                job.on_done(job.target, "handed over")
        return [job.target for job in jobs]

    def adopt(self, log_dir: str | os.PathLike[str]) -> list[Path]:
        """Finish in a new background process the conversions an earlier fit left in ``log_dir`` (their owner is
        gone: :mod:`fitprof._profile_jobs`); one warning names them. Never raises.

        Returns:
            The ``.xplane.pb`` files it will write.
        """
        from fitprof._profile_jobs import left_over, target_of, write_job

        folder = Path(log_dir) / "plugins" / "profile"
        try:
            found = left_over(folder) if folder.is_dir() else []
            if not found:
                return []
            proc = _spawn(self.command, stdout=subprocess.DEVNULL)
        except OSError as err:
            _log_debug(f"fitprof: could not finish the left-over .xplane.pb conversions ({err!r})")
            return []
        targets = []
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            for path, doc in found:
                fields = {k: doc.get(k) for k in ("trace", "run_dir", "session", "host")}
                write_job(target_of(path), fields, proc.pid)
                line = json.dumps({"id": 0, **fields, "job_file": str(path)})
                proc.stdin.write(line.encode() + b"\n")
                targets.append(target_of(path))
            proc.stdin.close()
        if targets:
            self.warn(
                "xspace-left-over",
                f"fitprof: writing in the background {len(targets)} .xplane.pb an earlier fit left unconverted: "
                + ", ".join(map(str, targets)),
            )
        return targets

    def _stop(self, proc: subprocess.Popen[bytes], *, kill: bool) -> None:
        """Stop the process: killed at once when it still works (the wait is over), else told to exit."""
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()  # an idle worker exits on end of input
        try:
            if kill:
                raise subprocess.TimeoutExpired(self.command, 0)
            proc.wait(0.5)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5.0)
        if self._reader is not None:
            self._reader.join(1.0)
        with self._lock:
            self._results.clear()  # the reader's report of the stop: already said by finish


def _remove_partial(target: Path) -> None:
    """Delete what a stopped writer of ``target`` left under a temporary name (never the job file)."""
    for part in target.parent.glob(f".{target.name}.fitprof-tmp-*"):
        if part.name.endswith(_JOB_SUFFIX):
            continue
        with contextlib.suppress(OSError):
            part.unlink()


_JOB_SUFFIX = ".fitprof-tmp-job"
""":data:`fitprof._profile_jobs.JOB_SUFFIX`, here too so that the process's own code stays stdlib only."""


def _write_job(job: Job, owner: int) -> None:
    """Write down ``job`` beside its target, owned by process ``owner`` (0: nobody); a job that cannot be written
    down is still converted, only not recoverable."""
    from fitprof._profile_jobs import write_job

    fields = {"trace": str(job.trace), "run_dir": job.run_dir, "session": job.session, "host": job.host}
    try:
        job.target.parent.mkdir(parents=True, exist_ok=True)
        job.job_file = write_job(job.target, fields, owner)
    except OSError as err:
        _log_debug(f"fitprof: could not write down the .xplane.pb job of {job.target} ({err!r})")


def _drop_job(job: Job) -> None:
    """The conversion will not be done (skipped, cancelled, lost during the fit): its job file goes."""
    if job.job_file is not None:
        with contextlib.suppress(OSError):
            job.job_file.unlink()


def _spawn(command: list[str], *, stdout: int) -> subprocess.Popen[bytes]:
    """The converter process: in a session of its own, so that it outlives the training process and the signals
    sent to that process's group; fed on its input, which it reads to the end whatever becomes of this process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the parent's fitprof, wherever it is
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=stdout,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        close_fds=True,
    )


def _log_debug(message: str) -> None:
    import logging

    logging.getLogger("fitprof").debug(message)


# ---------------------------------------------------------------------------------------------------- process
_BOOT = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"
"""How the process runs this file: as a script, so that it starts without importing the ``fitprof.fit`` package
(``python -m fitprof.fit.xplane_worker`` would import it, and with it pandas, before the first line of ``main``)."""


def main() -> None:
    """The worker process: one JSON job a line on stdin, one JSON answer a line on stdout; exits at end of input."""
    with contextlib.suppress(OSError, AttributeError):
        os.nice(NICE)
    out: IO[bytes] | None = sys.stdout.buffer
    for raw in sys.stdin.buffer:
        try:
            job: dict[str, Any] = json.loads(raw)
        except ValueError:
            continue
        answer: dict[str, Any] = {"id": job.get("id")}
        if job.get("job_file") and not os.path.exists(job["job_file"]):
            # its job file is gone with its folder (a staging folder deleted, a run removed): writing it would
            # create that folder again
            answer.update(ok=False, error="cancelled: its folder was deleted")
            with contextlib.suppress(OSError, ValueError):
                if out is not None:
                    out.write(json.dumps(answer).encode() + b"\n")
                    out.flush()
            continue
        try:
            # Imported at the first job, not at the start: fitprof and pandas take about 0.8 s of CPU to load, which
            # a process started with the fit would spend while the first epoch's steps (its window among them) run.
            from fitprof.traces.xspace_write import write_xspace

            path = write_xspace(job["trace"], job["run_dir"], job["session"], host=job["host"])
            answer.update(ok=True, path=str(path))
        except Exception as err:
            answer.update(ok=False, error=repr(err))
        if job.get("job_file"):  # done (or failed for good): no longer pending
            with contextlib.suppress(OSError):
                os.unlink(job["job_file"])
        if out is None:
            continue
        try:
            out.write(json.dumps(answer).encode() + b"\n")
            out.flush()
        except (OSError, ValueError):  # the training process has gone: the remaining jobs are still done
            out = None


if __name__ == "__main__":
    main()

"""The ``.xplane.pb`` of each Kineto window, written off the training path: small windows by a thread of the
training process, large ones by one background process per fit and rank.

Only TensorBoard's Profile tab reads the ``.xplane.pb``; the logged figures and the report file come from the trace
itself. A window's conversion is handed to the fit's :class:`XplaneWorker` as soon as the window stops (not at its
epoch's end), so a window that ends before the fit's last steps is converted before ``fit`` returns:

* **Small windows in a thread** (fewer than :data:`IN_THREAD_BELOW` events): the training process has fitprof and
  its converter loaded already (:meth:`XplaneWorker.start`, at the fit's start), so the conversion costs only its
  own work: about 35 ms of CPU for a 2,000-event window, where a fresh process first spends about 0.6 s starting
  and importing. The thread (``fitprof-xplane``) waits for the trace's background compression, counts the events,
  and converts; it holds the GIL against the steps that follow the window for that long, in 5 ms slices. It exists
  only while it has work.
* **Large windows in a process** (and every window with ``in_thread_below=0``): a 10^5-event window costs seconds
  of Python work, which would hold the GIL against the training loop and its data loading. The thread hands it to
  one process per fit, started at the first such window and fed each later one on its input: a fresh interpreter
  running this file (:data:`_BOOT`), never a fork of the training process (forking a process that holds torch or
  TensorFlow threads is unsafe), that does not import the user's ``__main__`` (``multiprocessing``'s ``spawn`` and
  ``forkserver`` do, and would run an unguarded training script a second time), at low priority
  (``os.nice(10)``). It starts on the standard library alone and loads the converter (fitprof and pandas, about
  0.8 s of CPU) at its first job.
* **Bounded queue, never blocking:** in the process one conversion runs and at most :data:`MAX_WAITING` wait. A
  window that ends while the queue is full pushes out the oldest waiting one (the newest windows are the ones worth
  seeing); the pushed-out window keeps its trace, report and figures, and one warning a fit names it. A waiting
  conversion whose window ``keep_last_windows`` deletes is dropped with it. Handing a job over never waits.
* **The end of the fit waits for none of it** (:meth:`XplaneWorker.end_of_fit`): a conversion the thread is still
  doing gets at most :data:`FIT_END_GRACE_S` to finish (a small window that ended just before the fit's end; on a
  quiet machine a window that ended mid-fit is done long before); every conversion left is then written into the
  process's input, its input is closed, and ``fit`` returns; the process finishes them and exits. It runs in a
  session of its own (``start_new_session``: a signal to the training process's group, such as a terminal's Ctrl-C
  or a job runner stopping a script, does not reach it), it is no daemon of the training process, and a closed
  pipe whose lines were all written still yields those lines, so a script that exits right after ``fit`` still gets
  its ``.xplane.pb``. :func:`fitprof.wait_for_profiles` waits for the files. With the environment variable
  :data:`WAIT_ENV` set (not ``0``), the end of the fit waits for them instead, up to ``timeout_s``
  (:data:`FINISH_TIMEOUT_S` by default), then stops the process.
* **Nothing is lost:** each conversion is written down in a job file beside its target when it is handed over
  (:mod:`fitprof._profile_jobs`), owned by the training process and, once sent to the process, by the process. A
  job whose owner is gone (the training process was killed during a conversion in the thread, the process was
  killed after the fit, the machine restarted) is finished by the next fit that profiles into the same log
  directory (:meth:`XplaneWorker.adopt`, in a background process, one warning naming the files), by ``fitprof
  report``, or by :func:`fitprof.wait_for_profiles`. A job whose job file is gone when its turn comes (its run
  folder was deleted) is skipped: writing it would create the folder again.
* **A crash or kill** of the process during the fit loses only the ``.xplane.pb`` it was writing (one warning); the
  trace, the report, the scalars and training are untouched, and the next large window starts a new process. The
  file is written under a temporary name and renamed (:func:`fitprof.traces.xspace_write.write_xspace`), so a
  remote mirror never copies a half file. A URL log directory's mirror waits for the files before its last copy
  (:meth:`fitprof._fs.Mirror.close`), so they reach the URL.

Stdlib only at import (the conversion modules are imported where a conversion runs).
"""

from __future__ import annotations

import contextlib
import gzip
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

IN_THREAD_BELOW = 10_000
"""A window with fewer events than this (Chrome trace events, counted as their ``"ph"`` keys) is converted by a thread
of the training process; a larger one by the process. About 16 us of CPU an event in that thread (35 ms for the
2,008-event ``tests/data/lightning_cpu.pt.trace.json.gz``, measured), so at most about 0.16 s a window, against the
process's 0.6 s to start and load before its first event."""

IN_THREAD_MAX_GZ_BYTES = 1_000_000
"""A gzipped trace larger than this goes to the process without being inflated to count its events (Kineto traces
hold 20-40 compressed bytes an event, so this is well past :data:`IN_THREAD_BELOW` events)."""

FIT_END_GRACE_S = 1.0
"""The most the end of a fit waits for a conversion the thread is doing (s) before handing it to the process too: a
small window that ended just before the fit did. The wait is at most what is left of one small conversion."""


@dataclass
class Job:
    """One conversion: the Kineto ``trace`` to ``<run_dir>/plugins/profile/<session>/<host>.xplane.pb``.

    Attributes:
        epoch: the window's epoch (for messages).
        trace: the gzipped Kineto trace (read, never changed).
        run_dir, session, host: where :func:`~fitprof.traces.xspace_write.write_xspace` writes.
        on_done: called in the training thread (:meth:`XplaneWorker.poll`) with the written path, or None when no
            file was written, and the reason.
        written_by: the id of the process that wrote the file (this one when the thread did), once written.
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
    handed: bool = False  # the fit ended while the thread converted it: the process does it
    written_by: int | None = None  # the process (pid) that wrote the file, once written

    @property
    def target(self) -> Path:
        """The ``.xplane.pb`` this job writes."""
        return Path(self.run_dir) / "plugins" / "profile" / self.session / f"{self.host}.xplane.pb"


class XplaneWorker:
    """The ``.xplane.pb`` writer of one fit and rank (module docstring), owned by the fit engine: a thread of this
    process for small windows, one background process for large ones.

    Args:
        warn: the adapter's warn-once ``(key, message)``; called only from the training thread.
        timeout_s: how long :meth:`finish` waits (s).
        command: the process's command line (default: this interpreter running this file, :data:`_BOOT`).
        in_thread_below: windows with fewer events are converted in the thread (default :data:`IN_THREAD_BELOW`
            as it is when the worker is made); 0 sends every window to the process.

    Attributes:
        skipped: the epochs whose conversion was replaced by a newer window's.
        lost: the epochs whose conversion was not finished (the process crashed or was killed, or the fit ended).
        in_thread: the epochs converted by the thread.
        starts: how many processes this worker started.
        thread_cpu_s: the CPU time the thread spent on its jobs: waiting for nothing, counting events, converting
            (s, :func:`time.thread_time`).
    """

    def __init__(
        self,
        warn: Callable[[str, str], None],
        *,
        timeout_s: float = FINISH_TIMEOUT_S,
        command: list[str] | None = None,
        in_thread_below: int | None = None,
    ) -> None:
        self.warn = warn
        self.timeout_s = timeout_s
        self.command = command or [sys.executable, "-c", _BOOT, os.path.abspath(__file__)]
        self.in_thread_below = IN_THREAD_BELOW if in_thread_below is None else in_thread_below
        self.skipped: list[int] = []
        self.lost: list[int] = []
        self.in_thread: list[int] = []
        self.starts = 0
        self.thread_cpu_s = 0.0
        self._lock = threading.Condition()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._running: Job | None = None  # the process's
        self._waiting: deque[Job] = deque()  # the process's
        self._inbox: deque[Job] = deque()  # handed over, not yet taken by the thread
        self._converting: Job | None = None  # the thread's job now (routed to the process or converted)
        self._thread: threading.Thread | None = None
        self._closing = False  # the fit is ending: the thread takes no further job
        self._results: list[tuple[Job, Path | None, str]] = []
        self._next_id = 0
        self._detached = False  # the fit has ended: the process owns what it was given, and nobody polls

    # ----------------------------------------------------------------------------------------------- state
    @property
    def pid(self) -> int | None:
        """The worker process's id (None: not started)."""
        return None if self._proc is None else self._proc.pid

    def pending(self) -> list[Job]:
        """The conversions not done yet: the thread's (waiting, running) and the process's (running, waiting)."""
        with self._lock:
            mine = ([self._converting] if self._converting is not None else []) + list(self._inbox)
            return mine + ([self._running] if self._running is not None else []) + list(self._waiting)

    def reading(self, path: Path) -> bool:
        """Whether a pending conversion still reads ``path`` or writes beside it (retention must not delete it)."""
        return any(path in (job.trace, job.target) for job in self.pending())

    # ---------------------------------------------------------------------------------------------- submit
    def start(self) -> None:
        """Load the converter in this process now (a fit's start, before any window), so that the thread's first
        conversion does not load it while the steps after its window run. Starts no process. Never raises: the
        first conversion loads it instead."""
        with contextlib.suppress(Exception):
            import fitprof.traces.xspace_write  # noqa: F401

    def submit(self, job: Job) -> None:
        """Hand one conversion over, as soon as its window has stopped (its trace may still be being compressed);
        never waits for the conversion (module docstring for where it runs and the queue policy)."""
        self.poll()
        _write_job(job, os.getpid())  # owned by the fit until the process is given it
        with self._lock:
            self._detached = self._closing = False
            self._next_id += 1
            job.ident = self._next_id
            direct = self.in_thread_below <= 0 and _written(job.trace)
            if not direct:
                self._inbox.append(job)
                direct = not self._ensure_thread()
                if direct:
                    self._inbox.remove(job)
        if direct:  # nothing to count and nothing to wait for (or no thread to be had): straight to the process
            _wait_ended(job.trace)
            self._to_process(job)
        self.poll()

    def cancel(self, trace: Path) -> bool:
        """Drop the waiting conversion of ``trace`` (its window is being deleted); True when one was dropped."""
        with self._lock:
            for queue in (self._inbox, self._waiting):
                for job in queue:
                    if job.trace == trace:
                        queue.remove(job)
                        _drop_job(job)
                        return True
        return False

    def _to_process(self, job: Job) -> None:
        """Queue ``job`` for the process (the queue policy of the module docstring) and send it when it is next."""
        replaced = None
        with self._lock:
            if self._running is None:
                self._running = job
            else:
                if len(self._waiting) >= MAX_WAITING:
                    replaced = self._waiting.popleft()
                self._waiting.append(job)
            if replaced is not None:
                _drop_job(replaced)
                self.skipped.append(replaced.epoch)
                self._results.append((replaced, None, "skipped"))  # said by poll, in the training thread
        self._dispatch()

    # ---------------------------------------------------------------------------------------------- thread
    def _ensure_thread(self) -> bool:
        """Start the thread if it is not running (the lock is held); False when no thread can be started."""
        if self._thread is not None:
            return True
        thread = threading.Thread(target=self._convert_loop, name="fitprof-xplane")
        try:
            thread.start()  # not a daemon: the interpreter lets it finish its small conversion at exit
        except RuntimeError:
            return False
        self._thread = thread
        return True

    def _convert_loop(self) -> None:
        """The thread: take the handed-over jobs one by one, until none is left or the fit ends."""
        while True:
            with self._lock:
                if not self._inbox or self._closing:
                    self._thread = None
                    self._lock.notify_all()
                    return
                job = self._converting = self._inbox.popleft()
            t0 = time.thread_time()
            try:
                self._take(job)
            except Exception as err:  # never a traceback from a thread; the job is reported as failed
                with self._lock:
                    if not job.handed:
                        _drop_job(job)
                        self._results.append((job, None, repr(err)))
            finally:
                with self._lock:
                    self.thread_cpu_s += time.thread_time() - t0
                    self._converting = None
                    self._lock.notify_all()

    def _take(self, job: Job) -> None:
        """Convert ``job`` here when its window is small, else hand it to the process."""
        failed = _wait_ended(job.trace)  # its compression, in another thread of this process
        if failed is not None or not job.trace.is_file():
            # the window's analysis warns about the trace; there is nothing to convert
            with self._lock:
                _drop_job(job)
                self._results.append((job, None, "no trace"))
            return
        if job.job_file is not None and not job.job_file.exists():
            with self._lock:
                self._results.append((job, None, _CANCELLED))
            return
        if self.in_thread_below <= 0 or not _fewer_events(job.trace, self.in_thread_below):
            self._to_process(job)
            return
        path: Path | None = None
        why = ""
        try:
            from fitprof.traces.xspace_write import write_xspace

            path = write_xspace(job.trace, job.run_dir, job.session, host=job.host)
        except Exception as err:
            why = repr(err)
        with self._lock:
            if job.handed:  # the fit ended meanwhile and handed it to the process, which owns its job file now
                return
            _drop_job(job)  # done (or failed for good): no longer pending
            self.in_thread.append(job.epoch)
            job.written_by = os.getpid() if path is not None else None
            self._results.append((job, path, why))

    # ----------------------------------------------------------------------------------------------- process
    def _dispatch(self) -> None:
        """Send the process's running job (the process started when needed); in any thread."""
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
        self.starts += 1
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
                job.written_by = msg.get("pid") if path is not None else None
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
        """Report the finished conversions (their ``on_done``, and one warning for a failure or a skip); restart a
        process that died with a job waiting. Call it from the training thread."""
        with self._lock:
            results, self._results = self._results, []
            restart = self._running is not None and not self._running.sent
        self._report(results)
        if restart:
            self._dispatch()

    def _report(self, results: list[tuple[Job, Path | None, str]]) -> None:
        """Say and hand on ``results`` (in the training thread)."""
        for job, path, why in results:
            if why == "skipped":
                self.warn(
                    "xspace-skipped",
                    f"fitprof: the .xplane.pb of epoch {job.epoch} was skipped: the conversion of an earlier window "
                    "was still running when newer windows ended, and only the newest wait. Its trace, report and "
                    "figures are kept (`fitprof analyze` reads the trace).",
                )
            elif path is None and why not in ("stopped", "no trace"):
                self.warn(
                    "xspace",
                    f"fitprof: could not write the .xplane.pb of epoch {job.epoch} ({why}); the trace, its report "
                    "and figures are kept (`fitprof analyze` reads the trace).",
                )
            if job.on_done is not None:
                job.on_done(path, why)

    # ---------------------------------------------------------------------------------------------- finish
    def _idle(self) -> bool:
        """Nothing left to convert, or only what a dead process held (the lock is held)."""
        thread_busy = bool(self._inbox) or self._converting is not None
        return not thread_busy and (self._running is None or self._proc is None)

    def finish(self, timeout_s: float | None = None) -> list[int]:
        """Wait for the pending conversions up to ``timeout_s`` (default :attr:`timeout_s`), then stop the process.

        Returns:
            The epochs whose ``.xplane.pb`` was left unwritten because the wait ran out (one warning names them).
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._lock:
            while not self._idle():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(min(left, 0.5))
            self._closing = True
            if self._converting is not None:
                self._converting.handed = True  # left over below: the thread's late result is not reported
            undone = ([self._converting] if self._converting is not None else []) + list(self._inbox)
            undone += ([self._running] if self._running is not None else []) + list(self._waiting)
            self._inbox.clear()
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

    def detach(self, grace_s: float = FIT_END_GRACE_S) -> list[Path]:
        """Hand every pending conversion to the process and return without waiting for it.

        A conversion the thread is doing gets up to ``grace_s`` seconds to end (it is a small one); the thread takes
        no further job. The jobs not yet sent (the thread's too, and the one it still converts after the grace) are
        written into the process's input (one short line each, which the pipe's buffer holds), the input is closed,
        and the process, in its own session, writes them and exits, whether or not the training process is still
        there. Their ``on_done`` is called at once with the path they will have (:func:`fitprof.wait_for_profiles`
        waits for it). A process that cannot be started leaves them to whoever finishes left-over jobs.

        Returns:
            The ``.xplane.pb`` files still to be written.
        """
        deadline = time.monotonic() + max(grace_s, 0.0)
        with self._lock:
            self._closing = True
            while self._converting is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            self._detached = True
            late = [self._converting] if self._converting is not None else []
            for job in late:
                job.handed = True  # the thread leaves its job file and result to the process
            jobs = late + list(self._inbox) + ([self._running] if self._running is not None else [])
            jobs += list(self._waiting)
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
            self._inbox.clear()
            self._running = None
            self._waiting.clear()
            results, self._results = self._results, []
            self._proc = None
        if proc is not None:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()  # the process exits at the end of its input, once the jobs are written
        self._report(results)
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


_CANCELLED = "cancelled: its folder was deleted"


def _written(trace: Path) -> bool:
    """Whether ``trace`` is written whole: no background compression of it is pending."""
    from fitprof.traces._limits import being_written

    return not being_written(trace)


def _wait_ended(trace: Path) -> BaseException | None:
    """Wait for the background compression of ``trace`` (:func:`fitprof.traces._limits.wait_ended`)."""
    from fitprof.traces._limits import wait_ended

    return wait_ended(trace)


def _fewer_events(trace: Path, bound: int) -> bool:
    """Whether the Kineto trace ``trace`` holds fewer than ``bound`` events (its ``"ph"`` keys, as
    :data:`fitprof.traces._limits.EVENT_KEY` counts them), read only when it is at most
    :data:`IN_THREAD_MAX_GZ_BYTES` big. Unreadable: False (the process reports why)."""
    try:
        if trace.stat().st_size > IN_THREAD_MAX_GZ_BYTES:
            return False
        opener: Any = gzip.open if trace.name.endswith(".gz") else open
        with opener(trace, "rb") as fh:
            text = fh.read()
    except (OSError, EOFError):
        return False
    return text.count(b'"ph"') < bound


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
            answer.update(ok=False, error=_CANCELLED)
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
            answer.update(ok=True, path=str(path), pid=os.getpid())
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

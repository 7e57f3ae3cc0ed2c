"""The framework-neutral epoch-end work of both callbacks: one pipeline, called by the Keras and the Lightning
adapter alike. Framework-free: the adapter hands in what needs its framework (the cross-rank gather and the
logger) as callables.

For each profiled window, at the end of its epoch:

1. :meth:`WindowPipeline.analyze`: read and analyse the trace with :func:`fitprof.analyze` (the very function
   ``fitprof analyze`` runs, so a trace gives the same figures there) into a complete
   :class:`~fitprof.analysis.BottleneckReport` (framework from the trace format; host, rank and world size
   passed in), warn once when the trace is over ``max_trace_mb``, write the report file
   (:mod:`fitprof.report_files`), count the ``.xplane.pb`` of a Kineto trace
   (``plugins/profile/<session>/<host>[_rank<r>].xplane.pb``, so TensorBoard's Profile tab lists it) among the
   window's files (its conversion was handed to the background converter, :mod:`fitprof.fit.xplane_worker`, when
   the window stopped: :meth:`WindowPipeline.hand_over`; the training loop waits only for what its logged figures
   need) and delete the trace files of windows beyond ``keep_last_windows`` (never a trace the converter still
   reads);
2. :meth:`WindowPipeline.gather`, on every rank that marked the epoch (with or without a report, so the
   collective always completes): gather every rank's figures (:func:`fitprof.cross_rank.pack`) with the
   adapter's ``gather``, combine them (:func:`fitprof.cross_rank.combine`), and on rank 0 make the
   :class:`~fitprof.fit.result.EpochLog` (the scalars, the named operator scalars for TensorBoard, the Markdown
   summary and the one-line summary) that the epoch's result carries to the adapter's ``log``. Non-finite figures (a window without steps) are never logged.

The logged keys are the same in every epoch (:func:`logged_keys`): the operators go by rank
(``fitprof/top_op_<i>_ms``), so ``History``, ``CSVLogger`` columns and ``monitor=`` keys never come and go; only
TensorBoard also gets them by name (``fitprof/top_ops/<op name>``), where a key that comes and goes costs nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import fitprof
from fitprof import cross_rank, metrics
from fitprof._retention import WindowFiles, oversize_message
from fitprof._session import hostname, profile_root, rank_host
from fitprof._warn import WarnOnce, no_traceback
from fitprof.analysis import BottleneckReport, across_windows
from fitprof.fit import steps
from fitprof.fit.result import EpochLog, Gather
from fitprof.fit.xplane_worker import Job, XplaneWorker
from fitprof.report_files import write_report_file
from fitprof.throughput import StepWork, with_throughput
from fitprof.traces import trace_format
from fitprof.traces._limits import wait_written


def logged_keys(top_k: int, world_size: int = 1) -> tuple[str, ...]:
    """Every scalar key a callback logs for an epoch, in order: the same set in every epoch of a fit.

    Args:
        top_k: how many operators are ranked (``fitprof/top_op_1_ms`` ... ``fitprof/top_op_<top_k>_ms``).
        world_size: with more than one rank, the cross-rank keys (``fitprof/step_time_ms_max``, ...) follow.
    """
    keys = metrics.BASE_KEYS + tuple(metrics.top_op_rank_key(i) for i in range(1, top_k + 1))
    return keys + (cross_rank.EXTRA_KEYS if world_size > 1 else ())


def every_key(
    scalars: dict[str, float], top_k: int, world_size: int = 1, extra: Iterable[str] = ()
) -> dict[str, float]:
    """``scalars`` with every key of :func:`logged_keys` and of ``extra`` (the probes' window keys, the churn keys
    of a ``profile_memory`` window), NaN where this epoch has no figure (not profiled, no step analysed, fewer
    operators than ``top_k``): Keras ``logs`` need the same keys every epoch."""
    out = {key: math.nan for key in (*logged_keys(top_k, world_size), *extra)}
    out.update(scalars)
    return out


def summary_line(epoch: int, scalars: dict[str, float], report: BottleneckReport | None) -> str:
    """The one line printed per profiled epoch on rank 0, e.g.
    ``fitprof epoch 3: 12.40 ms/step, input 71.8% of the window's steps, HtoD 0.0%, top op aten::mm 2.10 ms ->
    input-bound`` (the input share: of the profiled window's step time, not the epoch's).

    The figures are those logged (cross-rank means with several ranks); the top operator and the verdict are
    rank 0's own report's (left out when rank 0 has none).
    """
    parts = [f"fitprof epoch {epoch}: {scalars.get(metrics.STEP_TIME_MS.key, math.nan):.2f} ms/step"]
    parts.append(f"input {scalars.get(metrics.INPUT_PERCENT.key, math.nan):.1f}% of the window's steps")
    parts.append(f"HtoD {scalars.get(metrics.HTOD_PERCENT.key, math.nan):.1f}%")
    ranks = scalars.get(cross_rank.RANKS_REPORTED)
    if ranks is not None:
        parts.append(f"means over {int(ranks)} ranks")
    line = ", ".join(parts)
    if report is not None:
        if report.top_ops:
            top = report.top_ops[0]
            line += f", top op {top.name} {top.self_ms_per_step:.2f} ms"
        line += f" -> {report.verdict}"
    return line


def representativeness(scalars: dict[str, float], epoch_steps: steps.EpochSteps | None) -> str | None:
    """The "window is not representative of its epoch (...)" sentence for a window's logged ``scalars`` (mean step
    time and input share) against its epoch's always-on figures (:func:`fitprof.fit.steps.not_representative`);
    None when they agree, or without figures to compare."""
    if epoch_steps is None:
        return None
    return steps.not_representative(
        scalars.get(metrics.STEP_TIME_MS.key, math.nan), scalars.get(metrics.INPUT_PERCENT.key, math.nan), epoch_steps
    )


class WindowPipeline:
    """The epoch-end work of one callback (see the module docstring).

    Args:
        top_k: how many operators to rank.
        max_trace_mb: warn once when a trace is larger than this many MB (None: never).
        keep_last_windows: keep the trace files of only the last N windows (None: all).
        warn: the adapter's :class:`~fitprof._warn.WarnOnce`.
        converter: the background ``.xplane.pb`` writer (:class:`~fitprof.fit.xplane_worker.XplaneWorker`, made on
            the first call); None writes it in :meth:`analyze`, before it returns.

    Attributes:
        reports: the report of each analysed epoch (0-based epoch -> report).
        trace_paths: the trace each report was computed from.
        xplane_paths: the ``.xplane.pb`` written for each Kineto trace (with a ``converter``, once it is written).
        analysis_seconds: wall time of each epoch's analysis and report file, the time the training loop waits
            (plus the ``.xplane.pb`` without a ``converter``) (s).
        cross_rank: the combined cross-rank scalars of each epoch that was gathered (empty when no rank reported).
    """

    def __init__(
        self,
        *,
        top_k: int,
        max_trace_mb: float | None,
        keep_last_windows: int | None,
        warn: WarnOnce,
        converter: Callable[[], XplaneWorker] | None = None,
    ) -> None:
        self.top_k = top_k
        self.converter = converter
        self.max_trace_mb = max_trace_mb
        self.warn = warn
        self._files = WindowFiles(keep_last_windows)
        self.reports: dict[int, BottleneckReport] = {}
        self.trace_paths: dict[int, Path] = {}
        self.xplane_paths: dict[int, Path] = {}
        self.analysis_seconds: dict[int, float] = {}
        self.cross_rank: dict[int, dict[str, float]] = {}
        self._handed: dict[Path, Job] = {}  # the conversions handed over when their window stopped, by trace

    def __getstate__(self) -> dict[str, object]:
        """Copied and pickled with the engine: the conversions handed over (their callbacks) are not copied."""
        return {**self.__dict__, "_handed": {}}

    def clear(self) -> None:
        """Forget the results of earlier windows (a new ``fit``); trace retention goes on."""
        for results in (self.reports, self.trace_paths, self.xplane_paths, self.analysis_seconds, self.cross_rank):
            results.clear()
        self._handed.clear()

    def analyze(
        self,
        epoch: int,
        trace: Path,
        *,
        log_dir: str | os.PathLike[str],
        session: str | None,
        rank: int,
        world_size: int,
        discard: Callable[[], None] | None = None,
        work: StepWork | None = None,
        revise: Callable[[BottleneckReport], BottleneckReport] | None = None,
    ) -> BottleneckReport | None:
        """Analyse one window's trace and write what goes beside it; None (after one warning) when the analysis
        fails.

        Args:
            epoch: the window's 0-based epoch.
            trace: the trace file (``.xplane.pb`` or Kineto ``.pt.trace.json.gz``).
            log_dir: the run directory.
            session: the window's session folder name; None when the trace is a temporary copy because
                ``log_dir`` could not be written (then nothing is written and ``discard`` deletes the copy).
            rank: this process's global rank.
            world_size: how many ranks the run has.
            discard: deletes the temporary copy (only when ``session`` is None).
            work: the window's samples, items and FLOPs (:class:`~fitprof.throughput.WorkLog`), turned into the
                report's throughput fields (:func:`~fitprof.throughput.with_throughput`); None leaves them NaN.
            revise: what the callback knows beyond the trace, applied to the report before anything is written
                (a CPU-contended epoch: :func:`fitprof.analysis.cpu_contended`).
        """
        t0 = time.perf_counter()
        self.trace_paths[epoch] = trace
        host = hostname()
        analysis_error, analysis_cause = "", None
        try:  # fitprof.analyze, looked up now: the function `fitprof analyze` and users call
            report: BottleneckReport | None = fitprof.analyze(
                trace,
                top_k=self.top_k,
                host=host,
                rank=rank,
                world_size=world_size,
                # The window's own trace, just written: not untrusted input, so the reader's bounds are lifted.
                max_trace_mb=1e9,
                max_events=2**62,
            )
        except Exception as err:
            # Its text and cause only: the exception's traceback holds this frame, and through the reader's frames
            # the trace's text, which it would keep alive until the garbage collector finds the cycle.
            analysis_error, analysis_cause, report = repr(err), err.__cause__, None
        # The torch trace is compressed in the background while it is analysed from its plain text: what follows
        # (its size, its copy, the worker that reads it, the deletion of a temporary copy) needs the whole file.
        failed = wait_written(trace)
        if analysis_error and (failed is None or analysis_cause is not failed):  # a cause of its own to tell
            self.warn("analyze", f"fitprof: could not analyse {trace} ({analysis_error}).")
        if failed is not None:  # the one warning when the analysis failed only for want of the file
            figures = (
                f"the figures of epoch {epoch} are kept" if report is not None else f"epoch {epoch} has no figures"
            )
            self.warn(
                "write",
                f"fitprof: could not write the trace {trace} ({failed!r}); {figures}, the trace and its Profile-tab "
                "copy are not.",
            )
        else:
            message = oversize_message(trace, self.max_trace_mb)
            if message:
                self.warn("size", message)
        if report is not None:  # the device clock against the fit's first window's; one warning when it is wrong
            report = across_windows(report, next(iter(self.reports.values()), None))
            if not report.device_clock_ok:
                self.warn("device-clock", f"fitprof: epoch {epoch}: {report.device_clock_note}")
        if report is not None and work is not None:
            # the note reaches the report, its file and the tables: the reason, never a framework's traceback
            report = with_throughput(report, dataclasses.replace(work, flops_note=no_traceback(work.flops_note)))
        if report is not None and revise is not None:
            report = revise(report)
        if report is not None:
            self.reports[epoch] = report
        if session is None:
            if discard is not None:
                discard()
            self.analysis_seconds[epoch] = time.perf_counter() - t0
            return report
        if report is not None:
            try:
                write_report_file(log_dir, session=session, epoch=epoch, report=report, trace=trace, rank=rank)
            except OSError as err:
                self.warn("report", f"fitprof: could not write the report of epoch {epoch} ({err!r}).")
        files = [trace]
        # an XSpace window (TensorFlow, JAX) lives in its session folder, which goes with it
        session_dir: Path | None = Path(trace).parent if Path(trace).name.endswith(".xplane.pb") else None
        early = self._handed.pop(Path(trace), None)
        if trace_format(trace) == "kineto" and failed is None:
            worker = self.converter() if self.converter is not None else None
            xhost = rank_host(host, rank, world_size)
            if early is not None:  # handed over when its window stopped
                files.append(early.target)
                session_dir = early.target.parent
            elif worker is not None:  # off the training path: only the Profile tab reads it
                job = Job(
                    epoch, trace, os.fspath(log_dir), session, xhost, on_done=self._converted(epoch, log_dir, session)
                )
                files.append(job.target)
                session_dir = job.target.parent
                worker.submit(job)
            else:
                xplane = self._write_xspace(epoch, trace, log_dir, session, xhost)
                if xplane is not None:
                    files.append(xplane)
                    session_dir = xplane.parent
        self._files.add(session_dir, files, busy=self._busy)
        self.analysis_seconds[epoch] = time.perf_counter() - t0
        return report

    def gather(
        self,
        epoch: int,
        report: BottleneckReport | None,
        *,
        rank: int,
        world_size: int,
        gather: Gather | None,
        epoch_steps: steps.EpochSteps | None = None,
        extra: dict[str, float] | None = None,
        baseline_line: str = "",
    ) -> tuple[dict[str, float], EpochLog | None]:
        """Gather and combine the ranks' figures, and on rank 0 what it logs of them (one :class:`EpochLog`).

        Call it on every rank at the end of every profiled epoch (``gather`` None: no cross-rank figures, e.g. a
        single process, or a flush after an exception, when the other ranks may be anywhere). With
        ``epoch_steps`` (rank 0's always-on figures of the epoch, :class:`fitprof.fit.steps.EpochSteps`), the one-line
        and the Markdown summary say when the window is not representative of its epoch
        (:func:`representativeness`). ``extra``: this rank's own further figures of the window (the probes'
        :meth:`~fitprof.fit.probes.Probe.window_figures`), logged beside the report's when there is something to log.
        ``baseline_line``: the comparison with a baseline (:meth:`fitprof.compare.VsBaseline.line`), put first in the
        Markdown summary.

        Returns:
            The scalars of this epoch, the same on every rank that gathered: the report's own
            (:meth:`~fitprof.analysis.BottleneckReport.scalars`), with the cross-rank means, maxima and
            ``fitprof/ranks_reported`` over them when gathered; empty when there is nothing to log (no rank
            reported). Non-finite values are left out. Then rank 0's :class:`EpochLog` of them (None on the other
            ranks, or with nothing to log).
        """
        scalars = {} if report is None else report.scalars()
        vectors = None
        if gather is not None:
            try:
                vectors = gather(cross_rank.pack(report))
            except Exception as err:
                self.warn(
                    "gather", f"fitprof: could not gather the ranks' figures ({err!r}); rank 0 logs its own only."
                )
        combined: dict[str, float] = {}
        if vectors is not None:
            combined = self.cross_rank[epoch] = cross_rank.combine(vectors)
            if not combined:
                return {}, None
        scalars.update(combined)  # the usual figures become the means over the ranks, plus max and rank
        scalars = {k: v for k, v in scalars.items() if math.isfinite(v)}
        if scalars and extra:
            scalars.update({k: v for k, v in extra.items() if math.isfinite(v)})
        if not scalars or rank != 0:
            return scalars, None
        text = "" if report is None else report.summary_markdown()
        if combined and vectors is not None:
            own = "Rank 0's own figures follow." if report is not None else "Rank 0 has no figures for this epoch."
            text = f"{cross_rank.summary_line(vectors, combined, world_size)}\n\n{own}\n\n{text}".rstrip()
        ops = {} if report is None else {k: v for k, v in report.op_scalars().items() if math.isfinite(v)}
        line = summary_line(epoch, scalars, report)
        note = representativeness(scalars, epoch_steps)
        if note:
            line += f"; {note}"
            text = f"Note: {note}.\n\n{text}".rstrip()
        if baseline_line:
            text = f"{baseline_line}\n\n{text}".rstrip()
        return scalars, EpochLog(epoch, scalars, ops, text, line)

    # ------------------------------------------------------------------------------------ the .xplane.pb
    def hand_over(
        self,
        epoch: int,
        trace: Path,
        *,
        log_dir: str | os.PathLike[str],
        session: str | None,
        rank: int,
        world_size: int,
    ) -> None:
        """A window has just stopped: hand its ``.xplane.pb`` to the converter now, not at its epoch's end, so that
        a window that ends before the fit's last steps is converted by the time ``fit`` returns. Nothing for an
        XSpace trace, a temporary copy (``session`` None) or without a converter (:meth:`analyze` writes it then).
        Never raises: :meth:`analyze` hands it over instead."""
        if session is None or self.converter is None or not Path(trace).name.endswith((".json", ".json.gz")):
            return
        try:
            worker = self.converter()
            host = rank_host(hostname(), rank, world_size)
            job = Job(
                epoch, Path(trace), os.fspath(log_dir), session, host, on_done=self._converted(epoch, log_dir, session)
            )
            worker.submit(job)
        except Exception as err:  # the epoch's end tries again
            self.warn("xspace-early", f"fitprof: could not hand the .xplane.pb of epoch {epoch} over ({err!r}).")
            return
        self._handed[Path(trace)] = job

    def _write_xspace(
        self, epoch: int, trace: Path, log_dir: str | os.PathLike[str], session: str, host: str
    ) -> Path | None:
        try:  # the trace, its report and figures are kept whatever happens to its XSpace copy
            from fitprof.traces.xspace_write import write_xspace

            xplane = write_xspace(trace, log_dir, session, host=host)
        except Exception as err:
            self.warn(
                "xspace",
                f"fitprof: could not write the .xplane.pb for {trace} ({err!r}); the trace and its figures are "
                "kept (`fitprof analyze` reads it).",
            )
            with contextlib.suppress(OSError):  # no empty session in TensorBoard's Profile tab
                (profile_root(log_dir) / session).rmdir()
            return None
        self.xplane_paths[epoch] = xplane
        return xplane

    def _converted(
        self, epoch: int, log_dir: str | os.PathLike[str], session: str
    ) -> Callable[[Path | None, str], None]:
        """What the background conversion of ``epoch``'s window does when it ends (in the training thread)."""

        def done(path: Path | None, why: str) -> None:
            if path is not None:
                self.xplane_paths[epoch] = path
            else:
                with contextlib.suppress(OSError):  # no empty session in TensorBoard's Profile tab
                    (profile_root(log_dir) / session).rmdir()
            self._files.prune(self._busy)  # a window kept while its conversion ran can go now

        return done

    def _busy(self, path: Path) -> bool:
        """Whether retention must keep ``path`` for now: a conversion still reads or writes it (a waiting one is
        dropped instead, as its window is being deleted)."""
        worker = self.converter() if self.converter is not None else None
        if worker is None:
            return False
        return not worker.cancel(path) and worker.reading(path)

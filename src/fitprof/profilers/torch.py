"""torch.profiler windows, shared by the Lightning callback and the Keras callback on the torch backend.

:class:`TorchProfileWindow` (the :class:`~fitprof.profilers.base.ProfileWindow` of both callbacks, over :class:`TorchProfiler`) opens one profiling window at a time, marks training steps with
``ProfilerStep#N`` spans, wraps validation in :data:`~fitprof.traces._table.VALIDATION_ANNOTATION` and the
caller's own work in :data:`~fitprof.traces._table.OVERHEAD_ANNOTATION` (:meth:`TorchProfiler.begin_overhead`),
and exports a gzipped Kineto trace on stop. Every profiler call is guarded: a failure gives one warning, drops the window
and never reaches the training loop.

Why our own ``ProfilerStep#N`` spans: ``torch.profiler.profile.step()`` records ``ProfilerStep#N`` only when
the profiler has a ``schedule`` (``record_steps``); a schedule would start and stop Kineto on its own. We
open the profiler directly and enter ``record_function(f"ProfilerStep#{n}")`` ourselves, which gives the
same name and category (``user_annotation``) as torch's own step spans, with step boundaries where the
caller puts them (at batch end, so that a step holds its batch fetch and host-to-device copy).

``distributedInfo`` (backend, rank, world size) is written into the trace by torch itself
(``torch.profiler.profile.start_trace``) whenever ``torch.distributed`` is initialised, so it is not added
here.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import inspect
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from fitprof._atomic import writing
from fitprof._session import KINETO_SUFFIX, kineto_trace_name, profile_root, session_name
from fitprof._warn import WarnOnce
from fitprof.profilers.base import StepSpans, WindowBusy
from fitprof.profilers.quiet import quiet_profiler_lines
from fitprof.traces._limits import Text, hand_over, map_copy, wait_written, write_in_background
from fitprof.traces._repair import name_list, repair_names
from fitprof.traces._table import OVERHEAD_ANNOTATION, VALIDATION_ANNOTATION

log = logging.getLogger(__name__)

STEP_PREFIX = "ProfilerStep#"
"""Kineto's step-span prefix; the trace reader maps ``ProfilerStep#N`` to a step."""
TRACE_SUFFIX = KINETO_SUFFIX


def global_rank() -> int:
    """The process's global rank: ``torch.distributed`` when initialised, else ``$RANK``, else 0."""
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return int(torch.distributed.get_rank())
    except Exception:  # pragma: no cover - defensive: a broken process group must not stop training
        pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def profiler_running() -> bool:
    """Whether a torch profiler (ours, Lightning's, a user's) is enabled on this thread."""
    try:
        return bool(torch.autograd._profiler_enabled())
    except Exception:  # pragma: no cover - private API moved
        return False


class _EnteredNames:
    """The names entered through ``record_function`` while at least one of fitprof's windows is open.

    Torch records three kinds of names: operator names (C++ schema names such as ``aten::mm``), device kernel and
    runtime names, and the names Python code gives: ``record_function`` spans (users' annotations, fitprof's own,
    the ``DataLoader`` and optimizer spans torch opens itself) and, with ``with_stack``, Python frames. Only the
    names Python gives can hold what torch's C++ trace writer mangles (:func:`_odd_names`), so a window without
    ``with_stack`` checks just these instead of asking the profiler for every recorded event
    (``trace_activities()``: 139 ms plus 45 ms to read the names of a 78k-event window, one Python object an
    event).

    While installed, ``record_function.__enter__`` adds the span's name to a set first (one set insertion a span;
    the class is torch's own, so every caller's spans are seen). A name given past ``record_function``
    (``torch.ops.profiler._record_function_enter_new`` called directly, C++ ``RECORD_FUNCTION``) is not seen: the
    C++ writer then writes it as it does without fitprof, and the reader repairs a quote it left unescaped
    (:func:`fitprof.traces._repair.repair_names`).
    """

    def __init__(self) -> None:
        self.names: set[Any] = set()
        self._users = 0
        self._original: Any = None

    def install(self) -> None:
        self._users += 1
        if self._users > 1:
            return
        original = self._original = record_function.__enter__
        add = self.names.add

        def enter(rf: Any) -> Any:
            add(rf.name)
            return original(rf)

        enter.__wrapped__ = original  # type: ignore[attr-defined]
        record_function.__enter__ = enter  # type: ignore[method-assign]

    def uninstall(self) -> set[Any]:
        """Stop watching (when no other window is open); the names seen since the first window opened."""
        seen = set(self.names)
        self._users = max(self._users - 1, 0)
        if self._users == 0 and self._original is not None:
            record_function.__enter__ = self._original  # type: ignore[method-assign]
            self._original = None
            self.names.clear()
        return seen


_ENTERED = _EnteredNames()


class TorchProfiler(StepSpans):
    """Start, mark and stop one torch.profiler session at a time (the mechanics under :class:`TorchProfileWindow`).

    The window records CPU activity, plus CUDA when a CUDA device is available. Nothing else is recorded by
    default (no stacks, shapes, memory or FLOPs): a 5-step window of a small model is tens of KB gzipped. The
    four options are ``torch.profiler.profile``'s own, as Lightning's ``PyTorchProfiler`` passes them; their
    measured cost is in docs/arguments.md.

    Args:
        record_shapes: record operator input shapes (``Input Dims`` in each op's args).
        profile_memory: record tensor allocations and frees (``[memory]`` instant events).
        with_stack: record the Python and C++ stack of each operator (``python_function`` events).
        with_flops: estimate the FLOPs of matrix multiplications and convolutions (``flops`` in each op's
            args; torch records shapes for it).
        warn: the caller's :class:`~fitprof._warn.WarnOnce` (default: a new one that logs), so each distinct
            problem is warned once.

    Attributes:
        trace_path: the trace exported by the last :meth:`stop`, or None.
        temporary: the last trace is a temporary copy (the directory could not be written); delete it after use.
        started_here: True while a window that this object started is open.
    """

    def __init__(
        self,
        *,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        warn: WarnOnce | None = None,
    ) -> None:
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.warn_once = warn or WarnOnce(log.warning)
        self._prof: profile | None = None
        self._step: record_function | None = None
        self._annotations: list[record_function] = []
        self._overhead: record_function | None = None
        self._path: Path | None = None
        self.trace_path: Path | None = None
        self.step_num: int | None = None
        self.temporary = False
        self._watching = False

    # ----------------------------------------------------------------------------------------------- state
    @property
    def started_here(self) -> bool:
        return self._prof is not None

    # ----------------------------------------------------------------------------------------------- start
    def start(self, directory: str | os.PathLike[str], session: str, *, rank: int | None = None) -> bool:
        """Open a window whose trace will be ``<directory>/<host>_rank<rank>.<session>.pt.trace.json.gz``.

        Returns:
            True if the profiler was started. False, after one warning, if another torch profiler is already
            running on this thread (never start a second one: torch raises and can segfault at exit), if this
            object's window is still open, or if the start failed.
        """
        if self._prof is not None:
            self.warn_once("open", "fitprof: a profiling window is already open; not starting another.")
            return False
        if profiler_running():
            self.warn_once(
                "busy",
                "fitprof: another torch profiler is already running (e.g. Trainer(profiler='pytorch') or "
                "your own torch.profiler.profile); fitprof does not start a second one and skips its windows "
                "while that one runs.",
            )
            return False
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        rank = global_rank() if rank is None else rank
        prof: profile | None = None
        try:
            config = None if self.with_stack else trace_only_config()
            prof = profile(
                activities=activities,
                record_shapes=self.record_shapes,
                profile_memory=self.profile_memory,
                with_stack=self.with_stack,
                with_flops=self.with_flops,
                **({} if config is None else {"experimental_config": config}),
            )
            with quiet_profiler_lines():
                prof.start()
        except Exception as err:
            self.warn_once("start", f"fitprof: could not start the torch profiler ({err!r}); window skipped.")
            if prof is not None and profiler_running():  # half-started: undo what we did
                with contextlib.suppress(Exception), quiet_profiler_lines():
                    prof.stop()
            return False
        self._prof = prof
        if not self.with_stack:  # with stacks, Python frames name events too: every name is checked at export
            _ENTERED.install()
            self._watching = True
        self._path = Path(directory) / kineto_trace_name(session, rank)
        self.step_num = None
        return True

    # ----------------------------------------------------------------------------------------------- marks
    def begin_step(self, n: int) -> None:
        """Close the open step span, if any, and open ``ProfilerStep#n``.

        An open overhead span (:meth:`begin_overhead`) is closed before the old step closes and reopened inside
        the new one, so spans nest and the whole transition is either fitprof's own time or between steps.
        """
        if self._prof is not None:
            self._switch_step(lambda: self._open_step(n))

    def _open_step(self, n: int) -> None:
        try:
            rf = record_function(f"{STEP_PREFIX}{n}")
            rf.__enter__()
        except Exception as err:
            self.warn_once("mark", f"fitprof: could not mark a profiler step ({err!r}).")
        else:
            self._step = rf
            self.step_num = n

    def _end_step(self) -> None:
        rf, self._step = self._step, None
        if rf is not None:
            try:
                rf.__exit__(None, None, None)
            except Exception as err:
                self.warn_once("mark", f"fitprof: could not mark a profiler step ({err!r}).")

    def begin_overhead(self) -> None:
        """Open the :data:`~fitprof.traces._table.OVERHEAD_ANNOTATION` span around the caller's own work (its hook
        body); the analysis leaves it out of step time and reports it as ``fitprof/self_ms_per_step``. No-op
        outside a window or when one is already open."""
        if self._prof is None or self._overhead is not None:
            return
        self._overhead = self._enter(OVERHEAD_ANNOTATION)

    def _enter(self, name: str) -> record_function | None:
        """``record_function(name)``, entered; None, after one warning, when torch refuses it."""
        try:
            rf = record_function(name)
            rf.__enter__()
        except Exception as err:
            self.warn_once("mark", f"fitprof: could not annotate {name!r} ({err!r}).")
            return None
        return rf

    def _close_overhead(self) -> bool:
        rf, self._overhead = self._overhead, None
        if rf is None:
            return False
        try:
            rf.__exit__(None, None, None)
        except Exception as err:
            self.warn_once("mark", f"fitprof: could not close an annotation ({err!r}).")
        return True

    def begin_annotation(self, name: str = VALIDATION_ANNOTATION) -> None:
        """Open a ``record_function(name)`` span (default: the validation annotation) inside the window."""
        if self._prof is None:
            return
        rf = self._enter(name)
        if rf is not None:
            self._annotations.append(rf)

    def end_annotation(self) -> None:
        """Close the innermost annotation opened by :meth:`begin_annotation`, if any."""
        if self._annotations:
            rf = self._annotations.pop()
            try:
                rf.__exit__(None, None, None)
            except Exception as err:
                self.warn_once("mark", f"fitprof: could not close an annotation ({err!r}).")

    # ------------------------------------------------------------------------------------------------ stop
    def _unwatch(self) -> set[Any] | None:
        """The names :class:`_EnteredNames` saw for this window (None: it did not watch, every name is checked)."""
        if not self._watching:
            return None
        self._watching = False
        return _ENTERED.uninstall()

    def stop(self, *, export: bool = True, drop_open_step: bool = False) -> Path | None:
        """Close open spans, stop the profiler this object started and export its trace.

        Does nothing (returns None) when no window of this object is open: it never stops a profiler it did
        not start.

        Args:
            export: write the trace (False: just stop, e.g. after an exception).
            drop_open_step: the open ``ProfilerStep#N`` span holds no complete step (the epoch ended first):
                remove it from the exported trace so that the analysis does not count it (removed from the plain
                JSON before it is compressed: one decode and one encode, linear in the events).

        Returns:
            The path of the gzipped Kineto trace, or None when nothing was exported (no window, ``export``
            False, or a failure, which is warned about once). The file is compressed in the background and appears
            once it is whole (:func:`fitprof.traces._limits.wait_written` waits for it; fitprof's readers do).
        """
        if self._prof is None:
            return None
        # Spans close innermost first: the caller's overhead span (its hook body so far), annotations, the step;
        # what follows (stopping, exporting) is outside every step.
        self._close_overhead()
        while self._annotations:
            self.end_annotation()
        dropped = f"{STEP_PREFIX}{self.step_num}" if drop_open_step and self._step is not None else None
        self._end_step()
        prof, self._prof = self._prof, None
        path, self._path = self._path, None
        try:
            with quiet_profiler_lines():
                prof.stop()
        except Exception as err:
            self.warn_once("stop", f"fitprof: stopping the torch profiler failed ({err!r}); window dropped.")
            return None
        finally:  # after the stop: a span entered up to then, in any thread, is seen
            names = self._unwatch()
        if not export or path is None:
            return None
        self.temporary = False
        inexact: list[str] = []
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            inexact = _export_gzipped(prof, path, drop=dropped, names=names)
        except Exception as err:
            # log_dir cannot be written (read-only, full disk): analyse from a temporary copy instead, so the
            # figures still reach the loggers; the caller deletes it (``temporary`` is True).
            fallback = Path(tempfile.mkdtemp(prefix="fitprof-")) / path.name
            try:
                # torch's C++ writer saves a window once ("Trace is already saved"), even when that save failed
                python = bool(getattr(prof, _CXX_SAVED, False)) and _python_export_available(prof)
                inexact = _export_gzipped(prof, fallback, drop=dropped, names=names, python=python)
            except Exception:
                self.warn_once("export", f"fitprof: exporting the trace to {path} failed ({err!r}).")
                shutil.rmtree(fallback.parent, ignore_errors=True)
                return None
            finally:
                _release_results(prof)
            self.warn_once(
                "export",
                f"fitprof: could not write the trace to {path} ({err!r}); it is analysed from a temporary "
                "copy, which is then deleted.",
            )
            path, self.temporary = fallback, True
        if inexact:
            self.warn_once(
                "names",
                f"fitprof: this torch's trace writer cannot write {len(inexact)} event name(s) as they are: "
                f"{name_list(inexact)}. "
                "fitprof escaped the '\"' it leaves unescaped, so the trace stays valid JSON and the window is kept; "
                "in the trace, '\\' reads '/' and names holding tabs, control or non-ASCII characters read 'unknown' "
                "(a torch whose export_chrome_trace takes use_python_export writes them exactly).",
            )
        self.trace_path = path
        return path


def trace_only_config() -> Any | None:
    """torch's ``_ExperimentalConfig(trace_only=True)`` where this torch has it (2.13 does), else None.

    The window is only ever exported (never ``events()`` or ``key_averages()``, which it forbids), so the C++ side
    may skip what it prepares for those at the stop. Measured on torch 2.13 CPU, fresh processes interleaved, the
    training thread's CPU (``benchmarks/torch_trace_only.py``, load 8.6-10.4): ``stop()`` + ``export_chrome_trace``
    of a 2,984-event window 19.7 -> 12.0 ms (medians of 8, each pair cheaper: 1.14-2.17x), of a 31,481-event one
    213 -> 149 ms (4 of 4 pairs); the exported events the same (count, names, categories, phases, argument names).
    Not with ``with_stack`` (torch then turns it off with a warning: stacks need the Python events).
    """
    try:
        return torch._C._profiler._ExperimentalConfig(trace_only=True)
    except Exception:  # an older torch: no such flag (TypeError), or the private config moved
        return None


BUSY_MESSAGE = (
    "another torch profiler was running: one is already running on this thread (Trainer(profiler='pytorch') or your "
    "own torch.profiler.profile) and fitprof does not start a second one"
)
"""Why a window cannot start while another torch profiler runs (two at once raise and can segfault at exit)."""


class TorchProfileWindow:
    """One torch.profiler window, as both callbacks open it (:class:`~fitprof.profilers.base.ProfileWindow`).

    The Kineto trace is ``<log_dir>/<host>_rank<rank>.<session>.pt.trace.json.gz``; ``session_dir`` is
    ``<log_dir>/plugins/profile/<session>/``, where the epoch-end pipeline writes its ``.xplane.pb``.

    Args:
        log_dir: the run directory.
        epoch: the window's epoch (its session name).
        rank: this process's global rank (None: :func:`global_rank`).
        session: the session name (Lightning: rank 0's, shared by every rank); None picks a new one
            (:func:`fitprof._session.session_name`) with ``suffix`` at :meth:`start`.
        suffix: appended to a picked session name (a triggered window's ``_trigger_step<S>``).
        warn: the caller's :class:`~fitprof._warn.WarnOnce`.
        options: ``torch.profiler.profile`` flags (``record_shapes``, ``profile_memory``, ``with_stack``,
            ``with_flops``).
        hooks: objects with ``install()`` / ``uninstall()``, installed while the window runs (Keras on torch: the
            batch fetch annotated as input).
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        epoch: int,
        rank: int | None = None,
        session: str | None = None,
        suffix: str = "",
        warn: WarnOnce | None = None,
        options: dict[str, bool] | None = None,
        hooks: tuple[Any, ...] = (),
    ) -> None:
        self._log_dir = Path(log_dir)
        self._epoch, self._rank, self._session, self._suffix = epoch, rank, session, suffix
        self._profiler = TorchProfiler(warn=warn, **(options or {}))
        self._hooks = hooks
        self._tmp: Path | None = None
        self.session_dir: Path | None = None

    @property
    def started_here(self) -> bool:
        return self._profiler.started_here

    def start(self) -> None:
        """Raises:
        RuntimeError: when the profiler did not start; :class:`~fitprof.profilers.base.WindowBusy` when another
            torch profiler runs (:data:`BUSY_MESSAGE`)."""
        if profiler_running():
            raise WindowBusy(BUSY_MESSAGE, "another torch profiler was running")
        session = self._session or session_name(self._log_dir, self._epoch, self._suffix)
        if not self._profiler.start(self._log_dir, session, rank=self._rank):
            raise RuntimeError("the torch profiler did not start")
        self.session_dir = profile_root(self._log_dir) / session
        for hook in self._hooks:
            hook.install()

    def begin_step(self, step: int) -> None:
        self._profiler.begin_step(step)

    def end_step(self) -> None:
        self._profiler.end_step()

    def begin_overhead(self) -> None:
        self._profiler.begin_overhead()

    def end_overhead(self) -> None:
        self._profiler.end_overhead()

    def begin_annotation(self, name: str = VALIDATION_ANNOTATION) -> None:
        self._profiler.begin_annotation(name)

    def end_annotation(self) -> None:
        self._profiler.end_annotation()

    def stop(self, *, drop_open_step: bool = False) -> Path:
        """Stop and export the gzipped Kineto trace; return its path (a temporary copy, with ``session_dir`` None,
        when ``log_dir`` cannot be written). The file is compressed in the background and appears there once it is
        whole: fitprof's readers of it wait for it, and so does :func:`fitprof.traces._limits.wait_written`.

        Raises:
            RuntimeError: when the profiler could not stop or export (warned once already).
        """
        self._uninstall()
        path = self._profiler.stop(drop_open_step=drop_open_step)
        if path is None:
            raise RuntimeError("the torch profiler exported no trace")
        if self._profiler.temporary:
            self.session_dir, self._tmp = None, path
        return path

    def cleanup(self) -> None:
        """Delete the temporary copy kept when the trace could not be written to ``log_dir``."""
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            wait_written(tmp)  # not deleted under its compressing thread
            shutil.rmtree(tmp.parent, ignore_errors=True)

    def abort(self) -> None:
        self._uninstall()
        with contextlib.suppress(Exception):
            self._profiler.stop(export=False)

    def _uninstall(self) -> None:
        for hook in self._hooks:
            with contextlib.suppress(Exception):
                hook.uninstall()


_PLAIN_NAME = re.compile(r"[ !#-\[\]-~]*")
"""A name torch's C++ trace writer keeps as it is: printable ASCII without ``"`` and ``\\``."""


def _odd_names(prof: Any, names: Any = None) -> list[str]:
    """The recorded event names that torch's C++ Chrome-trace writer cannot write as they are, sorted.

    That writer (``export_chrome_trace`` without ``use_python_export``, torch 2.13) leaves ``"`` unescaped
    (invalid JSON), writes ``\\`` as ``/``, drops newlines and writes ``unknown`` for a name holding a tab,
    another control character or a non-ASCII character (pytorch/pytorch#146900). The names come from the
    profiler's own activity list; [] when it cannot be read. Cost, measured on a 4,025-event window (5 steps of
    an 8-layer MLP, 2 busy CPU cores, 12 interleaved repeats): the export's median went from 95 ms to 115 ms.
    ``names``: the only names that can need it (:class:`_EnteredNames`), checked instead of the activity list.
    """
    if names is not None:
        return sorted(n for n in names if isinstance(n, str) and not _PLAIN_NAME.fullmatch(n))
    try:
        results = prof.profiler.kineto_results
        items = results.trace_activities() if hasattr(results, "trace_activities") else results.events()
        names = {item.name() for item in items}
    except Exception:  # private API moved: export without the name repair
        return []
    return sorted(n for n in names if not _PLAIN_NAME.fullmatch(n))


def _python_export_available(prof: Any) -> bool:
    """Whether this torch's ``export_chrome_trace`` can write the trace from Python (``use_python_export``, which
    torch 2.13 has)."""
    try:
        return "use_python_export" in inspect.signature(prof.export_chrome_trace).parameters
    except (TypeError, ValueError):
        return False


def _export_gzipped(
    prof: Any, path: Path, *, drop: str | None = None, names: Any = None, python: bool = False
) -> list[str]:
    """Export the Chrome trace to ``path`` (``.gz``), every event name intact, without the complete events called
    ``drop`` (a step the epoch cut short).

    torch's own ``.gz`` export copies its temporary JSON into ``GzipFile`` line by line (11,654 writes for a
    5-step window: 53 ms); fitprof writes the plain JSON and compresses it in 1 MB chunks at the fastest level
    (:func:`_gzip_file`), in a thread of its own (:func:`_compress`; on the calling thread when no thread can be
    started): ``path`` appears once it is whole, and the readers of ``path``
    (:func:`fitprof.traces._limits.read_bounded`) and :func:`fitprof.traces._limits.wait_written` wait for it. The plain text is handed to the reader meanwhile.

    Names torch's fast C++ writer cannot write (:func:`_odd_names`) are exported exactly with torch's Python
    writer (``use_python_export=True``: correct JSON escapes, but about 6x slower, so only then). Where that
    writer does not exist or fails, the C++ writer's file is repaired (:mod:`fitprof.traces._repair`: the
    ``"`` it leaves unescaped is escaped) so that the trace is valid JSON; those names are returned, as that
    writer has also changed their ``\\``, control and non-ASCII characters.

    ``names``: the names that can need the Python writer (:class:`_EnteredNames`); None checks every recorded
    name. ``python``: export with the Python writer whatever the names (a second export of a window whose C++ save
    was tried: that writer refuses to save a trace twice).

    A trace the C++ writer could not write whole (a full disk: it raises nothing, :func:`_check_written`) raises
    :class:`OSError`, and the file it left is deleted.

    Returns:
        The names that could not be written exactly ([] when every name was).
    """
    odd = _odd_names(prof, names)
    fd, tmp = tempfile.mkstemp(suffix=".json", prefix="fitprof-", dir=path.parent)
    os.close(fd)
    compressing = False
    try:
        exact = False
        if python:
            prof.export_chrome_trace(tmp, use_python_export=True)
            exact = True
        elif odd and _python_export_available(prof):
            try:
                prof.export_chrome_trace(tmp, use_python_export=True)
                exact = True
            except Exception as err:
                log.debug("torch's Python trace export failed (%r); using its C++ writer", err)
        if not exact:
            setattr(prof, _CXX_SAVED, True)
            prof.export_chrome_trace(tmp)
            _check_written(Path(tmp))
            if odd:
                _repair_file(Path(tmp))
        if drop is not None:
            try:
                _drop_events(Path(tmp), drop)
            except OSError:  # the rewrite may have cut the file: the caller falls back to a temporary copy
                raise
            except Exception as err:  # the trace is kept with the partial step in it
                log.warning("fitprof: could not drop the partial step %s from the trace (%r).", drop, err)
        plain = Path(tmp)
        text = _plain_text(plain)  # mapped before the compressing thread deletes the file
        try:
            write_in_background(path, functools.partial(_compress, plain, path))
        except RuntimeError as err:  # no thread to be had (a process at its thread limit): compressed here instead
            log.debug("fitprof: the trace is compressed on the calling thread (%r)", err)
            compressing = True  # _compress deletes the plain file, written or not
            _compress(plain, path)
        else:
            compressing = True  # the thread deletes the plain file
        if text is not None:
            hand_over(path, text)
    finally:
        with contextlib.suppress(OSError):  # what torch's C++ writer leaves when it fails (see _check_written)
            os.unlink(tmp + _TORCH_PART)
        if not compressing:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return [] if exact else odd


def _release_results(prof: Any) -> None:
    """Free the recorded results of the stopped profiler ``prof`` now: the file its C++ writer failed to write stays
    open, its disk space held, until they are freed, and ``prof`` itself was seen to outlive the fit (a test's
    Lightning fit on a full disk still held the file open after ``fit`` returned)."""
    with contextlib.suppress(Exception):  # private attribute moved: freed with ``prof`` as before
        prof.profiler.kineto_results = None


_CXX_SAVED = "_fitprof_cxx_saved"
"""Set on a ``torch.profiler.profile`` once its C++ trace writer was asked to save (it saves only once)."""
_TORCH_PART = ".tmp"
"""The suffix of the file torch's C++ trace writer (Kineto's ``ChromeTraceLogger``, torch 2.13) writes first and
renames to the name it was given once the whole trace is written."""


def _check_written(plain: Path) -> None:
    """Raise when torch's C++ trace writer did not write the whole trace to ``plain``.

    On a full disk that writer logs "Failed to write to log file!" and raises nothing (torch 2.13): the trace it
    was writing stays cut under ``<plain>.tmp`` (open until the profiler object is freed) and ``plain`` keeps what
    it held before (here: nothing, as it is created empty first). A whole trace is a JSON document, so it ends in
    ``}`` (or ``]``, the legacy bare list): this checks the leftover, the size and that last byte, not the JSON.

    Raises:
        OSError: naming what was found.
    """
    part = Path(os.fspath(plain) + _TORCH_PART)
    if part.exists():
        raise OSError(f"torch's trace writer could not write the whole trace (a full disk?); it left {part.name} cut")
    with open(plain, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(size - 64, 0))
        tail = fh.read().rstrip()
    if not tail or tail[-1:] not in (b"}", b"]"):
        what = "an empty file" if size == 0 else f"a file cut at {size:,} bytes"
        raise OSError(f"torch's trace writer left {what} (a full disk?)")


GZIP_LEVEL = 1
"""The trace's gzip level: the fastest. Measured on a 32.8 MB window of 105k events: zlib level 6 took 0.32 s, ISA-L
level 1 0.025 s (2.26 MB instead of 1.57 MB); the trace is read back once, at the epoch's end."""


def _gzip_file(src: Path, dst: Path) -> None:
    """Compress ``src`` into the gzip file ``dst`` at :data:`GZIP_LEVEL`, with ISA-L (the ``fast`` extra) where it is
    installed, else zlib. ``dst`` appears whole or not at all (written under a hidden temporary name, renamed)."""
    try:
        from isal import igzip  # a gzip stream, as zlib's; about 10x faster at level 1

        opener: Any = igzip.open
    except ImportError:
        opener = gzip.open
    with open(src, "rb") as fin, writing(dst) as part, opener(part, "wb", compresslevel=GZIP_LEVEL) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


def _compress(plain: Path, gz: Path) -> None:
    """Compress the plain trace ``plain`` into ``gz`` (:func:`_gzip_file`), then delete ``plain``: the export's
    background write (:func:`fitprof.traces._limits.write_in_background`), off the training thread, as zlib and
    ISA-L release the GIL while they compress. The readers of ``gz`` and the copies to a remote log dir wait for
    it; what it raises is warned about by the epoch's analysis (:meth:`fitprof.fit.pipeline.WindowPipeline.analyze`),
    whose figures are read from the handed-over text meanwhile."""
    try:
        _gzip_file(plain, gz)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(plain)


def _plain_text(plain: Path) -> Text | None:
    """The plain text of the trace being compressed, for the reader (:func:`fitprof.traces._limits.hand_over`): the
    epoch's analysis reads the trace at once, and reading the plain text costs less than inflating it (28 MB: 95-150
    ms of CPU to inflate, measured). The text is a copy-on-write map of the plain file
    (:func:`fitprof.traces._limits.map_copy`), not a copy of it, and stays readable after the file is deleted. Best
    effort (None): the reader then waits for the compressed file and inflates it."""
    try:
        return map_copy(plain)
    except OSError as err:
        log.debug("fitprof: the trace's plain text was not handed to the reader (%r)", err)
        return None


def _repair_file(path: Path) -> None:
    """Escape the names torch's C++ writer left unescaped in the plain JSON trace at ``path``, in place."""
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    fixed, names = repair_names(text)
    if names:
        path.write_text(fixed, encoding="utf-8", errors="surrogateescape")


def _drop_events(path: Path, name: str) -> None:
    """Rewrite the plain JSON trace at ``path`` without its complete events called ``name``: one decode, one pass
    over the events and one encode (msgspec keeps every key, value and their order)."""
    data = msgspec.json.decode(path.read_bytes())
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        return
    data["traceEvents"] = [e for e in events if not (e.get("name") == name and e.get("ph") == "X")]
    if len(data["traceEvents"]) != len(events):
        path.write_bytes(msgspec.json.encode(data))


__all__ = [
    "BUSY_MESSAGE",
    "STEP_PREFIX",
    "TorchProfileWindow",
    "TorchProfiler",
    "global_rank",
    "profiler_running",
]

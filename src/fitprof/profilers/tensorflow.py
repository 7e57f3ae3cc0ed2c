"""The ``tf.profiler`` window: profile into a private folder, then move the ``.xplane.pb`` into a new session folder."""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fitprof._atomic import move_into_place, temporary_name
from fitprof._fs import OBJECT_STORES, scheme
from fitprof._session import XPLANE_SUFFIX, new_session_dir, rank_host
from fitprof._warn import WarnOnce
from fitprof.profilers.base import StepSpans
from fitprof.profilers.quiet import quiet_profiler_lines
from fitprof.traces._table import OVERHEAD_ANNOTATION

log = logging.getLogger(__name__)


class TFProfileWindow(StepSpans):
    """One profiled window of ``tf.profiler`` (a :class:`~fitprof.profilers.base.ProfileWindow`).

    ``start`` runs ``tf.profiler.experimental.start`` into a temporary folder; each step is wrapped in
    ``tf.profiler.experimental.Trace("train", step_num=n, _r=1)``, the marker xprof needs to find steps;
    ``stop`` stops the profiler and moves the ``.xplane.pb`` to ``<log_dir>/plugins/profile/<session>/``
    (``session_dir``, :func:`fitprof._session.new_session_dir`), named ``<host>_rank<r>.xplane.pb`` when ``world`` > 1.
    When ``log_dir`` cannot be written (read-only, a full disk) it returns the temporary copy, sets ``save_error``,
    leaves ``session_dir`` None (and no empty session folder in the Profile tab) and warns once per fit (``warn``,
    key ``"write"``, shared with the callbacks' other writes) that the window is analysed from that copy and not
    kept; ``cleanup`` deletes the copy after the analysis. Every other failure is raised as ``RuntimeError`` for the
    callback to turn into a warning.
    """

    _PROFILER = "tf.profiler"
    _TMP_PREFIX = "fitprof-tf-"

    def __init__(
        self,
        log_dir: str,
        *,
        epoch: int,
        rank: int = 0,
        world: int = 1,
        suffix: str = "",
        warn: WarnOnce | None = None,
    ) -> None:
        """``suffix``: appended to the session name (:func:`fitprof._session.session_name`; a triggered window's
        :func:`~fitprof._session.trigger_suffix`). ``warn``: the caller's :class:`~fitprof._warn.WarnOnce`
        (default: a new one)."""
        import tensorflow  # noqa: F401  (fail here, at construction, when TensorFlow is missing)

        self._init_state(log_dir, epoch=epoch, rank=rank, world=world, suffix=suffix, warn=warn)

    def _init_state(
        self, log_dir: str, *, epoch: int, rank: int, world: int, suffix: str = "", warn: WarnOnce | None = None
    ) -> None:
        self._log_dir = log_dir
        self._warn = warn or WarnOnce()
        self._suffix = suffix
        self._epoch, self._rank, self._world = epoch, rank, world
        self._tmp: str | None = None
        self._step: Any = None
        self._overhead: Any = None
        self.session_dir: Path | None = None
        self.save_error: OSError | None = None
        self._tmp_keep: str | None = None

    @property
    def _tf(self) -> Any:
        """The ``tensorflow`` module, imported where it is used: a window keeps no module in its state, so the
        callback that holds it can be copied and pickled."""
        import tensorflow as tf

        return tf

    def start(self) -> None:
        self._tmp = tempfile.mkdtemp(prefix=self._TMP_PREFIX)
        try:
            with quiet_profiler_lines():
                self._start_profiler(self._tmp)
        except Exception as err:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
            raise RuntimeError(f"{self._PROFILER} could not start: {err}") from err

    # The profiler's own calls, overridden by windows of other XSpace profilers (fitprof.profilers.jax).
    def _start_profiler(self, tmp: str) -> None:
        self._tf.profiler.experimental.start(tmp)

    def _stop_profiler(self, *, save: bool = True) -> None:
        self._tf.profiler.experimental.stop(save=save)

    def _step_marker(self, step: int) -> Any:
        return self._tf.profiler.experimental.Trace("train", step_num=step, _r=1)

    def _annotation(self, name: str) -> Any:
        return self._tf.profiler.experimental.Trace(name)

    def begin_step(self, step: int) -> None:
        """Close the open step marker, if any, and open step ``step``'s. An open overhead span is closed before
        and reopened after, so spans nest."""
        self._switch_step(lambda: self._open_step(step))

    def _open_step(self, step: int) -> None:
        self._step = self._step_marker(step)
        self._step.__enter__()

    def _end_step(self) -> None:
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None

    def begin_overhead(self) -> None:
        """Open a ``Trace("fitprof/overhead")`` span (:data:`~fitprof.traces._table.OVERHEAD_ANNOTATION`) around the
        caller's own work: left out of step time, reported as ``fitprof/self_ms_per_step``. No-op when the
        profiler is not running here or one is already open."""
        if self._tmp is None or self._overhead is not None:
            return
        trace = self._annotation(OVERHEAD_ANNOTATION)
        trace.__enter__()
        self._overhead = trace

    def _close_overhead(self) -> bool:
        trace, self._overhead = self._overhead, None
        if trace is None:
            return False
        trace.__exit__(None, None, None)
        return True

    def begin_annotation(self, name: str) -> None:
        """Open a ``Trace(name)`` span inside the window (no-op when the profiler is not running here)."""
        if self._tmp is None:
            return
        trace = self._annotation(name)
        trace.__enter__()
        self._annotations = [*getattr(self, "_annotations", []), trace]

    def end_annotation(self) -> None:
        """Close the innermost span :meth:`begin_annotation` opened, if any."""
        annotations = getattr(self, "_annotations", [])
        if annotations:
            annotations.pop().__exit__(None, None, None)

    def stop(self, *, drop_open_step: bool = False) -> Path:
        """Stop the profiler and return the moved ``.xplane.pb``.

        Args:
            drop_open_step: leave the open step (one that raised before it finished) out of the profile.

        Raises:
            RuntimeError: if stopping fails or no ``.xplane.pb`` was written.
        """
        self._close_overhead()  # innermost first: the caller's own span, the annotations, then the step
        while getattr(self, "_annotations", []):
            self.end_annotation()
        unfinished = None
        if drop_open_step:
            # Keep the open marker alive, unclosed, until the profiler has stopped: it is then never recorded.
            unfinished, self._step = self._step, None
        self.end_step()
        tmp, self._tmp = self._tmp, None
        try:
            with quiet_profiler_lines():
                self._stop_profiler()
        except Exception as err:
            raise RuntimeError(f"{self._PROFILER} could not stop: {err}") from err
        finally:
            del unfinished
        written = sorted(Path(tmp or ".").glob("plugins/profile/*/*.xplane.pb"))
        if not written:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"{self._PROFILER} wrote no .xplane.pb")
        session: Path | None = None
        try:
            session = new_session_dir(self._log_dir, self._epoch, getattr(self, "_suffix", ""))
            host = written[-1].name.removesuffix(XPLANE_SUFFIX)
            target = session / (rank_host(host, self._rank, self._world) + XPLANE_SUFFIX)
            move_into_place(written[-1], target)  # whole or not at all, even from another filesystem
        except OSError as err:
            # log_dir cannot be written (read-only, full disk): keep the temporary copy for the analysis.
            self.save_error = err
            self._tmp_keep = tmp
            if session is not None:  # a folder holds no data: it is made on a full disk, and would list empty
                with contextlib.suppress(OSError):
                    session.rmdir()
            warn = getattr(self, "_warn", None) or WarnOnce()
            warn(  # the key of the callbacks' other writes: one "could not write" a fit, whatever failed first
                "write",
                f"fitprof: could not write the profile in {self._log_dir} ({err!r}); the window is analysed from a "
                "temporary copy, which is then deleted: the Profile tab does not show it.",
            )
            return written[-1]
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        self.session_dir = session
        return target

    def cleanup(self) -> None:
        """Delete the temporary copy kept when the profile could not be saved in ``log_dir``."""
        if self._tmp_keep:
            shutil.rmtree(self._tmp_keep, ignore_errors=True)
            self._tmp_keep = None

    def abort(self) -> None:
        """Stop a running profiler without keeping anything (used after a failure)."""
        self._step = self._overhead = None
        self._annotations = []
        try:
            with quiet_profiler_lines():
                self._stop_profiler(save=False)
        except Exception:
            pass
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


class GFileStore:
    """A remote run directory through ``tf.io.gfile`` (``gs://``, ``s3://`` with tensorflow-io, ``hdfs://``,
    ``ram://``...), as Keras's ``TensorBoard`` callback writes: the :class:`fitprof._fs.Mirror` store of Keras on
    TensorFlow.

    Raises:
        OSError: when TensorFlow has no filesystem for the URL's scheme (the message names the URL).
    """

    def __init__(self, url: str) -> None:
        import tensorflow as tf

        self.url = url.rstrip("/")
        self._gfile = tf.io.gfile
        try:
            self._gfile.makedirs(self.url)
        except tf.errors.UnimplementedError as err:
            scheme = self.url.partition("://")[0]
            raise OSError(
                f"TensorFlow has no filesystem for '{scheme}://' ({err.message.strip()}; for s3:// and hdfs:// "
                "pip install tensorflow-io)"
            ) from None

    def put(self, local: Path, rel: str) -> None:
        target = f"{self.url}/{rel}"
        self._gfile.makedirs(target.rpartition("/")[0])
        if scheme(self.url) in OBJECT_STORES:  # an object appears whole once its upload completes
            if self._gfile.exists(target):
                self._gfile.remove(target)
            self._gfile.copy(str(local), target)
            return
        # Elsewhere (hdfs://, ram://...) copied to a temporary name and renamed: a copy cut short leaves no half
        # file under the final name.
        folder, _, name = target.rpartition("/")
        part = f"{folder}/{temporary_name(name).name}"
        if self._gfile.exists(part):  # TensorFlow's ram:// appends to a file written over: replace it
            self._gfile.remove(part)
        self._gfile.copy(str(local), part)
        self._gfile.rename(part, target, overwrite=True)

    def remove(self, rel: str) -> None:
        target = f"{self.url}/{rel}"
        if self._gfile.exists(target):
            self._gfile.remove(target)

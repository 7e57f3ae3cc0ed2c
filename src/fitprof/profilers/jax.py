"""The ``jax.profiler`` window: the :class:`~fitprof.profilers.tensorflow.TFProfileWindow` life cycle (private
folder, ``.xplane.pb`` moved into a new session folder) with JAX's own start, stop and step marker, plus the
annotation of each batch fetch.

JAX writes the same XSpace layout as TensorFlow (``<dir>/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>.xplane.pb``).
Steps are marked with ``jax.profiler.StepTraceAnnotation("train", step_num=n)``, which adds the ``_r=1`` stat that
xprof needs to find steps. Keras's JAX trainer fetches each batch in Python inside ``train_function``
(``next(iterator)``), after ``on_train_batch_begin``: :meth:`JaxProfileWindow.annotate_input` wraps that iterator so
each fetch is a ``fitprof/input`` span inside the step, read as input by :mod:`fitprof.traces.xspace`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fitprof._warn import WarnOnce
from fitprof.profilers.tensorflow import TFProfileWindow
from fitprof.traces.xspace import INPUT_ANNOTATION


class JaxProfileWindow(TFProfileWindow):
    """One profiled window of ``jax.profiler`` (the interface and guarantees of ``TFProfileWindow``).

    Raises ``RuntimeError`` from ``start`` when another ``jax.profiler`` trace is running (JAX allows one per
    process) and from ``stop`` when it cannot stop or wrote no ``.xplane.pb``.
    """

    _PROFILER = "jax.profiler"
    _TMP_PREFIX = "fitprof-jax-"

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
        import jax.profiler  # noqa: F401  (fail here, at construction, when JAX is missing)

        self._init_state(log_dir, epoch=epoch, rank=rank, world=world, suffix=suffix, warn=warn)

    @property
    def _jax_profiler(self) -> Any:
        """``jax.profiler``, imported where it is used: a window keeps no module in its state (copy, pickle)."""
        import jax.profiler

        return jax.profiler

    def _start_profiler(self, tmp: str) -> None:
        # JAX traces every Python call by default (python_tracer_level=1), which slows the Python batch fetch
        # the window measures; TensorFlow's profiler leaves it off (0): so does fitprof.
        options = self._jax_profiler.ProfileOptions()
        options.python_tracer_level = 0
        self._jax_profiler.start_trace(tmp, profiler_options=options)

    def _stop_profiler(self, *, save: bool = True) -> None:
        # JAX always writes the trace; an aborted window's folder is deleted by ``abort``.
        self._jax_profiler.stop_trace()

    def _step_marker(self, step: int) -> Any:
        return self._jax_profiler.StepTraceAnnotation("train", step_num=step)

    def _annotation(self, name: str) -> Any:
        return self._jax_profiler.TraceAnnotation(name)

    def annotate_input(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """``iterator`` with each ``next`` inside a ``fitprof/input`` annotation (the batch fetch as input)."""
        return _AnnotatedIterator(iterator, self._jax_profiler.TraceAnnotation)


class _AnnotatedIterator:
    """An iterator whose every ``next`` runs inside ``annotation(INPUT_ANNOTATION)``."""

    def __init__(self, iterator: Iterator[Any], annotation: Any) -> None:
        self._iterator = iterator
        self._annotation = annotation

    def __iter__(self) -> _AnnotatedIterator:
        return self

    def __next__(self) -> Any:
        with self._annotation(INPUT_ANNOTATION):
            return next(self._iterator)

"""The Keras torch backend: its window (:func:`torch_window`, the one
:class:`~fitprof.profilers.torch.TorchProfileWindow` with Keras's batch fetch annotated as input) and the
:class:`FetchTimer` of the always-on step timing.

On the torch backend Keras fetches each batch in Python before ``on_train_batch_begin``, so a step span
``[begin(n), begin(n+1))`` holds step ``n``'s compute and step ``n+1``'s fetch: every span still holds one
fetch and one step, so step time and input share keep their meaning.

The fetch is Keras's ``TorchEpochIterator.__next__`` (``keras/src/trainers/epoch_iterator.py``): it resumes
Keras's step generator and calls ``next()`` on a torch ``DataLoader`` wrapped around the data adapter's
iterator. torch annotates only that inner ``DataLoader.__next__``. While a window is open, :func:`torch_window` wraps the whole fetch in
:data:`INPUT_ANNOTATION`, a ``DataLoader``-style name that the Kineto reader files as input (nested spans are
united, never counted twice). Outside the window nothing is wrapped. The ``.xplane.pb`` is written at the
epoch's end by :class:`fitprof.fit.pipeline.WindowPipeline`, as for Lightning.
"""

from __future__ import annotations

import time
from typing import Any

from torch.autograd.profiler import record_function

from fitprof._batch import batch_size
from fitprof._warn import WarnOnce
from fitprof.profilers.torch import TorchProfileWindow

INPUT_ANNOTATION = "enumerate(DataLoader)#keras.TorchEpochIterator.__next__"
"""The span around each batch fetch of Keras's torch fit loop while a window is open: the Kineto reader files
``enumerate(DataLoader)#...__next__`` spans as input (:data:`fitprof.traces._table.Kind.INPUT`)."""


class _FetchAnnotation:
    """Wrap ``TorchEpochIterator.__next__`` in :data:`INPUT_ANNOTATION` between :meth:`install` and
    :meth:`uninstall` (the class attribute is set and then restored, so nothing is left behind)."""

    _MISSING = object()

    def __init__(self) -> None:
        self._cls: Any = None
        self._own: Any = self._MISSING

    def install(self) -> None:
        try:
            from keras.src.backend.torch.trainer import TorchEpochIterator
        except Exception:  # Keras moved it: torch's own DataLoader span still counts the inner fetch
            return
        if getattr(TorchEpochIterator.__next__, "_fitprof_input", False):
            return
        inherited = TorchEpochIterator.__next__

        def __next__(iterator: Any) -> Any:
            with record_function(INPUT_ANNOTATION):
                return inherited(iterator)

        __next__._fitprof_input = True  # type: ignore[attr-defined]
        self._own = TorchEpochIterator.__dict__.get("__next__", self._MISSING)
        self._cls = TorchEpochIterator
        TorchEpochIterator.__next__ = __next__

    def uninstall(self) -> None:
        cls, self._cls = self._cls, None
        if cls is None:
            return
        if self._own is self._MISSING:
            del cls.__next__
        else:
            cls.__next__ = self._own
        self._own = self._MISSING


class FetchTimer:
    """Time every batch fetch of Keras's torch fit loop, for the always-on step timing (no profiler).

    Between :meth:`install` and :meth:`uninstall`, ``TorchEpochIterator.__next__`` (the whole fetch: Keras's step
    generator and the ``DataLoader``, the span :data:`INPUT_ANNOTATION` marks inside a window) is wrapped to
    record its wall time (``time.perf_counter_ns``) and the samples it returned (:func:`fitprof._batch.batch_size`
    of each batch of the ``steps_per_execution`` buffer, summed). The fetch of step ``n`` happens right before
    ``on_train_batch_begin(n)``, so the hook reads :attr:`wait_ns` / :attr:`samples` of the batch it is about to
    run. Two ``perf_counter_ns`` calls and a shape lookup per step; validation fetches go through it too (the
    adapter reads it only in training batch hooks). The class attribute is set and then restored, as
    :class:`_FetchAnnotation` does (that one wraps this one while a window is open).

    Attributes:
        wait_ns: the wall time of the last fetch (ns), None before the first.
        samples: the samples the last fetch returned, None when unknown.
    """

    _MISSING = object()

    def __init__(self) -> None:
        self._cls: Any = None
        self._own: Any = self._MISSING  # what the class held before install (its own __next__, or none)
        self._wrapper: Any = None
        self.wait_ns: int | None = None
        self.samples: int | None = None

    def install(self) -> None:
        try:
            from keras.src.backend.torch.trainer import TorchEpochIterator
        except Exception:  # Keras moved it: no input wait and no samples (NaN), step time still measured
            return
        if self._cls is not None:
            return
        inherited = TorchEpochIterator.__next__
        timer = self

        def __next__(iterator: Any) -> Any:
            if timer._cls is None:  # uninstalled while another timer's wrapper was above it: pass through
                return inherited(iterator)
            t0 = time.perf_counter_ns()
            out = inherited(iterator)
            timer.wait_ns = time.perf_counter_ns() - t0
            try:
                timer.samples = _buffer_samples(out)
            except Exception:  # pragma: no cover - batch_size never raises; an odd tuple shape is no reason to fail
                timer.samples = None
            return out

        __next__._fitprof_timer = timer  # type: ignore[attr-defined]
        self._own = TorchEpochIterator.__dict__.get("__next__", self._MISSING)
        self._cls = TorchEpochIterator
        self._wrapper = __next__
        TorchEpochIterator.__next__ = __next__

    def uninstall(self) -> None:
        """Put back what :meth:`install` replaced, only while the class still holds this timer's own wrapper
        (another ``FitProfiler``'s timer installed after it is not stripped). A wrapper left under another one
        passes through from now on, and is skipped when the one above it is uninstalled."""
        cls, self._cls = self._cls, None
        self.wait_ns = self.samples = None
        if cls is None or cls.__dict__.get("__next__") is not self._wrapper:
            return
        own = self._own
        while getattr(own, "_fitprof_timer", None) is not None and own._fitprof_timer._cls is None:
            own = own._fitprof_timer._own  # an uninstalled timer's wrapper below this one: skip it too
        if own is self._MISSING:
            del cls.__next__
        else:
            cls.__next__ = own
        self._own = self._MISSING


def _buffer_samples(out: Any) -> int | None:
    """Samples in one ``EpochIterator.__next__`` result, ``(begin_step, end_step, [batch, ...])``."""
    buffer = out[2] if isinstance(out, tuple) and len(out) == 3 else None
    if not isinstance(buffer, list) or not buffer:
        return None
    total = 0
    for batch in buffer:
        n = batch_size(batch)
        if n is None:
            return None
        total += n
    return total


def torch_window(
    run_dir: str, *, epoch: int, rank: int, world: int, suffix: str, warn: WarnOnce, options: dict[str, bool]
) -> TorchProfileWindow:
    """The Keras torch-backend window: the one :class:`~fitprof.profilers.torch.TorchProfileWindow`, with Keras's
    batch fetch annotated as input while it runs (``world`` is in the trace already: torch writes
    ``distributedInfo``)."""
    return TorchProfileWindow(
        run_dir, epoch=epoch, rank=rank, suffix=suffix, warn=warn, options=options, hooks=(_FetchAnnotation(),)
    )

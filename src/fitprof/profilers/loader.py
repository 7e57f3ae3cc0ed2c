"""Worker-side timing of a PyTorch ``DataLoader``: what each worker spends producing a batch, in shared memory.

:meth:`DataLoaderTiming.attach` chains the loader's ``worker_init_fn``. Inside each worker process, after the user's
own ``worker_init_fn``, the chained function wraps the fetcher that worker creates for the loader's dataset (the one
object that runs the samples' ``__getitem__`` and the ``collate_fn`` of a batch, ``fetcher.fetch(index)``, for
map-style and iterable datasets alike) so that each call adds its wall time (``time.perf_counter_ns``), its CPU
time (``time.thread_time_ns``), its time waiting for a core (Linux's run-queue wait) and one batch to that worker's slots of a small shared ``int64`` array. The batch
is returned as the fetcher made it, untouched. The main process reads the array
(:meth:`DataLoaderTiming.read`) when it wants, without a message to the workers.

Why the fetcher, reached through ``worker_init_fn``: the dataset and the sampler cannot be replaced after a
``DataLoader`` is built (its ``__setattr__`` refuses), a ``collate_fn`` wrapper sees only the collate and not the
samples' ``__getitem__`` before it, and the worker loop creates its fetcher (``_DatasetKind.create_fetcher``) right
after ``worker_init_fn`` returns, in every worker, again at each epoch of ``persistent_workers``. The patch lives in
the worker process only (never the main one) and wraps only fetchers of the worker's own dataset. The chained
function and the array pickle, so spawn and forkserver workers get them as fork workers do.

:meth:`DataLoaderTiming.detach` puts the user's ``worker_init_fn`` back and switches the timing off in workers that
are still running (``persistent_workers=True``): they check a shared flag before each batch. With
``num_workers=0`` nothing is attached (:attr:`DataLoaderTiming.workers` is 0): the main process produces the
batches and the probe times that as the input wait.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

from fitprof.profilers.counters import LoaderCounters

log = logging.getLogger(__name__)

_FLAG = 0
"""Slot 0 of the shared array: 1 while the timing is on."""


class _TimedInit:
    """The chained ``worker_init_fn``: the user's function, then the fetcher wrapping (picklable for spawn)."""

    def __init__(self, user: Callable[[int], None] | None, shared: Any, workers: int) -> None:
        self.user = user
        self.shared = shared
        self.workers = workers

    def __call__(self, worker_id: int) -> None:
        if self.user is not None:
            self.user(worker_id)
        try:
            _wrap_fetchers(self.shared, self.workers, worker_id)
        except Exception as err:  # timing must never stop a worker: that worker goes untimed
            log.debug("fitprof: loader timing not installed in worker %s: %r", worker_id, err)


def _wrap_fetchers(shared: Any, workers: int, worker_id: int) -> None:
    """In a worker process: wrap every fetcher later created for this worker's dataset."""
    if not 0 <= worker_id < workers:
        return
    from torch.utils.data import _DatasetKind, get_worker_info

    info = get_worker_info()
    dataset = info.dataset if info is not None else None
    create = _DatasetKind.create_fetcher
    if getattr(create, "_fitprof_timed", False):  # this worker's loop already wrapped it (a reused process)
        return
    busy, cpu, runq, batches = (1 + k * workers + worker_id for k in range(4))
    waited = _runqueue_clock()

    def create_fetcher(kind: Any, ds: Any, *args: Any, **kwargs: Any) -> Any:
        fetcher = create(kind, ds, *args, **kwargs)
        if ds is not dataset:
            return fetcher
        fetch = fetcher.fetch

        def timed_fetch(index: Any) -> Any:
            if not shared[_FLAG]:
                return fetch(index)
            t0, c0, q0 = time.perf_counter_ns(), time.thread_time_ns(), waited()
            try:
                data = fetch(index)
            finally:
                shared[busy] += time.perf_counter_ns() - t0
                shared[cpu] += time.thread_time_ns() - c0
                shared[runq] += waited() - q0
            shared[batches] += 1
            return data

        fetcher.fetch = timed_fetch
        return fetcher

    create_fetcher._fitprof_timed = True  # type: ignore[attr-defined]
    _DatasetKind.create_fetcher = staticmethod(create_fetcher)  # type: ignore[assignment]


def _runqueue_clock() -> Callable[[], int]:
    """This thread's time runnable but waiting for a core, in ns (Linux ``/proc/thread-self/schedstat``, field 2:
    a ``pread`` on a file opened once, about 2 us); a clock that reads 0 where that file is missing."""
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        int(os.pread(fd, 64, 0).split()[1])
    except (OSError, ValueError, IndexError):
        return lambda: 0

    def read() -> int:
        try:
            return int(os.pread(fd, 64, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    return read


def _drop_running_workers(loader: Any) -> None:
    """Let persistent workers started before the timing go: the loader's next ``iter()`` starts timed ones.

    ``DataLoader(persistent_workers=True)`` keeps its iterator, and with it its workers, in ``loader._iterator``
    and hands it out again at every ``iter()``. Workers started before :meth:`DataLoaderTiming.attach` (a model
    built by pulling a batch, an earlier fit) would never run the chained ``worker_init_fn``. Dropping the loader's
    reference costs one restart of the workers; an epoch already iterating keeps its own reference and finishes
    on the old ones.
    """
    try:
        if getattr(loader, "persistent_workers", False) and getattr(loader, "_iterator", None) is not None:
            loader._iterator = None
    except Exception as err:  # pragma: no cover - a DataLoader that refuses: its old workers stay untimed
        log.debug("fitprof: persistent loader workers not restarted: %r", err)


def loaders_in(obj: Any) -> list[Any]:
    """The ``DataLoader`` objects in ``obj``: one, or a list, tuple or dict of them (Lightning's
    ``trainer.train_dataloader``), in order; anything else is skipped."""
    from torch.utils.data import DataLoader

    if isinstance(obj, DataLoader):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [x for item in obj for x in loaders_in(item)]
    return []


class AttachOnIter:
    """Attach a :class:`DataLoaderTiming` to each ``DataLoader`` that ``wanted`` accepts, right before it first
    iterates (before its workers start).

    Between :meth:`install` and :meth:`uninstall`, ``DataLoader.__iter__`` is wrapped on the class: the wrapper asks
    ``wanted(loader)`` of a loader it has not attached to yet, and on a yes attaches the timing and hands it to
    ``found``; a loader already attached is passed through (its timing stays). So every loader wanted is timed from
    its first ``iter()``: several train loaders, and a loader that appears later (Lightning's
    ``reload_dataloaders_every_n_epochs`` makes new ones at the epoch they are used). The class attribute is restored
    by :meth:`uninstall`; when another wrapper was installed above ours meanwhile, ours stays as a pass-through.

    Args:
        wanted: which loaders to time (Lightning: those of ``trainer.train_dataloader``).
        found: receives each new timing.
    """

    def __init__(self, wanted: Callable[[Any], bool], found: Callable[[DataLoaderTiming], None]) -> None:
        self.wanted = wanted
        self.found = found
        self._own: Any = None
        self._wrapper: Any = None
        self._looking = False
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()  # the loaders attached to (or refused)

    def install(self) -> None:
        from torch.utils.data import DataLoader

        if self._wrapper is not None:
            return
        inherited = DataLoader.__iter__
        hook = self

        def __iter__(loader: Any) -> Any:
            if hook._looking:
                try:
                    if loader not in hook._seen and hook.wanted(loader):
                        hook._seen.add(loader)
                        hook.found(DataLoaderTiming.attach(loader))
                except Exception as err:  # never in the way of the loader: it runs untimed
                    log.debug("fitprof: loader timing not attached: %r", err)
            return inherited(loader)

        self._own = DataLoader.__dict__.get("__iter__")
        self._wrapper = __iter__
        self._looking = True
        DataLoader.__iter__ = __iter__  # type: ignore[method-assign]

    def uninstall(self) -> None:
        from torch.utils.data import DataLoader

        self._looking = False
        self._seen = weakref.WeakSet()
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is not None and DataLoader.__dict__.get("__iter__") is wrapper:
            DataLoader.__iter__ = self._own  # type: ignore[method-assign]


class LoaderSet:
    """The timings of every train ``DataLoader`` of a fit, read as one :class:`fitprof.fit.loader.LoaderSource`.

    How the figures combine (Lightning's ``CombinedLoader``, a list or dict of loaders):

    * ``workers``: the loaders' ``num_workers`` summed (``loader_workers``, and the count the advice names: the
      total, to be shared out in proportion to each loader's batch time);
    * the counters: every worker's slots side by side, so the busy share is the busy time of all workers over
      all workers times the epoch's wall time;
    * :attr:`batches_per_step`: the loaders with workers, whose batches make up one step (``CombinedLoader``'s
      ``max_size_cycle``, ``min_size`` and ``max_size`` modes take one batch from each loader a step), 1 in its
      ``sequential`` mode; the probe multiplies the mean worker time per batch by it, so ``loader_batch_ms`` is the
      worker time per combined step and N workers are predicted to deliver a step every W/N.

    A loader that stops being wanted (``reload_dataloaders_every_n_epochs`` replaced it) is detached when the next
    one is added: its counters leave the set, and the probe reads the new set from its attach on.

    Args:
        sequential: whether the loaders take turns, one batch a step (Lightning: ``CombinedLoader`` in
            ``sequential`` mode); read at each :meth:`read`.
    """

    label = "num_workers"

    def __init__(self, sequential: Callable[[], bool] = lambda: False) -> None:
        self.timings: list[DataLoaderTiming] = []
        self.sequential = sequential

    def add(self, timing: DataLoaderTiming, wanted: Callable[[Any], bool] | None = None) -> None:
        """Add ``timing``; with ``wanted``, first detach and drop the timings whose loader it no longer accepts."""
        if wanted is not None:
            keep = []
            for t in self.timings:
                if t.loader is not None and wanted(t.loader):
                    keep.append(t)
                else:
                    t.detach()
            self.timings = keep
        self.timings.append(timing)

    @property
    def workers(self) -> int:
        """The workers of all loaders, summed."""
        return sum(t.workers for t in self.timings)

    @property
    def batches_per_step(self) -> int:
        """Batches from worker-fed loaders in one step: their number, or 1 when they take turns (at least 1)."""
        fed = sum(1 for t in self.timings if t.workers > 0)
        try:
            turns = bool(self.sequential())
        except Exception:  # the loop's private state moved: one batch from each, CombinedLoader's default
            turns = False
        return 1 if turns else max(1, fed)

    def read(self) -> LoaderCounters | None:
        """Every worker's counters, loader after loader in the order they were added (None with no workers)."""
        parts = [c for t in self.timings if t.workers > 0 and (c := t.read()) is not None]
        if not parts:
            return None
        return LoaderCounters(
            busy_ns=tuple(x for c in parts for x in c.busy_ns),
            cpu_ns=tuple(x for c in parts for x in c.cpu_ns),
            batches=tuple(x for c in parts for x in c.batches),
            runq_ns=tuple(x for c in parts for x in c.runq_ns),
        )

    def detach(self) -> None:
        """Detach every timing; never raises."""
        timings, self.timings = self.timings, []
        for t in timings:
            t.detach()


class DataLoaderTiming:
    """The worker-side timing of one ``DataLoader`` (a :class:`fitprof.fit.loader.LoaderSource`).

    Use :meth:`attach` before the loader starts its workers (before ``iter(loader)``; with ``persistent_workers``
    workers started earlier stay untimed) and :meth:`detach` at teardown.

    Attributes:
        loader: the ``DataLoader``.
        workers: its ``num_workers`` when attached (0: nothing is timed in workers).
    """

    def __init__(self, loader: Any, workers: int, shared: Any, user: Callable[[int], None] | None) -> None:
        self.loader = loader
        self.workers = workers
        self._shared = shared
        self._user = user
        self._init: _TimedInit | None = None

    @classmethod
    def attach(cls, loader: Any) -> DataLoaderTiming:
        """Time ``loader``'s workers from their next start.

        The shared array is allocated in the loader's multiprocessing context (``multiprocessing_context``, else
        the default): ``1 + 4 * num_workers`` int64 (the on flag; busy ns, CPU ns, run-queue ns, batches per worker).

        Raises:
            TypeError: ``loader`` has no ``num_workers`` / ``worker_init_fn`` (not a ``DataLoader``).
        """
        if not hasattr(loader, "num_workers") or not hasattr(loader, "worker_init_fn"):
            raise TypeError(f"expected a torch.utils.data.DataLoader, got {type(loader).__name__}")
        workers = int(loader.num_workers)
        user = loader.worker_init_fn
        if isinstance(user, _TimedInit):  # attached twice: share the first timing's counters
            timing = cls(loader, user.workers, user.shared, user.user)
            timing._init = user
            return timing
        if workers <= 0:
            return cls(loader, 0, None, user)
        _drop_running_workers(loader)
        ctx = loader.multiprocessing_context
        if isinstance(ctx, str):
            ctx = multiprocessing.get_context(ctx)
        make = getattr(ctx, "RawArray", None) or multiprocessing.RawArray
        shared = make(ctypes.c_int64, 1 + 4 * workers)
        shared[_FLAG] = 1
        timing = cls(loader, workers, shared, user)
        timing._init = _TimedInit(user, shared, workers)
        loader.worker_init_fn = timing._init
        return timing

    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy``, ``pickle``) is detached: it holds neither the loader nor the shared counters
        (which pickle only to a process being started) and reads None."""
        return {"loader": None, "workers": 0, "_shared": None, "_user": None, "_init": None}

    def read(self) -> LoaderCounters | None:
        """The cumulative counters since :meth:`attach` (None with no workers): one 8-byte read per slot."""
        s, n = self._shared, self.workers
        if s is None:
            return None
        return LoaderCounters(
            busy_ns=tuple(s[1 : 1 + n]),
            cpu_ns=tuple(s[1 + n : 1 + 2 * n]),
            batches=tuple(s[1 + 3 * n : 1 + 4 * n]),
            runq_ns=tuple(s[1 + 2 * n : 1 + 3 * n]),
        )

    def detach(self) -> None:
        """Put the user's ``worker_init_fn`` back and stop timing in running workers; never raises."""
        try:
            if self._shared is not None:
                self._shared[_FLAG] = 0
            if self._init is not None and self.loader.worker_init_fn is self._init:
                self.loader.worker_init_fn = self._user
        except Exception as err:  # pragma: no cover - a loader that refuses the attribute: leave it
            log.debug("fitprof: loader timing not detached: %r", err)
        self._init = None

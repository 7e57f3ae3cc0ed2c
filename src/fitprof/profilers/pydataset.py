"""Worker-side timing of a Keras ``PyDataset(workers=N)``: what each worker thread or process spends producing a batch.

Keras 3 feeds a ``PyDataset`` with workers through an ``OrderedEnqueuer`` (``keras/src/trainers/data_adapters/
py_dataset_adapter.py``): at each epoch's start it puts ``enqueuer.py_dataset`` into a module-level table
(``_SHARED_SEQUENCES``) and submits ``get_index(uid, i)``, a module-level function that runs ``table[uid][i]``, to a
pool of threads (``use_multiprocessing=False``) or processes (``True``; the table reaches them as the pool's
``initargs``, pickled for spawn workers, inherited by fork ones). Neither the pool nor ``get_index`` can be reached
to wrap, and the user's dataset is not ours to change; the enqueuer is Keras's own object, made for this ``fit``.

:meth:`PyDatasetTiming.attach` therefore points the fit's enqueuer at :class:`TimedPyDataset`, a proxy that holds the
user's dataset and a small shared ``int64`` array (and a lock): its ``__getitem__`` calls the dataset's and adds the
call's wall time (``time.perf_counter_ns``), the calling thread's CPU time (``time.thread_time_ns``), its wait for a
core (Linux's run-queue wait) and one batch to the worker's slots. The batch is returned as the dataset made it. The
proxy travels to worker processes inside the table, the array and the lock with it (a spawn worker gets them pickled
at its start, when ``multiprocessing`` allows it); threads share the one proxy. The main process reads the array
(:meth:`PyDatasetTiming.read`) without a message to the workers.

Worker slots: each worker thread (process) takes the next claim number under the lock on its first batch and uses
slot ``claim % N``; the pool is new at every epoch, so its N workers take the N slots again. Updates are made under the
lock, so two workers of overlapping pools sharing a slot still add correctly.

:meth:`PyDatasetTiming.detach` switches the timing off (a shared flag checked before each batch) and puts the user's
dataset back into the enqueuer (and the table). With no enqueuer (``workers=0``, or ``workers=1`` with threads: Keras
then loads in the main thread) nothing is wrapped and :attr:`PyDatasetTiming.workers` is 0.

The main side's wait for each batch: on torch Keras fetches it in Python before ``on_train_batch_begin`` (timed by
``fitprof.keras._torch_backend.FetchTimer``); TensorFlow and JAX pull it inside ``train_function``, and
:class:`BatchWait` times it around the adapter's generator.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import threading
import time
from typing import Any

from fitprof.profilers.counters import LoaderCounters

log = logging.getLogger(__name__)

_FLAG = 0
"""Slot 0 of the shared array: 1 while the timing is on."""
_CLAIMS = 1
"""Slot 1: the worker claims made so far (a worker's slot is its claim modulo the worker count)."""
_HEAD = 2


class _RunQueue:
    """One thread's time runnable but waiting for a core, ns (Linux ``/proc/thread-self/schedstat``, field 2, read
    with ``pread`` on a file opened once per thread, closed with the thread's state); 0 where the file is missing."""

    def __init__(self) -> None:
        self.fd: int | None = None
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            return
        self.fd = fd
        if self() == 0:
            self.close()

    def __call__(self) -> int:
        if self.fd is None:
            return 0
        try:
            return int(os.pread(self.fd, 64, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class TimedPyDataset:
    """The proxy the enqueuer fetches from: the user's ``PyDataset``, each ``__getitem__`` timed into shared slots.

    Everything else (``num_batches``, ``len``, other attributes) is the dataset's own.

    Args:
        dataset: the user's ``PyDataset``.
        shared: the counters, ``2 + 4 * workers`` int64 (on flag, claims; busy ns, CPU ns, run-queue ns, batches per
            worker slot).
        lock: guards the claims and the updates (a ``multiprocessing`` lock for process workers).
        workers: N, the slots.
    """

    def __init__(self, dataset: Any, shared: Any, lock: Any, workers: int) -> None:
        self.dataset = dataset
        self.shared = shared
        self.lock = lock
        self.workers = workers
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_local"]  # each worker process claims its own slot
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "dataset" not in self.__dict__:  # unpickling, copying: no forwarding yet
            raise AttributeError(name)
        return getattr(self.dataset, name)

    @property
    def num_batches(self) -> Any:
        return self.dataset.num_batches

    def __len__(self) -> int:
        return len(self.dataset)

    def _worker(self) -> tuple[int, _RunQueue]:
        """This thread's slot and run-queue clock, claimed on its first batch (again in a forked copy)."""
        local, pid = self._local, os.getpid()
        if getattr(local, "pid", None) != pid:
            with self.lock:
                claim = self.shared[_CLAIMS]
                self.shared[_CLAIMS] = claim + 1
            local.slot, local.clock, local.pid = claim % self.workers, _RunQueue(), pid
        return local.slot, local.clock

    def __getitem__(self, index: Any) -> Any:
        shared = self.shared
        if not shared[_FLAG]:
            return self.dataset[index]
        try:
            slot, waited = self._worker()
        except Exception as err:  # timing must never stop a worker: this batch goes untimed
            log.debug("fitprof: PyDataset worker slot not claimed: %r", err)
            return self.dataset[index]
        # The wall clock last, right before the batch: reading the run queue is a file read, which a loaded machine
        # can preempt, and that wait is not the batch's.
        c0, q0 = time.thread_time_ns(), waited()
        t0 = time.perf_counter_ns()
        try:
            return self.dataset[index]
        finally:
            busy, cpu, runq = time.perf_counter_ns() - t0, time.thread_time_ns() - c0, waited() - q0
            n = self.workers
            with self.lock:
                shared[_HEAD + slot] += busy
                shared[_HEAD + n + slot] += cpu
                shared[_HEAD + 2 * n + slot] += runq
                shared[_HEAD + 3 * n + slot] += 1


class PyDatasetTiming:
    """The worker-side timing of one fit's ``PyDataset`` (a :class:`fitprof.fit.loader.LoaderSource`).

    Use :meth:`attach` before the epoch's pool starts (Keras starts it at each epoch's first batch, after
    ``on_epoch_begin``; a pool already running when attached is timed from the next epoch's) and :meth:`detach` at the
    fit's end.

    Attributes:
        workers: N, the worker threads or processes (0: Keras loads in the main thread; nothing is timed).
        threads: whether the workers are threads of this process (``use_multiprocessing=False``), which share its
            GIL (:class:`fitprof.fit.loader.LoaderProbe` holds their CPU time to one core).
        label: ``"workers"``, the ``PyDataset`` argument the advice names.
    """

    label = "workers"

    def __init__(self, enqueuer: Any, workers: int, threads: bool, proxy: TimedPyDataset | None) -> None:
        self.enqueuer = enqueuer
        self.workers = workers
        self.threads = threads
        self._proxy = proxy

    @classmethod
    def attach(cls, adapter: Any) -> PyDatasetTiming:
        """Time the workers of ``adapter`` (Keras's ``PyDatasetAdapter`` of this fit) from their next start.

        The array is ``2 + 4 * workers`` int64 from ``multiprocessing.RawArray``, the lock a ``multiprocessing.Lock``
        for process workers (Keras's pool uses the default context), a ``threading.Lock`` for threads.

        Raises:
            TypeError: ``adapter`` has no ``py_dataset`` / ``enqueuer`` (not a ``PyDatasetAdapter``).
        """
        if not hasattr(adapter, "py_dataset") or not hasattr(adapter, "enqueuer"):
            raise TypeError(f"expected Keras's PyDatasetAdapter, got {type(adapter).__name__}")
        dataset = adapter.py_dataset
        processes = bool(dataset.use_multiprocessing) and not _pool_forced_to_threads()
        enqueuer = adapter.enqueuer
        if enqueuer is None:
            return cls(None, 0, not processes, None)
        workers = int(dataset.workers)
        current = enqueuer.py_dataset
        if isinstance(current, TimedPyDataset):  # attached twice: share the first timing's counters
            return cls(enqueuer, current.workers, not processes, current)
        shared = multiprocessing.RawArray(ctypes.c_int64, _HEAD + 4 * workers)
        lock = multiprocessing.Lock() if processes else threading.Lock()
        shared[_FLAG] = 1
        proxy = TimedPyDataset(current, shared, lock, workers)
        enqueuer.py_dataset = proxy
        table = _table()
        if table is not None and table.get(enqueuer.uid) is current:  # a thread pool already running: time it now
            table[enqueuer.uid] = proxy
        return cls(enqueuer, workers, not processes, proxy)

    def queued(self) -> int:
        """Batches waiting ready in the enqueuer: the first ``fit`` builds its model from a first batch, and Keras's
        enqueuer keeps what its pool made meanwhile (up to ``max_queue_size``) for the first epoch, made untimed."""
        try:
            return int(self.enqueuer.ready_queue.qsize()) if self.enqueuer is not None else 0
        except Exception:  # another Keras layout: nothing known to skip
            return 0

    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy``, ``pickle``) is detached: it holds neither the enqueuer nor the counters."""
        return {"enqueuer": None, "workers": 0, "threads": self.threads, "_proxy": None}

    def read(self) -> LoaderCounters | None:
        """The cumulative counters since :meth:`attach` (None with no workers)."""
        proxy, n = self._proxy, self.workers
        if proxy is None or n <= 0:
            return None
        s = proxy.shared
        with proxy.lock:
            return LoaderCounters(
                busy_ns=tuple(s[_HEAD : _HEAD + n]),
                cpu_ns=tuple(s[_HEAD + n : _HEAD + 2 * n]),
                batches=tuple(s[_HEAD + 3 * n : _HEAD + 4 * n]),
                runq_ns=tuple(s[_HEAD + 2 * n : _HEAD + 3 * n]),
            )

    def detach(self) -> None:
        """Stop timing and put the user's dataset back into the enqueuer (and Keras's table); never raises."""
        proxy, self._proxy = self._proxy, None
        if proxy is None:
            return
        dataset = proxy.dataset
        try:
            proxy.shared[_FLAG] = 0
            enqueuer = self.enqueuer
            if enqueuer is not None and enqueuer.py_dataset is proxy:
                enqueuer.py_dataset = dataset
            table = _table()
            if enqueuer is not None and table is not None and table.get(enqueuer.uid) is proxy:
                table[enqueuer.uid] = dataset
        except Exception as err:  # pragma: no cover - an enqueuer that refuses the attribute: the flag is off
            log.debug("fitprof: PyDataset timing not detached: %r", err)
        self.enqueuer = None


_MISSING = object()


class BatchWait:
    """The main side's wait for each ``PyDataset`` batch where Keras pulls it inside the step (TensorFlow, JAX).

    On TensorFlow and JAX Keras asks for a batch inside ``train_function``, after ``on_train_batch_begin``: TensorFlow
    through ``tf.data.Dataset.from_generator`` over the adapter's generator (``py_dataset_adapter.get_tf_dataset``;
    with workers its prefetching is switched off, so the step waits for the generator), JAX through the adapter's
    numpy iterator. Both iterate the generator that ``PyDatasetAdapter._get_iterator`` makes at each epoch (over the
    enqueuer's ``get()`` with workers, over ``__getitem__`` in the main thread without). :meth:`install` sets timed
    copies of those generator methods on the adapter instance (TensorFlow's dataset holds the bound
    ``_get_iterator``, which looks them up on the instance at each epoch): each ``next()`` of the generator is timed
    with ``time.perf_counter_ns`` into a running total. The batch is yielded as the generator made it.

    Which step a wait belongs to: a wait measured between two ``on_train_batch_begin`` calls is the wait of the
    step that ran between them, which :meth:`take` (the total since the last call) gives. The generator runs in a
    ``tf.data`` thread on TensorFlow; one thread adds, the main thread reads, so no lock is needed.

    Args:
        adapter: Keras's ``PyDatasetAdapter`` of this fit.
        plain: also time the generators without an enqueuer (the main thread loads: JAX); False where the framework
            pulls those batches ahead in the background (TensorFlow's ``prefetch(AUTOTUNE)``), so no wait is seen.
    """

    _METHODS = ("_finite_enqueuer_generator", "_infinite_enqueuer_generator")
    _PLAIN = ("_finite_generator", "_infinite_generator")

    def __init__(self, adapter: Any, *, plain: bool) -> None:
        self.adapter = adapter
        self.names = self._METHODS + (self._PLAIN if plain else ())
        self.total_ns = 0
        self._read_ns = 0
        self._on = False
        self._before: dict[str, Any] = {}  # what the instance held before (its own attribute, or none)

    def install(self) -> bool:
        """Set the timed generators on the adapter instance (over another callback's, if it set its own first);
        False (nothing set) where the adapter lacks one."""
        adapter = self.adapter
        if any(not callable(getattr(adapter, name, None)) for name in self.names):
            return False
        for name in self.names:
            self._before[name] = vars(adapter).get(name, _MISSING)
            setattr(adapter, name, self._timed(getattr(adapter, name)))
        self._on = True
        return True

    def _timed(self, make: Any) -> Any:
        def generator(*args: Any, **kwargs: Any) -> Any:
            inner = make(*args, **kwargs)
            try:
                while True:
                    t0 = time.perf_counter_ns()
                    try:
                        batch = next(inner)
                    except StopIteration:
                        return
                    finally:
                        if self._on:
                            self.total_ns += time.perf_counter_ns() - t0
                    yield batch
            finally:
                inner.close()

        generator._fitprof_wait = self  # type: ignore[attr-defined]
        return generator

    def take(self) -> int:
        """The wait (ns) since the last call: the step that ran since the last ``on_train_batch_begin``."""
        total = self.total_ns
        wait, self._read_ns = total - self._read_ns, total
        return wait

    def uninstall(self) -> None:
        """Put back what :meth:`install` replaced on the adapter instance, where it still holds this timing's own
        generators (one set above them later stays, and these pass through untimed); never raises. A generator
        already running goes on untimed."""
        self._on = False
        adapter, self.adapter = self.adapter, None
        if adapter is None:
            return
        for name in self.names:
            if getattr(vars(adapter).get(name), "_fitprof_wait", None) is not self:
                continue
            before = self._before.get(name, _MISSING)
            while getattr(before, "_fitprof_wait", None) is not None and before._fitprof_wait.adapter is None:
                before = before._fitprof_wait._before.get(name, _MISSING)  # a timing removed below this one: skip it
            with contextlib.suppress(Exception):
                if before is _MISSING:
                    delattr(adapter, name)
                else:
                    setattr(adapter, name, before)


def _table() -> dict[Any, Any] | None:
    """Keras's table of the datasets its pools fetch from (``_SHARED_SEQUENCES``), None where it is not found."""
    try:
        from keras.src.trainers.data_adapters import py_dataset_adapter

        table = py_dataset_adapter._SHARED_SEQUENCES
        return table if isinstance(table, dict) else None
    except Exception:  # another Keras layout: a running thread pool is timed from the next epoch
        return None


def _pool_forced_to_threads() -> bool:
    """Whether Keras runs process pools as thread pools (its ``_FORCE_THREADPOOL``, set in some test setups)."""
    try:
        from keras.src.trainers.data_adapters import py_dataset_adapter

        return bool(py_dataset_adapter._FORCE_THREADPOOL)
    except Exception:
        return False

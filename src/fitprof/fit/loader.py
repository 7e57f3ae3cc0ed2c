"""How many loader workers a fit needs: worker utilisation and a predicted step time, framework-free.

:class:`LoaderProbe` is a probe (:mod:`fitprof.fit.probes`): it times the main loop from the fit's events (the wait
for each batch and the rest of each step) and reads, once per epoch, what the loader's workers spent producing
batches from a :class:`LoaderSource` (for a PyTorch ``DataLoader``: :class:`fitprof.profilers.loader.DataLoaderTiming`,
which times each batch's fetch and collate inside the workers into shared memory; for a Keras ``PyDataset``:
:class:`fitprof.profilers.pydataset.PyDatasetTiming`, each ``__getitem__`` in the worker threads or processes). From
these it predicts the step time with N workers (:class:`StepModel`) and publishes the ``fitprof/epoch/loader_*``
figures (:data:`fitprof.metrics.LOADER_METRICS`) and one line of advice.

The model, per step, all times per batch: W the worker time to produce a batch (fetch and collate, wall clock in the
worker), W_cpu its CPU time, S the main loop's time between receiving a batch and asking for the next (the step
without its input wait), S_cpu the main thread's CPU time in it, M the main process's own per-batch cost that no
worker takes over (unpickling a batch from the workers, the pin-memory thread, a collate in the main process).
N workers deliver a batch every W/N at best; the loop needs one every S + M; C cores hold at most C busy threads, and
of those CPU-bound workers can count on F, the cores they used plus the cores that stood idle this epoch (other
processes hold the rest; more workers may win a larger share from them, so this errs on the slow side):

    T(N) = max(S + M, W' / N, W_cpu / min(N, F), (W_cpu + S_cpu) / C)

and the input wait is T(N) - S. W' is the batch's own time, W less the time the worker stood runnable waiting for a
core (Linux's run-queue wait, R): that wait is the machine's load, not the loading's work, and counting it would
make the count depend on how many workers the run started from (more workers, more waiting). With no workers the
main process does the work, on one thread: T(0) = max(S + W', (W_cpu + S_cpu) / min(1, F)), bounded by the cores as
every other count is. M is what the measured
wait leaves over once the workers' share (max(0, W/N - S)) is taken out, and at least the main thread's CPU time
while the loop waited (its work in the framework's fetch path runs whatever the workers do; while the workers are the
bound it is hidden in the wait, and only the CPU clock shows it).

Worker threads (a Keras ``PyDataset(workers=N, use_multiprocessing=False)``) share the process's GIL: Python code runs
in one thread at a time, so their CPU time is held to one core, F = 1, however many cores stand idle. Loading that
waits (sleeps, I/O) scales as processes do. Threads whose CPU time fills :data:`GIL_BUSY` of a core are another
matter: the loop's own Python waits for the GIL too, so S grows with the thread count and no prediction from one count
holds for another (measured: see :data:`GIL_BUSY`); for them the count and its step time are not published, and the
advice says so and gives a process count where processes are predicted to help (F then from the idle cores as for
process workers, before the cost of sending each batch between processes, which is not measured). Keras loads in the
main thread with ``workers=1`` and threads, so threads are advised in counts of 0 or at least 2. From a Keras run with
no workers the loading's CPU time is not known (its wait is timed without the main thread's CPU clock), and the
threads' prediction then takes the loading to wait, not compute.

An epoch whose workers waited for a core :data:`CONTENDED` of their batch time or more, on a machine where other
processes held at least :data:`CONTENDED_CORES` (where the idle time is known), is *contended*: what it measured
holds for that load only (at load 14-21, the same loader started from 1 and from 3 workers was advised 5 and 2
workers), so no count is advised, its figures are NaN, and the advice says why.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from fitprof.metrics import (
    LOADER_BATCH_MS,
    LOADER_BUSY_PERCENT,
    LOADER_METRICS,
    LOADER_STEP_TIME_IF_ENOUGH_WORKERS_MS,
    LOADER_WORKERS,
    LOADER_WORKERS_NEEDED,
)
from fitprof.profilers.counters import LoaderCounters

WAIT_TARGET = 0.05
"""The input wait a worker count must bring the step under, as a share of the predicted step time."""
CPU_SAMPLE_EVERY = 8
"""The main thread's CPU time (S_cpu, and its share of the wait) is read on every 8th step: ``time.thread_time_ns``
is a system call, 3.3 us on this project's 2-core VM, and reading it at both ends of every step made the probe cost
11.4-12.7 us a step against 3.8-4.2 us without it; sampled, 5.5-7.3 us (50,000 planted steps, load average 9)."""
GIL_BUSY = 0.25
"""Worker threads whose CPU time fills this share of one core are taken to be held back by the GIL, and no count is
predicted for them. On this project's 2-core VM (load average 5.3-5.5), 2, 3 and 4 threads burning 40 ms of Python CPU
time a batch filled 0.46, 0.44 and 0.53 of a core, the loop's step without its wait (20 ms of sleep and Keras's own
Python, 29.7 ms with the main thread loading) stretched to 67.3, 57.6 and 39.0 ms waiting for the GIL, and the step
times re-measured (83.2, 67.7, 48.9 ms) missed what the model predicted from 2 threads (81.7 ms for each count) by up
to 67% (``tests/pydataset_loop.py --cpu --batch-ms 40``)."""
CONTENDED = 0.2
"""An epoch is contended when its workers waited for a core at least this share of their batch time (and other
processes held cores: :data:`CONTENDED_CORES`)."""
CONTENDED_CORES = 0.5
"""The cores other processes must have held, over the epoch, for a worker's run-queue wait to count as contention
(where the usable cores' idle time is known): more workers than cores wait for each other, which the model counts."""
HEADROOM = 1.1
"""The worker count is chosen as if each batch took this much longer (the step time it predicts is not): a count
whose workers only just keep pace (W/N = S) re-measured up to 26% slower than predicted (Lightning, sleep-modelled
loading, 2 cores), as every late batch then makes the loop wait."""


class LoaderSource(Protocol):
    """What :class:`LoaderProbe` reads from a loader's timing: its worker count and its workers' counters.

    A source may also have ``threads`` (bool: the workers are threads sharing this process's GIL; default False) and
    ``label`` (str: the argument the advice names, default ``"num_workers"``) and ``queued()`` (int: batches made
    before the epoch that wait ready for it, which the loop gets without waiting; read at each epoch's start) and
    ``batches_per_step`` (int: the batches one step takes from the workers, one from each of several loaders; W is
    then the worker time per step, default 1: :class:`fitprof.profilers.loader.LoaderSet`).
    """

    @property
    def workers(self) -> int:
        """Worker processes (threads) producing batches; 0 when the main process does it."""
        ...

    def read(self) -> LoaderCounters | None:
        """The cumulative counters (None with 0 workers: the probe times the main process's wait itself)."""
        ...


def usable_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity(0)``; ``os.cpu_count()`` where that is missing)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def gil_enabled() -> bool:
    """Whether this interpreter has a GIL (``sys._is_gil_enabled()``, Python 3.13+; True before it)."""
    check = getattr(sys, "_is_gil_enabled", None)
    return True if check is None else bool(check())


def process_cpu_ns() -> int:
    """This process's CPU time so far, all its threads, user plus system (ns, ``time.process_time_ns``)."""
    return time.process_time_ns()


def idle_ns() -> int | None:
    """Idle time (idle and iowait) summed over the cores this process may use since boot, ns, from Linux's
    ``/proc/stat`` (its per-core lines, in clock ticks); None where that file is missing or unreadable."""
    try:
        allowed = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        tick = 1e9 / os.sysconf("SC_CLK_TCK")
        total = 0
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                fields = line.split()
                if fields and fields[0] in allowed:
                    total += int(fields[4]) + int(fields[5])
        return int(total * tick)
    except (AttributeError, OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class StepModel:
    """The model of the module docstring: what one epoch measured, per batch or per step (ns, or any one unit).

    Attributes:
        w: worker wall time per batch. s: the step without its input wait. m: the main process's own per-batch cost.
        w_cpu: worker CPU time per batch. s_cpu: the main thread's CPU time per step. cores: usable cores (>= 1).
        free: the cores the loader's workers can have (:attr:`LoaderEpoch.free_cores`; None: all ``cores``).
        w_runq: the part of ``w`` the worker stood runnable waiting for a core: not the loading's own time.

    Raises:
        ValueError: ``cores`` below 1.
    """

    w: float
    s: float
    m: float = 0.0
    w_cpu: float = 0.0
    s_cpu: float = 0.0
    cores: int = 1
    free: float | None = None
    w_runq: float = 0.0

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"cores must be >= 1, got {self.cores}")

    def step_ns(self, n: int) -> float:
        """The predicted step time with ``n`` workers (0: the main process loads).

        Raises:
            ValueError: ``n`` below 0.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0 workers, got {n}")
        cores = float(self.cores)
        free = cores if self.free is None else max(min(self.free, cores), 1e-3)
        own = self.own_ns
        if n == 0:  # the main thread loads and steps, on one core at most
            return max(self.s + own, (self.w_cpu + self.s_cpu) / min(1.0, free))
        room = min(float(n), free)
        return max(self.s + self.m, own / n, self.w_cpu / room, (self.w_cpu + self.s_cpu) / cores)

    @property
    def own_ns(self) -> float:
        """W', the batch's own time: ``w`` less its wait for a core, and never less than its CPU time."""
        return max(self.w - self.w_runq, self.w_cpu)

    def needed(
        self, *, w_runq: float = 0.0, most: int | None = None, skip_one: bool = False
    ) -> tuple[int, float, bool]:
        """The smallest worker count (0 to ``most``) whose predicted input wait is under :data:`WAIT_TARGET` of the
        step.

        ``most`` defaults to :func:`search_bound` of the batch's own time (``w_runq``: unused, kept for callers; the
        model's own :attr:`w_runq` is taken out of ``w``); ``skip_one``
        leaves out the count 1 (Keras loads in the main thread with one worker thread). The count is chosen with
        :data:`HEADROOM`; the step time returned is predicted without it. The cores bound the count through the
        model's CPU terms: once the workers' CPU time fills the cores, more workers predict no gain and are not chosen.

        Returns:
            ``(n, step_ns, reached)``: the count, its predicted step time, and whether the target is met; when no count
            meets it, the smallest count within 1% of the best predicted time.
        """
        top = search_bound(self.own_ns, self.w_cpu, self.cores) if most is None else most
        # chosen with batches HEADROOM late: at W/N = S the loop waits whenever one batch is late, so the count that
        # only just keeps pace re-measures slower than predicted
        late = replace(self, w=self.own_ns * HEADROOM, w_runq=0.0, w_cpu=self.w_cpu * HEADROOM)
        counts = [k for k in range(max(top, 2 if skip_one else 1) + 1) if not (skip_one and k == 1)]
        margin = [(k, late.step_ns(k)) for k in counts]
        for k, tk in margin:
            if tk - self.s <= WAIT_TARGET * tk:
                return k, self.step_ns(k), True
        best = min(tk for _, tk in margin)
        k = next(k for k, tk in margin if tk <= best * 1.01)
        return k, self.step_ns(k), False


def search_bound(w: float, w_cpu: float, cores: int) -> int:
    """The largest worker count advised: the cores when the loading is CPU-bound (its CPU time ``w_cpu`` is at least
    half the batch's own time ``w``, the wall time less the wait for a core: that wait is the machine's load, not
    the loading's), else 4 times the cores (workers that mostly sleep or wait on storage share cores; measured on 2
    cores: 4 sleeping workers ran about 4 times as fast as one, ``benchmarks/loader_prediction.py``)."""
    return cores if w_cpu >= 0.5 * w else 4 * cores


@dataclass(frozen=True)
class LoaderEpoch:
    """One epoch's loader figures (times in ns per batch or step), the inputs of the prediction.

    Attributes:
        workers: N, the loader's workers (0: the main process loads).
        steps: steady steps the main-loop means come from.
        batch_ns: W. batch_cpu_ns: W_cpu. batch_runq_ns: the worker's wait for a core per batch. step_ns: S. step_cpu_ns: S_cpu. wait_ns: the mean measured input wait, G.
        main_ns: M, ``max(0, G - max(0, W/N - S), G_cpu)`` with G_cpu the main thread's CPU time while the loop
            waited (0 with no workers).
        busy_percent: the workers' busy time over N times the epoch's wall time, 0-100 (no workers: the main
            process's input wait over the epoch's wall time).
        cores: the usable cores. free_cores: the cores CPU-bound workers could have had this epoch: their own CPU
            time plus the usable cores' idle time, over the epoch's wall time (None where the idle time is unknown or
            the loading is not CPU-bound); 1.0 for worker threads sharing a GIL.
        needed: the worker count advised. predicted_ns: its predicted step time.
        reached: whether ``needed`` brings the wait under the target.
        label: the argument the advice names (``num_workers``, Keras's ``workers``).
        threads: whether the workers are threads sharing a GIL.
        process_needed: with threads, the process count the model advises where processes are predicted to bring
            steps at least :data:`WAIT_TARGET` below ``predicted_ns``, else None. process_predicted_ns: its step time.
        worker_cpu_cores: the workers' CPU time over the epoch's wall time, in cores (None with no workers).
        other_cores: the cores other processes held over the epoch: the usable cores less their idle time and this
            process's measured CPU time (None where the idle time is unknown).
    """

    workers: int
    steps: int
    batch_ns: float
    batch_cpu_ns: float
    batch_runq_ns: float
    step_ns: float
    step_cpu_ns: float
    wait_ns: float
    main_ns: float
    busy_percent: float
    cores: int
    free_cores: float | None
    needed: int
    predicted_ns: float
    reached: bool
    label: str = "num_workers"
    threads: bool = False
    process_needed: int | None = None
    process_predicted_ns: float | None = None
    worker_cpu_cores: float | None = None
    other_cores: float | None = None

    @property
    def runq_share(self) -> float:
        """The share of the workers' batch time they stood waiting for a core (0 where unknown)."""
        return self.batch_runq_ns / self.batch_ns if self.workers > 0 and self.batch_ns > 0 else 0.0

    @property
    def contended(self) -> bool:
        """The workers waited for a core :data:`CONTENDED` of their batch time or more while other processes held
        :data:`CONTENDED_CORES` or more (that part unchecked where the idle time is unknown): no count holds."""
        others = self.other_cores
        return self.runq_share >= CONTENDED and (others is None or others >= CONTENDED_CORES)

    @property
    def gil_bound(self) -> bool:
        """Worker threads whose CPU time fills :data:`GIL_BUSY` of a core: the GIL, which the loop's own Python waits
        for too, sets the step time, and the model predicts no count for them."""
        return self.threads and self.workers > 0 and (self.worker_cpu_cores or 0.0) >= GIL_BUSY

    @property
    def measured_ns(self) -> float:
        """The measured mean step time over the steady steps, S + G."""
        return self.step_ns + self.wait_ns

    @property
    def model(self) -> StepModel:
        """The model these figures give."""
        return StepModel(
            w=self.batch_ns,
            s=self.step_ns,
            m=self.main_ns,
            w_cpu=self.batch_cpu_ns,
            s_cpu=self.step_cpu_ns,
            cores=self.cores,
            free=self.free_cores,
            w_runq=self.batch_runq_ns,
        )

    def predict(self, n: int) -> float:
        """The predicted step time with ``n`` workers, ns."""
        return self.model.step_ns(n)

    def advice(self) -> str:
        """One line: how many workers, the cores bound, or the main process as the bottleneck."""
        ms = 1e-6
        now = self.measured_ns * ms
        wait_share = self.wait_ns / self.measured_ns if self.measured_ns > 0 else 0.0
        n = self.workers
        if self.contended:
            others = "" if self.other_cores is None else f", other processes holding {self.other_cores:.1f} cores"
            return (
                f"the machine was busy: the loader's workers waited for a core {100 * self.runq_share:.0f}% of their "
                f"batch time ({self.batch_runq_ns * ms:.1f} of {self.batch_ns * ms:.1f} ms{others}; input wait "
                f"{100 * wait_share:.0f}% of a {now:.1f} ms step), so no {self.label} count is advised: what this "
                "epoch measured holds only for this load. Measure again with the machine less loaded"
            )
        if wait_share <= WAIT_TARGET:
            if self.needed < n:
                return (
                    f"the loader keeps up (input wait {100 * wait_share:.0f}% of a {now:.1f} ms step, workers busy "
                    f"{self.busy_percent:.0f}%): {self.label}={self.needed} would do"
                )
            return f"the loader keeps up (input wait {100 * wait_share:.0f}% of a {now:.1f} ms step)"
        if self.gil_bound:
            return self._gil_advice(wait_share)
        if n > 0 and self.batch_ns / n < 0.8 * self.step_ns:
            return (
                f"the workers idle ({self.busy_percent:.0f}% busy, {self.batch_ns * ms:.1f} ms a batch each) while the "
                f"loop waits {self.wait_ns * ms:.1f} ms a step: the time is spent in the main process (a collate or "
                f"transform done there, the pin-memory thread, unpickling large batches from the workers); more "
                f"workers will not help"
            )
        cores_bound = not self.reached and self.predicted_ns > self.step_ns + self.main_ns * 1.01
        free = self.free_cores
        if self.threads:
            tail = "threads share the GIL: their CPU work runs on about one core"
            if self.process_needed is not None and self.process_predicted_ns is not None:
                tail += (
                    f"; use_multiprocessing=True with {self.label}={self.process_needed} would bring steps to about "
                    f"{self.process_predicted_ns * ms:.1f} ms (before the cost of sending batches between processes)"
                )
            else:
                tail += ", and more cores than that would not help either: CPU-bound loading needs cheaper transforms"
        else:
            many = free is not None and free < self.cores - 0.5
            busy_cores = f" ({free:.1f} of them free to the loader)" if many else ""
            tail = f"only {self.cores} cores{busy_cores}: CPU-bound loading needs cheaper transforms or more cores"
        if self.threads and self.process_needed is not None:
            cores_bound = True
        if self.needed > n and self.predicted_ns < self.measured_ns * (1 - WAIT_TARGET):
            where = (
                f"workers busy {self.busy_percent:.0f}%"
                if n
                else f"loading in the main process {self.busy_percent:.0f}% of the time"
            )
            head = (
                f"{self.label}={self.needed} would bring steps to about {self.predicted_ns * ms:.1f} ms (now {now:.1f} "
                f"ms; {where}, {self.batch_ns * ms:.1f} ms a batch)"
            )
            return f"{head}; {tail}" if cores_bound else head
        if cores_bound:
            return (
                f"{tail} (workers busy {self.busy_percent:.0f}%, {self.batch_ns * ms:.1f} ms a batch, input wait "
                f"{100 * wait_share:.0f}% of a {now:.1f} ms step)"
            )
        return (
            f"the loop waits {self.wait_ns * ms:.1f} ms a step ({100 * wait_share:.0f}%) that more workers are not "
            f"predicted to remove: the main process's own per-batch work (collate, pin memory, unpickling)"
        )

    def _gil_advice(self, wait_share: float) -> str:
        """Worker threads held back by the GIL: no count is predicted; processes where they are predicted to help."""
        ms = 1e-6
        if self.process_needed is not None and self.process_predicted_ns is not None:
            way = (
                f"use_multiprocessing=True with {self.label}={self.process_needed} is predicted to bring steps to "
                f"about {self.process_predicted_ns * ms:.1f} ms (before the cost of sending batches between processes)"
            )
        else:
            way = (
                "try use_multiprocessing=True, which gives each worker its own interpreter (not predicted: the step "
                "measured here includes the loop's wait for the GIL), or cheaper transforms"
            )
        cores = self.worker_cpu_cores or 0.0
        return (
            f"threads share the GIL: the {self.workers} worker threads' CPU time filled {100 * cores:.0f}% of a "
            f"core ({self.batch_cpu_ns * ms:.1f} ms a batch) and the loop's own Python waits for the GIL too (input "
            f"wait {100 * wait_share:.0f}% of a {self.measured_ns * ms:.1f} ms step), so no thread count is predicted; "
            f"{way}"
        )


def _sampled_mean(values: list[int]) -> float:
    """The mean of the sampled values (-1: not sampled), 0 when none is."""
    kept = [max(0, v) for v in values if v >= 0]
    return sum(kept) / len(kept) if kept else 0.0


class LoaderProbe:
    """A probe: worker utilisation of the training loader and the worker count it needs, per epoch.

    The main loop is timed from the events: with ``step_end`` events the input wait of step k is ``step_start(k)``
    less ``step_end(k-1)`` and the rest of the step ``step_end(k)`` less ``step_start(k)``; without them (Keras) the
    time between two ``step_start`` is split with ``fetch_wait()``, the wait of the batch about to run. The first
    ``workers + 2`` steps of an epoch (workers starting, the first burst of prefetched batches), the batches a source's
    ``queued()`` says wait ready at the epoch's start, and a step after a
    validation run or a checkpoint are left out; the means come from the last whole multiple of ``max(1, workers)``
    steady steps (workers in lock-step deliver their batches in bursts of N, one long wait per burst).

    Logged metrics (:data:`fitprof.metrics.LOADER_METRICS`), NaN when there is no source or no steady step:
        ``fitprof/epoch/loader_workers``, ``loader_busy_percent``, ``loader_batch_ms``, ``loader_workers_needed``,
        ``step_time_if_enough_workers_ms``.

    Args:
        source: the loader's timing; :meth:`attach` sets it later (the adapter finds the loader at fit start).
        cores: usable cores (default :func:`usable_cores`).
        fetch_wait: for adapters without ``step_end``: the input wait (ns) of the batch whose ``step_start`` comes.
        cpu_clock: the main thread's CPU clock in ns (``time.thread_time_ns``; tests pass a fake).
        idle_clock: the usable cores' summed idle time in ns, or None (:func:`idle_ns`; tests pass a fake); read at
            each epoch's start and end, it gives the cores the workers could have had (:attr:`LoaderEpoch.free_cores`).
        process_clock: the process's CPU time in ns, all its threads (:func:`process_cpu_ns`), read at each epoch's
            start and end: the cores this process used, which other processes did not hold
            (:attr:`LoaderEpoch.other_cores`); None: the main thread's CPU time in the steps stands for it, and
            the process's other threads (an intra-op pool) would count as other processes.

    Raises:
        ValueError: ``cores`` below 1.
    """

    def __init__(
        self,
        source: LoaderSource | None = None,
        *,
        cores: int | None = None,
        fetch_wait: Callable[[], int | None] | None = None,
        cpu_clock: Callable[[], int] = time.thread_time_ns,
        idle_clock: Callable[[], int | None] = idle_ns,
        process_clock: Callable[[], int] | None = None,
    ) -> None:
        if cores is not None and cores < 1:
            raise ValueError(f"cores must be >= 1, got {cores!r}")
        self.source = source
        # False: the loader is the framework's own, built from arrays (Keras on torch fed NumPy), whose settings
        # the user does not write, so its worker advice is not printed (its figures still are logged)
        self.user_loader = True
        self.cores = cores if cores is not None else usable_cores()
        self.fetch_wait = fetch_wait
        self.cpu_clock = cpu_clock
        self.idle_clock = idle_clock
        self.process_clock = process_clock
        self._idle_start: int | None = None
        self._process_start: int | None = None
        self.last: LoaderEpoch | None = None
        self._begin: LoaderCounters | None = None
        self._epoch_start_ns: int | None = None
        self._queued = 0
        self._reset_steps()

    def attach(self, source: LoaderSource | None) -> None:
        """Read this loader from now on (None: stop reading one)."""
        self.source = source
        self._begin = self._read()

    def _read(self) -> LoaderCounters | None:
        return self.source.read() if self.source is not None else None

    def worker_cpu(self) -> tuple[int, ...] | None:
        """The workers' CPU time in their batch fetches so far (ns, one per worker; cumulative, a restarted worker
        from 0), None without workers: what the epoch-parts probe counts as the fit's own workers' CPU."""
        counts = self._read()
        return None if counts is None or not counts.cpu_ns else counts.cpu_ns

    def _reset_steps(self) -> None:
        # (step index in the epoch, wait, rest, main thread's CPU in the rest, and in the wait; -1: not sampled), ns
        self._steps: list[tuple[int, int, int, int, int]] = []
        self._seen = 0
        self._gap_sum = 0
        self._last_end: int | None = None
        self._last_start: int | None = None
        self._last_cpu: int | None = None
        self._end_cpu: int | None = None
        self._wait_cpu = -1
        self._pending_wait: int | None = None
        self._had_end = False

    # --------------------------------------------------------------------------------------------------- events
    def epoch_start(self, epoch: int, *, now_ns: int) -> None:
        self._reset_steps()
        self._epoch_start_ns = now_ns
        self._begin = self._read()
        self._idle_start = self.idle_clock()
        self._process_start = self.process_clock() if self.process_clock is not None else None
        queued = getattr(self.source, "queued", None)
        self._queued = int(queued()) if callable(queued) else 0
        self.last = None

    # step_start and step_end run every training step: the CPU clock read and the append are written out.
    def step_start(self, step: int, batch: object = None, *, now_ns: int) -> None:
        seen = self._seen = self._seen + 1
        k = seen % CPU_SAMPLE_EVERY
        if self._had_end:
            cpu = self.cpu_clock() if k == 0 else None
            last_end = self._last_end
            wait = None if last_end is None else now_ns - last_end
            # the main thread's own work while the loop waited
            self._wait_cpu = cpu - self._end_cpu if cpu is not None and self._end_cpu is not None else -1
        else:  # no step_end: the previous step ends here, its rest is the period less this batch's wait
            cpu = self.cpu_clock() if k in (0, 1) else None
            wait = self.fetch_wait() if self.fetch_wait is not None else None
            if self._last_start is not None and self._pending_wait is not None and wait is not None:
                used = cpu - self._last_cpu if cpu is not None and self._last_cpu is not None else -1
                rest = now_ns - self._last_start - wait
                self._steps.append((seen - 1, self._pending_wait, rest if rest > 0 else 0, used, -1))
        if wait is not None:
            self._gap_sum += wait
        self._pending_wait = wait
        self._last_start = now_ns
        self._last_cpu = cpu

    def step_end(self, step: int, batch: object = None, *, now_ns: int) -> None:
        k = self._seen % CPU_SAMPLE_EVERY
        # a sampled step's end, or the end before one
        cpu = self.cpu_clock() if k == 0 or k == CPU_SAMPLE_EVERY - 1 else None
        self._had_end = True
        last_start, pending = self._last_start, self._pending_wait
        if last_start is not None and pending is not None:
            used = cpu - self._last_cpu if cpu is not None and self._last_cpu is not None else -1
            rest = now_ns - last_start
            self._steps.append((self._seen, pending, rest if rest > 0 else 0, used, self._wait_cpu))
        self._end_cpu = cpu
        self._pending_wait = None
        self._last_start = None
        self._last_end = now_ns

    def _interrupt(self, *, now_ns: int) -> None:
        """Validation or a checkpoint: the step around it and the next wait are not steady."""
        self._last_end = None
        self._last_start = None
        self._pending_wait = None

    validation_start = _interrupt
    checkpoint_start = _interrupt

    def epoch_end(self, epoch: int, *, now_ns: int) -> None:
        if self._epoch_start_ns is None:
            return
        end = self._read()
        workers = self.source.workers if self.source is not None else 0
        counts = end.minus(self._begin) if end is not None else None
        self._begin = end
        wall = max(1, now_ns - self._epoch_start_ns)
        idle_end = self.idle_clock()
        idle = None if idle_end is None or self._idle_start is None else max(0, idle_end - self._idle_start) / wall
        skip = workers + 2 + self._queued
        steady = [s for s in self._steps if s[0] > skip]
        whole = (len(steady) // max(1, workers)) * max(1, workers)
        steady = steady[len(steady) - whole :]
        if not steady or (self.source is None and self.fetch_wait is None and not self._had_end):
            self.last = None
            return
        k = len(steady)
        wait = sum(s[1] for s in steady) / k
        rest = sum(s[2] for s in steady) / k
        rest_cpu = _sampled_mean([s[3] for s in steady])
        wait_cpu = _sampled_mean([s[4] for s in steady])
        threads = bool(getattr(self.source, "threads", False)) and gil_enabled()
        label = str(getattr(self.source, "label", "num_workers"))
        if workers > 0 and counts is not None and sum(counts.batches) > 0:
            # several loaders feeding one step: W is the worker time of a step's batches, one from each
            batches = sum(counts.batches) / max(1, int(getattr(self.source, "batches_per_step", 1)))
            w = sum(counts.busy_ns) / batches
            w_cpu = sum(counts.cpu_ns) / batches
            w_runq = sum(counts.runq_ns) / batches
            busy = 100.0 * sum(counts.busy_ns) / (workers * wall)
            # the idle cores bound only loading that wants a core: a worker that mostly sleeps gets its little CPU
            # time on a busy machine all the same (its wait for a core is the machine's, not the loading's)
            cpu_bound = w_cpu >= 0.5 * max(w - w_runq, w_cpu)
            free = None if idle is None or not cpu_bound else min(float(self.cores), idle + sum(counts.cpu_ns) / wall)
            # threads: the GIL runs their Python code one at a time, whatever the cores (a thread waiting for the GIL
            # is neither on a core nor on its run queue, so W_cpu and the run-queue wait do not show it)
            free, process_free = (1.0, free) if threads else (free, None)
            worker_cores: float | None = sum(counts.cpu_ns) / wall
            # the main process's own per-batch work shows when the workers are fast enough; while they are the bound
            # it hides in the wait, where the main thread's CPU time still counts it
            main = max(wait - max(0.0, w / workers - rest), wait_cpu, 0.0)
        elif workers == 0 and self.source is not None:
            w, w_cpu, w_runq, main, free, process_free, worker_cores = wait, 0.0, 0.0, 0.0, None, None, None
            if threads:  # the main thread loads: its CPU time while the loop waited is the loading's
                w_cpu = min(wait, wait_cpu)
                free, process_free = 1.0, None if idle is None else min(float(self.cores), idle + w_cpu * k / wall)
            busy = 100.0 * self._gap_sum / wall
        else:
            self.last = None
            return

        model = StepModel(w=w, s=rest, m=main, w_cpu=w_cpu, s_cpu=rest_cpu, cores=self.cores, free=free, w_runq=w_runq)
        # the cores other processes held: the usable cores less the idle ones and this process's own CPU time (all
        # its threads where the process clock is read: an intra-op pool is this process's, not another's)
        main_cores = (rest_cpu + wait_cpu) * k / wall
        own_cores = (worker_cores or 0.0) + main_cores
        if self.process_clock is not None and self._process_start is not None:
            process_cores = (self.process_clock() - self._process_start) / wall
            # The process clock holds worker threads (a PyDataset's) but no worker process: thread workers are
            # counted once
            if getattr(self.source, "threads", False):
                own_cores = max(own_cores, process_cores)
            else:
                own_cores = (worker_cores or 0.0) + max(main_cores, process_cores)
        others = None if idle is None else max(0.0, self.cores - idle - own_cores)
        needed, predicted, reached = model.needed(w_runq=w_runq, skip_one=threads)
        process_needed: int | None = None
        process_predicted: float | None = None
        if threads:
            n_proc, t_proc, _ = replace(model, free=process_free).needed(w_runq=w_runq)
            if t_proc < predicted * (1 - WAIT_TARGET):
                process_needed, process_predicted = n_proc, t_proc
        self.last = LoaderEpoch(
            workers=workers,
            steps=k,
            batch_ns=w,
            batch_cpu_ns=w_cpu,
            batch_runq_ns=w_runq,
            step_ns=rest,
            step_cpu_ns=rest_cpu,
            wait_ns=wait,
            main_ns=main,
            busy_percent=min(100.0, busy),
            cores=self.cores,
            free_cores=free,
            needed=needed,
            predicted_ns=predicted,
            reached=reached,
            label=label,
            threads=threads,
            process_needed=process_needed,
            process_predicted_ns=process_predicted,
            worker_cpu_cores=worker_cores,
            other_cores=others,
        )

    def epoch_figures(self) -> dict[str, float]:
        """This epoch's ``fitprof/epoch/loader_*`` figures (NaN without a source or steady steps; the worker count and
        its step time NaN for worker threads held back by the GIL, :attr:`LoaderEpoch.gil_bound`, and for a contended
        epoch, :attr:`LoaderEpoch.contended`)."""
        e = self.last
        if e is None:
            return {m.key: math.nan for m in LOADER_METRICS}
        none = e.gil_bound or e.contended
        return {
            LOADER_WORKERS.key: float(e.workers),
            LOADER_BUSY_PERCENT.key: e.busy_percent,
            LOADER_BATCH_MS.key: e.batch_ns * 1e-6,
            LOADER_WORKERS_NEEDED.key: math.nan if none else float(e.needed),
            LOADER_STEP_TIME_IF_ENOUGH_WORKERS_MS.key: math.nan if none else e.predicted_ns * 1e-6,
        }

    def window_figures(self) -> dict[str, float]:
        """None: the loader's figures are the epoch's, whatever was profiled."""
        return {}

    def advice(self, *, waiting_only: bool = False) -> str | None:
        """The last epoch's advice line, None before an epoch with figures (``waiting_only``: also None when the
        input wait was under :data:`WAIT_TARGET` of the step, nothing to act on, or the loader is not the user's:
        ``user_loader`` False)."""
        e = self.last
        if e is None or (waiting_only and (e.wait_ns <= WAIT_TARGET * e.measured_ns or not self.user_loader)):
            return None
        return e.advice()

"""Where every millisecond of an epoch went: its wall time split into parts that add up to it (framework-free).

:class:`EpochParts` is a probe: the adapters (through the engine) tell it when an epoch, a step, a validation run
or a checkpoint save starts and ends, and wrap the other callbacks' hooks and fitprof's own hooks in
:meth:`EpochParts.enter` / :meth:`EpochParts.leave`. Each event reads one clock (``time.perf_counter_ns`` unless a
``now_ns`` is given) and charges the time since the previous event to the part in force, so the parts add up to
the epoch's wall time exactly (integer nanoseconds, nothing estimated):

* ``train_steps``: from a step's start (Lightning ``on_train_batch_start``, Keras ``on_train_batch_begin``) to its
  end, plus the gap from the previous step's end to it (the batch fetch, the loop's own work). The first step's
  fetch is start-up, not step time;
* ``input`` (inside ``train_steps``, not added again): the batch-fetch wait of the steps after the first, as the
  adapter measured it (:meth:`EpochParts.input_wait`);
* ``validation``: between ``validation_start`` and ``validation_end``;
* ``checkpoint``: between ``checkpoint_start`` and ``checkpoint_end``, and inside the hooks of a checkpointing
  callback (``ModelCheckpoint``, ``BackupAndRestore``), whatever runs nested in them;
* ``callbacks``: inside the other callbacks' hooks (the innermost hook wins, each callback's own total is kept);
* ``startup``: from the epoch's start to its first step's start (workers spawned, iterator built, first batch);
* ``profiling``: inside fitprof's own hooks, plus the extra time of the steps a profiling window held: their time
  less as many of the epoch's median step outside the windows (none moved when no step ran outside them);
* ``other``: the rest: the gap from a step's end to a validation run or to the epoch's end, the time between two
  epochs outside any hook, anything no event bracketed.

An epoch ends in two steps. At fitprof's epoch-end hook (:meth:`EpochParts.epoch_end`) its steps are over and the
parts so far are given (:attr:`EpochParts.results` holds them until the close); the epoch *closes* later, at
:meth:`EpochParts.close`: the adapter calls it at the next epoch's start, at the fit's end, or (Keras) just before
``History`` records the epoch's logs. What the framework runs in between (a checkpoint saved by a callback whose
hook runs after fitprof's, as Lightning runs ``ModelCheckpoint`` after every other callback; other callbacks'
epoch-end hooks; fitprof's own analysis of a window) is counted in the epoch whose end made it, whatever the
callbacks' order. The next epoch's span starts at the close; the first epoch of a fit at its start. Over a fit
nothing between the first epoch's start and the last epoch's close is lost; what runs after that close is the
fit's teardown.

CPU contention, per epoch span (:func:`os.getrusage` and, where Linux has it, ``/proc/thread-self/schedstat``):
the process's CPU time against wall time, its involuntary context switches, and the share of the wall time the
training thread was ready to run but waited for a core. An epoch is *CPU-contended* when that wait is
:data:`CONTENDED_WAIT_PERCENT` or more of the wall time (without schedstat: when involuntary switches reach
:data:`CONTENDED_SWITCHES_PER_CPU_S` per second of CPU time). The verdict says so with the numbers, who held the
cores (this process's own other threads and loader workers, or other processes: :mod:`fitprof.fit.own_cpu`) and the
fix in threads and workers, never "speed up the operator".

Cost: two ``perf_counter_ns`` reads and a few list operations per step; two ``getrusage`` calls and two small
``/proc`` reads per epoch.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fitprof import metrics
from fitprof.fit.fit_wall import FitClock, FitWall
from fitprof.fit.loader import idle_ns
from fitprof.fit.own_cpu import OWN_FIX, holder, thread_cpu_ns

__all__ = [
    "CONTENDED_SWITCHES_PER_CPU_S",
    "CONTENDED_WAIT_PERCENT",
    "FEEDS",
    "PARTS",
    "PART_VERDICT_PERCENT",
    "PROFILING_LONG_EPOCH_S",
    "CpuUse",
    "EpochParts",
    "EpochWall",
    "FitWall",
    "contention",
    "contention_verdict",
    "lightning_hook_part",
    "part_verdicts",
]

PARTS = ("train_steps", "validation", "checkpoint", "callbacks", "startup", "profiling", "other")
"""The parts that add up to an epoch's wall time (``input`` is a share of ``train_steps``, not one of them)."""

TRAIN_STEPS, VALIDATION, CHECKPOINT, CALLBACKS, STARTUP, PROFILING, OTHER = range(7)
"""The indices of :data:`PARTS`: what :meth:`EpochParts.enter` takes."""
_GAP = 7  # from a step's end to the next event: the next step's (fetch) or other time, decided by that event
_IDLE = 8  # no epoch being counted (before the first epoch, after the fit)

PART_VERDICT_PERCENT = 10.0
"""A part other than the training steps that takes this share of the epoch's wall time (or more) is named in the
epoch's verdict, with its numbers and the framework's fix."""

CONTENDED_WAIT_PERCENT = 20.0
"""The training thread waiting for a core this share of the wall time (or more) makes the epoch CPU-contended.

Measured on a 2-core machine (torch matmuls 256x256 for 4 s, ``/proc/thread-self/schedstat``): with 3 CPU hogs
running, one intra-op thread waited 60% of the wall time for a core (1.03 ms a matmul against 0.48 ms
alone); 8 intra-op threads on the machine shared with other work, 55-56% (1.7 ms); on the same machine at load 5
without the hogs, one thread waited 31%. A thread that sleeps or waits for I/O does not count: it is not ready to
run."""

CONTENDED_SWITCHES_PER_CPU_S = 1000.0
"""Without schedstat: involuntary context switches per second of the process's CPU time that make the epoch
CPU-contended. Measured as above: 8 intra-op threads, 2,500-3,100 per CPU second; one thread, at most 270 (with 3
CPU hogs), 60-160 otherwise."""

_FIX_CHECKPOINT = {
    "keras": "save less often (ModelCheckpoint(save_freq=...) with more batches, or 'epoch') or save weights only "
    "(ModelCheckpoint(save_weights_only=True))",
    "lightning": "save less often (ModelCheckpoint(every_n_train_steps=... / every_n_epochs=...)), save weights only "
    "(save_weights_only=True), or save asynchronously (Trainer(plugins=[AsyncCheckpointIO()]))",
}
_FIX_VALIDATION = {
    "keras": "validate less often or on fewer batches: fit(validation_freq=N, validation_steps=M)",
    "lightning": "validate less often or on fewer batches: Trainer(val_check_interval=..., "
    "check_val_every_n_epoch=..., limit_val_batches=...)",
}
_FIX_STARTUP = {
    "keras": "keep the loader's workers between epochs: DataLoader(persistent_workers=True) on the torch backend, "
    "a tf.data pipeline built once (its start-up, worker_init_fn included, then runs once per fit)",
    "lightning": "keep the loader's workers between epochs: DataLoader(persistent_workers=True) (worker start-up "
    "and worker_init_fn then run once per fit, not once per epoch)",
}
_STARTUP_BY_FEED = {
    "DataLoader": _FIX_STARTUP["lightning"],
    "tf.data": "each epoch builds a new tf.data iterator, which fills its buffers before the first batch; where "
    "that is the time, a smaller shuffle(buffer_size) starts sooner, and work that does not change between epochs "
    "(decoding, resizing) can be .cache()d before the shuffle",
    "PyDataset": "Keras stops the PyDataset's workers at each epoch's end and starts them again, so the first batch "
    "waits for them every epoch; worker threads (use_multiprocessing=False) start sooner than processes",
    "arrays": "fed arrays, this is Keras's own start-up (the epoch's batches shuffled and its iterator built before "
    "the first step), with no setting of the input to change: a share that falls as epochs get longer",
}
"""Keras's start-up sentence by what the fit is fed (:attr:`EpochParts.feed`): advice that fits the input; an unknown
feed gets the general ``_FIX_STARTUP["keras"]``."""
FEEDS = ("DataLoader", "tf.data", "PyDataset", "arrays")
"""What a Keras fit may be fed, as :attr:`EpochParts.feed` names it ("" unknown: a generator, another adapter)."""
PROFILING_LONG_EPOCH_S = 30.0
"""An epoch at least this long (s) in which fitprof's own profiling still takes :data:`PART_VERDICT_PERCENT` or
more gets the advice to profile less: each window then cost 3 s or more, far above a window's usual cost (start,
stop, export and analysis plus the profiled steps' extra time: 0.03-0.5 s measured on the README's quickstarts, CPU,
5 profiled steps), so the window itself is expensive (many steps profiled, large traces). In a shorter epoch the
share is stated as a fact, with no advice: it is a cost per window, not per step, and falls as epochs get longer (a
20-step example spends 10-30% of each epoch on it, an epoch of thousands of steps a fraction of a percent)."""

_FIX_PROFILING = "profile fewer steps or epochs (profile_batch=..., every_n_epochs=...)"
_PROFILING_FACT = "a cost per profiled window, not per step, so its share falls as epochs get longer"
_FIX_OTHER = (
    "time outside the steps, validation, checkpoints and callback hooks: the framework's loop, logging, the "
    "last batch fetch"
)
_FIX_THREADS = {
    # Keras runs on any backend: each backend's own call, none put first
    "keras": "use fewer threads, k at most the free cores: OMP_NUM_THREADS=k, or in code "
    "torch.set_num_threads(k) on the torch backend, tf.config.threading.set_intra_op_parallelism_threads(k) on "
    "TensorFlow; and fewer loader workers",
    "lightning": "use fewer threads: torch.set_num_threads(k) or OMP_NUM_THREADS=k with k at most the free cores, "
    "and fewer DataLoader workers (num_workers)",
}
_NAMES = {
    VALIDATION: "validation",
    CHECKPOINT: "checkpointing",
    CALLBACKS: "callback hooks",
    STARTUP: "the epoch's start-up (first batch)",
    PROFILING: "fitprof's own profiling",
    OTHER: "other time",
}


@dataclass(frozen=True)
class CpuUse:
    """The process's CPU use over one epoch span.

    Attributes:
        cpu_s: user plus system CPU time of all the process's threads (s, ``getrusage(RUSAGE_SELF)``); loader
            worker processes are not counted.
        involuntary_switches: context switches forced on the process's threads by the scheduler (``ru_nivcsw``).
        run_wait_s: time the training thread (the one sending the events) was ready to run but waited for a core
            (s, the second field of ``/proc/thread-self/schedstat``); NaN where that file cannot be read.
        cores: the cores this process may run on (``os.sched_getaffinity``, else ``os.cpu_count()``).
        threads: the compute threads the adapter reported (intra-op threads), 0 when unknown.
        workers: the loader worker processes the adapter reported, 0 when none or unknown.
        load: the machine's 1-minute load average at the epoch's end (``os.getloadavg``; NaN where unknown): the
            runnable processes of every user, this one's threads included.
        thread_cpu_s: the training thread's own CPU time (s, the first field of ``/proc/thread-self/schedstat``);
            NaN where that file cannot be read.
        workers_cpu_s: the loader workers' CPU time in their batch fetches (s, summed over the workers, as the
            loader probe counts it); NaN without a loader the probe reads.
        idle_s: the usable cores' idle time summed over them (s, ``/proc/stat``); NaN where unknown.
    """

    cpu_s: float
    involuntary_switches: int
    run_wait_s: float
    cores: int
    threads: int = 0
    workers: int = 0
    load: float = math.nan
    thread_cpu_s: float = math.nan
    workers_cpu_s: float = math.nan
    idle_s: float = math.nan


@dataclass(frozen=True)
class EpochWall:
    """One epoch's wall time and its parts (s), which add up to ``wall_s`` exactly.

    Attributes:
        epoch: the 0-based epoch.
        wall_s: the epoch's span (s): from the previous epoch's close (the first epoch: its start) to its own close
            (see the module docstring; the parts so far at fitprof's epoch-end hook, until the close).
        train_steps_s, validation_s, checkpoint_s, callbacks_s, startup_s, profiling_s, other_s: the parts (s),
            see the module docstring; their sum is ``wall_s``.
        input_s: the input wait inside ``train_steps_s`` (s); NaN when the adapter measured none.
        steps: the steps that ended in the epoch.
        window_steps: those a profiling window held.
        cpu: the CPU use over the span.
        callback_s: each timed callback's own total (s), by the name the adapter gave.
    """

    epoch: int
    wall_s: float
    train_steps_s: float
    input_s: float
    validation_s: float
    checkpoint_s: float
    callbacks_s: float
    startup_s: float
    profiling_s: float
    other_s: float
    steps: int
    window_steps: int
    cpu: CpuUse
    callback_s: dict[str, float] = field(default_factory=dict)

    def part_s(self, part: int) -> float:
        """The seconds of one part, by its index in :data:`PARTS`."""
        return float(getattr(self, PARTS[part] + "_s"))

    @property
    def cpu_percent(self) -> float:
        """Process CPU time over wall time, times 100 (above 100 with several busy threads); NaN for an empty
        span."""
        return 100.0 * self.cpu.cpu_s / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def involuntary_switches_per_s(self) -> float:
        """Involuntary context switches per second of wall time; NaN for an empty span."""
        return self.cpu.involuntary_switches / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def run_wait_percent(self) -> float:
        """The training thread's wait for a core over wall time, times 100 (0-100); NaN without schedstat."""
        return 100.0 * self.cpu.run_wait_s / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def own_threads_s(self) -> float:
        """The CPU time of the process's threads other than the training thread (s): the process's less the
        training thread's, at least 0; NaN where the training thread's is unknown."""
        return max(0.0, self.cpu.cpu_s - self.cpu.thread_cpu_s) if math.isfinite(self.cpu.thread_cpu_s) else math.nan

    @property
    def own_threads_cpu_percent(self) -> float:
        """:attr:`own_threads_s` over wall time, times 100 (above 100 with several busy threads); NaN where
        unknown or for an empty span."""
        return 100.0 * self.own_threads_s / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def other_cores(self) -> float:
        """The cores other processes held on average over the span: the usable cores less their idle time and this
        fit's CPU time (the process's and its loader workers'), at least 0; NaN where the idle time is unknown."""
        if not (self.wall_s > 0 and math.isfinite(self.cpu.idle_s)):
            return math.nan
        workers = self.cpu.workers_cpu_s if math.isfinite(self.cpu.workers_cpu_s) else 0.0
        return max(0.0, self.cpu.cores - (self.cpu.idle_s + self.cpu.cpu_s + workers) / self.wall_s)

    def scalars(self) -> dict[str, float]:
        """The ``fitprof/epoch/*`` keys of :data:`fitprof.metrics.EPOCH_PARTS_METRICS` (NaN where unknown)."""
        return {
            metrics.EPOCH_WALL_S.key: self.wall_s,
            metrics.EPOCH_TRAIN_STEPS_S.key: self.train_steps_s,
            metrics.EPOCH_INPUT_S.key: self.input_s,
            metrics.EPOCH_VALIDATION_S.key: self.validation_s,
            metrics.EPOCH_CHECKPOINT_S.key: self.checkpoint_s,
            metrics.EPOCH_CALLBACKS_S.key: self.callbacks_s,
            metrics.EPOCH_STARTUP_S.key: self.startup_s,
            metrics.EPOCH_PROFILING_S.key: self.profiling_s,
            metrics.EPOCH_OTHER_S.key: self.other_s,
            metrics.EPOCH_CPU_PERCENT.key: self.cpu_percent,
            metrics.EPOCH_INVOLUNTARY_SWITCHES_PER_S.key: self.involuntary_switches_per_s,
            metrics.EPOCH_RUN_WAIT_PERCENT.key: self.run_wait_percent,
            metrics.EPOCH_OWN_THREADS_CPU_PERCENT.key: self.own_threads_cpu_percent,
        }


def _rusage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nivcsw


def _schedstat() -> int | None:
    """The calling thread's run-queue wait so far (ns), None where Linux does not give it."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _delta_s(end: int | None, start: int | None) -> float:
    return (end - start) / 1e9 if end is not None and start is not None else math.nan


def _workers_delta_s(end: tuple[int, ...] | None, start: tuple[int, ...] | None) -> float:
    """The workers' CPU time between two readings (s); a worker whose counter went down (restarted) counts from 0,
    as the loader probe counts it."""
    if end is None:
        return math.nan
    if start is None or len(start) != len(end):
        start = (0,) * len(end)
    return sum(b - a if b >= a else b for a, b in zip(start, end, strict=True)) / 1e9


def _load() -> float:
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return math.nan


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class EpochParts:
    """The probe that splits each epoch's wall time into :data:`PARTS` (see the module docstring).

    Events take ``now_ns`` (``time.perf_counter_ns()`` when None) so that the engine reads the clock once per event
    for all its probes. Each finished epoch is in :attr:`results`; :meth:`epoch_figures` gives the last one's
    ``fitprof/epoch/*`` scalars.

    Args:
        framework: ``"keras"`` or ``"lightning"``: the wording of the fixes.
        clock: the clock the events read when given no ``now_ns`` (ns).
        rusage: ``() -> (cpu_s, involuntary_switches)`` of the process (tests plant it).
        schedstat: ``() -> run-queue wait so far (ns) or None`` of the calling thread.
        cores: the cores the process may use (None: ``os.sched_getaffinity``).
        load: ``() -> the 1-minute load average`` (NaN where unknown).
        thread_cpu: ``() -> CPU time so far (ns) or None`` of the calling thread.
        idle: ``() -> the usable cores' summed idle time so far (ns) or None``.
        worker_cpu: ``() -> the loader workers' CPU time so far (ns, one per worker) or None`` (the loader
            probe's :meth:`~fitprof.fit.loader.LoaderProbe.worker_cpu`); None: no workers counted.

    Raises:
        ValueError: for a ``framework`` other than ``"keras"`` or ``"lightning"``.

    Attributes:
        results: the finished epochs of this fit, by 0-based epoch.
        threads: the intra-op threads, set by the adapter (0: unknown).
        workers: the loader worker processes, set by the adapter (0: none or unknown).
        feed: what the fit is fed, one of :data:`FEEDS` or "" (unknown), set by the Keras adapter: the start-up
            sentence's advice fits it.
    """

    def __init__(
        self,
        framework: str = "lightning",
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        rusage: Callable[[], tuple[float, int]] = _rusage,
        schedstat: Callable[[], int | None] = _schedstat,
        cores: int | None = None,
        load: Callable[[], float] = _load,
        thread_cpu: Callable[[], int | None] = thread_cpu_ns,
        idle: Callable[[], int | None] = idle_ns,
        worker_cpu: Callable[[], tuple[int, ...] | None] | None = None,
    ) -> None:
        if framework not in ("keras", "lightning"):
            raise ValueError(f"framework must be 'keras' or 'lightning', got {framework!r}")
        self.framework = framework
        self._clock = clock
        self._rusage = rusage
        self._schedstat = schedstat
        self._load = load
        self._thread_cpu, self._idle, self._worker_cpu = thread_cpu, idle, worker_cpu
        self.cores = int(cores) if cores is not None else _cores()
        self.threads = 0
        self.workers = 0
        self.feed = ""
        self.results: dict[int, EpochWall] = {}
        self._last: EpochWall | None = None
        self.clock = FitClock()
        self.fit: FitWall | None = None
        self._fit_marks: dict[str, int] = {}  # what the fit's figures are taken from again at its teardown
        self._fit_reset()

    def _fit_reset(self) -> None:
        self._acc = [0] * 9
        self._moved = self._acc
        self._phase = _IDLE
        self._saved_phase: list[int] = []
        self._nest: list[tuple[int, str, int]] = []  # (part, callback name, entered at)
        self._t = self._span_t0 = 0
        self._input = 0
        self._input_seen = False
        self._first_step = True
        self._steps = 0
        self._step_mark = 0  # train_steps ns at the previous step end
        self._step_ns: list[int] = []  # each step outside a window (ns)
        self._window = False
        self._window_ns = 0
        self._window_n = 0
        self._pending: int | None = None  # the epoch whose end hook ran and which is not closed yet
        self._ended = [0, 0, 0]  # the closed epochs' wall, profiling and checkpoint time (ns)
        self._last_end = -1  # the last epoch's end (ns)
        self._callback_ns: dict[str, int] = {}
        self._cpu0: tuple[float, int] = (0.0, 0)
        self._wait0: int | None = None
        self._own0: tuple[int | None, int | None, tuple[int, ...] | None] = (None, None, None)

    # --------------------------------------------------------------------------------------------- charging
    def _now(self, now_ns: int | None) -> int:
        return self._clock() if now_ns is None else int(now_ns)

    def _charge(self, now: int) -> None:
        part = self._nest[-1][0] if self._nest else self._phase
        self._acc[part] += now - self._t
        self._t = now

    def _resolve_gap(self, to: int) -> None:
        gap = self._acc[_GAP]
        if gap:
            self._acc[_GAP] = 0
            self._acc[to] += gap

    # ----------------------------------------------------------------------------------------------- events
    def fit_start(self, now_ns: int | None = None) -> None:
        """A new fit: forget the previous fit's epochs and any open span; the fit's wall time starts here."""
        self.results = {}
        self._last = None
        self.fit = None
        self._fit_marks = {}
        self._fit_reset()
        self.clock.start(self._now(now_ns))

    def data_start(self, now_ns: int | None = None) -> None:
        """The first epoch's loader starts being built before its epoch-start hook (Lightning's
        ``FitLoop.setup_data``: the sampler's ``__iter__``, worker start-up): the epoch's span and its start-up
        begin here. Ignored once an epoch is being counted."""
        if self._phase != _IDLE or self.results or self.clock.t0 < 0:
            return
        self._begin_span(self._now(now_ns))
        self._phase = STARTUP

    def epoch_start(self, epoch: int, now_ns: int | None = None) -> None:
        """The epoch starts: its start-up runs until the first step starts. The first epoch of a fit (or one after
        an unfinished span) starts its span here; a later one keeps the span its predecessor's close started (an
        epoch not closed yet closes here)."""
        now = self._now(now_ns)
        if self._pending is not None:  # the adapter did not close the last epoch: it closes here
            self.close(now)
        if self._phase == _IDLE:
            self._begin_span(now)
        else:
            self._charge(now)
            self._resolve_gap(OTHER)
        self._phase = STARTUP
        self._saved_phase = []
        self._first_step = True

    def _begin_span(self, now: int) -> None:
        if self.clock.first_span < 0:
            self.clock.first_span = now
        self._acc = [0] * 9
        self._t = self._span_t0 = now
        self._input = 0
        self._input_seen = False
        self._steps = 0
        self._step_mark = 0
        self._step_ns = []
        self._window_ns = 0
        self._window_n = 0
        self._callback_ns = {}
        self._cpu0 = self._rusage()
        self._wait0 = self._schedstat()
        self._own0 = (self._thread_cpu(), self._idle(), self._workers_now())

    def _workers_now(self) -> tuple[int, ...] | None:
        try:
            return self._worker_cpu() if self._worker_cpu is not None else None
        except Exception:  # a loader's counters that cannot be read leave the workers uncounted, never the epoch
            return None

    def step_start(self, step: int = 0, batch: object = None, now_ns: int | None = None) -> None:
        """A training step starts (its batch is fetched): the time since the previous step's end was that step's
        fetch and the loop's own work. Where the framework sends no step end (Keras), the previous step ends
        here."""
        phase = self._step_event(now_ns)
        if phase == _IDLE:
            return
        if phase == TRAIN_STEPS:
            self._end_step()
        acc = self._acc
        gap = acc[_GAP]
        if gap:
            acc[_GAP] = 0
            acc[TRAIN_STEPS] += gap
        self._phase = TRAIN_STEPS

    def input_wait(self, ns: int) -> None:
        """The batch-fetch wait (ns) of the step in progress, as the adapter timed it; the first step's is
        start-up."""
        self._input_seen = True
        if not self._first_step and ns > 0:
            self._input += ns

    def step_end(self, step: int = 0, batch: object = None, now_ns: int | None = None) -> None:
        """A training step ends (its optimizer step is done)."""
        if self._step_event(now_ns) == _IDLE:
            return
        self._end_step()
        self._phase = _GAP

    def _step_event(self, now_ns: int | None) -> int:
        """The time since the last event, charged to the running phase (the innermost timed hook's, when one runs);
        returns that phase (``_IDLE``: none runs, nothing is charged)."""
        phase = self._phase
        if phase != _IDLE:
            self._charge(self._clock() if now_ns is None else now_ns)
        return phase

    def _end_step(self) -> None:
        steps_ns = self._acc[TRAIN_STEPS]
        took, self._step_mark = steps_ns - self._step_mark, steps_ns
        self._steps += 1
        if self._window:
            self._window_ns += took
            self._window_n += 1
        else:
            self._step_ns.append(took)
        self._first_step = False

    def validation_start(self, now_ns: int | None = None) -> None:
        """A validation run starts (the sanity check before the first epoch is in no epoch: the fit's setup)."""
        if self._phase == _IDLE:
            self.clock.sanity_start(self._now(now_ns))
        self._push_phase(VALIDATION, now_ns)

    def validation_end(self, now_ns: int | None = None) -> None:
        """The validation run ends."""
        if self._phase == _IDLE:
            self.clock.sanity_end(self._now(now_ns))
        self._pop_phase(now_ns)

    def checkpoint_start(self, now_ns: int | None = None) -> None:
        """A checkpoint save starts."""
        self.enter(CHECKPOINT, now_ns=now_ns)

    def checkpoint_end(self, now_ns: int | None = None) -> None:
        """The checkpoint save ends."""
        self.leave(now_ns)

    def _push_phase(self, phase: int, now_ns: int | None) -> None:
        now = self._now(now_ns)
        if self._phase == _IDLE:
            return
        self._charge(now)
        if self._phase == TRAIN_STEPS:  # Keras: the last step ends where validation starts
            self._end_step()
            self._phase = _GAP
        self._resolve_gap(OTHER)
        self._saved_phase.append(self._phase)
        self._phase = phase

    def _pop_phase(self, now_ns: int | None) -> None:
        now = self._now(now_ns)
        if self._phase == _IDLE or not self._saved_phase:
            return
        self._charge(now)
        self._phase = self._saved_phase.pop()

    def enter(self, part: int, name: str = "", now_ns: int | None = None) -> None:
        """A span of ``part`` (:data:`CALLBACKS`, :data:`CHECKPOINT` or :data:`PROFILING`) starts: a callback's hook
        (``name`` it for the verdict), a save, fitprof's own hook. Nested spans: fitprof's own time stays
        fitprof's, a save's stays the save's (the ``on_save_checkpoint`` hooks it calls), else the innermost
        wins. Pair each with :meth:`leave`."""
        # The hot path (a callback's hook, every step): the charge is written out, no helper calls.
        now = self._clock() if now_ns is None else now_ns
        phase = self._phase
        if phase == _IDLE:
            if part == PROFILING:
                self.clock.own_enter(now)
            return
        nest = self._nest
        if nest:
            outer = nest[-1][0]
            self._acc[outer] += now - self._t
            if outer == PROFILING or (outer == CHECKPOINT and part == CALLBACKS):
                part = outer
        else:
            self._acc[phase] += now - self._t
        self._t = now
        nest.append((part, name, now))

    def leave(self, now_ns: int | None = None) -> None:
        """The span opened by the last :meth:`enter` ends (an unmatched call is ignored)."""
        nest = self._nest
        if not nest:
            self.clock.own_leave(self._clock() if now_ns is None else now_ns)
            return
        now = self._clock() if now_ns is None else now_ns
        part, name, since = nest.pop()
        if self._phase != _IDLE:
            self._acc[part] += now - self._t
            self._t = now
        if part == CALLBACKS and name:
            named = self._callback_ns
            named[name] = named.get(name, 0) + now - max(since, self._span_t0)

    def window_start(self, now_ns: int | None = None) -> None:
        """A profiling window opens: the steps that end until :meth:`window_end` carry its cost."""
        self._window = True

    def window_end(self, now_ns: int | None = None) -> None:
        """The profiling window closes."""
        self._window = False

    def epoch_end(self, epoch: int, now_ns: int | None = None) -> EpochWall | None:
        """fitprof's epoch-end hook: the epoch's steps are over. Returns its parts so far (also in :attr:`results`
        until :meth:`close` replaces them); the epoch stays open, so that what runs until its close (a save in a
        hook after fitprof's) is counted in it. None when no epoch was being counted."""
        now = self._now(now_ns)
        self._last = None
        if self._phase == _IDLE:
            return None
        if self._pending is not None:  # two end hooks without a close: the first epoch closes here
            self.close(now)
        self._charge(now)
        if self._phase == TRAIN_STEPS:
            self._end_step()
        self._resolve_gap(OTHER)
        self._phase = OTHER
        self._saved_phase = []
        self._pending = int(epoch)
        result = self._result(int(epoch))
        self.results[result.epoch] = self._last = result
        return result

    def close(self, now_ns: int | None = None) -> EpochWall | None:
        """The epoch whose end hook ran closes: its parts are final (:attr:`results`), and the next epoch's span
        starts here. None when no epoch waits for its close."""
        epoch, self._pending = self._pending, None
        if epoch is None or self._phase == _IDLE:
            return None
        now = self._now(now_ns)
        self._charge(now)
        self._resolve_gap(OTHER)
        result = self._result(epoch)
        self.results[epoch] = self._last = result
        ended = self._ended
        moved = self._moved  # the parts with a window's extra cost in profiling
        ended[0] += sum(moved[:7])
        ended[1] += moved[PROFILING]
        ended[2] += moved[CHECKPOINT]
        self._last_end = now
        self._begin_span(now)
        self._phase = OTHER
        self._saved_phase = []
        return result

    @property
    def pending(self) -> int | None:
        """The epoch whose end hook ran and which has not closed yet (None: none)."""
        return self._pending

    def _result(self, epoch: int) -> EpochWall:
        """The span's parts so far as epoch ``epoch``'s (the accumulators are left as they are: the span may go
        on until its close)."""
        acc = list(self._acc)
        extra = 0
        if self._window_n and self._step_ns:
            typical = sorted(self._step_ns)[len(self._step_ns) // 2]
            extra = min(max(self._window_ns - self._window_n * typical, 0), acc[TRAIN_STEPS])
        acc[TRAIN_STEPS] -= extra
        acc[PROFILING] += extra
        self._moved = acc
        wall = sum(acc[:7])
        cpu_s, switches = self._rusage()
        wait = self._schedstat()
        wait_s = (wait - self._wait0) / 1e9 if wait is not None and self._wait0 is not None else math.nan
        thread0, idle0, workers0 = self._own0
        thread, idle, workers = self._thread_cpu(), self._idle(), self._workers_now()
        cpu = CpuUse(
            cpu_s - self._cpu0[0],
            switches - self._cpu0[1],
            wait_s,
            self.cores,
            self.threads,
            self.workers,
            self._load(),
            thread_cpu_s=_delta_s(thread, thread0),
            workers_cpu_s=_workers_delta_s(workers, workers0),
            idle_s=_delta_s(idle, idle0),
        )
        steps_s = acc[TRAIN_STEPS] / 1e9
        return EpochWall(
            epoch=epoch,
            wall_s=wall / 1e9,
            train_steps_s=steps_s,
            input_s=min(self._input / 1e9, steps_s) if self._input_seen else math.nan,
            validation_s=acc[VALIDATION] / 1e9,
            checkpoint_s=acc[CHECKPOINT] / 1e9,
            callbacks_s=acc[CALLBACKS] / 1e9,
            startup_s=acc[STARTUP] / 1e9,
            profiling_s=acc[PROFILING] / 1e9,
            other_s=acc[OTHER] / 1e9,
            steps=self._steps,
            window_steps=self._window_n,
            cpu=cpu,
            callback_s={k: v / 1e9 for k, v in self._callback_ns.items()},
        )

    def fit_end(self, now_ns: int | None = None) -> None:
        """The fit ends: an epoch not closed yet closes here; what ran after the last epoch's close is in no epoch,
        but in the fit's teardown (:attr:`fit`, a :class:`~fitprof.fit.fit_wall.FitWall`)."""
        now = self._now(now_ns)
        if self._pending is not None:
            self.close(now)
        tail = [0] * 9
        if self._phase != _IDLE:
            self._charge(now)
            tail = self._acc
        ended = self._ended
        self._fit_marks = {
            "epochs_ns": ended[0],
            "epochs_profiling_ns": ended[1],
            "epochs_checkpoint_ns": ended[2],
            "last_end": self._last_end,
            "tail_profiling_ns": tail[PROFILING],
            "tail_checkpoint_ns": tail[CHECKPOINT],
        }
        self.fit = self.clock.wall(now, **self._fit_marks)
        self._phase = _IDLE
        self._nest = []
        self._saved_phase = []

    def exception(self, exc: BaseException | None = None, now_ns: int | None = None) -> None:
        """The fit raised: the epoch in progress is not finished, nothing more is counted (no fit figures)."""
        self.fit_end(now_ns)
        self.fit = None
        self._fit_marks = {}

    def fit_teardown(self, now_ns: int | None = None) -> FitWall | None:
        """The framework's own end of the fit after the fit-end event (Lightning's loops' teardown, which stops the
        loaders' workers, and the ``on_fit_end`` hooks run after ``on_train_end``) is the fit's teardown too:
        :attr:`fit` is taken again with its end here, and returned (None when no fit ended normally)."""
        if self._fit_marks:
            self.fit = self.clock.wall(self._now(now_ns), **self._fit_marks)
            self._fit_marks = {}
        return self.fit

    # ---------------------------------------------------------------------------------------------- results
    @property
    def fit_seconds(self) -> dict[str, float]:
        """The last finished fit's :meth:`FitWall.seconds() <fitprof.fit.fit_wall.FitWall.seconds>` (``wall``,
        ``setup``, ``epochs``, ...); empty before a fit ended or after one raised."""
        return self.fit.seconds() if self.fit is not None else {}

    def epoch_figures(self) -> dict[str, float]:
        """The ``fitprof/epoch/*`` part and CPU scalars (:meth:`EpochWall.scalars`) of the epoch that just ended;
        every key NaN when it was not counted (an epoch end without its start)."""
        if self._last is None:
            return {m.key: math.nan for m in metrics.EPOCH_PARTS_METRICS}
        return self._last.scalars()

    def window_figures(self) -> dict[str, float]:
        """No per-window figures: the parts are the epoch's (a window's own cost is in ``profiling_s``)."""
        return {}

    def verdicts(self, epoch: int | None = None) -> list[str]:
        """The epoch's findings (:func:`part_verdicts` and :func:`contention_verdict`), the last epoch's when
        ``epoch`` is None; empty when there is nothing to say or no such epoch."""
        if not self.results:
            return []
        result = self.results.get(max(self.results) if epoch is None else epoch)
        if result is None:
            return []
        out = part_verdicts(result, self.framework, feed=self.feed)
        contended = contention_verdict(result, self.framework)
        if contended:
            out.append(contended)
        return out


def part_verdicts(
    result: EpochWall, framework: str, *, percent: float = PART_VERDICT_PERCENT, feed: str = ""
) -> list[str]:
    """One line per part other than the training steps that took ``percent`` of the epoch or more, largest first,
    e.g. ``"checkpointing took 38% of epoch 2 (4.10 s of 10.80 s): save less often ..."``. fitprof's own share
    is stated as a fact about a short epoch, its fix given only over an epoch of :data:`PROFILING_LONG_EPOCH_S` or
    more.

    Args:
        result: the epoch's parts.
        framework: ``"keras"`` or ``"lightning"`` (the fix's wording).
        percent: the share (0-100) from which a part is named.
        feed: what a Keras fit is fed (:data:`FEEDS`, "" unknown): the start-up advice fits it.
    """
    if not result.wall_s > 0:
        return []
    found = []
    for part in (VALIDATION, CHECKPOINT, CALLBACKS, STARTUP, PROFILING, OTHER):
        seconds = result.part_s(part)
        share = 100.0 * seconds / result.wall_s
        if share >= percent:
            found.append((share, part, seconds))
    lines = []
    for share, part, seconds in sorted(found, reverse=True):
        if part == PROFILING:
            lines.append(_profiling_line(result, share, seconds))
            continue
        fix = _fix(part, result, framework, feed)
        lines.append(
            f"{_NAMES[part]} took {share:.0f}% of epoch {result.epoch} ({seconds:.2f} s of {result.wall_s:.2f} s): "
            f"{fix}"
        )
    return lines


def _profiling_line(result: EpochWall, share: float, seconds: float) -> str:
    """fitprof's own share of the epoch: a fact about a short epoch, advice only over a long one
    (:data:`PROFILING_LONG_EPOCH_S`); the two read as different sentences (:func:`fitprof.fit.voice.gist`), so a
    fit that said the fact still gets the advice when a long epoch needs it."""
    numbers = f"{seconds:.2f} s of {result.wall_s:.2f} s"
    if result.wall_s >= PROFILING_LONG_EPOCH_S:
        return (
            f"{_NAMES[PROFILING]} took {share:.0f}% of epoch {result.epoch}, a long one ({numbers}): {_FIX_PROFILING}"
        )
    return (
        f"{_NAMES[PROFILING]} took {share:.0f}% of epoch {result.epoch} ({numbers}, {result.steps} steps): "
        f"{_PROFILING_FACT}"
    )


def _fix(part: int, result: EpochWall, framework: str, feed: str = "") -> str:
    if part == CHECKPOINT:
        return _FIX_CHECKPOINT[framework]
    if part == VALIDATION:
        return _FIX_VALIDATION[framework]
    if part == STARTUP:
        return _STARTUP_BY_FEED.get(feed, _FIX_STARTUP[framework]) if framework == "keras" else _FIX_STARTUP[framework]
    if part == CALLBACKS:
        if result.callback_s:
            name, seconds = max(result.callback_s.items(), key=lambda item: item[1])
            return (
                f"the slowest is {name} ({seconds:.2f} s in its hooks): make its hooks cheaper or run them less often"
            )
        return "make the callbacks' hooks cheaper or run them less often"
    return _FIX_OTHER


def contention(result: EpochWall, framework: str) -> tuple[str, str] | None:
    """``(evidence, fix)`` when the epoch was starved of CPU (see the module docstring), else None: the evidence
    with its numbers and cause, e.g. ``"the training thread waited for a core 47% of epoch 0 (129 involuntary
    switches/s, CPU 19% of the wall time, 2 cores, load average 9.4, 1 intra-op threads + 0 loader workers); other
    processes held 1.6 of the 2 cores (this process's own threads used 0.1 of the 2 cores)"``, and the fix in that
    framework's terms. Who held the cores is measured where Linux gives the training thread's CPU time
    (:func:`fitprof.fit.own_cpu.holder`); elsewhere it is inferred from the thread and worker counts."""
    wait_pct = result.run_wait_percent
    cpu = result.cpu
    per_cpu_s = cpu.involuntary_switches / cpu.cpu_s if cpu.cpu_s > 0 else math.nan
    if math.isfinite(wait_pct):
        if wait_pct < CONTENDED_WAIT_PERCENT:
            return None
        evidence = f"the training thread waited for a core {wait_pct:.0f}% of epoch {result.epoch}"
    else:
        if not per_cpu_s >= CONTENDED_SWITCHES_PER_CPU_S:
            return None
        evidence = f"{per_cpu_s:,.0f} involuntary context switches per CPU second in epoch {result.epoch}"
    evidence += (
        f" ({result.involuntary_switches_per_s:,.0f} involuntary switches/s, CPU {result.cpu_percent:.0f}% of the "
        f"wall time, {cpu.cores} cores"
    )
    if math.isfinite(cpu.load):
        evidence += f", load average {cpu.load:.1f}"
    if cpu.threads:
        evidence += f", {cpu.threads} intra-op threads + {cpu.workers} loader workers"
    evidence += ")"
    held = holder(
        wall_s=result.wall_s,
        cores=cpu.cores,
        thread_cpu_s=cpu.thread_cpu_s,
        own_threads_s=result.own_threads_s,
        workers_cpu_s=cpu.workers_cpu_s,
        other_cores=result.other_cores,
        workers=cpu.workers,
    )
    if held is not None:  # measured: the cause is who used the cores
        cause, clause = held
        evidence += "; " + clause
        own_fix = OWN_FIX[framework].format(k=max(1, cpu.cores - 1))
        if cause == "own":
            return evidence, own_fix
        others_fix = "run fewer processes on this machine (or move to a quieter one)"
        return evidence, others_fix + ("; within this one, " + own_fix if cause == "both" else "")
    if cpu.threads and cpu.threads + cpu.workers > cpu.cores:
        evidence += f"; this process runs more threads and workers than the {cpu.cores} cores"
        fix = _FIX_THREADS[framework]
    else:
        evidence += "; other processes hold the cores"
        fix = "run fewer processes on this machine (or move to a quieter one); within this one, " + _FIX_THREADS[
            framework
        ].removeprefix("use ")
    return evidence, fix


def contention_verdict(result: EpochWall, framework: str) -> str | None:
    """``"CPU-contended: <evidence>, so step times measure waiting for a core, not the operators: <fix>"``
    (:func:`contention`), else None."""
    found = contention(result, framework)
    if found is None:
        return None
    evidence, fix = found
    return f"CPU-contended: {evidence}, so step times measure waiting for a core, not the operators: {fix}"


_LIGHTNING_CALLBACK = "[Callback]"
_LIGHTNING_CHECKPOINTS = ("[Callback]ModelCheckpoint",)


def lightning_hook_part(action: str, own: str = "FitProfiler") -> tuple[int, str] | None:
    """The part and callback name of one Lightning profiler action, None for an action that is no callback hook.

    Lightning's profiler names every callback hook call ``[Callback]<state_key>.<hook>`` (``state_key`` is the
    class name, plus the arguments that tell two instances apart: ``ModelCheckpoint{'monitor': None, ...}``). A
    ``ModelCheckpoint`` hook is :data:`CHECKPOINT`, fitprof's own (class ``own``) is :data:`PROFILING`, any other
    is :data:`CALLBACKS` under its class name.
    """
    if not action.startswith(_LIGHTNING_CALLBACK):
        return None
    if action.startswith(_LIGHTNING_CHECKPOINTS):
        return CHECKPOINT, "ModelCheckpoint"
    key = action[len(_LIGHTNING_CALLBACK) :].rpartition(".")[0]
    name = key.split("{", 1)[0].rpartition(".")[2]  # the class's own name, not its qualified one
    if name == own:
        return PROFILING, name
    return CALLBACKS, name

"""Who held the cores a CPU-contended training thread waited for, framework-free: this process's own other threads
(the intra-op pool, the framework's and fitprof's threads), the fit's own loader workers, or other processes.

A training thread waits for a core when every core runs something else. On a 2-core machine with nothing else
running, that something is the process itself: torch's intra-op pool of 2 threads (the calling thread and one
more), Keras's and TensorFlow's threads, the DataLoader's workers. Saying "other processes hold the cores" then
sends the user to look for processes that do not exist. So the epoch-parts probe measures, over each epoch span
(Linux only; elsewhere NaN and no claim is made):

* the training thread's own CPU time, ``/proc/thread-self/schedstat`` field 1 (:func:`thread_cpu_ns`), read in
  the same thread as its run-queue wait;
* the process's other threads: the process's CPU time (``getrusage(RUSAGE_SELF)``, threads that ended in the span
  included) less the training thread's;
* the loader workers' CPU time where the loader probe counts it (:meth:`fitprof.fit.loader.LoaderProbe.worker_cpu`:
  their batch fetch and collate, summed over the workers);
* the cores' idle time (``/proc/stat``, :func:`fitprof.fit.loader.idle_ns`); the cores other processes held are
  what is neither idle nor this fit's.

:func:`holder` words the cause from these: the process's own threads and workers when they used at least as much
of the cores as other processes (without the idle time: at least half of what the training thread left), else
other processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

__all__ = ["OWN_ALSO_CORES", "OWN_FIX", "holder", "thread_cpu_ns", "workers_in"]

OWN_FIX = {
    # Keras runs on any backend: each backend's own call, none put first
    "keras": "leave the training thread a core: torch.set_num_threads({k}) on the torch backend, "
    "tf.config.threading.set_intra_op_parallelism_threads({k}) on TensorFlow (or OMP_NUM_THREADS={k} before "
    "the import), and fewer loader workers",
    "lightning": "leave the training thread a core: torch.set_num_threads({k}) (or OMP_NUM_THREADS={k} before the "
    "import), and fewer DataLoader workers (num_workers)",
}
"""The advice when the process's own threads and workers hold the cores; ``{k}`` is the cores less one (at least
1): the threads that leave the training thread a core of its own."""
OWN_ALSO_CORES = 0.2
"""Own threads and workers that used this many cores (or more) are worth their fix even when other processes held
more: the README's Keras quickstart on the torch backend (2 intra-op threads, 2 cores, other processes holding
1.1-1.3 cores, load average 2-3) had its own threads use 0.2-0.5 of a core and its epochs take 0.7-1.5 s; with
``torch.set_num_threads(1)`` its own threads used 0.03-0.05 and the epochs took 0.1-0.2 s."""


def thread_cpu_ns() -> int | None:
    """The calling thread's CPU time so far (ns, ``/proc/thread-self/schedstat`` field 1), None where Linux does
    not give it."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def workers_in(probes: Iterable[object]) -> Callable[[], tuple[int, ...] | None] | None:
    """The first probe's ``worker_cpu`` (the loader probe's: its workers' cumulative CPU time, ns per worker), None
    when no probe counts workers."""
    for probe in probes:
        found = getattr(probe, "worker_cpu", None)
        if callable(found):
            return found
    return None


def holder(
    *,
    wall_s: float,
    cores: int,
    thread_cpu_s: float,
    own_threads_s: float,
    workers_cpu_s: float,
    other_cores: float,
    workers: int,
) -> tuple[str, str] | None:
    """Who held the cores over a span: ``(cause, clause)``, ``cause`` ``"own"`` when this process's own threads and
    workers did (see the module docstring), ``"others"`` when other processes did, ``"both"`` when other processes
    held more but the own threads and workers used :data:`OWN_ALSO_CORES` or more; the clause with the numbers,
    e.g. ``"this process's own threads used 1.1 of the 2 cores (other processes held 0.1 of the 2 cores)"``; None
    when the own threads were not measured (``own_threads_s`` NaN).

    Args:
        wall_s: the span (s).
        cores: the usable cores.
        thread_cpu_s: the training thread's CPU time in the span (s).
        own_threads_s: the process's other threads' CPU time in the span (s); NaN unmeasured.
        workers_cpu_s: the loader workers' CPU time in the span (s); NaN or 0 without workers.
        other_cores: the cores other processes held on average over the span; NaN where the idle time is unknown.
        workers: the loader workers the adapter reported (named in the clause when they used CPU).
    """
    if not (math.isfinite(own_threads_s) and wall_s > 0):
        return None
    threads_cores = max(0.0, own_threads_s) / wall_s
    workers_cores = workers_cpu_s / wall_s if math.isfinite(workers_cpu_s) and workers_cpu_s > 0 else 0.0
    own = threads_cores + workers_cores
    if math.isfinite(other_cores):
        is_own = own >= other_cores
    else:
        left = max(0.0, cores - thread_cpu_s / wall_s)
        is_own = own >= 0.5 * left
    used = f"this process's own threads used {threads_cores:.1f} of the {cores} cores"
    if workers_cores > 0:
        used += f" and its {workers or ''} loader workers {workers_cores:.1f}".replace("  ", " ")
    others = f"other processes held {other_cores:.1f} of the {cores} cores" if math.isfinite(other_cores) else ""
    if is_own:
        return "own", used + (f" ({others})" if others else "")
    return "both" if own >= OWN_ALSO_CORES else "others", (others or "other processes hold the cores") + f" ({used})"

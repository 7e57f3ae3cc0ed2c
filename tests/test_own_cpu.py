"""Who held the cores a contended training thread waited for, measured for real: busy threads inside this process
are its own (fitprof.fit.own_cpu), busy processes are other processes. Linux only (schedstat, /proc/stat)."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
import threading
import time

import pytest

from fitprof.fit import epoch_parts as ep
from fitprof.fit.epoch_parts import EpochParts, contention_verdict
from fitprof.fit.loader import usable_cores
from fitprof.fit.own_cpu import thread_cpu_ns

pytestmark = pytest.mark.skipif(thread_cpu_ns() is None, reason="needs Linux's /proc/thread-self/schedstat")

SPAN_S = 0.8
"""The epoch's length: the training thread spins in Python this long (s)."""
CORES = usable_cores()
"""The usable cores: one busy thread or process more than these makes the training thread wait."""


def spin(seconds: float) -> None:
    """The training thread's work: Python on a core (ready to run all along, so every wait for a core counts)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(i * i for i in range(2_000))


def hash_until(stop: threading.Event) -> None:
    """A busy thread of this process: hashlib releases the GIL on a large buffer, so it really holds a core."""
    data = b"x" * (8 << 20)
    while not stop.is_set():
        hashlib.sha256(data).digest()


def nothing_else_idle(cores: int):
    """The cores' idle time of a machine where only this process runs: the cores' time less this process's CPU
    time (ns), so the cores other processes held come out 0 whatever the machine's real load."""

    def idle() -> int:
        t = os.times()
        return int(cores * time.perf_counter_ns() - (t.user + t.system) * 1e9)

    return idle


def test_busy_threads_of_this_process_are_named_as_its_own() -> None:
    probe = EpochParts("keras", cores=CORES, idle=nothing_else_idle(CORES))
    stop = threading.Event()
    busy = [threading.Thread(target=hash_until, args=(stop,), daemon=True) for _ in range(CORES)]
    for t in busy:
        t.start()
    try:
        probe.fit_start()
        probe.epoch_start(0)
        thread0 = time.thread_time()
        probe.step_start(1)
        spin(SPAN_S)
        probe.step_end(1)
        thread_s = time.thread_time() - thread0
        r = probe.epoch_end(0)
    finally:
        stop.set()
        for t in busy:
            t.join()
    assert r is not None
    # the training thread's own CPU time is out of the own threads' figure, whatever the load: it is the process's
    # less this thread's (0.05 s: the reads of getrusage and of the clocks around the span)
    assert r.cpu.thread_cpu_s == pytest.approx(thread_s, abs=0.05)
    assert r.own_threads_s == pytest.approx(r.cpu.cpu_s - thread_s, abs=0.05)
    # the hashing threads get a share of the cores even at load 15 on 2 cores (2 of 16 runnable: 25%)
    assert r.own_threads_cpu_percent >= 10.0
    # a busy thread more than the cores: the training thread waits a third of the time at the least (2 cores)
    line = contention_verdict(r, "keras")
    assert line is not None, f"not contended: waited {r.run_wait_percent:.0f}%"
    assert "; this process's own threads used " in line and f"other processes held 0.0 of the {CORES} cores" in line
    assert line.endswith(ep.OWN_FIX["keras"].format(k=max(1, CORES - 1)))


def test_busy_other_processes_are_named_as_other_processes() -> None:
    probe = EpochParts("lightning", cores=CORES)
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL) for _ in range(CORES + 1)
    ]
    try:
        time.sleep(0.3)  # the hogs' interpreters started and spinning
        probe.fit_start()
        probe.epoch_start(0)
        probe.step_start(1)
        spin(SPAN_S)
        probe.step_end(1)
        r = probe.epoch_end(0)
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait()
    assert r is not None
    # this process ran one busy thread: its other threads (pytest's, none busy) used a small share of a core
    assert r.own_threads_cpu_percent < 20.0
    assert math.isfinite(r.other_cores) and r.other_cores >= 0.5 * CORES
    line = contention_verdict(r, "lightning")
    assert line is not None, f"not contended: waited {r.run_wait_percent:.0f}%"
    assert "; other processes held " in line and "(this process's own threads used 0." in line
    assert line.endswith("run fewer processes on this machine (or move to a quieter one)")

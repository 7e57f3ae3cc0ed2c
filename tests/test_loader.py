"""The loader probe (fitprof.fit.loader) on planted timings: a fake clock, a fake worker-counter source, no framework.

The real wrapping inside DataLoader workers and the prediction checked by re-measurement are in
test_loader_torch.py.
"""

from __future__ import annotations

import math

import pytest

from fitprof import metrics
from fitprof.fit.loader import (
    WAIT_TARGET,
    LoaderCounters,
    LoaderProbe,
    StepModel,
    search_bound,
    usable_cores,
)
from fitprof.profilers.loader import LoaderSet

MS = 1_000_000


class FakeSource:
    """A loader whose workers each produce batches of ``batch_ms`` wall (``cpu_ms`` CPU) time, counted on demand."""

    def __init__(self, workers: int, batch_ms: float, cpu_ms: float = 0.0, runq_ms: float = 0.0) -> None:
        self.workers = workers
        self.batch_ms, self.cpu_ms, self.runq_ms = batch_ms, cpu_ms, runq_ms
        self.done = [0] * workers
        self.next = 0
        self.busy = [0] * workers
        self.cpu = [0] * workers
        self.runq = [0] * workers

    def produce(self, batches: int) -> None:
        """Round robin, as a DataLoader hands out its batches."""
        for _ in range(batches if self.workers else 0):
            self.done[self.next] += 1
            self.busy[self.next] += int(self.batch_ms * MS)
            self.cpu[self.next] += int(self.cpu_ms * MS)
            self.runq[self.next] += int(self.runq_ms * MS)
            self.next = (self.next + 1) % self.workers

    def read(self) -> LoaderCounters | None:
        if not self.workers:
            return None
        return LoaderCounters(
            busy_ns=tuple(self.busy),
            cpu_ns=tuple(self.cpu),
            batches=tuple(self.done),
            runq_ns=tuple(self.runq),
        )


def drive(
    probe: LoaderProbe,
    source: FakeSource | None,
    *,
    steps: int,
    wait_ms: float,
    rest_ms: float,
    cpu_ms: float = 0.0,
    first_wait_ms: float = 0.0,
    step_end: bool = True,
    epoch: int = 0,
    t0: int = 0,
    tail_ms: float = 0.0,
    idle_cores: float | None = None,
    wait_cpu_ms: float = 0.0,
) -> int:
    """One epoch of planted steps; returns the clock at its end. Each step waits ``wait_ms`` and runs ``rest_ms``."""
    cpu = [0]
    probe.cpu_clock = lambda: cpu[0]
    if idle_cores is None:
        probe.idle_clock = lambda: None
    else:  # the usable cores stood idle this many cores' worth over the epoch
        probe.idle_clock = lambda: int(idle_cores * now)
    waits = [first_wait_ms] + [wait_ms] * (steps - 1)
    fetched = {"last": 0}

    def fetch_wait() -> int:
        return fetched["last"]

    probe.fetch_wait = None if step_end else fetch_wait
    now = t0
    probe.epoch_start(epoch, now_ns=now)
    for k in range(1, steps + 1):
        now += int(waits[k - 1] * MS)
        cpu[0] += int(wait_cpu_ms * MS)
        fetched["last"] = int(waits[k - 1] * MS)
        if source is not None:
            source.produce(1)
        probe.step_start(k, None, now_ns=now)
        now += int(rest_ms * MS)
        cpu[0] += int(cpu_ms * MS)
        if step_end:
            probe.step_end(k, None, now_ns=now)
    now += int(tail_ms * MS)
    probe.epoch_end(epoch, now_ns=now)
    return now


def test_the_model_and_the_count() -> None:
    # W = 40 ms a batch, S = 10 ms: 1 worker 40, 2 -> 20, 3 -> 13.3, 4 -> 10 (the step's own time), 0 -> 50
    assert StepModel(w=40, s=10).step_ns(0) == 50
    assert [StepModel(w=40, s=10, cores=8).step_ns(n) for n in (1, 2, 4, 8)] == [40, 20, 10, 10]
    assert StepModel(w=40, s=10, cores=8).step_ns(3) == pytest.approx(40 / 3)
    # the main process's own cost M stays whatever the workers do
    assert StepModel(w=40, s=10, m=3, cores=8).step_ns(8) == 13
    # CPU-bound loading on 2 cores: 4 workers run no faster than 2
    assert StepModel(w=40, s=10, w_cpu=40, cores=2).step_ns(4) == 20
    # and the main thread's own CPU shares those cores
    assert StepModel(w=40, s=10, w_cpu=40, s_cpu=10, cores=2).step_ns(4) == 25
    # chosen with 10% headroom: 44/5 = 8.8 ms a batch against the 10 ms step (4 workers would only just keep pace)
    assert StepModel(w=40, s=10, cores=8).needed() == (5, 10, True)
    assert StepModel(w=1, s=100, cores=8).needed() == (0, 101, True)  # 1% wait: no worker needed
    n, t, reached = StepModel(w=40, s=10, w_cpu=40, cores=2).needed()
    assert (n, t, reached) == (2, 20, False)
    assert search_bound(40, 40, 2) == 2 and search_bound(40, 1, 2) == 8
    with pytest.raises(ValueError, match="n must be >= 0 workers, got -1"):
        StepModel(w=1, s=1).step_ns(-1)
    with pytest.raises(ValueError, match="cores must be >= 1, got 0"):
        LoaderProbe(cores=0)
    assert usable_cores() >= 1


def test_worker_bound_loading_names_the_count() -> None:
    """One worker, 40 ms a batch, a 10 ms step: it waits 30 ms; 4 workers bring it to the step's 10 ms."""
    source = FakeSource(1, batch_ms=40)
    probe = LoaderProbe(source, cores=2)
    end = drive(probe, source, steps=40, wait_ms=30, rest_ms=10, first_wait_ms=500)
    e = probe.last
    assert e is not None
    assert e.steps == 40 - 3  # the first workers + 2 steps left out
    assert e.wait_ns == pytest.approx(30 * MS) and e.step_ns == pytest.approx(10 * MS)
    assert e.main_ns == pytest.approx(0, abs=1)
    figures = probe.epoch_figures()
    assert set(figures) == {m.key for m in metrics.LOADER_METRICS}
    assert figures["fitprof/epoch/loader_workers"] == 1
    assert figures["fitprof/epoch/loader_batch_ms"] == pytest.approx(40)
    assert figures["fitprof/epoch/loader_busy_percent"] == pytest.approx(100 * 40 * 40 / (end / MS))
    assert figures["fitprof/epoch/loader_workers_needed"] == 5  # sleep-like loading: up to 4 x 2 cores
    assert figures["fitprof/epoch/step_time_if_enough_workers_ms"] == pytest.approx(10)
    assert probe.advice() == (
        "num_workers=5 would bring steps to about 10.0 ms (now 40.0 ms; workers busy 77%, 40.0 ms a batch)"
    )


def test_cpu_bound_loading_is_bounded_by_the_cores() -> None:
    source = FakeSource(1, batch_ms=40, cpu_ms=39)
    probe = LoaderProbe(source, cores=2)
    drive(probe, source, steps=40, wait_ms=30, rest_ms=10)
    figures = probe.epoch_figures()
    assert figures["fitprof/epoch/loader_workers_needed"] == 2
    assert figures["fitprof/epoch/step_time_if_enough_workers_ms"] == pytest.approx(20)
    advice = probe.advice()
    assert advice is not None
    assert advice.startswith("num_workers=2 would bring steps to about 20.0 ms")
    assert advice.endswith("only 2 cores: CPU-bound loading needs cheaper transforms or more cores")
    # already at the cores: only the cores message
    source2 = FakeSource(2, batch_ms=40, cpu_ms=39)
    probe2 = LoaderProbe(source2, cores=2)
    drive(probe2, source2, steps=40, wait_ms=10, rest_ms=10)
    assert probe2.epoch_figures()["fitprof/epoch/loader_workers_needed"] == 2
    assert (probe2.advice() or "").startswith("only 2 cores: CPU-bound loading needs cheaper transforms or more cores")


def test_an_epoch_whose_workers_wait_for_a_core_advises_no_count() -> None:
    """20 ms of CPU in a 60 ms batch, 35 ms of it waiting for a core (other processes load the machine): contended,
    no count and the advice says why; the same batch sleeping those 35 ms instead may use more workers."""
    waiting, sleeping = FakeSource(1, 60, cpu_ms=20, runq_ms=35), FakeSource(1, 60, cpu_ms=20)
    p1, p2 = LoaderProbe(waiting, cores=2), LoaderProbe(sleeping, cores=2)
    drive(p1, waiting, steps=40, wait_ms=50, rest_ms=10)
    drive(p2, sleeping, steps=40, wait_ms=50, rest_ms=10)
    assert p1.last is not None and p1.last.contended
    assert math.isnan(p1.epoch_figures()["fitprof/epoch/loader_workers_needed"])
    assert math.isnan(p1.epoch_figures()["fitprof/epoch/step_time_if_enough_workers_ms"])
    assert (p1.advice() or "").startswith(
        "the machine was busy: the loader's workers waited for a core 58% of their batch time (35.0 of 60.0 ms; "
        "input wait 83% of a 60.0 ms step), so no num_workers count is advised"
    )
    assert p2.epoch_figures()["fitprof/epoch/loader_workers_needed"] == 6  # 66/6 = 11 ms: no count does better
    assert "only 2 cores" not in (p2.advice() or "")


def test_cores_other_processes_hold_are_not_counted() -> None:
    """The same CPU-bound worker (20 ms of CPU in a 60 ms batch, 35 ms waiting for a core): with 2 idle cores it may
    use 2 workers; with none idle it has only the third of a core it used, and a second worker gains nothing."""
    results = {}
    for idle in (2.0, 0.0):
        source = FakeSource(1, 60, cpu_ms=20, runq_ms=35)
        probe = LoaderProbe(source, cores=2)
        drive(probe, source, steps=40, wait_ms=50, rest_ms=10, first_wait_ms=50, idle_cores=idle, t0=10**12)
        assert probe.last is not None
        results[idle] = probe.last
    roomy, full = results[2.0], results[0.0]
    # the 35 ms wait for a core is not the batch's own time: 25 ms of it, over 2 workers
    assert roomy.free_cores == pytest.approx(2.0) and roomy.predict(2) == pytest.approx(12.5 * MS)
    assert not roomy.contended and roomy.other_cores == pytest.approx(0.0, abs=0.01)
    assert full.free_cores == pytest.approx(20 * 40 / (40 * 60), rel=0.01)  # its own CPU time over the wall time
    assert full.predict(2) == pytest.approx(60 * MS, rel=0.01)  # W_cpu / F: 20 ms / (1/3 core)
    assert full.contended and full.other_cores == pytest.approx(2 - 1 / 3, rel=0.02)
    assert (full.advice() or "").startswith("the machine was busy: the loader's workers waited for a core 58%")
    assert "other processes holding 1.7 cores" in (full.advice() or "")
    # a worker that sleeps most of its batch gets its little CPU time on a full machine all the same
    sleeper = FakeSource(1, 60, cpu_ms=1, runq_ms=2)
    probe = LoaderProbe(sleeper, cores=2)
    drive(probe, sleeper, steps=40, wait_ms=50, rest_ms=10, first_wait_ms=50, idle_cores=0.0, t0=10**12)
    assert probe.last is not None and probe.last.free_cores is None and not probe.last.contended
    assert probe.last.predict(2) == pytest.approx(29 * MS)  # (60 - 2) ms of its own over 2 workers


def test_the_main_threads_cpu_time_counts_even_where_the_workers_hide_it() -> None:
    """One worker, 40 ms a batch, a 10 ms step: the 30 ms wait is all the workers' (M reads 0 from the wall clock),
    yet the main thread worked 3 ms of it (the framework's fetch path) and 8 ms of each step: that 3 ms stays with any
    number of workers, and the 8 ms of each step share the cores with the workers' CPU time."""
    source = FakeSource(1, batch_ms=40, cpu_ms=30)
    probe = LoaderProbe(source, cores=2)
    drive(probe, source, steps=40, wait_ms=30, rest_ms=10, cpu_ms=8, wait_cpu_ms=3)
    e = probe.last
    assert e is not None
    assert e.main_ns == pytest.approx(3 * MS) and e.step_cpu_ns == pytest.approx(8 * MS)
    assert e.predict(8) == pytest.approx(max(13, 30 / 2, (30 + 8) / 2) * MS)  # the 2 cores: 19 ms
    assert e.predict(1) == pytest.approx(40 * MS)
    without = LoaderProbe(FakeSource(1, batch_ms=40), cores=2)
    drive(without, without.source, steps=40, wait_ms=30, rest_ms=10)  # type: ignore[arg-type]
    assert without.last is not None and without.last.main_ns == pytest.approx(0, abs=1)
    assert without.last.predict(8) == pytest.approx(10 * MS)


def test_a_main_process_bottleneck_is_told_apart() -> None:
    """Four workers need 8 ms a batch each (2 ms per step between them) yet the loop waits 6 ms: not the workers."""
    source = FakeSource(4, batch_ms=8)
    probe = LoaderProbe(source, cores=2)
    drive(probe, source, steps=42, wait_ms=6, rest_ms=10)
    e = probe.last
    assert e is not None and e.main_ns == pytest.approx(6 * MS)
    figures = probe.epoch_figures()
    assert figures["fitprof/epoch/step_time_if_enough_workers_ms"] == pytest.approx(16)  # nothing to gain
    advice = probe.advice() or ""
    assert advice.startswith("the workers idle (")
    assert "while the loop waits 6.0 ms a step: the time is spent in the main process" in advice
    assert "more workers will not help" in advice


def test_a_loader_that_keeps_up() -> None:
    source = FakeSource(4, batch_ms=8)
    probe = LoaderProbe(source, cores=2)
    drive(probe, source, steps=42, wait_ms=0.1, rest_ms=10)
    figures = probe.epoch_figures()
    assert figures["fitprof/epoch/loader_workers_needed"] == 1  # 8 ms a batch under a 10 ms step
    assert (probe.advice() or "").startswith("the loader keeps up (input wait 1% of a 10.1 ms step, workers busy")
    assert (probe.advice() or "").endswith("num_workers=1 would do")
    assert figures["fitprof/epoch/loader_workers_needed"] < 4 and WAIT_TARGET == 0.05


def test_no_workers_the_main_process_loads() -> None:
    """With num_workers=0 the wait is the loading: W is the wait, and workers would take it off the step."""
    source = FakeSource(0, batch_ms=0)
    probe = LoaderProbe(source, cores=2)
    end = drive(probe, source, steps=30, wait_ms=20, rest_ms=10)
    figures = probe.epoch_figures()
    assert figures["fitprof/epoch/loader_workers"] == 0
    assert figures["fitprof/epoch/loader_batch_ms"] == pytest.approx(20)
    assert figures["fitprof/epoch/loader_busy_percent"] == pytest.approx(100 * 29 * 20 / (end / MS))
    assert figures["fitprof/epoch/loader_workers_needed"] == 3  # 22/3 ms a batch with headroom, under 10 ms
    assert figures["fitprof/epoch/step_time_if_enough_workers_ms"] == pytest.approx(10)
    assert (probe.advice() or "").startswith("num_workers=3 would bring steps to about 10.0 ms (now 30.0 ms; loading")


def test_without_step_end_the_fetch_wait_splits_the_step() -> None:
    """Keras calls no step_end: the period between two step starts is split with the fetch timer's wait."""
    a, b = FakeSource(1, batch_ms=40), FakeSource(1, batch_ms=40)
    with_end, without = LoaderProbe(a, cores=2), LoaderProbe(b, cores=2)
    drive(with_end, a, steps=40, wait_ms=30, rest_ms=10)
    drive(without, b, steps=40, wait_ms=30, rest_ms=10, step_end=False)
    assert without.last is not None and with_end.last is not None
    assert without.last.wait_ns == pytest.approx(30 * MS) and without.last.step_ns == pytest.approx(10 * MS)
    assert without.epoch_figures() == pytest.approx(with_end.epoch_figures(), rel=0.02)


def test_epochs_count_their_own_batches_and_steady_steps() -> None:
    source = FakeSource(2, batch_ms=30)
    probe = LoaderProbe(source, cores=2)
    t = drive(probe, source, steps=40, wait_ms=5, rest_ms=10)
    source.batch_ms = 60  # the counters are cumulative: the second epoch's W comes from its own batches
    drive(probe, source, steps=40, wait_ms=20, rest_ms=10, epoch=1, t0=t)
    e = probe.last
    assert e is not None
    assert e.batch_ns == pytest.approx(60 * MS)
    assert e.steps == 36  # 40 - (2 + 2), a whole number of bursts of 2
    # a validation run in the middle: the wait across it is left out
    probe.epoch_start(2, now_ns=0)
    probe.step_start(1, None, now_ns=1 * MS)
    probe.step_end(1, None, now_ns=2 * MS)
    probe.validation_start(now_ns=2 * MS)
    probe.step_start(2, None, now_ns=900 * MS)
    probe.step_end(2, None, now_ns=901 * MS)
    probe.epoch_end(2, now_ns=902 * MS)
    assert probe.last is None
    assert all(math.isnan(v) for v in probe.epoch_figures().values())


def test_no_source_gives_nan_and_no_advice() -> None:
    probe = LoaderProbe(cores=2)
    drive(probe, None, steps=20, wait_ms=5, rest_ms=10)
    assert probe.advice() is None
    assert set(probe.epoch_figures()) == {m.key for m in metrics.LOADER_METRICS}
    assert all(math.isnan(v) for v in probe.epoch_figures().values())


def test_counters_of_a_restarted_worker_count_from_zero() -> None:
    before = LoaderCounters((100, 50), (10, 5), (4, 2))
    after = LoaderCounters((130, 20), (12, 2), (5, 1))  # worker 1 restarted: its counter went down
    assert after.minus(before) == LoaderCounters((30, 20), (2, 2), (1, 1))


class FakeTiming(FakeSource):
    """One loader's timing (:class:`fitprof.profilers.loader.DataLoaderTiming`'s face): planted counters."""

    def __init__(self, loader: str, workers: int, batch_ms: float) -> None:
        super().__init__(workers, batch_ms)
        self.loader, self.detached = loader, False

    def detach(self) -> None:
        self.detached = True


class EachStep:
    """Several loaders, one batch from each a step (Lightning's ``CombinedLoader``, mode ``max_size_cycle``)."""

    def __init__(self, *timings: FakeTiming) -> None:
        self.timings = timings

    def produce(self, batches: int) -> None:
        for t in self.timings:
            t.produce(batches)


def test_several_loaders_combine_into_one_step() -> None:
    """Two loaders (1 worker of 40 ms a batch, 1 of 20 ms) feed each step one batch each: the workers are summed,
    the batch time is per combined step (60 ms), the busy share is over both workers; taking turns (``sequential``)
    the batch time is per batch. A loader no longer wanted is detached when its replacement is added."""
    old, a, b = FakeTiming("old", 1, 40), FakeTiming("a", 1, 40), FakeTiming("b", 1, 20)
    loaders = LoaderSet()
    loaders.add(old)
    loaders.add(a, lambda loader: loader != "old")
    assert old.detached and not a.detached and loaders.timings == [a]
    loaders.add(b, lambda loader: loader in ("a", "b"))
    assert loaders.workers == 2 and loaders.batches_per_step == 2
    probe = LoaderProbe(loaders, cores=2)
    end = drive(probe, EachStep(a, b), steps=40, wait_ms=30, rest_ms=10)  # type: ignore[arg-type]
    figures = probe.epoch_figures()
    assert figures["fitprof/epoch/loader_workers"] == 2
    assert figures["fitprof/epoch/loader_batch_ms"] == pytest.approx(60)
    assert figures["fitprof/epoch/loader_busy_percent"] == pytest.approx(100 * 40 * 60 / (2 * end / MS))
    turns = LoaderSet(sequential=lambda: True)
    c, d = FakeTiming("c", 1, 40), FakeTiming("d", 1, 20)
    turns.add(c)
    turns.add(d)
    assert turns.batches_per_step == 1
    probe = LoaderProbe(turns, cores=2)
    drive(probe, EachStep(c, d), steps=40, wait_ms=30, rest_ms=10)  # type: ignore[arg-type]
    assert probe.epoch_figures()["fitprof/epoch/loader_batch_ms"] == pytest.approx(30)
    loaders.detach()
    assert a.detached and b.detached and loaders.workers == 0 and loaders.read() is None


def test_the_count_does_not_depend_on_the_worker_count_it_started_from() -> None:
    """The same sleep-modelled loader (96 ms of its own a batch, 3 ms of CPU) on a 4-core machine others load: from
    1 worker it waited 2 ms a batch for a core, from 3 workers 22 ms (more workers, more waiting). Taken out of the
    batch time, both runs advise the same count and predict the same step."""
    runs = {}
    for workers, runq in ((1, 2.0), (3, 22.0)):
        source = FakeSource(workers, 96 + runq, cpu_ms=3, runq_ms=runq)
        probe = LoaderProbe(source, cores=4)
        drive(probe, source, steps=60, wait_ms=(96 + runq) / workers - 10, rest_ms=10)
        assert probe.last is not None and not probe.last.contended  # 2% and 19% of the batch: under CONTENDED
        runs[workers] = probe.last
    assert abs(runs[1].needed - runs[3].needed) <= 1
    assert runs[1].needed == runs[3].needed == 11  # 96 ms * 1.1 / 11 = 9.6 ms, under the 10 ms step
    assert runs[1].predicted_ns == pytest.approx(runs[3].predicted_ns, rel=0.01)


def test_step_time_without_workers_is_bounded_by_the_cores() -> None:
    """No workers: the main thread loads and steps on one core at most, and only on the share of it free to it."""
    assert StepModel(w=40, s=10, w_cpu=40, s_cpu=10, cores=2).step_ns(0) == 50
    assert StepModel(w=40, s=10, w_cpu=40, s_cpu=10, cores=2, free=0.5).step_ns(0) == 100  # 50 ms of CPU, half a core
    assert StepModel(w=40, s=10, w_cpu=1, s_cpu=1, cores=2, free=0.5).step_ns(0) == 50  # sleeping loading: S + W


def test_the_wait_for_a_core_is_not_loading_time() -> None:
    """A 60 ms batch of which the worker stood 35 ms waiting for a core: 25 ms of loading, 20 of it CPU."""
    model = StepModel(w=60, s=10, w_cpu=20, w_runq=35, cores=8)
    assert model.own_ns == 25
    assert model.step_ns(1) == 25 and model.step_ns(2) == 12.5 and model.step_ns(0) == 35
    assert model.needed() == (3, 10, True)  # 25 * 1.1 / 3 = 9.2 ms: under the step; the CPU-bound bound is 8 cores
    assert StepModel(w=60, s=10, w_cpu=20, w_runq=70, cores=8).own_ns == 20  # never below the CPU time


def test_the_process_own_threads_are_not_other_processes() -> None:
    """The same CPU-bound worker on a full machine, but this process's own threads (an intra-op pool) used 1.2 of
    the 2 cores (the process clock): other processes held only what is left, 0.47 cores, under CONTENDED_CORES,
    so the epoch is not called contended by other processes and a count is advised; without the process clock
    (the main thread's CPU time standing for the process) the pool counted as other processes."""
    results = {}
    for clock in (False, True):
        source = FakeSource(1, 60, cpu_ms=20, runq_ms=35)
        readings = iter([0, int(1.2 * 40 * 60 * MS)])  # epoch start, end: 1.2 cores over the 2.4 s epoch
        probe = LoaderProbe(source, cores=2, process_clock=readings.__next__ if clock else None)
        drive(probe, source, steps=40, wait_ms=50, rest_ms=10, first_wait_ms=50, idle_cores=0.0, t0=10**12)
        assert probe.last is not None
        results[clock] = probe.last
    assert results[False].other_cores == pytest.approx(2 - 1 / 3, rel=0.02) and results[False].contended
    assert results[True].other_cores == pytest.approx(2 - 1 / 3 - 1.2, rel=0.02) and not results[True].contended

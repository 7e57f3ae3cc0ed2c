"""The epoch's wall time split into parts (fitprof.fit.epoch_parts): planted events on a fake clock, no framework."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from engine_fakes import Rig
from fitprof import metrics
from fitprof.fit import epoch_parts as ep
from fitprof.fit.epoch_parts import (
    CALLBACKS,
    CHECKPOINT,
    PROFILING,
    EpochParts,
    contention_verdict,
    lightning_hook_part,
    part_verdicts,
)
from fitprof.fit.loader import LoaderProbe
from fitprof.fit.voice import gist
from fitprof.profilers.counters import LoaderCounters

MS = 1_000_000


class Clock:
    """A fake ``perf_counter_ns``: ``advance`` moves it; each event reads it."""

    def __init__(self) -> None:
        self.t = 1_000 * MS

    def __call__(self) -> int:
        return self.t

    def advance(self, ms: float) -> None:
        self.t += int(ms * MS)


class Usage:
    """Planted ``getrusage`` and schedstat readings."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.switches = 0
        self.wait_ns: int | None = 0
        self.thread_ns: int | None = None  # the training thread's CPU time (None: not measured, not Linux)
        self.idle_ns: int | None = None  # the cores' idle time
        self.workers_ns: tuple[int, ...] | None = None  # the loader workers' CPU time

    def rusage(self) -> tuple[float, int]:
        return self.cpu_s, self.switches

    def schedstat(self) -> int | None:
        return self.wait_ns

    def thread_cpu(self) -> int | None:
        return self.thread_ns

    def idle(self) -> int | None:
        return self.idle_ns

    def worker_cpu(self) -> tuple[int, ...] | None:
        return self.workers_ns


def make(framework: str = "lightning") -> tuple[EpochParts, Clock, Usage]:
    clock, usage = Clock(), Usage()
    probe = EpochParts(
        framework,
        clock=clock,
        rusage=usage.rusage,
        schedstat=usage.schedstat,
        cores=2,
        load=lambda: 5.5,
        thread_cpu=usage.thread_cpu,
        idle=usage.idle,
        worker_cpu=usage.worker_cpu,
    )
    probe.fit_start()
    return probe, clock, usage


def run_epoch(probe: EpochParts, clock: Clock, epoch: int = 0, *, steps: int = 10) -> dict[str, float]:
    """One epoch with every part planted; returns the truths (s)."""
    truth = dict.fromkeys(
        ("train_steps", "input", "validation", "checkpoint", "callbacks", "startup", "profiling"), 0.0
    )
    truth["other"] = 0.0
    probe.epoch_start(epoch)
    clock.advance(120)  # workers spawn, first fetch
    truth["startup"] += 0.120
    for n in range(1, steps + 1):
        if n > 1:
            clock.advance(5)  # the fetch of this step
            probe.input_wait(4 * MS)
            truth["train_steps"] += 0.005
            truth["input"] += 0.004
        probe.step_start(n)
        clock.advance(20)
        truth["train_steps"] += 0.020
        probe.enter(PROFILING, "FitProfiler")  # fitprof's own batch-end hook holds the step end
        clock.advance(0.5)
        probe.step_end(n)
        clock.advance(0.5)
        probe.leave()
        truth["profiling"] += 0.001
        probe.enter(CALLBACKS, "Sleepy")
        clock.advance(3)
        probe.leave()
        truth["callbacks"] += 0.003
        if n == 5:
            clock.advance(2)  # the loop between the step and validation
            truth["other"] += 0.002
            probe.validation_start()
            clock.advance(40)
            probe.enter(CALLBACKS, "Sleepy")  # a callback's validation hook
            clock.advance(2)
            probe.leave()
            truth["validation"] += 0.040
            truth["callbacks"] += 0.002
            probe.validation_end()
        if n == 7:
            probe.checkpoint_start()
            clock.advance(25)
            probe.enter(CALLBACKS, "Sleepy")  # on_save_checkpoint inside the save: the save's time
            clock.advance(5)
            probe.leave()
            probe.checkpoint_end()
            truth["checkpoint"] += 0.030
    clock.advance(7)  # the loop after the last step
    truth["other"] += 0.007
    probe.enter(PROFILING, "FitProfiler")
    probe.epoch_end(epoch)
    return truth


def test_parts_equal_planted_truths_and_add_up_exactly() -> None:
    probe, clock, _ = make()
    truth = run_epoch(probe, clock)
    r = probe.results[0]
    for part in (*ep.PARTS, "input"):
        assert getattr(r, part + "_s") == pytest.approx(truth[part], abs=1e-9), part
    parts = [r.part_s(i) for i in range(len(ep.PARTS))]
    assert sum(parts) == pytest.approx(r.wall_s, abs=1e-12)
    assert r.wall_s == pytest.approx(sum(v for k, v in truth.items() if k != "input"), abs=1e-9)
    assert r.steps == 10 and r.window_steps == 0
    assert r.callback_s == {"Sleepy": pytest.approx(0.032)}  # its 30 ms in hooks plus 2 in the save, as it ran


def test_time_after_the_end_hook_belongs_to_the_epoch_until_its_close() -> None:
    """A save in a hook after fitprof's epoch-end hook (Lightning's ModelCheckpoint) is the epoch's own: the end
    hook gives the parts so far, the close (here the next epoch's start) the final ones; the next epoch starts
    there."""
    probe, clock, _ = make()
    truth0 = run_epoch(probe, clock, 0)  # ends inside fitprof's own epoch-end hook
    so_far = probe.results[0]
    assert probe.pending == 0
    assert so_far.checkpoint_s == pytest.approx(truth0["checkpoint"])
    assert probe.epoch_figures()[metrics.EPOCH_CHECKPOINT_S.key] == pytest.approx(so_far.checkpoint_s)
    clock.advance(300)  # fitprof's analysis after the epoch's end stamp
    probe.leave()
    probe.enter(CHECKPOINT, "ModelCheckpoint")  # Lightning runs ModelCheckpoint's epoch-end hook after fitprof's
    clock.advance(500)
    probe.leave()
    clock.advance(10)
    truth = run_epoch(probe, clock, 1)  # its epoch start closes epoch 0
    r0, r1 = probe.results[0], probe.results[1]
    assert r0.profiling_s == pytest.approx(truth0["profiling"] + 0.300)
    assert r0.checkpoint_s == pytest.approx(truth0["checkpoint"] + 0.500)
    assert r0.other_s == pytest.approx(truth0["other"] + 0.010)
    assert r0.wall_s == pytest.approx(so_far.wall_s + 0.810)
    assert sum(r0.part_s(i) for i in range(len(ep.PARTS))) == pytest.approx(r0.wall_s, abs=1e-12)
    for part in ("profiling", "checkpoint", "other", "startup"):
        assert getattr(r1, part + "_s") == pytest.approx(truth[part]), part
    assert probe.pending == 1 and probe.close() is probe.results[1] and probe.pending is None
    assert probe.close() is None  # nothing waits


def test_the_last_epoch_closes_at_the_fit_end_and_its_save_is_in_it() -> None:
    probe, clock, _ = make()
    run_epoch(probe, clock, 0)
    probe.leave()  # fitprof's epoch-end hook returns
    probe.close()
    truth = run_epoch(probe, clock, 1)
    probe.leave()
    probe.enter(CHECKPOINT, "ModelCheckpoint")
    clock.advance(400)
    probe.leave()
    clock.advance(20)
    probe.fit_end()
    r1 = probe.results[1]
    assert r1.checkpoint_s == pytest.approx(truth["checkpoint"] + 0.400)
    fit = probe.fit_seconds
    assert fit["teardown"] == pytest.approx(0.0)
    assert fit["epochs"] == pytest.approx(probe.results[0].wall_s + r1.wall_s)
    assert fit["checkpoint"] == pytest.approx(probe.results[0].checkpoint_s + r1.checkpoint_s)


def test_window_extra_cost_moves_to_profiling() -> None:
    probe, clock, _ = make()
    probe.epoch_start(0)
    for n in range(1, 21):
        windowed = 8 <= n <= 11
        if n == 8:
            probe.window_start()
        probe.step_start(n)
        clock.advance(30 if windowed else 10)  # the profiler triples these steps
        probe.step_end(n)
        if n == 11:
            probe.window_end()
    probe.epoch_end(0)
    r = probe.results[0]
    assert r.window_steps == 4
    assert r.profiling_s == pytest.approx(4 * 0.020)
    assert r.train_steps_s == pytest.approx(20 * 0.010)


def test_keras_start_up_advice_fits_what_the_fit_is_fed() -> None:
    """A 0.5 s first batch in a 1 s epoch: the sentence's advice names the knob of the input the fit uses."""
    probe, clock, _ = make("keras")
    probe.epoch_start(1)
    clock.advance(500)  # the iterator built, the first batch produced
    for n in range(1, 11):
        probe.step_start(n)
        clock.advance(50)
        probe.step_end(n)
    probe.epoch_end(1)
    result = probe.results[1]
    said = {feed: part_verdicts(result, "keras", feed=feed)[0] for feed in (*ep.FEEDS, "")}
    head = "the epoch's start-up (first batch) took 50% of epoch 1 (0.50 s of 1.00 s): "
    assert all(line.startswith(head) for line in said.values()), said
    assert "persistent_workers=True" in said["DataLoader"] and "tf.data" not in said["DataLoader"]
    assert "shuffle(buffer_size)" in said["tf.data"] and "DataLoader" not in said["tf.data"]
    assert "PyDataset's workers" in said["PyDataset"] and "DataLoader" not in said["PyDataset"]
    # fed NumPy arrays there is no loader setting to change: stated, not advised
    assert "no setting of the input to change" in said["arrays"]
    assert not any(word in said["arrays"] for word in ("DataLoader", "tf.data", "persistent_workers"))
    assert "persistent_workers=True" in said[""] and "tf.data" in said[""]  # unknown: both frameworks' knobs
    probe.feed = "tf.data"
    assert probe.verdicts(1) == [said["tf.data"]]  # the probe's own verdicts use the feed the adapter set
    # Lightning is always fed a DataLoader
    assert "persistent_workers=True" in part_verdicts(result, "lightning", feed="arrays")[0]


def _own_share_epoch(step_ms: float, window_cost_ms: float) -> list[str]:
    """The verdicts of a 20-step epoch of ``step_ms`` steps whose fitprof hook costs ``window_cost_ms`` once."""
    probe, clock, _ = make("keras")
    probe.epoch_start(0)
    for n in range(1, 21):
        probe.step_start(n)
        clock.advance(step_ms)
        probe.step_end(n)
    probe.enter(PROFILING, "FitProfiler")  # the window's export and analysis at the epoch's end
    clock.advance(window_cost_ms)
    probe.leave()
    probe.epoch_end(0)
    return probe.verdicts()


def test_fitprofs_own_share_is_a_fact_on_a_short_epoch_and_advice_only_on_a_long_one() -> None:
    # a quickstart-sized epoch: 20 steps of 10 ms, a window costing 0.1 s (a third of the epoch)
    (short,) = _own_share_epoch(10, 100)
    assert short == (
        "fitprof's own profiling took 33% of epoch 0 (0.10 s of 0.30 s, 20 steps): a cost per profiled window, "
        "not per step, so its share falls as epochs get longer"
    )
    assert "profile fewer" not in short and "profile_batch" not in short
    # a long epoch (20 steps of 1.6 s: 32 s) whose window still takes 4 s, 11%: told to profile less
    (long_,) = _own_share_epoch(1600, 4000)
    assert long_.startswith("fitprof's own profiling took 11% of epoch 0, a long one (4.00 s of 36.00 s): ")
    assert long_.endswith("profile fewer steps or epochs (profile_batch=..., every_n_epochs=...)")
    # the fact and the advice are two sentences: a fit that stated the fact is still told when a long epoch needs it
    assert gist(short) != gist(long_)
    # just under the long-epoch bound: still the fact
    assert ep.PROFILING_LONG_EPOCH_S == 30.0
    (under,) = _own_share_epoch(1300, 3000)  # 29 s
    assert "falls as epochs get longer" in under
    assert _own_share_epoch(10, 15) == []  # under 10% of the epoch: not named at all


def test_no_input_measured_is_nan_and_first_fetch_is_startup() -> None:
    probe, clock, _ = make()
    probe.epoch_start(0)
    clock.advance(50)
    probe.step_start(1)
    clock.advance(10)
    probe.step_end(1)
    probe.epoch_end(0)
    assert math.isnan(probe.results[0].input_s)
    probe.epoch_start(1)
    probe.input_wait(40 * MS)  # the first step's fetch: start-up already
    probe.step_start(1)
    probe.step_end(1)
    probe.epoch_end(1)
    assert probe.results[1].input_s == 0.0


def test_the_first_steps_fetch_is_not_input_wait_when_the_steps_take_time() -> None:
    """Steps of 100 ms each, so that no clamp to the steps' time can hide a first fetch counted as input: only the
    second step's 5 ms wait is input."""
    probe, clock, _ = make()
    probe.epoch_start(0)
    probe.input_wait(40 * MS)  # the first step's fetch (workers starting): start-up
    probe.step_start(1)
    clock.advance(100)
    probe.step_end(1)
    probe.input_wait(5 * MS)
    probe.step_start(2)
    clock.advance(100)
    probe.step_end(2)
    probe.epoch_end(0)
    r = probe.results[0]
    assert r.train_steps_s == pytest.approx(0.2)
    assert r.input_s == pytest.approx(0.005)


def test_random_event_orders_always_add_up() -> None:
    rng = random.Random(7)
    for _ in range(200):
        probe, clock, _ = make()
        probe.epoch_start(0)
        depth = 0
        for _ in range(rng.randint(1, 60)):
            clock.advance(rng.random() * 10)
            pick = rng.randrange(9)
            if pick == 0:
                probe.step_start()
            elif pick == 1:
                probe.step_end()
            elif pick == 2:
                probe.enter(rng.choice((CALLBACKS, CHECKPOINT, PROFILING)), "cb")
                depth += 1
            elif pick == 3 and depth:
                probe.leave()
                depth -= 1
            elif pick == 4:
                probe.validation_start()
            elif pick == 5:
                probe.validation_end()
            elif pick == 6:
                probe.window_start()
            elif pick == 7:
                probe.window_end()
            else:
                probe.input_wait(int(rng.random() * 5 * MS))
        clock.advance(1)
        r = probe.epoch_end(0)
        assert r is not None
        assert sum(r.part_s(i) for i in range(len(ep.PARTS))) == pytest.approx(r.wall_s, rel=1e-12, abs=1e-12)
        assert r.wall_s > 0 and min(r.part_s(i) for i in range(len(ep.PARTS))) >= 0
        assert not r.input_s > r.train_steps_s


def test_nothing_counted_outside_a_fit() -> None:
    probe, clock, _ = make()
    probe.step_start(1)
    probe.step_end(1)
    assert probe.epoch_end(0) is None
    run_epoch(probe, clock)
    probe.fit_end()
    clock.advance(1000)
    assert probe.epoch_end(1) is None
    probe.fit_start()
    assert probe.results == {}
    figures = probe.epoch_figures()  # the same keys every epoch, NaN for an epoch not counted
    assert set(figures) == {m.key for m in metrics.EPOCH_PARTS_METRICS} and all(map(math.isnan, figures.values()))


def test_exception_drops_the_unfinished_epoch() -> None:
    probe, clock, _ = make()
    probe.epoch_start(0)
    probe.step_start(1)
    clock.advance(10)
    probe.exception(RuntimeError("boom"))
    assert probe.epoch_end(0) is None and probe.results == {}


def test_checkpoint_verdict_names_numbers_and_the_framework_fix() -> None:
    for framework, fix in (("lightning", "AsyncCheckpointIO"), ("keras", "save_freq")):
        probe, clock, _ = make(framework)
        probe.epoch_start(2)
        for n in range(1, 11):
            probe.step_start(n)
            clock.advance(60)
            probe.step_end(n)
        probe.checkpoint_start()
        clock.advance(410)
        probe.checkpoint_end()
        probe.epoch_end(2)
        lines = probe.verdicts()
        assert len(lines) == 1
        assert lines[0].startswith("checkpointing took 41% of epoch 2 (0.41 s of 1.01 s): ")
        assert fix in lines[0]


def test_part_below_the_threshold_is_not_named_and_slow_callback_is() -> None:
    probe, clock, _ = make()
    probe.epoch_start(0)
    for n in range(1, 11):
        probe.step_start(n)
        clock.advance(10)
        probe.step_end(n)
        probe.enter(CALLBACKS, "Cheap")
        clock.advance(0.5)
        probe.leave()
        probe.enter(CALLBACKS, "Sleepy")
        clock.advance(2)
        probe.leave()
    probe.validation_start()
    clock.advance(9)  # 6.7% of the epoch
    probe.validation_end()
    probe.epoch_end(0)
    r = probe.results[0]
    lines = part_verdicts(r, "lightning")
    assert len(lines) == 1 and lines[0].startswith("callback hooks took 19% of epoch 0")
    assert "the slowest is Sleepy (0.02 s in its hooks)" in lines[0]
    assert part_verdicts(r, "lightning", percent=5.0)[1].startswith("validation took 7%")


def test_contention_from_run_queue_wait() -> None:
    probe, clock, usage = make("keras")
    probe.threads, probe.workers = 8, 2
    probe.epoch_start(0)
    probe.step_start(1)
    clock.advance(1000)
    usage.cpu_s, usage.switches, usage.wait_ns = 0.6, 1700, 560 * MS
    probe.step_end(1)
    probe.epoch_end(0)
    r = probe.results[0]
    assert r.run_wait_percent == pytest.approx(56.0)
    assert r.cpu_percent == pytest.approx(60.0)
    assert r.involuntary_switches_per_s == pytest.approx(1700.0)
    line = contention_verdict(r, "keras")
    assert line is not None and line.startswith("CPU-contended: the training thread waited for a core 56% of epoch 0")
    assert "8 intra-op threads + 2 loader workers" in line
    assert "this process runs more threads and workers than the 2 cores" in line
    assert "OMP_NUM_THREADS" in line and "compute-bound" not in line
    assert probe.verdicts()[-1] == line


def test_no_contention_below_the_threshold_and_the_fallback_rule() -> None:
    probe, clock, usage = make()
    probe.epoch_start(0)
    clock.advance(1000)
    usage.cpu_s, usage.switches, usage.wait_ns = 0.9, 5000, 150 * MS  # 15% waiting: not contended
    probe.epoch_end(0)
    assert contention_verdict(probe.results[0], "lightning") is None
    # Without schedstat: involuntary switches per CPU second decide.
    usage.wait_ns = None
    probe.epoch_start(1)
    clock.advance(1000)
    usage.cpu_s, usage.switches = 1.9, 10000  # 5000 more over 1 CPU s
    probe.epoch_end(1)
    r = probe.results[1]
    assert math.isnan(r.run_wait_percent)
    line = contention_verdict(r, "lightning")
    assert line is not None and "5,000 involuntary context switches per CPU second" in line
    assert "load average 5.5" in line and "other processes hold the cores" in line and "run fewer processes" in line
    usage.switches += 300  # 300 per CPU s: not contended
    usage.cpu_s += 1.0
    probe.epoch_start(2)
    clock.advance(1000)
    probe.epoch_end(2)
    assert contention_verdict(probe.results[2], "lightning") is None


def test_scalars_are_the_metrics_keys() -> None:
    probe, clock, _ = make()
    run_epoch(probe, clock)
    figures = probe.epoch_figures()
    assert set(figures) == {m.key for m in metrics.EPOCH_PARTS_METRICS}
    assert all(k.startswith(metrics.EPOCH_PREFIX) for k in figures)
    assert figures[metrics.EPOCH_WALL_S.key] == pytest.approx(probe.results[0].wall_s)
    assert all(m in metrics.ALL for m in metrics.EPOCH_PARTS_METRICS)


def test_framework_is_checked() -> None:
    with pytest.raises(ValueError, match="framework must be 'keras' or 'lightning', got 'jax'"):
        EpochParts("jax")


def test_lightning_hook_names() -> None:
    assert lightning_hook_part("[Callback]ModelCheckpoint{'monitor': None, 'mode': 'min'}.on_train_batch_end") == (
        CHECKPOINT,
        "ModelCheckpoint",
    )
    assert lightning_hook_part("[Callback]FitProfiler.on_train_batch_end") == (PROFILING, "FitProfiler")
    assert lightning_hook_part("[Callback]Sleepy.on_validation_batch_end") == (CALLBACKS, "Sleepy")
    assert lightning_hook_part("[Callback]EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}.on_validation_end") == (
        CALLBACKS,
        "EarlyStopping",
    )
    assert lightning_hook_part("[Callback]run.<locals>.Sleepy.on_train_batch_end") == (CALLBACKS, "Sleepy")
    assert lightning_hook_part("[LightningModule]Model.on_train_batch_end") is None
    assert lightning_hook_part("[_TrainingEpochLoop].train_dataloader_next") is None


def test_real_clock_and_getrusage_work_here() -> None:
    probe = EpochParts("keras")
    probe.fit_start()
    probe.epoch_start(0)
    probe.step_start(1)
    sum(i * i for i in range(200_000))
    probe.step_end(1)
    r = probe.epoch_end(0)
    assert r is not None and r.wall_s > 0 and r.cpu.cpu_s >= 0 and r.cpu.cores >= 1


def test_keras_steps_end_at_the_next_step_start() -> None:
    """Keras sends no step end: a step runs from its batch begin to the next one (or to validation, the epoch's
    end); the hooks of other callbacks in between are theirs."""
    probe, clock, _ = make("keras")
    probe.epoch_start(0)
    clock.advance(80)
    for n in range(1, 6):
        probe.step_start(n)
        clock.advance(12)  # the train function
        probe.enter(CHECKPOINT, "ModelCheckpoint")  # its on_train_batch_end saves every second step
        clock.advance(30 if n % 2 == 0 else 0.1)
        probe.leave()
        clock.advance(3)  # the next fetch
    probe.validation_start()
    clock.advance(50)
    probe.validation_end()
    probe.enter(PROFILING, "FitProfiler")  # the epoch end arrives inside fitprof's own on_epoch_end
    clock.advance(1)
    r = probe.epoch_end(0)
    assert r is not None and r.steps == 5
    assert r.startup_s == pytest.approx(0.080)
    assert r.train_steps_s == pytest.approx(5 * 0.015)
    assert r.checkpoint_s == pytest.approx(0.060 + 3 * 0.0001)
    assert r.validation_s == pytest.approx(0.050)
    assert r.profiling_s == pytest.approx(0.001)
    assert r.other_s == 0.0


def contended_epoch(*, cpu_s: float, thread_s: float, idle_s: float | None, workers_s: float = 0.0) -> ep.EpochWall:
    """One 1-second epoch whose training thread waited 43% of it, with the CPU times planted (s)."""
    probe, clock, usage = make("keras")
    probe.threads, probe.workers = 2, 2 if workers_s else 0
    usage.thread_ns, usage.idle_ns = 0, None if idle_s is None else 0
    usage.workers_ns = (0, 0) if workers_s else None
    probe.epoch_start(0)
    probe.step_start(1)
    clock.advance(1000)
    usage.cpu_s, usage.switches, usage.wait_ns = cpu_s, 900, 430 * MS
    usage.thread_ns = int(thread_s * 1e9)
    usage.idle_ns = None if idle_s is None else int(idle_s * 1e9)
    if workers_s:
        usage.workers_ns = (int(workers_s * 0.6e9), int(workers_s * 0.4e9))
    probe.epoch_end(0)
    return probe.results[0]


def test_contention_by_the_process_own_threads_says_so() -> None:
    """The README's case: 2 cores, nothing else running, the intra-op pool's other thread and Keras's threads busy
    beside the training thread: its wait is the process's own doing, and the advice is to leave it a core."""
    r = contended_epoch(cpu_s=1.5, thread_s=0.55, idle_s=0.4)
    assert r.own_threads_s == pytest.approx(0.95)
    assert r.scalars()[metrics.EPOCH_OWN_THREADS_CPU_PERCENT.key] == pytest.approx(95.0)
    assert r.other_cores == pytest.approx(0.1)
    line = contention_verdict(r, "keras")
    assert line is not None and line.startswith("CPU-contended: the training thread waited for a core 43% of epoch 0")
    assert "; this process's own threads used 0.9 of the 2 cores (other processes held 0.1 of the 2 cores)" in line
    assert "other processes hold" not in line and "run fewer processes" not in line
    assert line.endswith(ep.OWN_FIX["keras"].format(k=1)) and "torch.set_num_threads(1)" in line
    assert gist(line) == "CPU-contended"  # still one verdict kind a fit
    # the loader workers are the fit's own too: counted beside the threads, and out of the other processes' share
    w = contended_epoch(cpu_s=1.0, thread_s=0.5, idle_s=0.2, workers_s=0.5)
    assert w.cpu.workers_cpu_s == pytest.approx(0.5) and w.other_cores == pytest.approx(0.3)
    wline = contention_verdict(w, "lightning")
    assert wline is not None
    assert "this process's own threads used 0.5 of the 2 cores and its 2 loader workers 0.5 (other processes" in wline
    assert "torch.set_num_threads(1)" in wline and "num_workers" in wline


def test_contention_by_other_processes_says_so() -> None:
    r = contended_epoch(cpu_s=0.5, thread_s=0.48, idle_s=0.0)
    assert r.own_threads_cpu_percent == pytest.approx(2.0)
    assert r.other_cores == pytest.approx(1.5)
    line = contention_verdict(r, "lightning")
    assert line is not None
    assert "; other processes held 1.5 of the 2 cores (this process's own threads used 0.0 of the 2 cores)" in line
    assert line.endswith("run fewer processes on this machine (or move to a quieter one)")
    # other processes held more, but the own threads a fifth of a core or more: their fix is worth giving too
    both = contended_epoch(cpu_s=1.0, thread_s=0.7, idle_s=0.0)
    bline = contention_verdict(both, "keras")
    assert bline is not None
    assert "; other processes held 1.0 of the 2 cores (this process's own threads used 0.3 of the 2 cores)" in bline
    assert bline.endswith(
        "run fewer processes on this machine (or move to a quieter one); within this one, "
        + ep.OWN_FIX["keras"].format(k=1)
    )
    # without the idle time: the own threads are the cause only when they used half of what the thread left
    quiet = contended_epoch(cpu_s=0.5, thread_s=0.48, idle_s=None)
    assert math.isnan(quiet.other_cores)
    assert "; other processes hold the cores (this process's own threads used 0.0" in str(
        contention_verdict(quiet, "keras")
    )
    busy = contended_epoch(cpu_s=1.3, thread_s=0.5, idle_s=None)  # 0.8 of the 1.5 cores left
    assert "; this process's own threads used 0.8 of the 2 cores, so step" in str(contention_verdict(busy, "keras"))


def test_own_threads_unknown_without_the_thread_cpu_time() -> None:
    """Not Linux: no training thread CPU time, the figure is NaN and the cause is the old rule's, no measured claim."""
    probe, clock, _ = make()
    run_epoch(probe, clock)
    r = probe.results[0]
    assert math.isnan(r.own_threads_cpu_percent) and math.isnan(r.cpu.thread_cpu_s)
    assert math.isnan(probe.epoch_figures()[metrics.EPOCH_OWN_THREADS_CPU_PERCENT.key])


def test_the_engine_hands_the_loader_probes_workers_to_the_parts(tmp_path: Path) -> None:
    """The loader probe among the engine's probes (given as a generator, as any iterable may be) is where the
    epoch-parts probe reads the workers' CPU time: the delta over the epoch, a restarted worker from 0."""

    class Source:
        workers = 2

        def __init__(self) -> None:
            self.cpu = [100 * MS, 300 * MS]

        def read(self) -> LoaderCounters:
            return LoaderCounters((0, 0), tuple(self.cpu), (0, 0))

    source = Source()
    loader = LoaderProbe(source, cores=2, idle_clock=lambda: None)

    def work(engine: object, epoch: int, step: int) -> None:
        if step == 2:
            source.cpu = [400 * MS, 50 * MS]  # the second worker restarted: its 50 ms count from 0

    rig = Rig(tmp_path, profile_batch=0, probes=(p for p in (loader,)))
    rig.fit(1, steps=4, every_step=work)
    parts = rig.engine.parts.results[0]
    assert parts.cpu.workers_cpu_s == pytest.approx(0.35)
    # the loader probe still runs: the generator was not used up finding it
    assert metrics.LOADER_WORKERS.key in rig.engine.probes.figures("epoch")

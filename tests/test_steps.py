"""fitprof.fit.steps on deterministic synthetic step sequences (no timing): the recorder's figures and exclusions,
the slowdown trigger's firing, silence on stationary noise, exclusions, max and spacing; the window comparison."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fitprof.fit.steps import EpochSteps, SlowdownTrigger, StepRecorder, not_representative

MS_NS = 1_000_000

MS = 1_000_000  # ns


def _feed(recorder: StepRecorder, times_ms: list[float], *, start: int = 0, **kwargs: object) -> list[int | None]:
    """Step boundaries at cumulative ``times_ms`` (one step per entry), from ``start`` ns."""
    now = start
    out = []
    for i, ms in enumerate(times_ms, 1):
        now += int(ms * MS)
        out.append(recorder.step(now, i, **kwargs))  # type: ignore[arg-type]
    return out


def test_recorder_figures_over_clean_steps() -> None:
    rec = StepRecorder(warmup_steps=2)
    rec.begin_epoch(0)
    times = [100.0, 50.0] + [10.0] * 9 + [20.0]  # two warm-up steps, then 10 clean steps
    now = 0
    for i, ms in enumerate(times, 1):
        now += int(ms * MS)
        rec.step(now, i, input_ns=int(ms * MS) // 4, samples=32)
    s = rec.summary()
    assert (s.steps_timed, s.steps_excluded) == (10, 2)
    assert rec.step_index == list(range(3, 13))
    assert s.step_time_ms_p50 == pytest.approx(10.0)
    assert s.step_time_ms_max == pytest.approx(20.0)
    assert s.step_time_ms_p90 == pytest.approx(float(np.percentile([10.0] * 9 + [20.0], 90)))
    assert s.step_time_ms_mean == pytest.approx(11.0)
    assert s.input_percent == pytest.approx(25.0)
    assert s.samples_per_s == pytest.approx(320 / 0.110)


def test_recorder_unknowns_are_nan_and_partial_knowledge_uses_known_steps() -> None:
    rec = StepRecorder(warmup_steps=0)
    rec.begin_epoch(0)
    _feed(rec, [10.0, 10.0])
    s = rec.summary()
    assert s.steps_timed == 2 and math.isnan(s.input_percent) and math.isnan(s.samples_per_s)
    rec.begin_epoch(0)
    rec.step(10 * MS, 1, input_ns=5 * MS, samples=8)
    rec.step(30 * MS, 2)  # 20 ms, nothing known
    s = rec.summary()
    assert s.input_percent == pytest.approx(50.0)  # only the measured step counts
    assert s.samples_per_s == pytest.approx(8 / 0.010)
    rec.begin_epoch(None)
    assert rec.step(5 * MS, 1) is None  # no origin: the first boundary only sets it
    empty = StepRecorder().summary()
    assert empty.steps_timed == 0 and math.isnan(empty.step_time_ms_p50)


def test_recorder_exclusions() -> None:
    rec = StepRecorder(warmup_steps=1)
    rec.begin_epoch(0)
    out = _feed(rec, [9.0, 10.0, 10.0])
    assert out == [None, 10 * MS, 10 * MS]
    rec.exclude_next(2)  # e.g. validation ran after step 3: steps 4 and 5 are left out
    rec.exclude_next(1)  # a smaller request never shortens a larger one
    now = 29 * MS
    got = []
    for i, ms in enumerate([500.0, 30.0, 10.0], 4):
        now += int(ms * MS)
        got.append(rec.step(now, i))
    assert got == [None, None, 10 * MS]
    assert rec.step_index == [2, 3, 6]
    assert rec.summary().steps_excluded == 3


def _noisy(n: int, seed: int, base: float = 10.0, sigma: float = 0.03, spikes: float = 0.01) -> np.ndarray:
    """Step times (ms) like this machine's: lognormal noise plus rare single-step spikes of 2-5x."""
    rng = np.random.default_rng(seed)
    t = base * rng.lognormal(0.0, sigma, n)
    hit = rng.random(n) < spikes
    t[hit] *= rng.uniform(2.0, 5.0, hit.sum())
    return t


def _run(trigger: SlowdownTrigger, times_ms: np.ndarray, first: int = 1) -> list[int]:
    return [e.step for i, ms in enumerate(times_ms, first) if (e := trigger.observe(int(ms * MS), i)) is not None]


@pytest.mark.parametrize("seed", range(5))
def test_never_fires_on_stationary_noise(seed: int) -> None:
    assert _run(SlowdownTrigger(), _noisy(5000, seed)) == []


@pytest.mark.parametrize(("jump", "seed"), [(1.5, 0), (2.0, 1), (4.0, 2)])
def test_fires_within_a_few_steps_of_a_jump(jump: float, seed: int) -> None:
    times = _noisy(600, seed)
    times[300:] *= jump
    trigger = SlowdownTrigger(max_windows=1)
    fired = _run(trigger, times)
    assert len(fired) == 1
    assert 305 <= fired[0] <= 308  # steps 301..305 are the first five slow ones (1-based)
    event = trigger.events[0]
    assert event.baseline_ms == pytest.approx(10.0, rel=0.05)
    assert event.step_time_ms == pytest.approx(10.0 * jump, rel=0.15)
    assert event.threshold_ms < event.step_time_ms


def test_on_noise_free_steps_the_25_percent_floor_decides() -> None:
    """Steps of exactly 10 ms (no spread: the robust margin is 0): the threshold is the 25% floor, 12.5 ms; five
    steps at 12 ms (20% slower) do not fire it, five at 13 ms do."""
    trigger = SlowdownTrigger(max_windows=2, min_spacing=0)
    assert _run(trigger, np.full(64, 10.0)) == []
    assert trigger.threshold_ms == pytest.approx(12.5)
    assert _run(trigger, np.full(8, 12.0), first=65) == []
    assert _run(trigger, np.full(5, 13.0), first=73) == [77]


def test_a_small_drift_does_not_fire() -> None:
    times = _noisy(600, 3)
    times[300:] *= 1.15  # under the 25% relative margin
    assert _run(SlowdownTrigger(), times) == []


def test_max_windows_and_spacing() -> None:
    times = _noisy(2000, 4)
    for start in (200, 400, 600, 1200, 1600):  # five bursts of 30 slow steps
        times[start : start + 30] *= 3.0
    assert _run(SlowdownTrigger(max_windows=3, min_spacing=500), times) == [205, 1205]  # the rest too close
    assert _run(SlowdownTrigger(max_windows=3, min_spacing=300), times) == [205, 605, 1205]  # 403 too close, max 3
    assert _run(SlowdownTrigger(max_windows=0), times) == []
    fired = _run(SlowdownTrigger(max_windows=10, min_spacing=0), times)
    assert [f // 100 * 100 for f in fired] == [200, 400, 600, 1200, 1600]


def test_a_withdrawn_firing_gives_back_the_baseline() -> None:
    """A false alarm (withdrawn when its window proved no slower) must not cost the baseline: a real slowdown that
    begins before a fresh baseline could have filled still fires, against the steps before the false alarm."""
    times = _noisy(200, 6)
    times[60:65] *= 3.0  # a transient stall: fires at step 65
    times[70:] *= 3.0  # the real slowdown, 5 clean steps after it
    trigger = SlowdownTrigger(min_spacing=0)
    fired: list[int] = []
    for i, ms in enumerate(times, 1):
        event = trigger.observe(int(ms * MS), i)
        if event is not None:
            fired.append(event.step)
            if event.step == 65:
                trigger.withdraw(event)  # its window's steps were as fast as the baseline's
    assert fired[:2] == [65, 75], fired  # steps 71-75 are the first five slow ones after the stall
    assert trigger.events[0].baseline_ms == pytest.approx(10.0, rel=0.05)


def test_a_persistent_slowdown_becomes_the_baseline() -> None:
    times = _noisy(3000, 5)
    times[500:] *= 2.0
    trigger = SlowdownTrigger(max_windows=5, min_spacing=50)
    assert len(_run(trigger, times)) == 1
    assert trigger.baseline_ms == pytest.approx(20.0, rel=0.05)


def test_excluded_steps_never_enter_the_baseline() -> None:
    """The adapter feeds the trigger only what the recorder kept: slow excluded steps fire nothing."""
    rec = StepRecorder(warmup_steps=3)
    trigger = SlowdownTrigger(max_windows=5, min_spacing=0)
    rec.begin_epoch(0)
    times = _noisy(400, 6)
    times[:3] = 500.0  # warm-up
    times[200:202] = 300.0  # a validation pause and the step after it
    now = 0
    fired = []
    for i, ms in enumerate(times, 1):
        if i == 200:
            rec.exclude_next(2)
        now += int(ms * MS)
        dt = rec.step(now, i)
        if dt is not None and trigger.observe(dt, i) is not None:
            fired.append(i)
    assert fired == []
    assert trigger.baseline_ms == pytest.approx(10.0, rel=0.05)
    assert 200 not in rec.step_index and 201 not in rec.step_index and 1 not in rec.step_index


def test_needs_a_baseline_before_firing() -> None:
    times = np.full(40, 10.0)
    times[5:] = 40.0  # slow from step 6: not enough baseline yet, then it becomes the baseline
    assert _run(SlowdownTrigger(min_baseline=16), times) == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"consecutive": 0}, "consecutive must be an int >= 1, got 0"),
        ({"baseline_steps": 2}, "baseline_steps must be an int >= 4"),
        ({"min_baseline": 100}, "min_baseline must be <= baseline_steps"),
        ({"rel": -0.1}, "rel must be a number >= 0"),
        ({"mad_k": float("nan")}, "mad_k must be a number >= 0"),
        ({"max_windows": True}, "max_windows must be an int"),
    ],
)
def test_bad_trigger_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SlowdownTrigger(**kwargs)  # type: ignore[arg-type]


def _epoch(mean: float, input_pct: float) -> EpochSteps:
    return EpochSteps(100, 3, mean, mean, mean, mean, input_pct, math.nan)


def test_not_representative() -> None:
    assert not_representative(11.0, 25.0, _epoch(10.0, 20.0)) is None
    said = not_representative(16.0, 45.0, _epoch(10.0, 20.0))
    assert said == (
        "the window is not representative of its epoch (step time 16.0 ms vs a median of 10.0 ms over the epoch's "
        "100 timed steps; input 45.0% vs 20.0% for the epoch)"
    )
    # judged on the median step, the progress bar's figure: a few slow steps lift the mean (6.1 ms) but not it
    skewed = EpochSteps(100, 3, 2.4, 2.6, 300.0, 6.1, 20.0, math.nan)
    assert not_representative(2.5, 20.0, skewed) is None
    assert not_representative(19.65, 20.0, skewed) == (
        "the window is not representative of its epoch (step time 19.6 ms vs a median of 2.4 ms over the epoch's "
        "100 timed steps)"
    )
    assert not_representative(10.0, 45.0, _epoch(10.0, math.nan)) is None  # no input measured: not compared
    assert not_representative(math.nan, 20.0, _epoch(10.0, 20.0)) is None


def test_device_step_times_replace_the_host_step_times_only() -> None:
    rec = StepRecorder(warmup_steps=0)
    rec.begin_epoch(0)
    _feed(rec, [10.0, 10.0, 10.0, 10.0], input_ns=2 * MS, samples=4)
    s = rec.summary(device_ms=[8.0, 8.0, 8.0, 20.0])
    assert (s.step_time_ms_p50, s.step_time_ms_max, s.step_time_ms_mean) == (8.0, 20.0, 11.0)
    assert s.input_percent == pytest.approx(20.0) and s.samples_per_s == pytest.approx(400.0)  # host clock
    assert rec.summary(device_ms=[8.0]).step_time_ms_p50 == pytest.approx(10.0)  # wrong length: ignored


def test_take_out_keeps_steps_next_to_a_save_timed() -> None:
    rec = StepRecorder(warmup_steps=0)
    rec.begin_epoch(0)
    t = 0
    for n in range(1, 11):
        t += 50 * MS_NS
        if n % 2 == 0:  # a 120 ms save every second step, inside it
            t += 120 * MS_NS
            rec.take_out(120 * MS_NS)
        rec.step(t, n)
    s = rec.summary()
    assert s.steps_timed == 10 and s.steps_excluded == 0
    assert s.step_time_ms_max == pytest.approx(50.0) and s.step_time_ms_p50 == pytest.approx(50.0)


def test_take_out_of_an_excluded_step_does_not_leak_into_the_next() -> None:
    rec = StepRecorder(warmup_steps=1)
    rec.begin_epoch(0)
    rec.take_out(30 * MS_NS)
    rec.step(40 * MS_NS, 1)  # warm-up: excluded, its take-out dropped with it
    rec.step(80 * MS_NS, 2)
    assert rec.step_ns == [40 * MS_NS]


def test_too_few_says_why_by_reason() -> None:
    from fitprof.fit import steps as st

    rec = StepRecorder(warmup_steps=3)
    rec.begin_epoch(0)
    t = 0
    for n in range(1, 13):
        t += MS_NS
        if n in (4, 8):
            rec.exclude_next(2, reason=st.VALIDATION)
        if n == 11:
            rec.exclude_next(1, reason=st.WINDOW)
        rec.step(t, n)
    assert len(rec.step_ns) == 4
    assert rec.too_few(3) is None  # 12 steps: a short epoch times few by its nature
    # 8 of the 12 steps were outside the warm-up and the window: what a repeating pause could have cost
    assert rec.too_few(3, min_seen=9) is None
    msg = rec.too_few(3, min_seen=8)
    assert msg == (
        "epoch 3 timed 4 of 12 steps (fewer than 10): 4 steps during or after validation, 3 warm-up steps (the first "
        "of the epoch), 1 step in or after a profiling window"
    )
    assert rec.too_few(3, min_steps=4, min_seen=8) is None
    rec.begin_epoch(0)
    assert rec.too_few(4, min_seen=0) is None  # no step seen: nothing to say

"""The engine both callbacks drive, alone: a fake window (which writes a real Kineto trace of the steps it marked)
and a fake clock, no framework. Each test drives the events an adapter sends and reads back the window calls, the
warnings and the figures of the real epoch-end pipeline.

Both step conventions run through the same tests where they mean the same: ``step_end`` (Lightning: a step ends
at its batch end, the window is marked there for the next step) and ``step_start`` (Keras: a step begins at its
batch begin and ends at the next one, validation or the epoch's end).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine_fakes import Rig
from fitprof import metrics
from fitprof.fit import Busy, schedule
from fitprof.fit.config import make_config
from fitprof.fit.steps import SlowdownTrigger

BOUNDARIES = ("step_end", "step_start")


def _overheads_balanced(log: list[tuple[Any, ...]]) -> bool:
    depth = 0
    for entry in log:
        depth += {"overhead": 1, "/overhead": -1}.get(entry[0], 0)
        if depth not in (0, 1):
            return False
    return depth == 0


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_the_scheduled_window_warms_up_marks_its_steps_and_is_analysed(tmp_path: Path, boundary: str) -> None:
    rig = Rig(tmp_path, (3, 5), boundary=boundary)
    results = rig.fit(epochs=2, steps=8)
    assert [e for e in rig.log if e[0] in ("start", "mark", "stop")] == [
        ("start", 0, ""), ("mark", 3), ("mark", 4), ("mark", 5), ("stop", (3, 4, 5)),
        ("start", 1, ""), ("mark", 3), ("mark", 4), ("mark", 5), ("stop", (3, 4, 5)),
    ]  # fmt: skip
    # The profiler starts one step early (the warm-up step 2 runs unmarked): at the boundary before step 2.
    start = rig.log.index(("start", 0, ""))
    assert rig.clock.ns > 0 and rig.windows[0].marks[0][1] - 10_000_000 >= 0
    marks = [e for e in rig.log[start + 1 :] if e[0] != "end_step"]  # Keras closes a step's marker at its end
    assert marks[:2] == [("overhead",), ("mark", 3)]  # step 2 ran between start and mark 3
    assert _overheads_balanced(rig.log)
    if boundary == "step_start":  # each step's marker closes at the next step's start, inside the hook's span
        assert len(rig.events("end_step")) == 2 * 4  # at steps 3, 4, 5 and 6 (which closes the window)
    reports = rig.engine.pipeline.reports
    assert {e: r.steps_analyzed for e, r in reports.items()} == {0: 3, 1: 3}
    assert reports[0].step_time_ms == pytest.approx(10.0)
    assert results[0].window[metrics.STEP_TIME_MS.key] == pytest.approx(10.0)
    assert rig.messages == []
    assert rig.engine.coverage.windows == 2


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_the_warm_up_step_starts_the_profiler_one_step_early(tmp_path: Path, boundary: str) -> None:
    starts: list[tuple[int, int]] = []

    def watch(engine: Any, epoch: int, step: int) -> None:
        if engine.window is not None and not starts:
            starts.append((epoch, step))

    rig = Rig(tmp_path, (3, 5), boundary=boundary)
    rig.fit(steps=8, every_step=watch)
    assert starts == [(0, 2)]  # open during step 2, the warm-up step


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_first_step_one_has_no_warm_up_step(tmp_path: Path, boundary: str) -> None:
    rig = Rig(tmp_path, (1, 2), boundary=boundary)
    rig.fit(steps=4)
    start = rig.log.index(("start", 0, ""))
    assert rig.log[start + 1 : start + 4] == [("overhead",), ("mark", 1), ("/overhead",)]
    assert rig.engine.pipeline.reports[0].steps_analyzed == 2


@pytest.mark.parametrize(("profile_batch", "counted"), [((6, 10), 4), ((3, 5), 1), ((2, 3), 4), ((1, 3), 4)])
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_the_flop_count_step_is_outside_the_window_and_out_of_the_timing(
    tmp_path: Path, boundary: str, profile_batch: tuple[int, int], counted: int
) -> None:
    """The step before the warm-up step, or the one after the window when there is none."""
    rig = Rig(tmp_path, profile_batch, boundary=boundary)
    steps: list[list[int]] = []
    rig.fit(steps=16, every_step=lambda engine, epoch, step: steps.append(list(engine.steps.step_index)))
    assert [c for c in rig.work.calls if c[0] == "count_flops"] == [("count_flops", counted)]
    assert counted not in rig.engine.steps.step_index
    first, last = profile_batch
    assert not set(range(first - 1, last + 1)) & set(rig.engine.steps.step_index)  # the window's steps neither
    assert schedule.plan(make_config(profile_batch, 1, 5)).count_step == counted


def test_every_n_epochs_picks_the_epochs(tmp_path: Path) -> None:
    rig = Rig(tmp_path, (2, 3), every_n_epochs=2)
    rig.fit(epochs=5, steps=4)
    assert sorted(rig.engine.pipeline.reports) == [0, 2, 4]


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_an_epoch_that_ends_inside_the_window_analyses_what_it_has(tmp_path: Path, boundary: str) -> None:
    rig = Rig(tmp_path, (3, 8), boundary=boundary)
    rig.fit(steps=5)
    assert rig.messages == [
        "fitprof: epoch 0 ended after step 5, inside the window (profile_batch=3,8); the steps profiled so far are "
        "analysed. For epochs of 5 steps, profile_batch=(3, 5) fits."
    ]
    assert rig.engine.pipeline.reports[0].steps_analyzed == 3  # steps 3-5, every one complete


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_an_epoch_that_ends_on_the_warm_up_step_profiles_nothing_and_says_why(tmp_path: Path, boundary: str) -> None:
    rig = Rig(tmp_path, (6, 10), boundary=boundary)
    rig.fit(epochs=2, steps=5)
    assert rig.engine.pipeline.reports == {}
    assert all(w.state == "aborted" for w in rig.windows)  # any window started was dropped, never exported
    assert rig.messages == [
        "fitprof: nothing was profiled: the window starts at step 6 (profile_batch=6,10) but the epochs had 5 "
        "training steps. Set profile_batch to steps that exist, e.g. profile_batch=(3, 5)."
    ]


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_an_exception_inside_the_window_drops_the_open_step_and_stops_the_profiler(
    tmp_path: Path, boundary: str
) -> None:
    rig = Rig(tmp_path, (3, 8), boundary=boundary)
    engine = rig.engine
    engine.fit_start(log_dir=rig.log_dir)
    engine.epoch_start(0)
    for step in range(1, 6):  # step 5 raises: started, never ended
        engine.step_start(step)
        rig.clock.tick(10)
        if step < 5 and boundary == "step_end":
            engine.step_end(step)
    logged: list[Any] = []
    result = engine.exception(RuntimeError("boom"), log=logged.append)
    assert engine.window is None and rig.windows[0].state == "stopped"
    # step_end: steps 3 and 4 ended, 5 was marked at 4's end and never ran; step_start: 5 was marked and raised.
    assert engine.pipeline.reports[0].steps_analyzed == 2
    assert result is not None and result.window[metrics.STEPS_ANALYZED.key] == 2.0
    assert [entry.epoch for entry in logged] == [0]


def test_reports_are_those_of_the_last_fit(tmp_path: Path) -> None:
    rig = Rig(tmp_path, (2, 3))
    rig.fit(epochs=3, steps=4)
    assert sorted(rig.engine.pipeline.reports) == [0, 1, 2]
    rig.fit(epochs=1, steps=4)
    assert sorted(rig.engine.pipeline.reports) == [0]
    assert len(rig.engine.epoch_steps) == 1


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_window_that_cannot_start_warns_once_and_names_the_other_profiler(tmp_path: Path, boundary: str) -> None:
    rig = Rig(tmp_path, (2, 3), boundary=boundary, fail="busy")
    rig.fit(epochs=2, steps=4)
    assert rig.messages == [
        "fitprof: profiling skipped for epoch 0: another profiler is already running; fitprof does not start a "
        "second one",
        "fitprof: nothing was profiled: another profiler held the profiler when the window (profile_batch=2,3) was "
        "to start (it ran). Stop the other profiler, or give the two profilers different steps.",
    ]
    assert [c for c in rig.work.calls if c[0] == "count_flops"] == []  # no FLOPs for a window that never opened


def test_a_step_marker_that_fails_drops_the_window(tmp_path: Path) -> None:
    rig = Rig(tmp_path, (3, 4), fail="mark")
    rig.fit(steps=6)
    assert rig.windows[0].state == "aborted"
    assert (
        rig.messages[0]
        == "fitprof: could not mark step 3 (RuntimeError('marker broke')); the window of epoch 0 was dropped."
    )
    assert rig.engine.pipeline.reports == {}


def test_a_window_that_cannot_stop_is_dropped_with_one_warning(tmp_path: Path) -> None:
    rig = Rig(tmp_path, (3, 4), fail="stop")
    rig.fit(steps=6)
    assert rig.messages[0] == "fitprof: the window of epoch 0 was dropped: the profiler could not stop"
    assert rig.windows[0].state == "aborted"


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_another_profilers_steps_are_left_to_it(tmp_path: Path, boundary: str) -> None:
    rig = Rig(tmp_path, (6, 8), boundary=boundary)
    engine = rig.engine
    engine.fit_start(log_dir=rig.log_dir)
    engine.epoch_start(0, busy=[Busy(7, 9, "OtherProfiler(steps=(7, 9))", "OtherProfiler")])
    assert not engine.armed
    assert rig.messages == [
        "fitprof: OtherProfiler(steps=(7, 9)) profiles the same steps as the window of epoch 0 (profile_batch=6,8); "
        "two profilers cannot run at once, so fitprof leaves those steps to OtherProfiler and profiles no window in "
        "that epoch. Give the two callbacks different steps to get both profiles."
    ]
    assert engine.coverage.blocked == "OtherProfiler(steps=(7, 9)) profiles the same steps"


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_profile_that_ends_on_the_warm_up_step_costs_the_window_its_warm_up(tmp_path: Path, boundary: str) -> None:
    rig = Rig(tmp_path, (6, 8), boundary=boundary)
    engine = rig.engine
    engine.fit_start(log_dir=rig.log_dir, ends_after=lambda s: s >= 10)
    engine.epoch_start(0, busy=[Busy(1, 5, "Other", "Other")])
    opened_during: list[int] = []
    for step in range(1, 11):
        engine.step_start(step)
        if engine.window is not None and not opened_during:
            opened_during.append(step)
        rig.clock.tick(10)
        if boundary == "step_end":
            engine.step_end(step)
    engine.epoch_end(0)
    assert opened_during == [6] and rig.messages == []  # started at step 6 itself, marked at once
    assert engine.pipeline.reports[0].steps_analyzed == 3


def _slow_from(step: int, ms: float = 10.0, slow_ms: float = 60.0) -> Any:
    return lambda index: slow_ms if index >= step else ms


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_slowdown_opens_a_triggered_window_compared_with_the_scheduled_one(tmp_path: Path, boundary: str) -> None:
    """10 ms steps, then 60 ms from step 41: 5 slow steps fire the trigger after step 45; step 46 is the triggered
    window's warm-up step, 47-48 (as many as profile_batch) its analysed steps."""
    rig = Rig(tmp_path, (3, 4), boundary=boundary, trigger=SlowdownTrigger(min_spacing=0))
    results = rig.fit(steps=60, step_ms=_slow_from(40))
    starts = rig.events("start")
    assert starts == [("start", 0, ""), ("start", 0, "_trigger_step45")]
    assert [n for n, _ in rig.windows[1].marks] == [47, 48]
    ((epoch, event, report),) = rig.engine.triggered
    assert (epoch, event.step) == (0, 45)
    assert event.step_time_ms == pytest.approx(60.0) and event.baseline_ms == pytest.approx(10.0)
    assert report is not None and report.steps_analyzed == 2 and report.step_time_ms == pytest.approx(60.0)
    (triggered,) = results[0].triggered
    assert "slowdown after step 45" in triggered.line and "step 10.0 -> 60.0 ms" in triggered.line
    assert results[0].trigger[metrics.TRIGGER_STEP.key] == 45.0
    assert rig.engine.pipeline.reports[0].steps_analyzed == 2  # the scheduled window stays the epoch's report


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_false_alarm_uses_up_neither_the_budget_nor_the_spacing(tmp_path: Path, boundary: str) -> None:
    """A transient stall (5 steps of 60 ms among 10 ms steps, as when another process takes the cores) fires the
    trigger after step 45; its window's steps (47-48) are back at 10 ms: a false alarm, taken back. The real
    slowdown from step 121 then still fires, though the default 200-step spacing would have hidden it, and with
    ``max_windows=1`` the budget is still there for it."""
    stall = set(range(40, 45))
    rig = Rig(tmp_path, (3, 4), boundary=boundary, trigger=SlowdownTrigger(max_windows=1))
    results = rig.fit(steps=160, step_ms=lambda i: 60.0 if i in stall or i >= 120 else 10.0)
    fired = [(event.step, report.step_time_ms) for _, event, report in rig.engine.triggered]
    assert len(fired) == 2 and fired[0][0] == 45, fired
    assert fired[0][1] == pytest.approx(10.0) and fired[1][1] == pytest.approx(60.0) and fired[1][0] > 120
    assert list(rig.engine.false_alarms) == [(0, 45)]
    assert rig.engine.trigger is not None and len(rig.engine.trigger.events) == 1  # the real one only
    first, second = results[0].triggered
    assert "slowdown after step 45 (60.0 ms/step vs baseline 10.0 ms) was a false alarm" in first.line
    assert "does not count against trigger_max_windows or trigger_min_spacing" in first.line
    assert "false alarm" not in second.line


def test_a_triggered_window_never_overlaps_the_scheduled_block() -> None:
    # A window after step n: warm-up n+1, analysed n+2..n+1+L, closed at n+2+L (spe 1).
    assert schedule.may_trigger(10, length=5, scheduled=18)
    assert not schedule.may_trigger(10, length=5, scheduled=17)  # it would close on the scheduled block's step
    assert schedule.may_trigger(10, length=5, scheduled=None)
    assert not schedule.may_trigger(10, length=5, busy=[(17, 30)])  # another profiler at the closing step
    assert schedule.may_trigger(10, length=5, busy=[(18, 30)])
    assert not schedule.may_trigger(10, length=5, spe=2, scheduled=22)  # closes at 11 + 2 * 6 = 23


def test_a_slowdown_right_before_the_scheduled_window_waits(tmp_path: Path) -> None:
    """Slow from step 20 with the scheduled window at 40-44: a triggered window would close after the block
    starts, so it fires only after the scheduled window."""
    rig = Rig(tmp_path, (40, 44), trigger=SlowdownTrigger(min_spacing=0))
    rig.fit(steps=80, step_ms=_slow_from(30))
    ((_, event, _),) = rig.engine.triggered
    assert event.step > 44
    assert rig.events("start")[0] == ("start", 0, "")


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_validation(tmp_path: Path, boundary: str) -> None:
    """Lightning validates inside the window (annotated, left out of the step timing); Keras validates after the
    epoch's last step (the window closes)."""
    rig = Rig(tmp_path, (2, 6), boundary=boundary)

    def validate(engine: Any, epoch: int, step: int) -> None:
        if step == 4:
            engine.validation_start()
            engine.validation_end()

    rig.fit(steps=8, every_step=validate)
    if boundary == "step_end":
        assert rig.events("annotate") == [("annotate", "fitprof/validation")] and len(rig.events("/annotate")) == 1
        assert rig.engine.pipeline.reports[0].steps_analyzed == 5
    else:
        assert rig.events("annotate") == [] and [n for n, _ in rig.windows[0].marks] == [2, 3, 4]


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_save_is_taken_out_of_its_step_which_stays_timed(tmp_path: Path, boundary: str) -> None:
    """A 300 ms save every second step (what the adapters' hook timers report through save_begin / save_end): every
    step after the warm-up stays timed, at its training time; inside the window the save is annotated."""
    rig = Rig(tmp_path, (11, 13), boundary=boundary)

    def save(engine: Any, epoch: int, step: int) -> None:
        if step % 2 == 0:
            engine.checkpoint_start()
            engine.checkpoint_end()
            engine.save_begin()
            rig.clock.tick(300.0)
            engine.save_end(300_000_000)

    results = rig.fit(steps=24, every_step=save)
    epoch = results[0].epoch
    unsaved = Rig(tmp_path / "unsaved", (11, 13), boundary=boundary).fit(steps=24)[0].epoch
    # The same steps timed as without any save: only the warm-up and the window's are left out.
    assert epoch[metrics.EPOCH_STEPS_TIMED.key] == unsaved[metrics.EPOCH_STEPS_TIMED.key] >= 12
    assert epoch[metrics.EPOCH_STEP_TIME_MS_MAX.key] == pytest.approx(10.0)
    assert epoch[metrics.EPOCH_CHECKPOINT_S.key] == pytest.approx(0.0)  # no hook timer in this rig: saves unseen
    opened = [e for e in rig.log if e == ("annotate", "fitprof/checkpoint")]
    assert opened and all(w.annotations == 0 for w in rig.windows)  # the window's saves, each closed


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_step_times_come_from_the_engines_clock(tmp_path: Path, boundary: str) -> None:
    rig = Rig(tmp_path, 0, boundary=boundary)
    results = rig.fit(steps=12, step_ms=lambda i: 10.0 + (i % 3))
    epoch = results[0].epoch
    assert epoch[metrics.EPOCH_STEP_TIME_MS_MAX.key] == pytest.approx(12.0)
    assert epoch[metrics.EPOCH_STEP_TIME_MS_P50.key] == pytest.approx(11.0)


class Recorder:
    """A probe with every optional method: what the engine forwarded, and figures of its own."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any, int]] = []

    def __getattr__(self, name: str) -> Any:
        from fitprof.fit.probes import EVENTS

        if name not in EVENTS:
            raise AttributeError(name)
        return lambda *args, now_ns: self.events.append((name, args, now_ns))

    def epoch_figures(self) -> dict[str, float]:
        steps = sum(1 for e in self.events if e[0] == "step_start")
        return {"fitprof/epoch/probe_steps": float(steps), "fitprof/epoch/probe_nan": math.nan}

    def window_figures(self) -> dict[str, float]:
        (start,) = [t for name, _, t in self.events if name == "window_start"]
        (end,) = [t for name, _, t in self.events if name == "window_end"][-1:]
        return {"fitprof/probe_window_ms": (end - start) / 1e6}


class Broken:
    def epoch_start(self, epoch: int, *, now_ns: int) -> None:
        raise ValueError("no")


def test_probes_get_every_event_with_the_clock_and_their_figures_are_published(tmp_path: Path) -> None:
    probe = Recorder()
    rig = Rig(tmp_path, (3, 5), probes=(probe, Broken()))
    results = rig.fit(epochs=1, steps=6)
    names = [name for name, _, _ in probe.events]
    assert names[:3] == ["fit_start", "epoch_start", "step_start"]
    assert names.count("step_start") == names.count("step_end") == 6
    assert names[-2:] == ["epoch_end", "fit_end"]
    assert ("epoch_start", (0,), 1_000_000_000) in probe.events  # with the engine clock's reading
    assert results[0].epoch["fitprof/epoch/probe_steps"] == 6.0
    assert math.isnan(results[0].epoch["fitprof/epoch/probe_nan"])  # epoch figures keep their NaN (stable keys)
    assert results[0].window["fitprof/probe_window_ms"] == pytest.approx(30.0)  # steps 3-5, 10 ms each
    assert rig.messages == ["fitprof: the probe Broken failed (ValueError('no')); its figures are left out."]


@pytest.mark.slow  # spawns a fresh interpreter: only a new process shows which modules an import pulls in
def test_the_engine_imports_no_framework() -> None:
    code = (
        "import sys, fitprof.fit, fitprof.fit.engine, fitprof.fit.schedule, fitprof.profilers.base\n"
        "print(sorted(m for m in ('torch', 'tensorflow', 'keras', 'lightning', 'jax') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_baseline_is_compared_with_each_window_once_in_the_engine(tmp_path: Path) -> None:
    """``baseline=``: a first fit at 10 ms a step writes the report files the second fit is compared with. At 13 ms
    a step the window logs +30% under ``fitprof/vs_baseline/step_time_percent``, its summary starts with the
    comparison and names the operator that grew most, and the regression warns once in the fit; at 10 ms it logs
    0% and warns nothing."""
    for run in ("base", "slower", "same"):
        (tmp_path / run).mkdir()
    Rig(tmp_path / "base", (3, 5)).fit(epochs=2, steps=6)  # two windows, 10 ms a step
    logged: list[Any] = []
    slower = Rig(tmp_path / "slower", (3, 5), baseline=tmp_path / "base")
    slower.fit(epochs=2, steps=6, step_ms=13.0, log=logged.append)
    key = metrics.VS_BASELINE_STEP_TIME_PERCENT.key
    assert [entry.scalars[key] for entry in logged] == [pytest.approx(30.0), pytest.approx(30.0)]
    assert logged[0].text.startswith(f"Against the baseline {tmp_path / 'base'} (regression): step time +30.0%")
    assert "the operator that grew most: aten::mm" in logged[0].text
    assert len(slower.messages) == 1 and slower.messages[0].startswith("fitprof: epoch 0 regressed. Against the")
    logged.clear()
    same = Rig(tmp_path / "same", (3, 5), baseline=tmp_path / "base")
    same.fit(epochs=1, steps=6, log=logged.append)
    assert logged[0].scalars[key] == pytest.approx(0.0)
    assert "(no regression)" in logged[0].text
    assert same.messages == []


def test_a_baseline_that_cannot_be_read_is_refused_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file or folder"):
        Rig(tmp_path, (3, 5), baseline=tmp_path / "missing")
    with pytest.raises(TypeError, match="baseline must be a path"):
        Rig(tmp_path, (3, 5), baseline=3)


def _fit_in_calls(rig: Rig, spe: int, calls: int) -> None:
    """One epoch of ``calls`` Keras calls of ``spe`` batches each, 10 ms a call (steps numbered by batch)."""
    engine = rig.engine
    engine.fit_start(log_dir=rig.log_dir, steps_per_execution=spe)
    engine.epoch_start(0)
    for call in range(calls):
        engine.step_start(call * spe + 1)
        rig.clock.tick(10.0)
    engine.epoch_end(0, steps=calls * spe)
    engine.fit_end()


def test_under_steps_per_execution_the_default_window_analyses_five_calls(tmp_path: Path) -> None:
    from fitprof.fit.config import DEFAULT_PROFILE_BATCH

    (tmp_path / "default").mkdir()
    (tmp_path / "given").mkdir()
    rig = Rig(tmp_path / "default", DEFAULT_PROFILE_BATCH, boundary="step_start")
    _fit_in_calls(rig, spe=5, calls=12)
    assert [e[1] for e in rig.events("mark")] == [26, 31, 36, 41, 46]  # calls 6-10
    assert rig.engine.pipeline.reports[0].steps_analyzed == 5
    assert rig.messages == []

    given = Rig(tmp_path / "given", (6, 10), boundary="step_start")  # the user's window counts batches
    _fit_in_calls(given, spe=5, calls=12)
    assert [e[1] for e in given.events("mark")] == [6]


@pytest.mark.parametrize("profile_batch", [(3, 5), 0])
def test_a_window_is_converted_from_its_stop_without_a_process(
    tmp_path: Path, profile_batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converter is made at the fit's start and starts no process; a small window's .xplane.pb is written by
    this process's thread from the window's stop, before its epoch ends, and is there when the fit returns."""
    import time

    import fitprof
    from fitprof.fit.xplane_worker import WAIT_ENV

    monkeypatch.delenv(WAIT_ENV, raising=False)  # the end of the fit waits for nothing
    rig = Rig(tmp_path, profile_batch)
    for pipeline in (rig.engine.pipeline, rig.engine.trigger_pipeline):
        pipeline.converter = rig.engine._converter  # the real converter (the rig writes in the training thread)
    seen: list[tuple[bool, int, int]] = []  # at each step: converter made, processes it started, windows so far
    before_epoch_end: list[Path] = []

    def every_step(engine: Any, epoch: int, step: int) -> None:
        worker = engine._xplane
        seen.append((worker is not None, 0 if worker is None else worker.starts, len(rig.windows)))
        if step == 8 and rig.windows:  # the window (steps 3-5) stopped two steps ago; its epoch has not ended
            end = time.monotonic() + 60
            while not (found := list(tmp_path.rglob("*.xplane.pb"))) and time.monotonic() < end:
                time.sleep(0.01)
            before_epoch_end.extend(found)

    rig.fit(epochs=1, steps=8, every_step=every_step, warm_up=True)
    assert "fitprof.traces.kineto" in sys.modules and "fitprof.traces.xspace_write" in sys.modules
    if profile_batch == 0:  # a fit that profiles nothing makes no converter
        assert seen == [(False, 0, 0)] * 8 and rig.engine.pipeline.xplane_paths == {}
        return
    assert seen[0] == (True, 0, 0)  # made before the first window opened
    assert {starts for _, starts, _ in seen} == {0}  # never a process
    xplanes = rig.engine.pipeline.xplane_paths
    assert set(xplanes) == {0} and before_epoch_end == [xplanes[0]]
    assert fitprof.analyze(xplanes[0]).steps_analyzed == 3  # the window's steps, read back from the file
    assert rig.engine._xplane is None  # let go at the end of the fit
    assert not list(tmp_path.rglob("*fitprof-tmp*"))  # no job file or half file left
    assert rig.messages == []

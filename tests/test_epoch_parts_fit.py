"""Every millisecond of the epoch, in real fits of both frameworks: each planted cost against its truth timed in
the same run (``tests/epoch_parts_child.py``), the parts adding up to the wall time, and the epoch's verdict.

Each framework's fits run one after another in one child process (:func:`fits`), each with its own log folder,
model and callbacks: the framework's import is paid once per framework, not once per test.

The figures are read back from what the callbacks wrote: Lightning's ``CSVLogger`` file (``pl_module.log``),
Keras's ``History``, and both callbacks' per-epoch file (``plugins/fitprof/epochs.rank0.jsonl``). Tolerance: 15% of
the truth or 30 ms, whichever is larger (the issue's bar); measured spread: see each assertion.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from fitprof import metrics
from fitprof.report_files import epoch_file_path, read_epoch_file
from keras_child import child_env, run_result

CHILD = Path(__file__).with_name("epoch_parts_child.py")
PARTS = ("train_steps_s", "validation_s", "checkpoint_s", "callbacks_s", "startup_s", "profiling_s", "other_s")
SCENARIOS = ("validation", "checkpoint", "callback", "startup")
PLANTED = {
    "validation": "validation_s",
    "checkpoint": "checkpoint_s",
    "callback": "callbacks_s",
    "startup": "startup_s",
}
VERDICT = {
    "validation": "validation took",
    "checkpoint": "checkpointing took",
    "callback": "callback hooks took",
    "startup": "start-up (first batch) took",
    "threads": "CPU-contended",
}


@pytest.fixture(scope="module", params=["lightning", "keras"])
def fits(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, dict[str, Any]]:
    """``(framework, log root, runs)``: every scenario of :data:`SCENARIOS` fitted in one child process, each under
    ``root / scenario``; ``runs`` maps a scenario to its result (the child's docstring)."""
    framework: str = request.param
    pytest.importorskip("lightning" if framework == "lightning" else "keras")
    root = tmp_path_factory.mktemp(f"epoch_parts_{framework}")
    runs, _ = run_result([str(CHILD), framework, str(root), *SCENARIOS], env=child_env(KERAS_BACKEND="torch"))
    return framework, root, runs


def _run(fits: tuple[str, Path, dict[str, Any]], scenario: str) -> tuple[str, Path, dict[str, Any]]:
    """``(framework, log folder, result)`` of one scenario's fit; fails with the child's traceback if it raised."""
    framework, root, runs = fits
    run = runs[scenario]
    assert "error" not in run, run["error"]
    return framework, root / scenario, run


def _logged(framework: str, run: dict[str, Any], logdir: Path) -> list[dict[str, float]]:
    """Each epoch's ``fitprof/epoch/*`` figures as the framework's own channel holds them."""
    if framework == "keras":
        history = run["history"]
        epochs = len(history[metrics.EPOCH_WALL_S.key])
        return [{k: v[e] for k, v in history.items() if k.startswith(metrics.EPOCH_PREFIX)} for e in range(epochs)]
    # An epoch's figures come in two rows at its step: those of fitprof's epoch-end hook (pl_module.log), then its
    # parts, final at its close (the next epoch's start or the fit's end).
    by_epoch: dict[int, dict[str, float]] = {}
    with open(logdir / "csv" / "version_0" / "metrics.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r.get("epoch"):
                figures = {k: float(v) for k, v in r.items() if k.startswith(metrics.EPOCH_PREFIX) and v}
                by_epoch.setdefault(int(r["epoch"]), {}).update(figures)
    return [figures for _, figures in sorted(by_epoch.items()) if metrics.EPOCH_WALL_S.key in figures]


def _close(measured: float, truth: float) -> bool:
    return abs(measured - truth) <= max(0.15 * truth, 0.030)


@pytest.mark.slow
# The oversubscribed run ("threads" in the child) is left out: its training thread waited for a core 15.6-25.7% of
# the epoch on this 2-core machine against the 20% the verdict needs, so whether it reads CPU-contended depends on
# the machine; tests/test_epoch_parts.py checks the verdict on planted figures.
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_parts_match_truths_and_add_up(fits: tuple[str, Path, dict[str, Any]], scenario: str) -> None:
    framework, logdir, run = _run(fits, scenario)
    logged = _logged(framework, run, logdir)
    truth = run["truth"]
    assert len(logged) == 2
    for epoch, figures in enumerate(logged):
        wall = figures[metrics.EPOCH_WALL_S.key]
        parts = sum(figures[metrics.EPOCH_PREFIX + p] for p in PARTS)
        assert parts == pytest.approx(wall, rel=1e-3), figures  # exact in the probe; float32 on Lightning's way
        assert figures[metrics.EPOCH_INPUT_S.key] <= figures[metrics.EPOCH_TRAIN_STEPS_S.key] or math.isnan(
            figures[metrics.EPOCH_INPUT_S.key]
        )
        key = PLANTED.get(scenario)
        if key is not None:
            measured, expected = figures[metrics.EPOCH_PREFIX + key], truth[scenario][str(epoch)]
            print(f"{framework} {scenario} epoch {epoch}: {key} {measured:.3f} s, truth {expected:.3f} s")
            assert _close(measured, expected), (epoch, key, measured, expected)
    # The first epoch's span: from its start to the next epoch's start, its callbacks' epoch-end hooks included.
    wall = logged[0][metrics.EPOCH_WALL_S.key]
    print(f"{framework} {scenario} epoch 0: wall {wall:.3f} s, truth {truth['wall']['0']:.3f} s; {logged[0]}")
    assert _close(wall, truth["wall"]["0"])
    records = read_epoch_file(epoch_file_path(logdir, 0))
    assert [r.epoch for r in records] == [0, 1]
    assert records[0].figures[metrics.EPOCH_WALL_S.key] == pytest.approx(logged[0][metrics.EPOCH_WALL_S.key], rel=1e-3)
    said = " ".join(records[0].verdicts)
    print(f"{framework} {scenario} epoch 0 verdicts: {records[0].verdicts}")
    assert VERDICT[scenario] in said, records[0].verdicts
    if scenario == "callback":
        assert "the slowest is Sleepy" in said
    if scenario == "startup":  # fed a DataLoader on both: its knob, not a tf.data one (Keras knows its input)
        assert "persistent_workers=True" in said and "tf.data" not in said, records[0].verdicts
    if scenario == "threads":
        assert "compute-bound" not in said


SAVES_IN_WINDOW = {"keras": (6, 8, 10), "lightning": (6, 8)}
"""The steps (1-based) of the default window (steps 6-10) whose save the window holds: Keras saves in its
``ModelCheckpoint.on_train_batch_end``, before the window closes at the end of step 10; Lightning runs
``ModelCheckpoint`` after every other callback's hook, so step 10's save comes after the window closed."""


@pytest.mark.slow
def test_saves_inside_the_window_are_out_of_its_step_time(fits: tuple[str, Path, dict[str, Any]]) -> None:
    """A save every second step, inside the default window: the window's step time leaves the saves out and names
    them (their total against the truth of those very saves); the always-on timing keeps timing steps (each save
    taken out of its step, none dropped)."""
    framework, logdir, run = _run(fits, "checkpoint")
    window = run["window"]["0"]
    steps = window[metrics.STEPS_ANALYZED.key]
    saves = run["save_s"]["0"]  # one every second step: after step 2, 4, ...
    assert len(saves) == 20 / 2
    inside = [saves[step // 2 - 1] for step in SAVES_IN_WINDOW[framework]]
    total_s = window[metrics.CHECKPOINT_MS_PER_STEP.key] * steps / 1e3
    print(f"{framework}: saves (ms) {[round(1e3 * s) for s in saves]}; window {window}")
    assert steps == 5
    assert _close(total_s, sum(inside)), (total_s, inside)
    # The saves are out of the step time: with them in, it would be at least their share of a step.
    assert window[metrics.STEP_TIME_MS.key] < 0.5 * 1e3 * sum(inside) / steps
    logged = _logged(framework, run, logdir)
    assert logged[0][metrics.EPOCH_STEPS_TIMED.key] >= 5

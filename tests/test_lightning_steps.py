"""Lightning: always-on step timing (``fitprof/epoch/*``) and windows triggered by a slowdown.

Two short fits, each steady and then slowed down at a known step: once by a sleep in the dataset (input), once by
an extra operator in ``training_step`` (``fitprof_test::slow_op`, a custom operator that sleeps`). The trigger must fire within a few steps of the change,
the triggered window's verdict / comparison must name the cause while the normal window's does not, and the
epoch's input share must match a truth timed inside the dataset. Figures are read back from TensorBoard's event
files and ``trainer.callback_metrics``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from contention import measured, tolerates_load  # noqa: E402
from fitprof import metrics  # noqa: E402
from fitprof.lightning import FitProfiler  # noqa: E402
from fitprof.traces import read_trace  # noqa: E402

SLOW_FROM = 40  # 0-based batch index from which the run is slowed down (step 41 is the first slow one)
# Every step also sleeps this long in ``training_step``: a steady floor under the step time. Without it the steps
# took about 1 ms, so the trigger's 25% margin was 0.25-0.3 ms, and in one CI run a burst of load made 5 steps in a
# row 1.3-1.6 ms against a 1.28 ms threshold: the trigger fired at step 38, before the slowdown, and (its baseline
# starting afresh after a firing) could not fire again in this short fit. A sleep stretches with load far less than
# a computed step does, and it makes the margin 1-1.5 ms.
STEADY_S = 0.004
STEPS = SLOW_FROM + 18  # room for 5 slow steps, a 5-step window and the 2 steps after it
BATCH = 32


@torch.library.custom_op(  # type: ignore[misc]
    "fitprof_test::slow_op", mutates_args=(), schema="(Tensor x, float seconds) -> Tensor"
)
def _slow_op(x: Any, seconds: float) -> Any:
    """An operator of its own (``fitprof_test::slow_op`` in the trace) whose self time is a sleep."""
    time.sleep(seconds)
    return x.clone()


class _Plan:
    """How slow the slowdown is: sized in the run from the test's own step times before it, 3x the trigger's
    threshold (median + 8 robust sigmas), at least 50 ms, so it fires on a busy machine as on a quiet one."""

    def __init__(self) -> None:
        self.slow_s = 0.0


class _Batches(torch.utils.data.Dataset):  # type: ignore[misc]
    """Whole batches (``DataLoader(batch_size=None)``); from ``sleep_from`` on each takes ``sleep_s`` longer.
    Every ``__getitem__`` interval is recorded (``perf_counter_ns``): the truth of the input wait."""

    def __init__(self, plan: _Plan, sleep_from: int | None) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(STEPS, BATCH, 64, generator=g)
        self.y = torch.randn(STEPS, BATCH, 1, generator=g)
        self.plan, self.sleep_from = plan, sleep_from
        self.spans: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return STEPS

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        t0 = time.perf_counter_ns()
        if self.sleep_from is not None and i >= self.sleep_from:
            time.sleep(self.plan.slow_s)
        out = (self.x[i].clone(), self.y[i].clone())
        self.spans.append((t0, time.perf_counter_ns()))
        return out


class _Net(pl.LightningModule):
    def __init__(self, plan: _Plan, op_from: int | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.plan, self.op_from = plan, op_from

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        time.sleep(STEADY_S)
        if self.op_from is not None and batch_idx >= self.op_from:
            x = _slow_op(x, self.plan.slow_s)  # the injected slower operator
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class _Ends(pl.Callback):
    """The test's own clock: each training step's end (``perf_counter_ns``); sizes the slowdown before it starts."""

    def __init__(self, plan: _Plan) -> None:
        self.ends: dict[int, int] = {}
        self.plan = plan

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.ends[0] = time.perf_counter_ns()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        n = batch_idx + 1
        self.ends[n] = time.perf_counter_ns()
        if n == SLOW_FROM - 1:
            ms = np.diff([self.ends[i] for i in range(3, n + 1)]) / 1e6
            median = float(np.median(ms))
            threshold = median + 8 * 1.4826 * float(np.median(np.abs(ms - median)))
            self.plan.slow_s = max(0.05, 3 * threshold / 1e3)


def _fit(root: Path, plan: _Plan, dataset: _Batches, module: _Net) -> tuple[Any, FitProfiler, _Ends]:
    fp = FitProfiler(trigger="slowdown", verbose=True)
    ends = _Ends(plan)
    trainer = pl.Trainer(
        max_epochs=1,
        default_root_dir=root,
        logger=TensorBoardLogger(root, name="tb"),
        callbacks=[ends, fp],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, torch.utils.data.DataLoader(dataset, batch_size=None))
    return trainer, fp, ends


@pytest.fixture(scope="module")
def input_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, FitProfiler, _Ends, _Batches]:
    root = tmp_path_factory.mktemp("steps_input")
    plan = _Plan()
    dataset = _Batches(plan, sleep_from=SLOW_FROM)
    with measured(__name__):  # the timings its tests read are made here
        trainer, fp, ends = _fit(root, plan, dataset, _Net(plan))
    return root, trainer, fp, ends, dataset


@pytest.fixture(scope="module")
def op_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, FitProfiler]:
    root = tmp_path_factory.mktemp("steps_op")
    plan = _Plan()
    trainer, fp, _ = _fit(root, plan, _Batches(plan, sleep_from=None), _Net(plan, op_from=SLOW_FROM))
    return root, trainer, fp


def _scalars(root: Path) -> dict[str, list[float]]:
    (run,) = {p.parent for p in (root / "tb").rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
@tolerates_load
def test_input_slowdown_fires_and_the_triggered_window_is_input_bound(
    input_run: tuple[Path, Any, FitProfiler, _Ends, _Batches], capsys: pytest.CaptureFixture[str]
) -> None:
    root, trainer, fp, _, _ = input_run
    assert fp.reports[0].verdict != "input-bound"  # the scheduled window, steps 6-10, before the slowdown
    assert len(fp.triggered) == 1
    epoch, event, report = fp.triggered[0]
    assert epoch == 0 and SLOW_FROM + 1 <= event.step <= SLOW_FROM + 8  # within a few steps of the first slow one
    assert event.step_time_ms > event.baseline_ms
    assert report is not None and report.verdict == "input-bound"
    assert report.steps_analyzed >= 4
    sessions = [p.name for p in (root / "tb" / "version_0" / "plugins" / "profile").iterdir()]
    assert any(s.endswith(f"_epoch0_trigger_step{event.step}") for s in sessions), sessions
    # The trace: step S + 1 is the triggered window's warm-up step (recorded, not marked), S + 2 .. S + 6 analysed.
    (trace,) = (root / "tb" / "version_0").glob(f"*_epoch0_trigger_step{event.step}.pt.trace.json.gz")
    table = read_trace(trace)
    assert sorted(table.loc[table["kind"] == "step", "step_num"]) == list(range(event.step + 2, event.step + 7))
    assert report.steps_analyzed == 5
    scalars = _scalars(root)
    assert scalars[metrics.TRIGGER_STEP.key] == [float(event.step)]
    assert scalars[metrics.TRIGGER_STEP_TIME_MS.key][0] == pytest.approx(event.step_time_ms, rel=1e-5)
    assert scalars[metrics.TRIGGER_BASELINE_MS.key][0] == pytest.approx(event.baseline_ms, rel=1e-5)
    assert float(trainer.callback_metrics[metrics.TRIGGER_STEP.key]) == event.step


@pytest.mark.slow
def test_epoch_figures_reach_tensorboard_and_match_a_truth_timed_in_the_dataset(
    input_run: tuple[Path, Any, FitProfiler, _Ends, _Batches],
) -> None:
    root, trainer, fp, ends, dataset = input_run
    figures = fp.epoch_steps[0]
    scalars = _scalars(root)
    for metric, value in (
        (metrics.EPOCH_STEP_TIME_MS_P50, figures.step_time_ms_p50),
        (metrics.EPOCH_STEP_TIME_MS_P90, figures.step_time_ms_p90),
        (metrics.EPOCH_STEP_TIME_MS_MAX, figures.step_time_ms_max),
        (metrics.EPOCH_INPUT_PERCENT, figures.input_percent),
        (metrics.EPOCH_SAMPLES_PER_S, figures.samples_per_s),
        (metrics.EPOCH_STEPS_TIMED, figures.steps_timed),
    ):
        assert scalars[metric.key] == [pytest.approx(value, rel=1e-5)], metric.key
        assert float(trainer.callback_metrics[metric.key]) == pytest.approx(value, rel=1e-5)
    # Excluded: 3 warm-up steps, each window's profiler warm-up step (one step before its analysed ones),
    # its 5 steps and the 2 after it, twice (scheduled and triggered), and the step whose FLOPs are counted (the
    # one before the scheduled window's warm-up step: counting slows it).
    assert figures.steps_timed == STEPS - 3 - 2 * (1 + 5 + 2) - 1
    first = fp.profile_batch[0]
    assert first - 2 not in fp.steps.step_index and first - 1 not in fp.steps.step_index
    clean = fp.steps.step_index
    assert len(clean) == figures.steps_timed and 1 not in clean and 6 not in clean
    # Truth: the time spent inside the dataset during each clean step, over the clean steps' wall time (the
    # test's own step-end stamps).
    spans = np.asarray(dataset.spans, dtype=np.int64)
    waited = total = 0
    for n in clean:
        lo, hi = ends.ends[n - 1], ends.ends[n]
        waited += int(np.clip(np.minimum(spans[:, 1], hi) - np.maximum(spans[:, 0], lo), 0, None).sum())
        total += hi - lo
    truth = 100.0 * waited / total
    assert 20.0 < truth < 99.9
    assert figures.input_percent == pytest.approx(truth, abs=3.0)
    assert figures.samples_per_s == pytest.approx(BATCH * len(clean) / (total / 1e9), rel=0.05)
    assert figures.step_time_ms_max >= figures.step_time_ms_p90 >= figures.step_time_ms_p50 > 0


@pytest.mark.slow
def test_operator_slowdown_names_the_operator_that_grew(
    op_run: tuple[Path, Any, FitProfiler], capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, fp = op_run
    assert len(fp.triggered) == 1
    _, event, report = fp.triggered[0]
    assert SLOW_FROM + 1 <= event.step <= SLOW_FROM + 8
    assert report is not None and report.verdict != "input-bound"
    assert report.top_ops[0].name == "fitprof_test::slow_op"
    assert not [op for op in fp.reports[0].top_ops if op.name == "fitprof_test::slow_op"]


@pytest.mark.slow
def test_summary_lines(
    input_run: tuple[Path, Any, FitProfiler, _Ends, _Batches], op_run: tuple[Path, Any, FitProfiler]
) -> None:
    """The printed lines were captured by the fixtures' fits: read them back from the TensorBoard text."""
    for root, grew in ((input_run[0], None), (op_run[0], "grew most: fitprof_test::slow_op")):
        (run,) = {p.parent for p in (root / "tb").rglob("events.out.tfevents.*")}
        acc = EventAccumulator(str(run), size_guidance={"tensors": 0})
        acc.Reload()
        texts = [t.tensor_proto.string_val[0].decode() for t in acc.Tensors("fitprof/trigger/summary/text_summary")]
        assert len(texts) == 1
        assert "slowdown after step" in texts[0] and "vs the normal window of epoch 0" in texts[0]
        if grew:
            assert grew in texts[0]
        else:
            assert "-> input-bound" in texts[0]


def test_trigger_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="trigger must be None or one of \\['slowdown'\\]; got 'fast'"):
        FitProfiler(trigger="fast")
    with pytest.raises(ValueError, match="trigger_max_windows must be an int >= 1; got 0"):
        FitProfiler(trigger="slowdown", trigger_max_windows=0)
    with pytest.raises(TypeError, match="trigger_min_spacing must be an int >= 0"):
        FitProfiler(trigger="slowdown", trigger_min_spacing=1.5)  # type: ignore[arg-type]
    assert FitProfiler().trigger is None and math.isnan(FitProfiler().steps.summary().input_percent)

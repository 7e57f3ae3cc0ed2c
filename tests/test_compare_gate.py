"""``fitprof compare`` as a CI gate: direction and size, comparability from the setup, statistics over every epoch
of every run, a threshold per figure, CPU contention, and the baseline store. Planted report files (traces of known
durations analysed by fitprof, written with its own writer) and per-epoch files (written with its own writer) or
TensorBoard event files (tensorboard's writer): no timing of real fits, so every figure is known."""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

import fitprof
from contention import tolerates_load
from fitprof.cli import main
from fitprof.compare import (
    BOOTSTRAP_RESAMPLES,
    EVERY_STEP_INPUT_MS,
    KIND_RUN,
    Side,
    Stat,
    bootstrap,
    compare,
    load_side,
    operator_key,
    steps_per_epoch,
)
from fitprof.metrics import (
    EPOCH_CPU_PERCENT,
    EPOCH_INPUT_PERCENT,
    EPOCH_MEMORY_PEAK_MB,
    EPOCH_OWN_THREADS_CPU_PERCENT,
    EPOCH_RUN_WAIT_PERCENT,
    EPOCH_SAMPLES_PER_S,
    EPOCH_STARTUP_S,
    EPOCH_STEP_TIME_MS_P50,
    EPOCH_STEPS_TIMED,
    EPOCH_TRAIN_STEPS_S,
    EPOCH_VALIDATION_S,
)
from fitprof.report_files import append_epoch_record
from test_compare import BASE_OPS, as_json, kineto_window, log_epochs, row, run_cli, run_dir

P50 = EPOCH_STEP_TIME_MS_P50.key


def epochs(run: Path, rows: list[dict[str, float]], *, rank: int = 0) -> Path:
    """The per-epoch file of ``run``, one line per row (epochs 0, 1, ...), as the callbacks append it: one more
    call on the same run appends a second fit (another run of the folder)."""
    for epoch, figures in enumerate(rows):
        append_epoch_record(run, epoch=epoch, rank=rank, framework="lightning", figures=figures, verdicts=[])
    return run


def steady(p50s: list[float], **extra: float) -> list[dict[str, float]]:
    return [{P50: p, **extra} for p in p50s]


# ---------------------------------------------------------------------------------------- direction and size


def test_a_faster_candidate_never_fails_on_what_did_not_shrink(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The step 45% faster (its big operator cut), while a small operator grew 30% (+0.3 ms) and the input wait
    grew 50%: both take a larger share of a smaller step, past every threshold, yet the step did not grow by any of
    it, so nothing fails. The same operator growth on an unchanged step fails."""
    base = epochs(run_dir(tmp_path / "base", BASE_OPS, seed=1), steady([9.8, 9.9, 9.85]))
    faster_ops = {**BASE_OPS, "aten::addmm": 1.5, "aten::relu": 1.3}
    fast = epochs(run_dir(tmp_path / "fast", faster_ops, seed=2, input_ms=1.5), steady([5.3, 5.35, 5.4]))
    rc, records = as_json(capsys, base, fast)
    relu, wait = row(records, "aten::relu"), row(records, "input_ms_per_step")
    assert relu["change_percent"] > 25 and relu["significant"] and relu["candidate_percent"] > relu["baseline_percent"]
    assert wait["change_percent"] > 40 and wait["significant"]
    assert relu["step_held"] and not relu["regression"]
    assert wait["step_held"] and not wait["regression"]
    assert rc == 0, records[0]["headline"]
    assert row(records, P50)["change_percent"] < -40 and not row(records, P50)["worse"]
    # the same +0.3 ms on a step that grew by it is a regression
    grown_ops = {**BASE_OPS, "aten::relu": 2.3}
    grown = epochs(run_dir(tmp_path / "grown", grown_ops, seed=2), steady([11.1, 11.2, 11.15]))
    rc, records = as_json(capsys, base, grown, "--fail-over", "step=50")
    assert rc == 1 and row(records, "aten::relu")["regression"], records[0]["headline"]
    assert "aten::relu" in records[0]["headline"]


def test_a_falling_throughput_is_worse_and_a_rising_one_better(tmp_path: Path) -> None:
    """Throughput: lower is worse, in the windows and in the every-step figure."""
    base = load_side(
        epochs(
            run_dir(tmp_path / "base", BASE_OPS, seed=1, fields={"samples_per_s": 1000.0}),
            steady([8.0, 8.1, 8.05], **{EPOCH_SAMPLES_PER_S.key: 1000.0}),
        )
    )
    for name, value, worse in (("less", 700.0, True), ("more", 1400.0, False)):
        side = load_side(
            epochs(
                run_dir(tmp_path / name, BASE_OPS, seed=2, fields={"samples_per_s": value}),
                steady([8.0, 8.1, 8.05], **{EPOCH_SAMPLES_PER_S.key: value}),
            )
        )
        result = compare(base, side)
        for field in ("samples_per_s", EPOCH_SAMPLES_PER_S.key):
            change = next(c for c in result.figures if c.name == field)
            assert change.worse is worse, (field, value)


# ---------------------------------------------------------------------------------------- comparable setups


def test_operator_names_are_matched_across_keras_auto_numbering() -> None:
    assert operator_key("sequential_3/dense_2/MatMul") == "sequential/dense/MatMul"
    assert operator_key("dense_1/BiasAdd:0") == "dense/BiasAdd:0"
    assert operator_key("aten::linalg_qr") == "aten::linalg_qr"
    assert operator_key("ProfilerStep#12") == "ProfilerStep#12"
    assert operator_key("conv2d") == "conv2d"


def test_a_model_built_twice_is_the_same_operators(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The second model of a process numbers its layers anew: its operators are the first one's, unchanged."""
    first = {"sequential/dense/MatMul": 6.0, "sequential/dense_1/MatMul": 2.0, "sequential/dense_1/Relu": 0.5}
    second = {"sequential_1/dense_2/MatMul": 6.0, "sequential_1/dense_3/MatMul": 2.0, "sequential_1/dense_3/Relu": 0.5}
    base = run_dir(tmp_path / "base", first, seed=1)
    cand = run_dir(tmp_path / "cand", second, seed=2)
    rc, records = as_json(capsys, base, cand)
    assert rc == 0, records[0]["headline"]
    ops = [r for r in records if r["record"] == "operator"]
    assert {r["status"] for r in ops} == {"both"}
    assert row(records, "sequential/dense/MatMul")["baseline"] == pytest.approx(8.0, rel=0.05)  # dense + dense_1


def test_a_new_dominant_operator_is_a_named_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A QR decomposition added to each step (the step doubles): compared, not refused; exit 1, named."""
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    cand = run_dir(tmp_path / "cand", {**BASE_OPS, "aten::linalg_qr": 9.0}, seed=2)
    rc, records = as_json(capsys, base, cand)
    assert rc == 1
    qr = row(records, "aten::linalg_qr")
    assert qr["status"] == "new" and qr["regression"]
    assert "linalg_qr" in records[0]["headline"].split(";")[0]


# -------------------------------------------------------------------------------- every epoch of every run


def test_a_folder_of_runs_counts_every_run(tmp_path: Path) -> None:
    """Three runs in one folder, each with its own event file logging epochs 0-2: nine samples, three runs (runs
    logged at the same steps do not overwrite each other); the same from per-epoch files, two fits of one file
    being two runs."""
    pytest.importorskip("tensorboard")
    folder = tmp_path / "events"
    for n, p50s in enumerate(([8.0, 8.1, 8.2], [9.0, 9.1, 9.2], [10.0, 10.1, 10.2])):
        log_epochs(run_dir(folder / f"run{n}", BASE_OPS, seed=n), p50s)
    side = load_side(folder)
    assert sorted(side.epochs[P50]) == pytest.approx([8.0, 8.1, 8.2, 9.0, 9.1, 9.2, 10.0, 10.1, 10.2])
    assert side.runs == 3 and len(side.windows) == 9
    files = tmp_path / "files"
    epochs(run_dir(files / "a", BASE_OPS, seed=1), steady([8.0, 8.1]))
    epochs(files / "a", steady([8.2, 8.3]))  # a second fit into the same run
    epochs(run_dir(files / "b", BASE_OPS, seed=2), steady([9.0, 9.1]))
    side = load_side(files)
    assert sorted(side.epochs[P50]) == pytest.approx([8.0, 8.1, 8.2, 8.3, 9.0, 9.1])
    assert side.runs == 3


def test_the_effect_is_printed_with_its_interval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Six epochs a side (two runs of three): the ratio of the medians and its bootstrap interval, recomputed here
    from the samples, in the record and the headline."""
    base, cand = tmp_path / "base", tmp_path / "cand"
    b_values, c_values = [10.0, 10.2, 9.9, 10.1, 10.3, 9.8], [11.6, 11.4, 11.9, 11.5, 11.8, 11.7]
    for n in range(2):
        epochs(run_dir(base / f"r{n}", BASE_OPS, seed=n), steady(b_values[3 * n : 3 * n + 3]))
        epochs(run_dir(cand / f"r{n}", BASE_OPS, seed=10 + n), steady(c_values[3 * n : 3 * n + 3]))
    rc, records = as_json(capsys, base, cand)
    step = row(records, P50)
    _d_lo, _d_hi, r_lo, r_hi = bootstrap(b_values, c_values)
    assert step["ratio"] == pytest.approx(11.65 / 10.05)
    assert (step["ratio_low"], step["ratio_high"]) == pytest.approx((r_lo, r_hi))
    assert 1 < r_lo < step["ratio"] < r_hi
    assert step["regression"] and rc == 1
    assert records[0]["baseline_runs"] == 2 and records[0]["baseline_epochs"] == 6
    assert f"ratio {step['ratio']:.3f} [{r_lo:.3f}, {r_hi:.3f}] at 99%" in records[0]["headline"]
    assert BOOTSTRAP_RESAMPLES >= 1000


def test_overlapping_samples_are_not_significant() -> None:
    """Three samples a side: significant only when every candidate sample is past every baseline sample."""
    d_lo, _, _, _ = bootstrap([10.0, 10.5, 11.0], [10.9, 11.5, 12.0])
    assert d_lo <= 0
    d_lo, _, r_lo, _ = bootstrap([10.0, 10.5, 11.0], [11.1, 11.5, 12.0])
    assert d_lo > 0 and r_lo == pytest.approx(11.1 / 11.0)
    assert Stat.of([3.0, 1.0, 2.0]).median == 2.0


# -------------------------------------------------------------------------------------- a threshold a figure


def test_input_wait_gates_and_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """+20 ms in collate_fn on a ~50 ms step, on a noisy machine: the step time's epochs overlap (not
    significant), the input wait's (share x median step) do not: exit 1, the headline names the input wait."""
    base = epochs(
        run_dir(tmp_path / "base", BASE_OPS, seed=1),
        [{P50: p, EPOCH_INPUT_PERCENT.key: q} for p, q in ((50.0, 9.0), (62.0, 8.0), (45.0, 10.0))],
    )
    cand = epochs(
        run_dir(tmp_path / "cand", BASE_OPS, seed=2),
        [{P50: p, EPOCH_INPUT_PERCENT.key: q} for p, q in ((70.0, 35.0), (55.0, 40.0), (85.0, 33.0))],
    )
    rc, records = as_json(capsys, base, cand)
    step, wait = row(records, P50), row(records, "fitprof/epoch/input_ms_per_step")
    assert step["significant"] is False and not step["regression"]
    assert wait["significant"] and wait["regression"] and wait["gate"] == "input"
    assert rc == 1
    assert records[0]["headline"].startswith("regression: input wait, every step +")
    rc, records = as_json(capsys, base, cand, "--fail-over", "input=500")  # its own threshold: +390% passes
    assert rc == 0, records[0]["headline"]


STEPS = 20
"""Steps of each planted epoch."""


def timed_epochs(
    run: Path, *, step_ms: float, input_ms: float, startup_s: list[float], memory_mb: float = 1000.0
) -> Path:
    """The per-epoch file of ``run`` as the callbacks write it (:func:`append_epoch_record`): one epoch per
    ``startup_s``, each with :data:`STEPS` steps of ``step_ms`` (+-0.5 ms, a fixed pattern that differs by epoch)
    of which ``input_ms`` is the input wait, every clean step time kept, the epoch parts and the memory peak."""
    for epoch, startup in enumerate(startup_s):
        steps = [step_ms + 0.5 * ((n * 7 + epoch * 3) % 5 - 2) / 2 for n in range(STEPS)]
        p50 = sorted(steps)[STEPS // 2 - 1] / 2 + sorted(steps)[STEPS // 2] / 2
        figures = {
            P50: p50,
            EPOCH_INPUT_PERCENT.key: 100.0 * (input_ms + 0.05 * epoch) / p50,
            EPOCH_STEPS_TIMED.key: float(STEPS),
            EPOCH_TRAIN_STEPS_S.key: sum(steps) / 1000.0,
            EPOCH_STARTUP_S.key: startup,
            EPOCH_MEMORY_PEAK_MB.key: memory_mb + epoch,
        }
        append_epoch_record(
            run, epoch=epoch, rank=0, framework="lightning", figures=figures, verdicts=[], step_ms=steps
        )
    return run


def test_the_regression_that_costs_most_time_is_named_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """+20 ms in ``collate_fn`` on a ~50 ms step, as the callbacks record it: the input wait +20 ms on every step
    (4.5 -> 24.5 ms, +440%), and the epoch's start-up +20 ms once an epoch (its first batch's fetch: 1.7 -> 21.7 ms,
    +1200%). Both regress, and so does the memory peak (+50%); the headline names the input wait, which costs 400 ms
    an epoch, before the start-up's 20 ms, and the memory after every time. Ranked by percent, the start-up would
    be named."""
    ops = {**BASE_OPS, "fitprof_gate::work": 40.0}
    base = timed_epochs(
        run_dir(tmp_path / "base", ops, seed=1, input_ms=4.5),
        step_ms=52.0,
        input_ms=4.5,
        startup_s=[0.0017, 0.0016, 0.0018],
    )
    cand = timed_epochs(
        run_dir(tmp_path / "cand", ops, seed=2, input_ms=24.5),
        step_ms=72.0,
        input_ms=24.5,
        startup_s=[0.0217, 0.0216, 0.0218],
        memory_mb=1500.0,
    )
    rc, records = as_json(capsys, base, cand)
    head, wait, startup = records[0], row(records, EVERY_STEP_INPUT_MS), row(records, EPOCH_STARTUP_S.key)
    assert rc == 1, head["headline"]
    assert wait["regression"] and startup["regression"] and row(records, EPOCH_MEMORY_PEAK_MB.key)["regression"]
    assert startup["change_percent"] > 1000 > 500 > wait["change_percent"] > 400  # by percent: the start-up
    assert head["steps_per_epoch"] == pytest.approx(STEPS, rel=0.02)
    assert wait["cost_ms_per_epoch"] == pytest.approx(wait["change"] * head["steps_per_epoch"])
    assert wait["cost_ms_per_epoch"] == pytest.approx(400, rel=0.05)
    assert startup["cost_ms_per_epoch"] == pytest.approx(20.0, rel=1e-6)
    assert row(records, EPOCH_MEMORY_PEAK_MB.key)["cost_ms_per_epoch"] is None  # no time: null in strict JSON
    first = head["headline"].split(";")[0]
    assert first.startswith("regression: input wait, every step +"), head["headline"]
    assert first.endswith("(and 2 more)")  # the start-up and the memory peak
    result = compare(load_side(base), load_side(cand))
    # the step time first, then by time (the memory peak, no time, after every time)
    assert [c.name for c in result.regressions] == [
        P50,
        EVERY_STEP_INPUT_MS,
        EPOCH_STARTUP_S.key,
        EPOCH_MEMORY_PEAK_MB.key,
    ]


def test_an_epoch_part_that_costs_more_is_named_before_the_input_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The other way round: the input wait +2 ms a step (+400%, 40 ms an epoch of 20 steps) and the start-up +1 s an
    epoch (workers spawned slower: +50%): the start-up costs more and is named first, though its percent is
    smaller."""
    base = timed_epochs(
        run_dir(tmp_path / "base", BASE_OPS, seed=1), step_ms=50.0, input_ms=0.5, startup_s=[2.0, 2.01, 2.02]
    )
    cand = timed_epochs(
        run_dir(tmp_path / "cand", BASE_OPS, seed=2), step_ms=52.0, input_ms=2.5, startup_s=[3.0, 3.01, 3.02]
    )
    rc, records = as_json(capsys, base, cand)
    wait, startup = row(records, EVERY_STEP_INPUT_MS), row(records, EPOCH_STARTUP_S.key)
    assert rc == 1 and wait["regression"] and startup["regression"], records[0]["headline"]
    assert wait["change_percent"] > 150 > 60 > startup["change_percent"]
    assert startup["cost_ms_per_epoch"] == pytest.approx(1000.0) and wait["cost_ms_per_epoch"] < 50
    assert records[0]["headline"].startswith("regression: epoch start-up, every epoch +"), records[0]["headline"]


def test_an_input_wait_growth_the_step_hardly_feels_does_not_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs of the same code, as measured on a quiet machine: the input wait +0.5 ms a step (0.5 -> 1.0 ms,
    +100%, past its 10% threshold and --min-ms) on a 50 ms step that grew 0.5 ms: 1% of the step, under
    PART_MIN_STEP_PERCENT's 3%, so not a regression; +2 ms (4% of the step) is."""
    base = timed_epochs(
        run_dir(tmp_path / "base", BASE_OPS, seed=1), step_ms=50.0, input_ms=0.5, startup_s=[2.0, 2.0, 2.0]
    )
    cand = timed_epochs(
        run_dir(tmp_path / "cand", BASE_OPS, seed=2), step_ms=50.5, input_ms=1.0, startup_s=[2.0, 2.0, 2.0]
    )
    rc, records = as_json(capsys, base, cand)
    wait = row(records, EVERY_STEP_INPUT_MS)
    assert wait["change_percent"] > 90 and wait["significant"] and wait["change"] > 0.1
    assert rc == 0 and not wait["regression"] and wait["small_for_step"], records[0]["headline"]
    rc, out, _ = run_cli(capsys, base, cand)
    assert "slower, small for the step" in out
    worse = timed_epochs(
        run_dir(tmp_path / "worse", BASE_OPS, seed=3), step_ms=52.0, input_ms=2.5, startup_s=[2.0, 2.0, 2.0]
    )
    rc, records = as_json(capsys, base, worse)
    assert rc == 1 and row(records, EVERY_STEP_INPUT_MS)["regression"], records[0]["headline"]


def test_steps_per_epoch_from_the_epochs_figures() -> None:
    """The steps an epoch ran: its training-step time over its median step, else its clean steps, the median over
    the epochs; NaN without an epoch."""
    rows = [
        {EPOCH_TRAIN_STEPS_S.key: 1.0, P50: 50.0, EPOCH_STEPS_TIMED.key: 12.0},  # 20 steps, 12 of them clean
        {EPOCH_TRAIN_STEPS_S.key: 1.1, P50: 50.0},
        {EPOCH_STEPS_TIMED.key: 9.0},  # written without the epoch parts
    ]
    side = Side("run", KIND_RUN, [], rows=rows)
    assert steps_per_epoch(side) == pytest.approx(20.0)
    assert steps_per_epoch(dataclasses.replace(side, rows=rows[2:])) == 9.0
    assert math.isnan(steps_per_epoch(dataclasses.replace(side, rows=[])))


def _collate_run(root: Path, name: str, collate_ms: float) -> Path:
    """A tiny Lightning MLP, 3 epochs of 20 steps, one 5-step window each (``FitProfiler``, written into its run
    directory); its loader's steady batches take 5 ms (a sleep in ``Dataset.__getitem__`` at each batch's first
    sample) while the first batch of an epoch is ready at once (a warm cache), and ``collate_fn`` sleeps
    ``collate_ms`` on every batch. Sleep-modelled: the waits are set, not the machine's speed."""
    import time

    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, Dataset, default_collate

    from fitprof.lightning import FitProfiler

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    batch, steps = 16, 20
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(steps * batch, 32, generator=g), torch.randint(0, 4, (steps * batch,), generator=g)

    class Slow(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return len(xs)

        def __getitem__(self, i: int) -> Any:
            if i and i % batch == 0:  # each batch but the epoch's first (no shuffle: batch k starts at k * batch)
                time.sleep(0.005)
            return xs[i], ys[i]

    def collate(items: Any) -> Any:
        time.sleep(collate_ms / 1000)
        return default_collate(items)

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

        def training_step(self, b: Any, batch_idx: int) -> Any:
            return torch.nn.functional.cross_entropy(self.net(b[0]), b[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    run = root / name
    trainer = pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[FitProfiler(log_dir=run, profile_batch=(6, 10), verbose=False)],
    )
    trainer.fit(Model(), DataLoader(Slow(), batch_size=batch, collate_fn=collate))
    return run


@pytest.mark.slow
@tolerates_load
def test_a_slower_collate_fn_in_real_lightning_runs_names_the_input_wait(tmp_path: Path) -> None:
    """Two real Lightning runs, the candidate's ``collate_fn`` sleeping 20 ms a batch: the first batch of each
    epoch is fetched in its start-up, which grows 20 ms once an epoch from a few ms (a larger percent than the
    input wait's 5 -> 25 ms), while the input wait grows 20 ms on every step. The headline names the input wait.
    A busy machine may make a side CPU-contended (then the status is inconclusive, and the figures, read with the
    contention set aside, still name the input wait). The candidate is trained first: the first fit of a process
    spends some 20 ms more in its first epoch's start-up, which would hide the baseline's start-up growth."""
    pytest.importorskip("lightning")
    root = Path(tempfile.mkdtemp(dir=tmp_path))  # a retry under load trains afresh
    cand = _collate_run(root, "cand", 20.0)
    base = _collate_run(root, "base", 0.0)
    result = compare(load_side(base), load_side(cand))
    assert result.status in ("regression", "inconclusive"), result.headline()
    figures = dataclasses.replace(result, contention=[])
    wait = next(c for c in result.figures if c.name == EVERY_STEP_INPUT_MS)
    startup = next(c for c in result.figures if c.name == EPOCH_STARTUP_S.key)
    assert wait.regression and wait.change > 15, figures.headline()
    # the case that misleads a ranking by percent: the start-up regressed too, by a larger percent
    assert startup.regression and startup.change_percent > wait.change_percent, figures.headline()
    assert figures.headline().startswith("regression: input wait, every step +"), figures.headline()
    if not result.contention:
        assert result.headline() == figures.headline()


def test_every_figure_has_its_own_threshold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Validation +30% and memory peak +8%: each fails at its own threshold and passes above it."""
    rows = steady([8.0, 8.1, 8.05], **{EPOCH_VALIDATION_S.key: 2.0, EPOCH_MEMORY_PEAK_MB.key: 1000.0})
    base = epochs(run_dir(tmp_path / "base", BASE_OPS, seed=1), rows)
    worse = [
        {**r, EPOCH_VALIDATION_S.key: 2.6 + 0.01 * n, EPOCH_MEMORY_PEAK_MB.key: 1080.0} for n, r in enumerate(rows)
    ]
    cand = epochs(run_dir(tmp_path / "cand", BASE_OPS, seed=2), worse)
    rc, records = as_json(capsys, base, cand)
    assert rc == 1
    assert (
        row(records, EPOCH_VALIDATION_S.key)["regression"] and not row(records, EPOCH_MEMORY_PEAK_MB.key)["regression"]
    )
    rc, records = as_json(capsys, base, cand, "--fail-over", "validation=40")
    assert rc == 0, records[0]["headline"]
    rc, records = as_json(capsys, base, cand, "--fail-over", "validation=40", "--fail-over", "memory=5")
    assert rc == 1 and [r["name"] for r in records if r.get("regression")] == [EPOCH_MEMORY_PEAK_MB.key]
    assert records[0]["thresholds"]["memory"] == 5 and records[0]["thresholds"]["step"] == 10
    rc, out, err = run_cli(capsys, base, cand, "--fail-over", "latency=5")
    assert rc == 2 and out == "" and "unknown figure 'latency'" in err and "validation" in err


# ---------------------------------------------------------------------------------------------- contention


def test_a_contended_side_is_inconclusive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The candidate's thread waited for a core 35-41% of two of its three epochs: inconclusive (exit 3), whatever
    the figures say, naming the side and the wait; --inconclusive fail / pass make it 1 / 0."""
    base = epochs(
        run_dir(tmp_path / "base", BASE_OPS, seed=1), steady([8.0, 8.1, 8.05], **{EPOCH_RUN_WAIT_PERCENT.key: 2.0})
    )
    rows = steady([8.0, 8.1, 8.05])
    for r, wait in zip(rows, (35.0, 41.0, 5.0), strict=True):
        r[EPOCH_RUN_WAIT_PERCENT.key] = wait
    cand = epochs(run_dir(tmp_path / "cand", BASE_OPS, seed=2), rows)
    rc, records = as_json(capsys, base, cand)
    assert rc == 3 and records[0]["status"] == "inconclusive"
    assert records[0]["contention"] == [
        "candidate: 2 of 3 epochs CPU-contended (the training thread waited for a core up to 41% of the wall time)"
    ]
    assert "candidate: 2 of 3 epochs CPU-contended" in records[0]["headline"]
    assert as_json(capsys, base, cand, "--inconclusive", "fail")[0] == 1
    assert as_json(capsys, base, cand, "--inconclusive", "pass")[0] == 0
    rc, out, _ = run_cli(capsys, base, cand, "--format", "markdown")
    assert out.startswith("### fitprof compare: INCONCLUSIVE")
    # a regression on a contended side is inconclusive too: the step times measured the wait
    slow = epochs(
        run_dir(tmp_path / "slow", {**BASE_OPS, "aten::addmm": 9.0}, seed=3), [{**r, P50: 11.0} for r in rows]
    )
    rc, records = as_json(capsys, base, slow)
    assert rc == 3 and any(r.get("regression") for r in records)
    # one contended epoch of four is not a contended side
    calm = epochs(run_dir(tmp_path / "calm", BASE_OPS, seed=4), [*rows[2:], *rows[2:], *rows[2:], rows[0]])
    assert as_json(capsys, base, calm)[0] == 0


def test_a_mostly_sleeping_thread_contended_by_its_runnable_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A training thread that needs a core a third of the time (a sleep-modelled or GPU-blocked step) waited for
    one 16% of the wall time, under the 20% line, but 45% of the time it was ready to run (16 over 16 + 35 - 15):
    contended, as measured beside 2 busy processes; the quiet machine's 1% of its runnable time is not."""
    quiet = {EPOCH_RUN_WAIT_PERCENT.key: 0.2, EPOCH_CPU_PERCENT.key: 42.0, EPOCH_OWN_THREADS_CPU_PERCENT.key: 15.0}
    base = epochs(run_dir(tmp_path / "base", BASE_OPS, seed=1), steady([8.0, 8.1, 8.05], **quiet))
    busy = {EPOCH_RUN_WAIT_PERCENT.key: 16.0, EPOCH_CPU_PERCENT.key: 35.0, EPOCH_OWN_THREADS_CPU_PERCENT.key: 15.0}
    cand = epochs(run_dir(tmp_path / "cand", BASE_OPS, seed=2), steady([8.0, 8.1, 8.05], **busy))
    rc, records = as_json(capsys, base, cand)
    assert rc == 3, records[0]["headline"]
    assert records[0]["contention"] == [
        "candidate: 3 of 3 epochs CPU-contended (the training thread waited for a core up to 16% of the wall time, "
        "44% of the time it was ready to run)"
    ]
    same = epochs(run_dir(tmp_path / "same", BASE_OPS, seed=3), steady([8.0, 8.1, 8.05], **quiet))
    assert as_json(capsys, base, same)[0] == 0
    # without the CPU figures the wall-time line alone decides
    bare = epochs(
        run_dir(tmp_path / "bare", BASE_OPS, seed=4), steady([8.0, 8.1, 8.05], **{EPOCH_RUN_WAIT_PERCENT.key: 16.0})
    )
    assert as_json(capsys, base, bare)[0] == 0


def test_a_window_of_a_contended_epoch_is_inconclusive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A side of report files only: a window whose epoch the callback found CPU-contended makes it inconclusive."""
    base = run_dir(tmp_path / "base", BASE_OPS, seed=1)
    cand = run_dir(tmp_path / "cand", BASE_OPS, seed=2, fields={"contention": "run-queue wait 33% of the epoch"})
    rc, records = as_json(capsys, base, cand)
    assert rc == 3 and records[0]["contention"] == ["candidate: 3 window(s) of a CPU-contended epoch"]


# ------------------------------------------------------------------------------------------ the baseline store


def test_save_compare_against_accept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``baseline save``, ``compare --against``, ``--accept --reason`` (the decision recorded, the candidate the new
    baseline), and the next comparison printing the decision; the store a folder, then a ``memory://`` URL."""
    pytest.importorskip("fsspec")
    base = epochs(run_dir(tmp_path / "base", BASE_OPS, seed=1), steady([8.0, 8.1, 8.05]))
    slow = epochs(run_dir(tmp_path / "slow", {**BASE_OPS, "aten::addmm": 9.0}, seed=2), steady([11.0, 11.1, 11.05]))
    for store in (os.fspath(tmp_path / "store"), "memory://fitprof-test-store"):
        capsys.readouterr()
        assert main(["baseline", "save", "main", os.fspath(base), "--store", store]) == 0
        assert "saved" in capsys.readouterr().out
        rc, records = as_json(capsys, "--against", "main", slow, "--store", store)
        assert rc == 1 and records[0]["baseline"] == "baseline 'main'"
        assert records[0]["baseline_epochs"] == 3
        rc, _, err = run_cli(capsys, "--against", "main", slow, "--store", store, "--accept")
        assert rc == 2 and "--reason" in err
        rc, records = as_json(
            capsys, "--against", "main", slow, "--store", store, "--accept", "--reason", "QR needed for accuracy"
        )
        assert rc == 0 and any("accepted as the baseline 'main'" in n for n in records[0]["notes"])
        rc, records = as_json(capsys, "--against", "main", slow, "--store", store)
        assert rc == 0, records[0]["headline"]
        note = records[0]["notes"][0]
        assert note.startswith("baseline 'main': last decision: accepted ") and "QR needed for accuracy" in note
        assert "it was regression" in note and "aten::addmm" in note
    rc, _, err = run_cli(capsys, "--against", "nope", slow, "--store", os.fspath(tmp_path / "store"))
    assert rc == 2 and "no baseline 'nope'" in err
    capsys.readouterr()
    assert main(["baseline", "save", "../x", os.fspath(base), "--store", os.fspath(tmp_path / "store")]) == 2
    assert main(["baseline", "save", "x", os.fspath(tmp_path / "missing"), "--store", os.fspath(tmp_path)]) == 2
    rc, _out, err = run_cli(capsys, base)
    assert rc == 2 and "BASELINE CANDIDATE" in err


def test_markdown_for_a_pull_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = epochs(run_dir(tmp_path / "base", BASE_OPS, seed=1), steady([8.0, 8.1, 8.05]))
    cand = epochs(run_dir(tmp_path / "cand", {**BASE_OPS, "aten::linalg_qr": 9.0}, seed=2), steady([17.0, 17.1, 17.2]))
    rc, out, _ = run_cli(capsys, base, cand, "--format", "markdown")
    assert rc == 1
    lines = out.splitlines()
    assert lines[0] == "### fitprof compare: REGRESSION"
    assert lines[2].startswith("**regression: aten::linalg\\_qr new") or "linalg" in lines[2]
    assert any(line.startswith("| step time, every step (median) |") and "REGRESSION" in line for line in lines)
    assert any("ratio [interval]" in line for line in lines)


def test_a_single_window_against_a_baseline_still_works(tmp_path: Path) -> None:
    """The callbacks' ``baseline=`` path: one window against a baseline's windows (the function the epoch end
    calls), a slower operator a regression."""
    from fitprof.compare import against_baseline, load_baseline

    base = load_baseline(epochs(run_dir(tmp_path / "base", BASE_OPS, seed=1), steady([8.0, 8.1, 8.05])))
    trace = kineto_window(tmp_path / "slow.pt.trace.json", {**BASE_OPS, "aten::cumsum": 2.5}, seed=7, jitter=0.02)
    vs = against_baseline(base, dataclasses.replace(fitprof.analyze(trace), samples_per_step=32.0), epoch=1)
    assert vs.regressed and vs.step_time_percent > 20
    assert "aten::cumsum" in vs.line()

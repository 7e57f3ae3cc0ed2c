"""Lightning: the whole dict of figures fitprof hands the loggers at each epoch's end, compared key by key and value
by value, on a fake clock (``time.perf_counter_ns`` patched, as Lightning's ``ThroughputMonitor`` tests patch
theirs).

A real ``Trainer`` fits the tiny model; each training step moves the fake clock by 10 ms and nothing else does, so
every figure timed by fitprof's clock is known exactly. The window's figures must be its report's, the process's
own readings finite numbers; Lightning's loggers get finite figures only (a NaN is never logged).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.loggers.logger import Logger  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import lightning_tiny  # noqa: E402
from engine_fakes import Clock  # noqa: E402
from fitprof import metrics  # noqa: E402
from fitprof.lightning import FitProfiler  # noqa: E402
from logged_dict import MEASURED, PROCESS_EPOCH_KEYS, compare, window_from_report  # noqa: E402

EPOCHS, STEPS, STEP_MS, TOP_K = 3, 10, 10.0, 3


class _Ticking(lightning_tiny.Tiny):
    """Each training step takes 10 ms of the fake clock."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.clock.tick(STEP_MS)
        return super().training_step(batch, batch_idx)


class _Kept(Logger):
    """A logger that keeps every ``log_metrics`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[dict[str, float], int | None]] = []

    @property
    def name(self) -> str:
        return "kept"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls.append((dict(metrics), step))


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, dict[str, float]], Any]:
    clock = Clock()
    patch = pytest.MonkeyPatch()
    patch.setattr(time, "perf_counter_ns", clock)  # every fitprof clock read: the adapter's, the hook timers'
    try:
        fp = FitProfiler(profile_batch=(3, 5), every_n_epochs=2, top_k=TOP_K, verbose=False)
        fp._engine.clock = fp._engine.parts._clock = clock  # bound when the engine was made
        # The loader model weighs the main thread's CPU time against the step's wall time: on the fake clock the
        # step takes no CPU either, or a slow machine's real CPU time would outweigh the fake step and ask for a worker.
        fp._loader.cpu_clock = lambda: 0
        kept = _Kept()
        tmp = tmp_path_factory.mktemp("dict")
        trainer = lightning_tiny.trainer(tmp, [fp], max_epochs=EPOCHS, logger=kept, log_every_n_steps=1000)
        trainer.fit(_Ticking(clock), lightning_tiny.loader(STEPS))
    finally:
        patch.undo()
    by_epoch: dict[int, dict[str, float]] = {}
    for logged, _ in kept.calls:
        if "epoch" in logged:
            by_epoch.setdefault(int(logged["epoch"]), {}).update(logged)
    return by_epoch, fp


def _expected(fp: Any, epoch: int) -> dict[str, Any]:
    wall_s = STEPS * STEP_MS / 1e3  # the fake clock moves only inside the training steps
    expected: dict[str, Any] = {"epoch": float(epoch), **window_from_report(fp.reports.get(epoch), TOP_K)}
    expected.update(
        {
            metrics.EPOCH_STEP_TIME_MS_P50.key: STEP_MS,
            metrics.EPOCH_STEP_TIME_MS_P90.key: STEP_MS,
            metrics.EPOCH_STEP_TIME_MS_MAX.key: STEP_MS,
            metrics.EPOCH_INPUT_PERCENT.key: 0.0,  # the fetch takes no time on the fake clock
            metrics.EPOCH_SAMPLES_PER_S.key: 4 / (STEP_MS / 1e3),  # batches of 4
            metrics.EPOCH_STEPS_TIMED.key: float(fp.epoch_steps[epoch].steps_timed),
            metrics.EPOCH_WALL_S.key: wall_s,
            metrics.EPOCH_TRAIN_STEPS_S.key: wall_s,
            metrics.EPOCH_INPUT_S.key: 0.0,
            metrics.EPOCH_VALIDATION_S.key: 0.0,
            metrics.EPOCH_CHECKPOINT_S.key: 0.0,
            metrics.EPOCH_CALLBACKS_S.key: 0.0,
            metrics.EPOCH_STARTUP_S.key: 0.0,
            metrics.EPOCH_PROFILING_S.key: 0.0,
            metrics.EPOCH_OTHER_S.key: 0.0,
            **dict.fromkeys(PROCESS_EPOCH_KEYS, MEASURED),
            metrics.EPOCH_MEMORY_GROWTH_MB.key: math.nan if epoch == 0 else MEASURED,  # against the previous epoch
            # The loader loads in the main process (no workers), in no time on the fake clock.
            metrics.LOADER_WORKERS.key: 0.0,
            metrics.LOADER_BUSY_PERCENT.key: 0.0,
            metrics.LOADER_BATCH_MS.key: 0.0,
            metrics.LOADER_WORKERS_NEEDED.key: 0.0,
            metrics.LOADER_STEP_TIME_IF_ENOUGH_WORKERS_MS.key: STEP_MS,
        }
    )
    # Lightning's loggers get finite figures only: the NaN ones (no window, no loader workers, no trigger) are left
    # out.
    return {k: v for k, v in expected.items() if v is MEASURED or not math.isnan(v)}


@pytest.mark.slow
@pytest.mark.parametrize("epoch", range(EPOCHS))
def test_each_epoch_hands_the_loggers_the_whole_expected_dict(
    fitted: tuple[dict[int, dict[str, float]], Any], epoch: int
) -> None:
    logged, fp = fitted
    assert sorted(fp.reports) == [0, 2]  # every_n_epochs=2
    wrong = compare(logged[epoch], _expected(fp, epoch), rel=1e-6)  # pl_module.log keeps float32
    assert wrong == [], "\n".join(wrong)

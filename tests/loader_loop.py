"""A plain torch training loop with modelled work, driving :class:`fitprof.fit.loader.LoaderProbe` as an engine would.

The step sleeps (a host waiting for its GPU); each sample's ``__getitem__`` sleeps or burns CPU, and the collate
sleeps. The dataset and the collate time themselves into a shared array, per worker: the truth the probe's busy
share is compared with. Used by ``tests/test_loader_torch.py`` and ``benchmarks/loader_prediction.py``.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from fitprof.fit.loader import LoaderEpoch, LoaderProbe
from fitprof.profilers.loader import DataLoaderTiming

MAX_WORKERS = 8


def _slot() -> int:
    info = get_worker_info()
    return info.id + 1 if info is not None else 0


def _burn(ns: int) -> None:
    end = time.thread_time_ns() + ns
    x = 0
    while time.thread_time_ns() < end:
        x += 1


class ModelledDataset(Dataset):  # type: ignore[type-arg]
    """``size`` samples; each ``__getitem__`` sleeps ``item_ms`` (``cpu=True``: burns that much CPU time) and adds its
    own wall time to ``truth[worker slot]`` (slot 0: the main process)."""

    def __init__(self, size: int, item_ms: float, truth: Any, *, cpu: bool = False) -> None:
        self.size, self.item_ns, self.truth, self.cpu = size, int(item_ms * 1e6), truth, cpu

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> torch.Tensor:
        t0 = time.perf_counter_ns()
        if self.cpu:
            _burn(self.item_ns)
        else:
            time.sleep(self.item_ns * 1e-9)
        out = torch.full((8,), float(i))
        self.truth[_slot()] += time.perf_counter_ns() - t0
        return out


class ModelledCollate:
    """``default_collate`` after a sleep of ``ms``, timed into the same truth array."""

    def __init__(self, ms: float, truth: Any) -> None:
        self.ns, self.truth = int(ms * 1e6), truth

    def __call__(self, samples: list[Any]) -> Any:
        t0 = time.perf_counter_ns()
        if self.ns:
            time.sleep(self.ns * 1e-9)
        out = default_collate(samples)
        self.truth[_slot()] += time.perf_counter_ns() - t0
        return out


@dataclass
class EpochRun:
    """One epoch of :func:`run`: the probe's figures, the truth and the loop's own clock."""

    workers: int
    probe: LoaderEpoch | None
    truth_busy_percent: float
    step_ms: float
    """The mean period between step ends over the steady steps (the probe's rule: after ``workers + 2`` steps, a
    whole multiple of ``max(1, workers)`` steps), by the loop's own clock."""
    batches_equal: bool


def run(
    workers: int,
    *,
    steps: int = 48,
    batch_size: int = 2,
    item_ms: float = 20.0,
    collate_ms: float = 0.0,
    step_ms: float = 6.0,
    epochs: int = 1,
    ctx: str | None = None,
    persistent: bool = False,
    cpu: bool = False,
    cores: int | None = None,
) -> list[EpochRun]:
    """Train ``epochs`` epochs of ``steps`` steps with ``workers`` workers and the probe attached."""
    torch.set_num_threads(1)
    truth = multiprocessing.get_context(ctx).RawArray(ctypes.c_int64, MAX_WORKERS + 1)
    ds = ModelledDataset(steps * batch_size, item_ms, truth, cpu=cpu)
    expected = [torch.arange(i, i + batch_size, dtype=torch.float32) for i in range(0, steps * batch_size, batch_size)]
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        num_workers=workers,
        collate_fn=ModelledCollate(collate_ms, truth),
        multiprocessing_context=ctx if workers else None,
        persistent_workers=persistent and workers > 0,
    )
    timing = DataLoaderTiming.attach(loader)
    probe = LoaderProbe(timing, cores=cores)
    clock = time.perf_counter_ns
    out: list[EpochRun] = []
    try:
        for epoch in range(epochs):
            before = list(truth)
            t_start = clock()
            probe.epoch_start(epoch, now_ns=t_start)
            ends: list[int] = []
            equal = True
            for step, batch in enumerate(loader, start=1):
                probe.step_start(step, batch, now_ns=clock())
                equal = equal and torch.equal(batch[:, 0], expected[step - 1])
                time.sleep(step_ms * 1e-3)
                t = clock()
                probe.step_end(step, batch, now_ns=t)
                ends.append(t)
            t_end = clock()
            probe.epoch_end(epoch, now_ns=t_end)
            done = [a - b for a, b in zip(truth, before, strict=True)]
            wall = t_end - t_start
            if workers:
                truth_busy = 100.0 * sum(done[1:]) / (workers * wall)
            else:
                truth_busy = 100.0 * done[0] / wall
            skip = workers + 2
            steady = len(ends) - skip
            whole = (steady // max(1, workers)) * max(1, workers)
            period = (ends[-1] - ends[-1 - whole]) / whole * 1e-6 if whole else float("nan")
            out.append(EpochRun(workers, probe.last, truth_busy, period, equal and len(ends) == steps))
    finally:
        timing.detach()
    return out

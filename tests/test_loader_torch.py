"""The DataLoader worker timing (fitprof.profilers.loader) inside real workers, and the loader probe's prediction
checked by re-measuring with the predicted number of workers, on a plain torch loop with sleep-modelled work
(tests/loader_loop.py: the step sleeps as a host waits for its GPU, each ``__getitem__`` sleeps).

Tolerances: the busy share against the truth the dataset and collate time themselves, 10 pp (the issue's target;
measured 0.0-1.2 pp apart on 2 cores at load 8-11); the predicted step time against the re-measured one, 20% (the
issue's target; for the spread see benchmarks/loader_prediction.py).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from contention import tolerates_load  # noqa: E402
from fitprof.profilers.loader import AttachOnIter, DataLoaderTiming, _TimedInit  # noqa: E402
from loader_loop import ModelledCollate, ModelledDataset, run  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


class _MarkInit:
    """A user's worker_init_fn: marks its worker in a shared array (picklable for spawn)."""

    def __init__(self, marks: Any) -> None:
        self.marks = marks

    def __call__(self, worker_id: int) -> None:
        self.marks[worker_id] += 1


def _loader(workers: int, ctx: str | None = None, persistent: bool = False, init: Any = None) -> DataLoader:
    truth = multiprocessing.get_context(ctx).RawArray(ctypes.c_int64, 9)
    return DataLoader(
        ModelledDataset(32, 2.0, truth),
        batch_size=4,
        num_workers=workers,
        collate_fn=ModelledCollate(0.0, truth),
        multiprocessing_context=ctx if workers else None,
        persistent_workers=persistent,
        worker_init_fn=init,
    )


def test_no_workers_attach_nothing_and_the_wait_is_the_loading() -> None:
    def init(worker_id: int) -> None:
        return None

    loader = _loader(0, init=init)
    timing = DataLoaderTiming.attach(loader)
    assert timing.workers == 0 and timing.read() is None and loader.worker_init_fn is init
    timing.detach()
    assert loader.worker_init_fn is init
    (epoch,) = run(0, steps=24, batch_size=4, item_ms=5.0, step_ms=8.0)
    assert epoch.batches_equal and epoch.probe is not None
    assert epoch.probe.workers == 0
    # W is the main process's wait: 4 sleeps of 5 ms, at least
    assert epoch.probe.batch_ns >= 20e6
    assert abs(epoch.probe.busy_percent - epoch.truth_busy_percent) <= 10.0
    assert epoch.probe.needed >= 1 and (epoch.probe.advice() or "").startswith(f"num_workers={epoch.probe.needed} ")


def test_attach_chains_and_detach_restores() -> None:
    marks = multiprocessing.RawArray(ctypes.c_int64, 2)
    user = _MarkInit(marks)
    loader = _loader(2, init=user)
    timing = DataLoaderTiming.attach(loader)
    assert isinstance(loader.worker_init_fn, _TimedInit) and loader.worker_init_fn.user is user
    again = DataLoaderTiming.attach(loader)  # a second attach shares the first one's counters
    assert again.workers == 2 and again.read() == timing.read()
    timing.detach()
    assert loader.worker_init_fn is user
    with pytest.raises(TypeError, match=r"expected a torch\.utils\.data\.DataLoader, got list"):
        DataLoaderTiming.attach([1, 2])


@pytest.mark.slow
@pytest.mark.parametrize(("ctx", "persistent"), [("fork", False), ("fork", True), ("spawn", True)])
def test_workers_are_timed_batches_untouched(ctx: str, persistent: bool) -> None:
    """Fork and spawn workers, persistent or not: each batch is the one an untimed loader gives, every batch is
    counted once per epoch, the user's worker_init_fn still runs, and the busy share is the truth's."""
    marks = multiprocessing.get_context(ctx).RawArray(ctypes.c_int64, 2)
    loader = _loader(2, ctx, persistent, _MarkInit(marks))
    truth = loader.dataset.truth
    plain = [b.clone() for b in DataLoader(loader.dataset, batch_size=4, collate_fn=loader.collate_fn)]
    truth[0] = 0  # slot 0 is the main process's, which made `plain`
    timing = DataLoaderTiming.attach(loader)
    for epoch in range(2):
        t0 = time.perf_counter_ns()
        got = list(loader)
        wall = time.perf_counter_ns() - t0
        assert len(got) == len(plain) and all(torch.equal(a, b) for a, b in zip(got, plain, strict=True))
        counts = timing.read()
        assert counts is not None and sum(counts.batches) == 8 * (epoch + 1)
        # each worker's busy time holds the truth its samples and collates timed (4 batches of 4 x 2 ms sleeps a
        # worker an epoch, at least), within 10 pp of the epoch's wall time (a preemption between the two clocks)
        for w in range(2):
            assert truth[1 + w] >= 32e6 * (epoch + 1)
            assert truth[1 + w] <= counts.busy_ns[w], (counts.busy_ns, list(truth))
            assert counts.busy_ns[w] - truth[1 + w] <= 0.1 * wall, (counts.busy_ns, list(truth), wall)
        truth[1], truth[2] = counts.busy_ns  # the next epoch's error counts from here
    assert list(marks) == ([1, 1] if persistent else [2, 2])
    timing.detach()
    assert loader.worker_init_fn is not None and not isinstance(loader.worker_init_fn, _TimedInit)
    list(loader)  # persistent workers still hold the wrapper: it stops counting once detached
    assert sum(timing.read().batches) == 16  # type: ignore[union-attr]
    if ctx == "fork" and not persistent:  # the busy share against the truth, through the probe, on a modelled loop
        (first, second) = run(2, steps=16, item_ms=6.0, step_ms=8.0, ctx=ctx, persistent=persistent, epochs=2)
        for e in (first, second):
            assert e.batches_equal and e.probe is not None
            assert abs(e.probe.busy_percent - e.truth_busy_percent) <= 10.0, (
                e.probe.busy_percent,
                e.truth_busy_percent,
            )


@pytest.mark.slow
@tolerates_load
def test_predicted_step_time_holds_when_re_measured() -> None:
    """One worker at 2 x 60 ms a batch against a 20 ms step: the probe predicts the step time with 2, 3 and 4
    workers; each, re-measured with that many workers right after the run that predicted it (the load of a shared
    machine drifts within minutes), is within 20% of the prediction. The busy share is within 10 pp of the truth in
    every run. The sleeps are long against the main thread's wake-up latency on 2 loaded cores: at 20 ms samples and
    6 ms steps (benchmarks/loader_prediction.py) 1 of 9 predictions missed by 23% at load 10."""
    scale = {"steps": 40, "item_ms": 60.0, "step_ms": 20.0}
    for n in (2, 3, 4):
        (one,) = run(1, ctx="fork", **scale)
        assert one.probe is not None and one.batches_equal
        assert abs(one.probe.busy_percent - one.truth_busy_percent) <= 10.0
        predicted = one.probe.predict(n) * 1e-6
        (again,) = run(n, ctx="fork", **scale)
        assert again.batches_equal and again.probe is not None
        assert abs(again.probe.busy_percent - again.truth_busy_percent) <= 10.0
        assert abs(predicted - again.step_ms) <= 0.2 * again.step_ms, (n, predicted, again.step_ms)
    assert one.probe.needed >= 4  # sleeping workers: more than the 2 cores pay off
    assert (one.probe.advice() or "").startswith(f"num_workers={one.probe.needed} would bring steps to about")


def test_attach_on_iter_picks_each_wanted_loader_once() -> None:
    """The class-level ``DataLoader.__iter__`` wrapper attaches to each loader ``wanted`` accepts, right before it
    first iterates: a second train loader, and one that appears later (a reload), too; it is gone after uninstall
    (no processes: 0 workers)."""
    own = DataLoader.__dict__["__iter__"]
    other, wanted, second = _loader(0), _loader(0), _loader(0)
    train = [wanted, second]
    found: list[DataLoaderTiming] = []
    hook = AttachOnIter(lambda loader: any(loader is x for x in train), found.append)
    hook.install()
    try:
        assert DataLoader.__dict__["__iter__"] is not own
        list(other)
        assert not found
        assert len(list(wanted)) == 8 and [t.loader for t in found] == [wanted]
        list(wanted)
        assert len(found) == 1  # found once, then only passing calls through
        list(second)
        assert [t.loader for t in found] == [wanted, second]
        reloaded = _loader(0)  # the next epoch's loader
        train[:] = [reloaded]
        list(reloaded)
        list(wanted)  # no longer wanted, and already seen
        assert [t.loader for t in found] == [wanted, second, reloaded]
    finally:
        hook.uninstall()
    assert DataLoader.__dict__["__iter__"] is own


@pytest.mark.slow
def test_persistent_workers_started_before_attach_are_restarted_timed() -> None:
    """Persistent workers already running (an earlier fit, a model built from one batch) never run the chained
    worker_init_fn: attach lets them go, and the next epoch's new workers are timed."""
    loader = _loader(2, "fork", persistent=True)
    list(loader)  # workers started untimed
    running = loader._iterator
    timing = DataLoaderTiming.attach(loader)
    assert loader._iterator is None
    list(loader)
    counts = timing.read()
    assert counts is not None and sum(counts.batches) == 8 and loader._iterator is not running
    timing.detach()

"""What a loader's timing reads from its workers, framework-free: :class:`LoaderCounters`, made by the timings of
:mod:`fitprof.profilers.loader` (a PyTorch ``DataLoader``) and :mod:`fitprof.profilers.pydataset` (a Keras
``PyDataset``) and read by the loader probe (:mod:`fitprof.fit.loader`), which sits above them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoaderCounters:
    """Cumulative counters of one loader's workers since the timing was attached, one entry per worker.

    Attributes:
        busy_ns: wall time inside the batch fetch (samples and collate), ns, per worker.
        cpu_ns: the worker thread's CPU time in the same spans, ns, per worker.
        batches: batches fetched, per worker.
        runq_ns: time in the same spans the worker was runnable but waited for a core (Linux's run-queue wait), ns,
            per worker; empty where unknown.
    """

    busy_ns: tuple[int, ...]
    cpu_ns: tuple[int, ...]
    batches: tuple[int, ...]
    runq_ns: tuple[int, ...] = ()

    def minus(self, earlier: LoaderCounters | None) -> LoaderCounters:
        """The counts since ``earlier`` (a worker that restarted, whose counter went down, counts from 0)."""
        if earlier is None or len(earlier.busy_ns) != len(self.busy_ns):
            return self

        def sub(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(x - y if x >= y else x for x, y in zip(a, b, strict=True))

        runq = sub(self.runq_ns, earlier.runq_ns) if len(self.runq_ns) == len(earlier.runq_ns) else self.runq_ns
        return LoaderCounters(
            sub(self.busy_ns, earlier.busy_ns),
            sub(self.cpu_ns, earlier.cpu_ns),
            sub(self.batches, earlier.batches),
            runq,
        )

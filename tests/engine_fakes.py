"""A fake profiler window and a fake clock for the engine's tests: no framework, no profiler, no sleep.

The fake window writes a real Kineto trace at ``stop``: one ``ProfilerStep#N`` span per marked step, from its mark
to the next (by the fake clock), holding one ``aten::mm``; so the engine's real pipeline analyses it and the
tests read the figures back from the report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fitprof._session import kineto_trace_name, profile_root, session_name
from fitprof._warn import WarnOnce
from fitprof.fit import FitEngine
from fitprof.fit.boundary import KERAS, LIGHTNING
from fitprof.fit.config import make_config
from fitprof.profilers.base import WindowBusy


class Clock:
    """A clock that moves only when told: ``tick(ms)``."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns

    def tick(self, ms: float) -> None:
        self.ns += round(ms * 1e6)


class FakeWindow:
    """Records every call in the rig's ``log``; ``fail`` = "start" / "busy" / "mark" / "stop" makes that call fail."""

    def __init__(self, rig: Rig, epoch: int, suffix: str) -> None:
        self.rig, self.epoch, self.suffix, self.fail = rig, epoch, suffix, rig.fail
        self.session_dir: Path | None = None
        self.marks: list[tuple[int, int]] = []  # (step, clock ns)
        self.state = "new"
        self.annotations = 0

    def _log(self, *entry: Any) -> None:
        self.rig.log.append(entry)

    def start(self) -> None:
        if self.fail == "busy":
            raise WindowBusy("another profiler is already running; fitprof does not start a second one", "it ran")
        if self.fail == "start":
            raise RuntimeError("the profiler did not start")
        self.state = "running"
        self.session = session_name(self.rig.log_dir, self.epoch, self.suffix)
        self.session_dir = profile_root(self.rig.log_dir) / self.session
        self._log("start", self.epoch, self.suffix)

    def begin_step(self, step: int) -> None:
        if self.fail == "mark":
            raise RuntimeError("marker broke")
        self.marks.append((step, self.rig.clock()))
        self._log("mark", step)

    def end_step(self) -> None:
        self._log("end_step")

    def begin_overhead(self) -> None:
        self._log("overhead")

    def end_overhead(self) -> None:
        self._log("/overhead")

    def begin_annotation(self, name: str) -> None:
        self.annotations += 1
        self._log("annotate", name)

    def end_annotation(self) -> None:
        self.annotations -= 1
        self._log("/annotate")

    def stop(self, *, drop_open_step: bool = False) -> Path:
        if self.fail == "stop":
            self.state = "stopped"
            raise RuntimeError("the profiler could not stop")
        self.state = "stopped"
        now = self.rig.clock()
        ends = [t for _, t in self.marks[1:]] + [now]
        steps = [(n, t0, t1) for (n, t0), t1 in zip(self.marks, ends, strict=True)]
        if drop_open_step:
            steps = steps[:-1]
        self._log("stop", tuple(n for n, _, _ in steps))
        events = []
        for n, t0, t1 in steps:
            ts, dur = t0 / 1e3, (t1 - t0) / 1e3
            events.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"ProfilerStep#{n}",
                    "pid": 1,
                    "tid": 1,
                    "ts": ts,
                    "dur": dur,
                }
            )
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts, "dur": dur})
        path = Path(self.rig.log_dir) / kineto_trace_name(self.session, 0).removesuffix(".gz")
        path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
        return path

    def cleanup(self) -> None:
        pass

    def abort(self) -> None:
        self.state = "aborted"
        self._log("abort")


class Work:
    """The engine's Work protocol, recording what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def epoch_start(self) -> None:
        self.calls.append(("epoch_start",))

    def count_flops(self, step: int, batch: Any) -> None:
        self.calls.append(("count_flops", step))

    def window_opened(self) -> None:
        self.calls.append(("window_opened",))

    def window_step(self, batch: Any) -> None:
        self.calls.append(("window_step", batch))

    def window_closed(self) -> None:
        self.calls.append(("window_closed",))

    def work(self) -> None:
        return None


class Rig:
    """An engine with a fake clock and fake windows writing into ``log_dir``; ``messages`` holds its warnings."""

    def __init__(
        self, log_dir: Path, profile_batch: Any = (3, 5), *, boundary: str = "step_end", fail: str = "", **kwargs: Any
    ) -> None:
        self.log_dir = str(log_dir)
        self.clock = Clock()
        self.log: list[tuple[Any, ...]] = []
        self.windows: list[FakeWindow] = []
        self.messages: list[str] = []
        self.fail = fail
        self.boundary = boundary
        self.work = kwargs.pop("work", None) or Work()
        every = kwargs.pop("every_n_epochs", 1)

        def new_window(epoch: int, suffix: str) -> FakeWindow:
            window = FakeWindow(self, epoch, suffix)
            self.windows.append(window)
            return window

        self.engine = FitEngine(
            make_config(profile_batch, every, 5),
            new_window=new_window,
            warn=WarnOnce(self.messages.append),
            boundary=KERAS if boundary == "step_start" else LIGHTNING,
            clock=self.clock,
            work=self.work,
            **kwargs,
        )
        # The .xplane.pb is written in the training thread here: starting the background converter's process cost
        # about 1.5 s a fit, most of this file's time; tests/test_xplane_worker.py tests that process.
        for pipeline in (self.engine.pipeline, self.engine.trigger_pipeline):
            pipeline.converter = None

    def fit(
        self,
        epochs: int = 1,
        steps: int = 8,
        *,
        step_ms: Any = 10.0,
        every_step: Any = None,
        log: Any = None,
        warm_up: bool = False,
    ) -> list[Any]:
        """Drive one fit of ``epochs`` epochs of ``steps`` steps, each ``step_ms`` long (a number, or a function
        of the step's global index); ``every_step(engine, epoch, step)`` runs at each step's start; ``log`` gets
        each profiled epoch's :class:`~fitprof.fit.pipeline.EpochLog`; ``warm_up``: the adapters' call of
        ``engine.warm_up(kineto=True)`` after ``fit_start``. Returns each epoch's result."""
        engine, results, index = self.engine, [], 0
        ends = self.boundary == "step_end"
        engine.fit_start(log_dir=self.log_dir, ends_after=(lambda s: s >= steps) if ends else None)
        if warm_up:
            engine.warm_up(kineto=True)
        for epoch in range(epochs):
            engine.epoch_start(epoch)
            for step in range(1, steps + 1):
                engine.step_start(step, {"step": step})
                if every_step is not None:
                    every_step(engine, epoch, step)
                self.clock.tick(step_ms(index) if callable(step_ms) else step_ms)
                index += 1
                if ends:
                    engine.step_end(step, {"step": step})
            kwargs = {} if log is None else {"log": log}
            results.append(engine.epoch_end(epoch, steps=0 if ends else steps, **kwargs))
        engine.fit_end()
        return results

    def events(self, kind: str) -> list[tuple[Any, ...]]:
        return [e for e in self.log if e[0] == kind]

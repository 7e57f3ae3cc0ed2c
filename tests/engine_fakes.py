"""A fake profiler window and a fake clock for the engine's tests: no framework, no profiler, no sleep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fitprof._config import make_config
from fitprof._warn import WarnOnce
from fitprof.fit import FitEngine


class Clock:
    """A clock that moves only when told: ``tick(ms)``."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns

    def tick(self, ms: float) -> None:
        self.ns += int(ms * 1e6)


class FakeWindow:
    """Records every call; ``stop`` returns a path that needs no trace (the engine's tests never analyse it)."""

    def __init__(self, log: list[tuple[Any, ...]], epoch: int, suffix: str, *, fail: str = "") -> None:
        self.log, self.epoch, self.suffix, self.fail = log, epoch, suffix, fail
        self.session_dir: Path | None = None
        self.steps: list[int] = []
        self.dropped_open = False
        self.state = "new"

    def start(self) -> None:
        if self.fail == "start":
            raise RuntimeError("another profiler is already running")
        self.state = "running"
        self.log.append(("start", self.epoch, self.suffix))

    def begin_step(self, step: int) -> None:
        if self.fail == "mark":
            raise RuntimeError("marker broke")
        self.steps.append(step)
        self.log.append(("mark", step))

    def end_step(self) -> None:
        self.log.append(("end_step",))

    def begin_overhead(self) -> None:
        self.log.append(("overhead",))

    def end_overhead(self) -> None:
        self.log.append(("/overhead",))

    def begin_annotation(self, name: str) -> None:
        self.log.append(("annotate", name))

    def end_annotation(self) -> None:
        self.log.append(("/annotate",))

    def stop(self, *, drop_open_step: bool = False) -> Path:
        self.state = "stopped"
        self.dropped_open = drop_open_step
        self.log.append(("stop", tuple(self.steps), drop_open_step))
        return Path(f"/nonexistent/epoch{self.epoch}{self.suffix}.xplane.pb")

    def cleanup(self) -> None:
        pass

    def abort(self) -> None:
        self.state = "aborted"
        self.log.append(("abort", tuple(self.steps)))


class Rig:
    """An engine with a fake clock and fake windows; ``messages`` holds its warnings."""

    def __init__(self, profile_batch: Any = (3, 5), *, boundary: str = "step_end", fail: str = "", **kwargs: Any):
        self.clock = Clock()
        self.log: list[tuple[Any, ...]] = []
        self.windows: list[FakeWindow] = []
        self.messages: list[str] = []
        self.fail = fail

        def new_window(epoch: int, suffix: str) -> FakeWindow:
            w = FakeWindow(self.log, epoch, suffix, fail=self.fail)
            self.windows.append(w)
            return w

        every = kwargs.pop("every_n_epochs", 1)
        self.engine = FitEngine(
            make_config(profile_batch, every, 5),
            new_window=new_window,
            warn=WarnOnce(self.messages.append),
            boundary=boundary,  # type: ignore[arg-type]
            clock=self.clock,
            **kwargs,
        )

    def events(self, kind: str) -> list[tuple[Any, ...]]:
        return [e for e in self.log if e[0] == kind]

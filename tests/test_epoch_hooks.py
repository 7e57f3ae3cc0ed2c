"""The adapters' hook timers feed the epoch-parts probe: Lightning's profiler actions and Keras's callback list,
driven here by plain objects that call them as the frameworks do (no framework import)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fitprof.fit.epoch_parts import EpochParts
from fitprof.fit.hooks import FETCH_ACTION, CallbackHooks, ProfilerHooks, Saves, wrap_save

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.t = 10**12

    def __call__(self) -> int:
        return self.t


class FakeProfiler:
    """Lightning's ``PassThroughProfiler``: start and stop do nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def start(self, action_name: str) -> None:
        self.calls.append(("start", action_name))

    def stop(self, action_name: str) -> None:
        self.calls.append(("stop", action_name))


def _sleep(ms: float) -> None:
    time.sleep(ms / 1000)


def test_lightning_actions_become_parts_and_fetch_time() -> None:
    parts = EpochParts("lightning")
    saves: list[int] = []
    begun: list[bool] = []
    hooks = ProfilerHooks(parts, saves=Saves(lambda: begun.append(True), saves.append))
    prof = FakeProfiler()
    assert hooks.install(prof)
    ckpt = "[Callback]ModelCheckpoint{'monitor': None, 'mode': 'min'}.on_train_batch_end"
    parts.fit_start()
    parts.epoch_start(0)
    for n in range(1, 4):
        prof.start(FETCH_ACTION)
        _sleep(5)
        prof.stop(FETCH_ACTION)
        parts.step_start(n)
        _sleep(5)
        prof.start("[Callback]FitProfiler.on_train_batch_end")
        parts.step_end(n)
        prof.stop("[Callback]FitProfiler.on_train_batch_end")
        prof.start("[Callback]Sleepy.on_train_batch_end")
        _sleep(10)
        prof.stop("[Callback]Sleepy.on_train_batch_end")
        prof.start(ckpt)
        prof.start("[Callback]Sleepy.on_save_checkpoint")  # called by the save
        _sleep(20)
        prof.stop("[Callback]Sleepy.on_save_checkpoint")
        prof.stop(ckpt)
    r = parts.epoch_end(0)
    assert r is not None
    assert len(saves) == 3 and len(begun) == 3 and all(ns >= 20 * MS for ns in saves)
    assert r.checkpoint_s >= 0.060 and r.checkpoint_s == pytest.approx(sum(saves) / 1e9, abs=0.003)
    assert r.callbacks_s >= 0.030 and r.callback_s["Sleepy"] == pytest.approx(r.callbacks_s)
    assert hooks.take_fetch() >= 15 * MS and hooks.fetch_ns == 0
    assert prof.calls[0] == ("start", FETCH_ACTION)  # every call still reaches the profiler
    hooks.uninstall()
    assert "start" not in vars(prof) and "stop" not in vars(prof)


def test_lightning_hooks_without_a_probe_time_the_fetch_only() -> None:
    hooks = ProfilerHooks()
    prof = FakeProfiler()
    hooks.install(prof)
    prof.start("[Callback]Sleepy.on_train_batch_end")
    prof.stop("[Callback]Sleepy.on_train_batch_end")
    prof.start(FETCH_ACTION)
    prof.stop(FETCH_ACTION)
    assert hooks.fetch_ns > 0
    hooks.uninstall()


def test_lightning_uninstall_leaves_a_later_wrapper_alone() -> None:
    hooks = ProfilerHooks()
    prof = FakeProfiler()
    hooks.install(prof)
    later = prof.start
    prof.start = lambda action_name: later(action_name)  # type: ignore[method-assign]
    theirs = prof.start
    hooks.uninstall()
    assert prof.start is theirs and "stop" not in vars(prof)


class Callback:
    """Keras's base class, as far as the wrapper sees it: its empty hooks are marked default."""

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        pass

    on_train_batch_end._is_default = True  # type: ignore[attr-defined]

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        pass

    on_epoch_end._is_default = True  # type: ignore[attr-defined]


class Sleepy(Callback):
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        _sleep(10)


class Saver(Callback):
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if batch % 2:
            _sleep(30)


class Quiet(Callback):
    pass


def test_keras_callback_list_becomes_parts() -> None:
    parts = EpochParts("keras")
    saves: list[int] = []
    cbs = [Sleepy(), Saver(), Quiet()]
    hooks = CallbackHooks(parts, checkpointing=(Saver,), saves=Saves(end=saves.append))
    assert hooks.install(cbs) == 2  # Quiet overrides nothing: left alone
    assert "on_train_batch_end" not in vars(cbs[2]) and "on_epoch_end" not in vars(cbs[0])
    parts.fit_start()
    parts.epoch_start(0)
    for n in range(4):
        parts.step_start(n + 1)
        _sleep(5)
        for cb in cbs:  # CallbackList.on_train_batch_end
            cb.on_train_batch_end(n, {})
    r = parts.epoch_end(0)
    assert r is not None and r.steps == 4
    assert len(saves) == 4 and sum(ns >= 30 * MS for ns in saves) == 2
    assert r.checkpoint_s == pytest.approx(sum(saves) / 1e9, abs=0.002) and r.checkpoint_s >= 0.060
    assert r.callbacks_s >= 0.040 and set(r.callback_s) == {"Sleepy"}
    assert r.train_steps_s >= 0.020
    hooks.uninstall()
    assert all("on_train_batch_end" not in vars(cb) for cb in cbs)


def test_keras_hooks_on_another_thread_are_not_timed() -> None:
    import threading

    parts = EpochParts("keras")
    cb = Sleepy()
    hooks = CallbackHooks(parts, checkpointing=())
    hooks.install([cb])
    parts.fit_start()
    parts.epoch_start(0)
    worker = threading.Thread(target=cb.on_train_batch_end, args=(0,))
    worker.start()
    worker.join()
    r = parts.epoch_end(0)
    assert r is not None and r.callbacks_s == 0.0
    hooks.uninstall()


def test_lightning_hooks_left_at_their_default_are_not_timed() -> None:
    parts = EpochParts("lightning")
    seen: list[tuple[str, str]] = []

    def overrides(key: str, hook: str) -> bool:
        seen.append((key, hook))
        return hook == "on_train_batch_end"

    hooks = ProfilerHooks(parts, overrides=overrides)
    prof = FakeProfiler()
    hooks.install(prof)
    parts.fit_start()
    parts.epoch_start(0)
    slept = {"on_before_backward": 0.0, "on_train_batch_end": 0.0}
    for _ in range(2):
        for hook in slept:
            prof.start(f"[Callback]Sleepy.{hook}")
            t0 = time.perf_counter()
            _sleep(5)
            slept[hook] += time.perf_counter() - t0
            prof.stop(f"[Callback]Sleepy.{hook}")
    r = parts.epoch_end(0)
    assert r is not None
    assert seen == [("Sleepy", "on_before_backward"), ("Sleepy", "on_train_batch_end")]  # asked once per action
    # the two on_train_batch_end calls only
    assert slept["on_train_batch_end"] <= r.callbacks_s < slept["on_train_batch_end"] + slept["on_before_backward"]
    hooks.uninstall()


class Trainer:
    def __init__(self) -> None:
        self.saved = 0

    def save_checkpoint(self, path: str) -> None:
        _sleep(20)
        self.saved += 1


def test_a_save_seen_twice_counts_once() -> None:
    """ModelCheckpoint's hook calls the trainer's save: one save, one take-out, all of it checkpoint time."""
    parts = EpochParts("lightning")
    ended: list[int] = []
    saves = Saves(end=ended.append)
    hooks = ProfilerHooks(parts, saves=saves)
    prof = FakeProfiler()
    hooks.install(prof)
    trainer = Trainer()
    undo = wrap_save(parts, saves, trainer, "save_checkpoint")
    assert undo is not None
    parts.fit_start()
    parts.epoch_start(0)
    action = "[Callback]ModelCheckpoint{'monitor': None}.on_train_batch_end"
    prof.start(action)
    trainer.save_checkpoint("a")
    prof.stop(action)
    trainer.save_checkpoint("b")  # a save from elsewhere (a user's callback)
    r = parts.epoch_end(0)
    assert r is not None and trainer.saved == 2
    assert len(ended) == 2 and saves.count == 2 and all(ns >= 20 * MS for ns in ended)
    assert r.checkpoint_s == pytest.approx(saves.total_ns / 1e9, abs=0.002)
    undo()
    hooks.uninstall()
    assert "save_checkpoint" not in vars(trainer)

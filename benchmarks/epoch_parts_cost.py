"""What splitting the epoch's wall time into parts costs per step: the probe's events and the hook timers, side by side.

    python benchmarks/epoch_parts_cost.py [--steps 20000] [--repeats 7]

Framework-free: each variant replays, in one process, what a framework does per training step, ``--steps`` times,
and the per-step cost is the loop's wall time over the steps. Variants, interleaved in a new shuffled order each
repeat (medians over the repeats, their range, and each variant's cost above its framework's baseline):

* ``lightning_fetch_only``: the 30 profiler ``start``/``stop`` calls Lightning made in one step of a fit with one
  user callback and a ``ModelCheckpoint`` (the action names recorded from Lightning 2.x, plus fitprof's own
  callback's hooks) through a pass-through profiler wrapped by :class:`fitprof.fit.hooks.ProfilerHooks` without a
  probe: what the Lightning adapter's batch-fetch timer already costs;
* ``lightning_parts``: the same wrapper feeding an :class:`fitprof.fit.epoch_parts.EpochParts` (the overridden
  hooks of fitprof, ``ModelCheckpoint`` and the user callback timed as spans), plus the probe's step start, step end
  and input-wait events;
* ``keras_bare``: a Keras-like ``CallbackList`` of four callbacks (fitprof's with its batch-begin hook, a progress
  bar and a ``ModelCheckpoint`` with batch-end hooks, a history with none) called for one step;
* ``keras_parts``: the same list with :class:`fitprof.fit.hooks.CallbackHooks` installed (its three overridden
  batch hooks timed as spans) and the probe's step-start event.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable

from fitprof.fit.epoch_parts import EpochParts
from fitprof.fit.hooks import FETCH_ACTION, CallbackHooks, ProfilerHooks

_CKPT = "[Callback]ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0}"
_ACTIONS = [
    f"{_CKPT}.on_train_batch_end",
    "[Callback]FitProfiler.on_train_batch_end",
    "[Callback]User.on_train_batch_end",
    "[LightningModule]M.on_train_batch_end",
    FETCH_ACTION,
    "[LightningModule]M.on_before_batch_transfer",
    "[Strategy]SingleDeviceStrategy.batch_to_device",
    "[LightningModule]M.transfer_batch_to_device",
    "[LightningModule]M.on_after_batch_transfer",
    "[Callback]User.on_train_batch_start",
    "[Callback]FitProfiler.on_train_batch_start",
    f"{_CKPT}.on_train_batch_start",
    "[LightningModule]M.on_train_batch_start",
    "[Strategy]SingleDeviceStrategy.on_train_batch_start",
    "run_training_batch",
    "[LightningModule]M.optimizer_step",
    "[Strategy]SingleDeviceStrategy.training_step",
    "[Callback]User.on_before_zero_grad",
    f"{_CKPT}.on_before_zero_grad",
    "[LightningModule]M.on_before_zero_grad",
    "[LightningModule]M.optimizer_zero_grad",
    "[Strategy]SingleDeviceStrategy.backward",
    "[Callback]User.on_before_backward",
    f"{_CKPT}.on_before_backward",
    "[LightningModule]M.on_before_backward",
    "[Callback]User.on_after_backward",
    f"{_CKPT}.on_after_backward",
    "[LightningModule]M.on_after_backward",
    "[Callback]User.on_before_optimizer_step",
    f"{_CKPT}.on_before_optimizer_step",
]
_OVERRIDDEN = {("FitProfiler", "on_train_batch_start"), ("FitProfiler", "on_train_batch_end")}
_OVERRIDDEN |= {("User", "on_train_batch_end")}


class _PassThrough:
    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass


def _overrides(key: str, hook: str) -> bool:
    if key.startswith("ModelCheckpoint"):
        return hook in ("on_train_batch_end", "on_validation_end", "on_train_epoch_end")
    return (key, hook) in _OVERRIDDEN


def lightning(steps: int, with_parts: bool) -> float:
    prof = _PassThrough()
    parts = EpochParts("lightning") if with_parts else None
    hooks = ProfilerHooks(parts, overrides=_overrides)
    hooks.install(prof)
    if parts is not None:
        parts.fit_start()
        parts.epoch_start(0)
    start, stop = prof.start, prof.stop
    t0 = time.perf_counter_ns()
    for n in range(1, steps + 1):
        for action in _ACTIONS:
            start(action)
            stop(action)
        if parts is not None:
            parts.input_wait(hooks.take_fetch())
            parts.step_start(n)
            parts.step_end(n)
        else:
            hooks.take_fetch()
    took = time.perf_counter_ns() - t0
    hooks.uninstall()
    return took / steps / 1e3


class _Callback:
    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        pass

    on_train_batch_begin._is_default = True  # type: ignore[attr-defined]

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        pass

    on_train_batch_end._is_default = True  # type: ignore[attr-defined]


class _Fitprof(_Callback):
    def __init__(self, parts: EpochParts | None) -> None:
        self.parts = parts

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if self.parts is not None:
            self.parts.step_start(batch + 1)


class _Progbar(_Callback):
    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        pass


class _Checkpoint(_Callback):
    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        pass


class _History(_Callback):
    pass


def keras(steps: int, with_parts: bool) -> float:
    parts = EpochParts("keras") if with_parts else None
    own = _Fitprof(parts)
    callbacks = [own, _Progbar(), _Checkpoint(), _History()]
    hooks = None
    if parts is not None:
        parts.fit_start()
        parts.epoch_start(0)
        hooks = CallbackHooks(parts, own=own, checkpointing=(_Checkpoint,))
        hooks.install(callbacks)
    t0 = time.perf_counter_ns()
    for n in range(steps):
        for cb in callbacks:
            cb.on_train_batch_begin(n, None)
        for cb in callbacks:
            cb.on_train_batch_end(n, None)
    took = time.perf_counter_ns() - t0
    if hooks is not None:
        hooks.uninstall()
    return took / steps / 1e3


VARIANTS: dict[str, Callable[[int], float]] = {
    "lightning_fetch_only": lambda n: lightning(n, False),
    "lightning_parts": lambda n: lightning(n, True),
    "keras_bare": lambda n: keras(n, False),
    "keras_parts": lambda n: keras(n, True),
}
BASELINE = {"lightning_parts": "lightning_fetch_only", "keras_parts": "keras_bare"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    order = list(VARIANTS)
    for _ in range(args.repeats):
        random.shuffle(order)
        for name in order:
            results[name].append(VARIANTS[name](args.steps))
    medians = {name: statistics.median(v) for name, v in results.items()}
    for name, values in results.items():
        line = f"{name:22s} {medians[name]:7.2f} us/step (range {min(values):.2f}-{max(values):.2f})"
        base = BASELINE.get(name)
        if base is not None:
            diffs = [a - b for a, b in zip(values, results[base], strict=True)]  # paired within a repeat
            line += f"; +{statistics.median(diffs):.2f} us/step over {base} (paired, range {min(diffs):.2f}-{max(diffs):.2f})"
        print(line)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""How often ``trigger="slowdown"`` fires on a steady run (nothing slows down): false triggers per 1,000 steps.

    python benchmarks/false_triggers.py [--steps 1100] [--epochs 2] [--repeats 3] [--frameworks lightning,keras]
                                        [--threads 1]

Each run is a fresh child process that trains a tiny model (the one of ``benchmarks/step_timing_cost.py``: a
32-64-4 MLP, batch 16, data in memory) for ``--epochs`` epochs of ``--steps`` steps with
``FitProfiler(trigger="slowdown", trigger_min_spacing=0, trigger_max_windows=1000)`` and its default
``profile_batch`` window: no spacing and no cap, so every firing the rule makes is counted (with the defaults,
3 windows at most per fit and 200 steps apart, fewer would be *opened*). Every firing on such a run is false.

Printed per run: the clean steps the trigger saw (the epoch figures' ``steps_timed``, summed over epochs), the
firings (each with its step, the slow run's median and the baseline), the spread of the steady step times
(median and MAD over all clean steps, as a fraction of the median), and the load average; then the rate per
1,000 clean steps per framework over all runs, and how many of the firings fitprof itself judged false alarms (the
triggered window's steps no slower than the threshold: the firing is taken back, using up neither
``trigger_max_windows`` nor ``trigger_min_spacing``).

``--threads N`` gives the framework N intra-op threads (torch ``set_num_threads``, TensorFlow's intra-op pool)
instead of 1: on a machine with fewer cores than threads they compete for the cores, and steps stall now and then
(the busy-machine case that fired the trigger on a steady run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

TRIGGER = {"trigger": "slowdown", "trigger_min_spacing": 0, "trigger_max_windows": 1000, "verbose": False}


def child_lightning(steps: int, epochs: int, tmp: str, threads: int = 1) -> dict[str, Any]:
    import lightning.pytorch as pl
    import torch

    from fitprof.lightning import FitProfiler

    torch.set_num_threads(threads)

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(steps * 16, 32, generator=g), torch.randint(0, 4, (steps * 16,)))
    cb = FitProfiler(log_dir=os.path.join(tmp, "fitprof"), **TRIGGER)
    clean: list[int] = []

    class Keep(pl.Callback):  # the clean step times of each epoch, read before the next epoch clears them
        def on_train_epoch_end(self, *args: Any) -> None:
            clean.extend(cb.steps.step_ns)

    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=[cb, Keep()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(ds, batch_size=16))
    return {
        "clean_steps": sum(s.steps_timed for s in cb.epoch_steps.values()),
        "firings": [[e, t.step, t.step_time_ms, t.baseline_ms] for e, t, _ in cb.triggered],
        "false_alarms": len(cb._engine.false_alarms),
        "step_ns": clean,
    }


def child_keras(steps: int, epochs: int, tmp: str, threads: int = 1) -> dict[str, Any]:
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    import tensorflow as tf

    from fitprof.keras import FitProfiler

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rng = np.random.default_rng(0)
    x = rng.random((steps * 16, 32), dtype=np.float32)
    y = rng.integers(0, 4, steps * 16)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).cache().prefetch(2)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = FitProfiler(log_dir=os.path.join(tmp, "fitprof"), **TRIGGER)
    clean: list[int] = []

    class Keep(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            clean.extend(cb.steps.step_ns)

    model.fit(data, epochs=epochs, verbose=0, callbacks=[cb, Keep()])
    return {
        "clean_steps": sum(s.steps_timed for s in cb.epoch_steps.values()),
        "firings": [[e, t.step, t.step_time_ms, t.baseline_ms] for e, t, _ in cb.triggered],
        "false_alarms": len(cb._engine.false_alarms),
        "step_ns": clean,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1100, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--frameworks", default="lightning,keras")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of the framework (default 1)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        warnings.filterwarnings("ignore")
        tmp = tempfile.mkdtemp(prefix="fitprof_false_")
        try:
            run = child_lightning if args.child == "lightning" else child_keras
            Path(args.out).write_text(json.dumps(run(args.steps, args.epochs, tmp, args.threads)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    totals: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as d:
        for rep in range(args.repeats):
            for framework in args.frameworks.split(","):
                out = Path(d) / f"{framework}_{rep}.json"
                load = os.getloadavg()[0]
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child", framework, "--out", str(out)]
                cmd += ["--steps", str(args.steps), "--epochs", str(args.epochs), "--threads", str(args.threads)]
                env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"}
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
                if proc.returncode != 0:
                    raise RuntimeError(f"{framework} run failed:\n{proc.stderr[-3000:]}")
                r = json.loads(out.read_text())
                ms = np.asarray(r["step_ns"], dtype=np.float64) / 1e6
                med = float(np.median(ms))
                mad = float(np.median(np.abs(ms - med)))
                totals.setdefault(framework, [0, 0, 0])
                totals[framework][0] += r["clean_steps"]
                totals[framework][1] += len(r["firings"])
                totals[framework][2] += r.get("false_alarms", 0)
                firings = "; ".join(f"epoch {e} step {s}: {a:.1f} vs {b:.1f} ms" for e, s, a, b in r["firings"])
                print(
                    f"repeat {rep} {framework:<9}: {r['clean_steps']} clean steps, median {med:.2f} ms, MAD "
                    f"{100 * mad / med:.0f}% of median, max {ms.max() / med:.1f}x median, {len(r['firings'])} "
                    f"firings [{firings}], {r.get('false_alarms', 0)} judged false alarms, load {load:.1f}, "
                    f"{time.perf_counter() - t0:.0f} s",
                    flush=True,
                )
    print()
    print(f"intra-op threads: {args.threads}, cores: {os.cpu_count()}")
    print("| framework | clean steps | false firings | per 1,000 steps | judged false alarms by fitprof |")
    print("|---|---:|---:|---:|---:|")
    for framework, (n, fired, judged) in totals.items():
        print(f"| {framework} | {n} | {fired} | {1000 * fired / n:.2f} | {judged} |")


if __name__ == "__main__":
    main()

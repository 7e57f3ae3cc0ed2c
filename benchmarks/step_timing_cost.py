"""What step timing costs outside the profiled windows: fitprof against no callback and TraceML, side by side.

    python benchmarks/step_timing_cost.py [--steps 2200] [--repeats 3] [--frameworks lightning,keras]

TraceML (``traceml-ai``, ``pip install "fitprof[bench]"`` or ``pip install traceml-ai==0.5.0``) is run the way its
README runs a script, ``traceml run --mode summary script.py``: a launcher starts an aggregator process and the
script under ``torchrun``, and TraceML's runtime attaches its ``TraceMLCallback`` to the Lightning ``Trainer``
by itself (sampler threads, DataLoader and ``batch_to_device`` patches, forward / backward / optimizer regions,
telemetry sent over TCP to the aggregator). Without ``traceml-ai`` its rows are skipped with a message. TraceML
has no Keras integration, so the Keras rows compare fitprof with no callback only.

Variants (each one a fresh child process that trains the same tiny model for one epoch of ``--steps`` steps;
each repeat runs every (framework, variant) once, in a new shuffled order):

* ``none``: no profiling callback;
* ``traceml`` (Lightning): ``traceml run`` as above;
* ``fitprof``: ``FitProfiler()`` with its default window (steps 6-10), so the measured steps (``SKIP``.. the
  end) lie after the window: always-on step timing and the batch hooks only;
* ``fitprof_trigger``: the same with ``trigger="slowdown"``, the rolling baseline updated at every step (the
  run is steady: a window it opens anyway is counted and printed);
* ``fitprof_nowindow``: ``FitProfiler(profile_batch=0)``: the step timing with no profiler window in the process
  at all (does a torch profiler window leave a cost behind in the steps after it?).

Step time is the interval between consecutive batch-begin hooks (``on_train_batch_start`` in Lightning,
``on_train_batch_begin`` in Keras) of a timing callback placed first, the same in every variant, so it holds
everything the loop does per step: the fetch, every callback's hooks, the step itself. Per run: the median step
time over steps ``SKIP``..``--steps``; per variant: the median over the repeats of those medians (and their
range); the overhead is that minus the ``none`` figure of the same framework (microseconds per step) and the
ratio of the two. The load average of the machine is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

SKIP = 100  # steps left out at the start: compilation, warm-up, the default window (steps 6-10) and its export
VARIANTS = {
    "lightning": ["none", "traceml", "fitprof", "fitprof_trigger", "fitprof_nowindow"],
    "keras": ["none", "fitprof", "fitprof_trigger", "fitprof_nowindow"],
}
TRACEML_HINT = 'pip install "fitprof[bench]" (or pip install traceml-ai==0.5.0)'


def fitprof_kwargs(variant: str, log_dir: str) -> dict[str, Any]:
    """The ``FitProfiler`` arguments of a fitprof variant (the same in both frameworks)."""
    kwargs: dict[str, Any] = {"log_dir": log_dir, "verbose": False}
    if variant == "fitprof_trigger":
        kwargs["trigger"] = "slowdown"
    if variant == "fitprof_nowindow":  # step timing without any window in the process (profile_batch=0)
        kwargs["profile_batch"] = 0
    return kwargs


def windows_opened(callback: Any) -> int:
    """How many windows a fitprof callback opened in its fit (the default one plus any triggered)."""
    return int(callback._engine.coverage.windows)


# -- the child: one fit, step times out as JSON ---------------------------------------------------------------

HOOK_NS: dict[int, int] = {}  # --hook-cost: step (stamps taken so far) -> ns spent inside the tool's hooks
STAMPS: list[float] = []  # the step clock's stamps, shared with the hook timer


def time_hooks(callback: Any, base: type) -> None:
    """Wrap every hook ``callback``'s class overrides (``on_*`` methods not inherited from ``base``) on the
    instance, adding the time spent inside them to ``HOOK_NS`` under the step in progress (the frameworks look
    hooks up on the instance)."""
    for name in dir(type(callback)):
        if not name.startswith("on_") or getattr(type(callback), name) is getattr(base, name, None):
            continue
        inner = getattr(callback, name)

        def timed(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return _inner(*args, **kwargs)
            finally:
                step = len(STAMPS)
                HOOK_NS[step] = HOOK_NS.get(step, 0) + time.perf_counter_ns() - t0

        setattr(callback, name, timed)


def hook_us(n: int) -> list[float]:
    """Microseconds inside the tool's hooks for each step ``SKIP``..``n - 1`` (the last step, which holds the
    epoch-end work, and the window's steps at the start are left out, as in the step-time figures)."""
    return [HOOK_NS.get(step, 0) / 1e3 for step in range(SKIP, n)]


def hook_cost_enabled() -> bool:
    return os.environ.get("FITPROF_BENCH_HOOKS") == "1"


def deltas_us(stamps: list[float]) -> list[float]:
    return [1e6 * (b - a) for a, b in zip(stamps[SKIP:], stamps[SKIP + 1 :], strict=False)]


def child_lightning(variant: str, steps: int, tmp: str) -> dict[str, Any]:
    import lightning.pytorch as pl
    import torch

    torch.set_num_threads(1)
    stamps = STAMPS

    class StepClock(pl.Callback):
        def on_train_batch_start(self, *args: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if hook_cost_enabled():  # the tools' hooks, TraceML's attached by its launcher included
                for cb in trainer.callbacks:
                    if "traceml" in type(cb).__module__.lower() or "fitprof" in type(cb).__module__.lower():
                        time_hooks(cb, pl.Callback)

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
    callbacks: list[Any] = [StepClock()]
    profiler = None
    if variant.startswith("fitprof"):
        from fitprof.lightning import FitProfiler

        profiler = FitProfiler(**fitprof_kwargs(variant, os.path.join(tmp, "fitprof")))
        callbacks.append(profiler)
    trainer = pl.Trainer(
        max_epochs=1,
        callbacks=callbacks,
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
    traceml = [type(cb).__name__ for cb in trainer.callbacks if "traceml" in type(cb).__module__.lower()]
    return {
        "deltas_us": deltas_us(stamps),
        "windows": windows_opened(profiler) if profiler is not None else 0,
        "traceml_callbacks": traceml,
        "hook_us": hook_us(len(stamps)),
    }


def child_keras(variant: str, steps: int, tmp: str) -> dict[str, Any]:
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    stamps = STAMPS

    class StepClock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            stamps.append(time.perf_counter())

    rng = np.random.default_rng(0)
    x = rng.random((steps * 16, 32), dtype=np.float32)
    y = rng.integers(0, 4, steps * 16)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).cache().prefetch(2)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks: list[Any] = [StepClock()]
    profiler = None
    if variant.startswith("fitprof"):
        from fitprof.keras import FitProfiler

        profiler = FitProfiler(**fitprof_kwargs(variant, os.path.join(tmp, "fitprof")))
        if hook_cost_enabled():
            time_hooks(profiler, keras.callbacks.Callback)
        callbacks.append(profiler)
    model.fit(data, epochs=1, verbose=0, callbacks=callbacks)
    return {
        "deltas_us": deltas_us(stamps),
        "windows": windows_opened(profiler) if profiler is not None else 0,
        "hook_us": hook_us(len(stamps)),
    }


def child_main(args: argparse.Namespace) -> None:
    warnings.filterwarnings("ignore")
    tmp = tempfile.mkdtemp(prefix="fitprof_bench_")
    try:
        run = child_lightning if args.child_framework == "lightning" else child_keras
        result = run(args.child_variant, args.steps, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    Path(args.out).write_text(json.dumps(result))


# -- the parent: interleaved children, the table ---------------------------------------------------------------


def traceml_available() -> bool:
    return (
        shutil.which("traceml", path=os.path.dirname(sys.executable)) is not None or shutil.which("traceml") is not None
    )


def run_child(framework: str, variant: str, steps: int, work: Path) -> dict[str, Any]:
    out = work / f"{framework}_{variant}_{time.monotonic_ns()}.json"
    script = str(Path(__file__).resolve())
    child_args = ["--child-framework", framework, "--child-variant", variant, "--steps", str(steps), "--out", str(out)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"}
    if variant == "traceml":
        exe = shutil.which("traceml", path=os.path.dirname(sys.executable)) or "traceml"
        logs = work / f"traceml_logs_{time.monotonic_ns()}"
        cmd = [exe, "run", "--mode", "summary", "--logs-dir", str(logs), "--no-dashboard-auto-open", script]
        cmd += ["--args", *child_args]
    else:
        cmd = [sys.executable, script, *child_args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(
            f"{framework}/{variant} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return json.loads(out.read_text())


def hook_cost(jobs: list[tuple[str, str]], steps: int) -> None:
    """Per tool, one run with every hook of its callback timed (``time_hooks``): microseconds per step spent
    inside them over steps ``SKIP``.. the last but one (after the window, before the epoch's end), median and
    mean. For TraceML a lower bound: its DataLoader and ``batch_to_device`` patches, forward hooks, sampler
    threads and telemetry run outside its callback hooks."""
    os.environ["FITPROF_BENCH_HOOKS"] = "1"
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("| framework | tool | steps | inside its callback hooks, us per step: median | mean | p90 |")
    print("|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        for job in jobs:
            if job[1] == "none":
                continue
            result = run_child(*job, steps, Path(d))
            us = sorted(result["hook_us"])
            mean = sum(us) / len(us)
            p90 = us[(9 * len(us)) // 10]
            print(
                f"| {job[0]} | {job[1]} | {len(us)} | {statistics.median(us):.1f} | {mean:.1f} | {p90:.1f} |",
                flush=True,
            )
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2200, help="training steps per run (measured: SKIP..steps)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--frameworks", default="lightning,keras")
    parser.add_argument("--variants", default="", help="a comma-separated subset of the variants (default: all)")
    parser.add_argument(
        "--hook-cost",
        action="store_true",
        help="instead: one run per tool, timing the time spent inside the tool's callback hooks per step",
    )
    parser.add_argument("--child-framework", help=argparse.SUPPRESS)
    parser.add_argument("--child-variant", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_framework:
        child_main(args)
        return
    jobs = [(f, v) for f in args.frameworks.split(",") for v in VARIANTS[f]]
    if args.variants:
        jobs = [j for j in jobs if j[1] in args.variants.split(",") or j[1] == "none"]
    if not traceml_available():
        print(f"TraceML is not installed: its rows are skipped ({TRACEML_HINT}).")
        jobs = [j for j in jobs if j[1] != "traceml"]
    if args.hook_cost:
        hook_cost(jobs, args.steps)
        return
    load0 = os.getloadavg()
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; {os.cpu_count()} CPUs", flush=True)
    medians: dict[tuple[str, str], list[float]] = {j: [] for j in jobs}
    spreads: dict[tuple[str, str], list[tuple[float, float]]] = {j: [] for j in jobs}
    windows: dict[tuple[str, str], list[int]] = {j: [] for j in jobs}
    counted: dict[tuple[str, str], int] = dict.fromkeys(jobs, 0)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        for rep in range(args.repeats):
            order = jobs[:]
            rng.shuffle(order)
            for job in order:
                result = run_child(*job, args.steps, work)
                deltas = sorted(result["deltas_us"])
                med = statistics.median(deltas)
                medians[job].append(med)
                spreads[job].append((deltas[len(deltas) // 10], deltas[(9 * len(deltas)) // 10]))
                windows[job].append(result["windows"])
                counted[job] += len(deltas)
                extra = f", TraceML callbacks {result['traceml_callbacks']}" if job[1] == "traceml" else ""
                print(
                    f"repeat {rep}: {job[0]:<9} {job[1]:<16} median {med:8.1f} us/step over {len(deltas)} steps "
                    f"(p10-p90 {spreads[job][-1][0]:.0f}-{spreads[job][-1][1]:.0f}), windows {result['windows']}{extra}",
                    flush=True,
                )
    load1 = os.getloadavg()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    print()
    print("| framework | variant | steps measured | step time, us (median of run medians) | run medians, us |"
          " overhead, us/step | ratio | windows opened |")  # fmt: skip
    print("|---|---|---:|---:|---|---:|---:|---|")
    for job in jobs:
        base = statistics.median(medians[(job[0], "none")])
        med = statistics.median(medians[job])
        runs = ", ".join(f"{v:.0f}" for v in medians[job])
        paired = [a - b for a, b in zip(medians[job], medians[(job[0], "none")], strict=True)]
        over = "–" if job[1] == "none" else f"{med - base:+.0f} (paired {min(paired):+.0f} to {max(paired):+.0f})"
        ratio = "–" if job[1] == "none" else f"{med / base:.3f}"
        print(f"| {job[0]} | {job[1]} | {counted[job]} | {med:.0f} | {runs} | {over} | {ratio} | {windows[job]} |")


if __name__ == "__main__":
    main()

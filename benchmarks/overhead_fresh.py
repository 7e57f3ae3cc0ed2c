"""fitprof against no profiler and the frameworks' own profilers, each run in a fresh process.

    python benchmarks/overhead_fresh.py [--repeats 5] [--steps 300] [--memory-epochs 20] [--threads 1]
                                        [--frameworks keras,lightning] [--json results.json]

The parent process only orchestrates: every run is a child (this script with ``--child``) that imports the
framework, trains one configuration, writes its clock readings and file sizes as JSON and exits. Repeats are
interleaved (all configurations of both frameworks in a shuffled order, then the next repeat), and every figure
below is a median over repeats; ratios are medians of the per-repeat ratios (paired: same repeat).

Configurations (one epoch of ``--steps`` steps; every profiler's window covers steps 6-10):

* ``none``: no profiling callback;
* ``fitprof``: ``FitProfiler(profile_batch=(6, 10))``;
* ``tensorboard`` (Keras): ``keras.callbacks.TensorBoard(log_dir, profile_batch=(6, 10))``, all else default;
* ``pytorchprofiler`` (Lightning): ``Trainer(profiler=PyTorchProfiler(schedule=schedule(wait=4, warmup=1,
  active=5)))``: warm-up at the end of ``training_step`` 4, records from the end of ``training_step`` 5 to the
  end of ``training_step`` 10, where it stops and exports (the same five steps as fitprof's window).

Model: the same MLP in both (256 -> 768 -> 768 -> 10, ReLU, SGD, batch 128, cross-entropy), batches served
from memory (``tf.data`` cached and prefetched; a ``DataLoader`` over 16 prebuilt batches), one intra-op thread
(``--threads``; with two threads on this 2-core machine the step time of a fresh process came out bimodal, 11 or
15 ms, for the same configuration).

Clocks: a callback placed before the profiler and one placed after it read ``perf_counter`` at the hook the
profilers act on (Keras: ``on_train_batch_begin``, so Keras keeps dispatching batch ends asynchronously unless
the profiler itself overrides ``on_train_batch_end``; Lightning: ``on_train_batch_end``) and at epoch end. Step
k is the interval between the "before" clocks of consecutive steps. Figures:

1. steps outside the window: steps ``--skip``..N, far after the window; mean (total time / steps) and median,
   and the process's CPU time per step over the same steps (less sensitive to the machine's load);
2. the window: the region of steps 4-11 (every profiler's warm-up, start, profiled steps, stop and export
   fall inside it), its time over the same region without a profiler, the median profiled step (steps 7-9),
   fitprof's start and stop (its hook, between the two clocks);
3. epoch end: the work between the two epoch-end clocks (fitprof: its analysis), per profiled step;
   end of fit: from the last ``on_train_end`` clock to ``fit`` returning (Lightning's profiler summarises here);
4. bytes on disk per profiled step of each profiler's trace files;
5. host memory (``--memory-epochs`` epochs of 15 steps, a window in every epoch): RSS from ``/proc/self/statm``
   after the epoch-end work of epochs 5 and N, fitprof and no profiler.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIRST, LAST = 6, 10  # the profiled window, 1-based and inclusive
REGION = (FIRST - 2, LAST + 1)  # steps holding every profiler's warm-up, start, stop and export
BATCH, FEATURES, CLASSES, NBATCHES = 128, 256, 10, 16
MEMORY_STEPS = 15
CONFIGS = {"keras": ["none", "fitprof", "tensorboard"], "lightning": ["none", "fitprof", "pytorchprofiler"]}


# ------------------------------------------------------------------------------------------------- children
def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cpu_snapshot() -> list[float]:
    """Machine-wide CPU seconds (busy, steal) from ``/proc/stat`` and this process's own CPU seconds."""
    with open("/proc/stat") as fh:
        ticks = [int(v) for v in fh.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    own = os.times()
    busy = sum(ticks[:8]) - ticks[3] - ticks[4] - ticks[7]  # all but idle, iowait and steal
    return [busy / hz, ticks[7] / hz, own.user + own.system]


def cpu_during(start: list[float]) -> dict[str, float]:
    """Since ``start``: CPU seconds used by other processes, and stolen by the hypervisor."""
    end = cpu_snapshot()
    return {"others_cpu_s": (end[0] - start[0]) - (end[2] - start[2]), "steal_s": end[1] - start[1]}


def file_sizes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def keras_child(config: str, steps: int, epochs: int, logdir: Path, threads: int, hidden: int) -> dict[str, Any]:
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras
    import numpy as np
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)

    from fitprof.keras import FitProfiler

    class Clock(keras.callbacks.Callback):
        def __init__(self, memory: bool = False) -> None:
            super().__init__()
            self.batch: list[float] = []
            self.cpu: list[float] = []
            self.epoch_end: list[float] = []
            self.train_end = 0.0
            self.memory = memory
            self.rss: list[float] = []

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.batch.append(time.perf_counter())
            self.cpu.append(time.process_time())

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.epoch_end.append(time.perf_counter())
            if self.memory:
                self.rss.append(rss_mb())

        def on_train_end(self, logs: Any = None) -> None:
            self.train_end = time.perf_counter()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((NBATCHES * BATCH, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, NBATCHES * BATCH)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).cache().repeat().prefetch(4)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    tool: list[Any] = []
    if config == "fitprof":
        tool = [FitProfiler(logdir / "fitprof", profile_batch=(FIRST, LAST))]
    elif config == "tensorboard":
        tool = [keras.callbacks.TensorBoard(str(logdir / "tensorboard"), profile_batch=(FIRST, LAST))]
    before, after = Clock(), Clock(memory=True)
    cpu0 = cpu_snapshot()
    t0 = time.perf_counter()
    model.fit(ds, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=[before, *tool, after])
    returned = time.perf_counter()
    cpu = cpu_during(cpu0)
    files = file_sizes(logdir)
    trace = {k: v for k, v in files.items() if k.endswith(".xplane.pb")}
    return {
        "versions": {"keras": keras.__version__, "tensorflow": tf.__version__},
        "fit_start": t0,
        "before": before.batch,
        "before_cpu": before.cpu,
        "after": after.batch,
        "epoch_end_before": before.epoch_end,
        "epoch_end_after": after.epoch_end,
        "train_end": after.train_end,
        "returned": returned,
        "rss": after.rss,
        "files": files,
        "trace_bytes": sum(trace.values()),
        **cpu,
    }


def lightning_child(config: str, steps: int, epochs: int, logdir: Path, threads: int, hidden: int) -> dict[str, Any]:
    import lightning
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import TensorBoardLogger
    from lightning.pytorch.profilers import PyTorchProfiler

    from fitprof.lightning import FitProfiler

    if threads:
        torch.set_num_threads(threads)

    class Clock(Callback):
        def __init__(self, memory: bool = False) -> None:
            self.batch: list[float] = []
            self.cpu: list[float] = []
            self.epoch_end: list[float] = []
            self.train_end = 0.0
            self.memory = memory
            self.rss: list[float] = []

        def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
            self.batch.append(time.perf_counter())
            self.cpu.append(time.process_time())

        def on_train_epoch_end(self, *args: Any, **kwargs: Any) -> None:
            self.epoch_end.append(time.perf_counter())
            if self.memory:
                self.rss.append(rss_mb())

        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            self.train_end = time.perf_counter()

    class Batches(torch.utils.data.Dataset):
        def __init__(self, n: int) -> None:
            g = torch.Generator().manual_seed(0)
            self.n = n
            self.x = torch.randn(NBATCHES, BATCH, FEATURES, generator=g)
            self.y = torch.randint(0, CLASSES, (NBATCHES, BATCH), generator=g)

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> Any:
            return self.x[i % NBATCHES], self.y[i % NBATCHES]

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(FEATURES, hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(hidden, hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(hidden, CLASSES),
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    before, after = Clock(), Clock(memory=True)
    callbacks: list[Callback] = [before]
    profiler: Any = None
    if config == "fitprof":
        callbacks.append(FitProfiler(log_dir=logdir / "fitprof", profile_batch=(FIRST, LAST)))
    elif config == "pytorchprofiler":
        schedule = torch.profiler.schedule(wait=FIRST - 2, warmup=1, active=LAST - FIRST + 1)
        profiler = PyTorchProfiler(dirpath=logdir / "pytorchprofiler", filename="prof", schedule=schedule)
    callbacks.append(after)
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=callbacks,
        profiler=profiler,
        logger=TensorBoardLogger(logdir / "logs"),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=logdir,
    )
    loader = torch.utils.data.DataLoader(Batches(steps), batch_size=None)
    cpu0 = cpu_snapshot()
    t0 = time.perf_counter()
    trainer.fit(MLP(), loader)
    returned = time.perf_counter()
    cpu = cpu_during(cpu0)
    files = file_sizes(logdir)
    if config == "fitprof":
        trace = {k: v for k, v in files.items() if k.endswith((".pt.trace.json.gz", ".xplane.pb"))}
    else:
        trace = {k: v for k, v in files.items() if ".pt.trace.json" in k}
    return {
        "versions": {"lightning": lightning.__version__, "torch": torch.__version__},
        "fit_start": t0,
        "before": before.batch,
        "before_cpu": before.cpu,
        "after": after.batch,
        "epoch_end_before": before.epoch_end,
        "epoch_end_after": after.epoch_end,
        "train_end": after.train_end,
        "returned": returned,
        "rss": after.rss,
        "files": files,
        "trace_bytes": sum(trace.values()),
        **cpu,
    }


def child(args: argparse.Namespace) -> None:
    import warnings

    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    run = keras_child if args.child == "keras" else lightning_child
    with tempfile.TemporaryDirectory() as d:
        result = run(args.config, args.steps, args.epochs, Path(d), args.threads, args.hidden)
    Path(args.out).write_text(json.dumps(result))


# --------------------------------------------------------------------------------------------------- parent
def spawn(framework: str, config: str, steps: int, epochs: int, tmp: Path, args: Any) -> dict[str, Any]:
    out = tmp / f"{framework}-{config}-{time.monotonic_ns()}.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, __file__, "--child", framework, "--config", config]
    cmd += ["--steps", str(steps), "--epochs", str(epochs), "--out", str(out)]
    cmd += ["--threads", str(args.threads), "--hidden", str(args.hidden)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"child {framework}/{config} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    result["process_s"] = time.perf_counter() - t
    return result


def step_times(r: dict[str, Any], framework: str) -> dict[int, float]:
    """ms of step k (1-based) from the "before" clocks.

    Keras: clocks at ``on_train_batch_begin(k)``, step k ends where k+1 begins. Lightning: clocks at
    ``on_train_batch_end(k)``, step k starts where k-1 ended.
    """
    t = r["before"]
    if framework == "keras":
        return {k: (t[k] - t[k - 1]) * 1e3 for k in range(1, len(t))}
    return {k: (t[k - 1] - t[k - 2]) * 1e3 for k in range(2, len(t) + 1)}


def figures(r: dict[str, Any], framework: str, config: str, skip: int) -> dict[str, float]:
    st = step_times(r, framework)
    outside = [st[k] for k in st if k >= skip]
    c = r["before_cpu"]  # process CPU time at the same clocks: over steps skip..last counted
    cpu = (c[-1] - c[skip - 1]) if framework == "keras" else (c[-1] - c[skip - 2])
    f = {
        "outside_mean": statistics.fmean(outside),
        "outside_median": statistics.median(outside),
        "outside_cpu": cpu * 1e3 / len(outside),
        "region": sum(st[k] for k in range(REGION[0], REGION[1] + 1)),
        "profiled_step": statistics.median(st[k] for k in range(FIRST + 1, LAST)),
        "epoch_end": (r["epoch_end_after"][0] - r["epoch_end_before"][0]) * 1e3,
        "end_of_fit": (r["returned"] - r["train_end"]) * 1e3,
        "trace_bytes": r["trace_bytes"],
        "process_s": r["process_s"],
        "fit_s": r["returned"] - r["fit_start"],
        "others_cpu_s": r["others_cpu_s"],
        "steal_s": r["steal_s"],
    }
    if config == "fitprof":
        b, a = r["before"], r["after"]
        if framework == "keras":  # opens at on_train_batch_begin(FIRST), closes at on_train_batch_begin(LAST+1)
            f["start"], f["stop"] = (a[FIRST - 1] - b[FIRST - 1]) * 1e3, (a[LAST] - b[LAST]) * 1e3
        else:  # opens at on_train_batch_end(FIRST-1), closes at on_train_batch_end(LAST)
            f["start"], f["stop"] = (a[FIRST - 2] - b[FIRST - 2]) * 1e3, (a[LAST - 1] - b[LAST - 1]) * 1e3
    return f


def med(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float], fmt: str = ".3f") -> str:
    return f"{med(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def report(results: dict[tuple[str, str], list[dict[str, float]]], frameworks: list[str], args: Any) -> None:
    n = args.repeats
    print(f"\n### Steps outside the window (steps {args.skip}..{args.steps}), {n} fresh processes per configuration\n")
    print("| framework | configuration | ms/step, mean (median [min, max] over runs) | ratio to none, mean | "
          "ratio to none, per-step median | fitprof's ratio to it, mean | process CPU ms/step | "
          "CPU ratio to none |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for fw in frameworks:
        none, fp = results[(fw, "none")], results[(fw, "fitprof")]
        for cfg in CONFIGS[fw]:
            rs = results[(fw, cfg)]
            ratio = [a["outside_mean"] / b["outside_mean"] for a, b in zip(rs, none, strict=True)]
            ratio_med = [a["outside_median"] / b["outside_median"] for a, b in zip(rs, none, strict=True)]
            vs = [a["outside_mean"] / b["outside_mean"] for a, b in zip(fp, rs, strict=True)]
            cpu = [a["outside_cpu"] / b["outside_cpu"] for a, b in zip(rs, none, strict=True)]
            print(f"| {fw} | {cfg} | {spread([r['outside_mean'] for r in rs])} | {spread(ratio, '.4f')} | "
                  f"{spread(ratio_med, '.4f')} | {spread(vs, '.4f')} | {spread([r['outside_cpu'] for r in rs])} | "
                  f"{spread(cpu, '.4f')} |")  # fmt: skip

    others = [r["others_cpu_s"] for rs in results.values() for r in rs]
    steal = [r["steal_s"] for rs in results.values() for r in rs]
    print(f"\nDuring each child's fit: other processes' CPU {spread(others, '.2f')} s, steal {spread(steal, '.2f')} s "
          "(median [min, max] over all children).")  # fmt: skip

    print(f"\n### The window (steps {FIRST}-{LAST}) and the work around it: steps {REGION[0]}-{REGION[1]}\n")
    print("| framework | configuration | steps 4-11, ms | over none, ms | fitprof's ratio to it (steps 4-11) | "
          "profiled step (7-9), ms | fitprof start / stop, ms |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|")
    for fw in frameworks:
        none, fp = results[(fw, "none")], results[(fw, "fitprof")]
        for cfg in CONFIGS[fw]:
            rs = results[(fw, cfg)]
            extra = [a["region"] - b["region"] for a, b in zip(rs, none, strict=True)]
            vs = [a["region"] / b["region"] for a, b in zip(fp, rs, strict=True)]
            ss = "–"
            if cfg == "fitprof":
                ss = f"{spread([r['start'] for r in rs], '.1f')} / {spread([r['stop'] for r in rs], '.1f')}"
            print(f"| {fw} | {cfg} | {spread([r['region'] for r in rs], '.1f')} | {spread(extra, '.1f')} | "
                  f"{spread(vs, '.3f')} | {spread([r['profiled_step'] for r in rs], '.2f')} | {ss} |")  # fmt: skip

    print("\n### Epoch end, end of fit, trace bytes\n")
    print("| framework | configuration | epoch-end callback work, ms | per profiled step, ms | end of fit, ms | "
          "trace bytes | bytes per profiled step | process wall, s |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    steps = LAST - FIRST + 1
    for fw in frameworks:
        for cfg in CONFIGS[fw]:
            rs = results[(fw, cfg)]
            ee = [r["epoch_end"] for r in rs]
            tb = [r["trace_bytes"] for r in rs]
            print(f"| {fw} | {cfg} | {spread(ee, '.1f')} | {med(ee) / steps:.1f} | "
                  f"{spread([r['end_of_fit'] for r in rs], '.1f')} | {med(tb):,.0f} | {med(tb) / steps:,.0f} | "
                  f"{med([r['process_s'] for r in rs]):.1f} |")  # fmt: skip


def memory_report(mem: dict[tuple[str, str], dict[str, Any]], epochs: int) -> None:
    print(f"\n### Host memory, {epochs} epochs of {MEMORY_STEPS} steps, a window (steps {FIRST}-{LAST}) in every "
          "fitprof epoch\n")  # fmt: skip
    print(f"| framework | configuration | RSS after epoch 1, MB | after epoch 5, MB | after epoch {epochs}, MB | "
          f"growth 5 → {epochs}, MB | epoch-end callback work, ms: epoch 1 / median of epochs 2-{epochs} |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|")
    for (fw, cfg), r in mem.items():
        rss = r["rss"]
        work = [(a - b) * 1e3 for a, b in zip(r["epoch_end_after"], r["epoch_end_before"], strict=True)]
        print(
            f"| {fw} | {cfg} | {rss[0]:.1f} | {rss[4]:.1f} | {rss[-1]:.1f} | {rss[-1] - rss[4]:+.1f} | {work[0]:.0f} / {med(work[1:]):.0f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per configuration")
    parser.add_argument("--steps", type=int, default=300, help="steps of the one timed epoch")
    parser.add_argument("--skip", type=int, default=61, help="first step counted as 'outside the window'")
    parser.add_argument("--memory-epochs", type=int, default=20, help="0: no memory runs")
    parser.add_argument("--frameworks", default="keras,lightning")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of TensorFlow and torch (0: default)")
    parser.add_argument("--hidden", type=int, default=768, help="width of the two hidden layers")
    parser.add_argument("--seed", type=int, default=0, help="seed of the run order")
    parser.add_argument("--json", help="write every child's figures here")
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    frameworks = [f for f in args.frameworks.split(",") if f]
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    rng = random.Random(args.seed)
    results: dict[tuple[str, str], list[dict[str, float]]] = {(f, c): [] for f in frameworks for c in CONFIGS[f]}
    versions: dict[str, str] = {}
    raw: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for rep in range(args.repeats):
            order = list(results)
            rng.shuffle(order)
            for fw, cfg in order:
                r = spawn(fw, cfg, args.steps, 1, tmp, args)
                versions.update(r["versions"])
                results[(fw, cfg)].append(figures(r, fw, cfg, args.skip))
                raw.append({"repeat": rep, "framework": fw, "config": cfg, **results[(fw, cfg)][-1]})
                f = results[(fw, cfg)][-1]
                print(f"repeat {rep} {fw:<9} {cfg:<15} {f['outside_mean']:7.3f} ms/step; process {f['process_s']:.1f} s, "
                      f"fit {f['fit_s']:.1f} s, other processes' CPU {f['others_cpu_s']:.2f} s, steal {f['steal_s']:.2f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
        mem: dict[tuple[str, str], dict[str, Any]] = {}
        if args.memory_epochs >= 5:
            for fw in frameworks:
                for cfg in ("none", "fitprof"):
                    mem[(fw, cfg)] = spawn(fw, cfg, MEMORY_STEPS, args.memory_epochs, tmp, args)
                    print(f"memory {fw} {cfg}: {mem[(fw, cfg)]['rss'][-1]:.1f} MB", file=sys.stderr, flush=True)

    import fitprof

    print(f"{datetime.date.today()}, {os.cpu_count()} CPU cores, {platform.platform()}, Python "
          f"{platform.python_version()}, fitprof {fitprof.__version__}, "
          + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))  # fmt: skip
    print(f"load average (1 min) before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f}; "
          f"whole run {time.perf_counter() - started:.0f} s")  # fmt: skip
    report(results, frameworks, args)
    if mem:
        memory_report(mem, args.memory_epochs)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": raw, "memory": {f"{k[0]}/{k[1]}": v for k, v in mem.items()}}))


if __name__ == "__main__":
    main()

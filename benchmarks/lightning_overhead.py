"""What FitProfiler costs a Lightning run: hooks outside the window, the window itself, the analysis.

    python benchmarks/lightning_overhead.py [--reps 7] [--steps 300] [--threads 1]

Three configurations train the same tiny model in one process, interleaved (order shuffled each repeat):

* ``none``: no profiling callback;
* ``fitprof``: ``FitProfiler(profile_batch=(2, 3))``: the window closes at step 3, so steps 20.. measure the
  cost of its batch hooks outside the window (plus the shared per-epoch work);
* ``lightning``: Lightning's ``PyTorchProfiler()`` (default schedule: wait 1, warmup 1, active 3), whose
  ``record_function`` wrapping of every hook stays on for the whole run.

Step time is the interval between consecutive ``on_train_batch_end`` calls (a timing callback registered first,
the same in every configuration), median over steps 20..N of one run, then median over repeats. The direct
cost of FitProfiler's ``on_train_batch_end`` outside the window is also timed in a tight loop. Finally the
end-of-epoch work (``fitprof.analyze`` of the window's trace, the ``.xplane.pb`` conversion) and the export at
window end are timed on a 5-step window of the digits model.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PyTorchProfiler

from fitprof import analyze
from fitprof.lightning import FitProfiler
from fitprof.traces.xspace_write import write_xspace

SKIP = 20


class StepClock(Callback):
    """Records ``perf_counter`` at every ``on_train_batch_end``."""

    def __init__(self) -> None:
        self.t: list[float] = []

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.t.append(time.perf_counter())

    def median_step_ms(self) -> float:
        deltas = [b - a for a, b in zip(self.t[SKIP:], self.t[SKIP + 1 :], strict=False)]
        return 1e3 * statistics.median(deltas)


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(steps: int) -> Any:
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(steps * 16, 32, generator=g), torch.randint(0, 4, (steps * 16,)))
    return torch.utils.data.DataLoader(ds, batch_size=16)


def run(config: str, steps: int, tmp: Path) -> float:
    clock = StepClock()
    callbacks: list[Callback] = [clock]
    profiler: Any = None
    if config == "fitprof":
        callbacks.append(FitProfiler(log_dir=tmp / "fitprof", profile_batch=(2, 3)))
    elif config == "lightning":
        profiler = PyTorchProfiler(dirpath=tmp / "lightning", filename="prof")
    trainer = pl.Trainer(
        max_epochs=1,
        callbacks=callbacks,
        profiler=profiler,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp,
        num_sanity_val_steps=0,
    )
    trainer.fit(Tiny(), loader(steps))
    return clock.median_step_ms()


def hook_cost_ns(calls: int = 200_000) -> float:
    """ns per ``FitProfiler.on_train_batch_end`` call outside the window (epoch profiled, window done)."""
    cb = FitProfiler(profile_batch=(2, 3))
    cb._epoch_on = True  # a profiled epoch, past its window: the realistic slow path of the fast path
    cb._first, cb._last = 10**9, 10**9 + 1
    hook = cb.on_train_batch_end
    t = time.perf_counter_ns()
    for i in range(calls):
        hook(None, None, None, None, i)  # type: ignore[arg-type]
    return (time.perf_counter_ns() - t) / calls


def analysis_cost(tmp: Path, reps: int) -> dict[str, float]:
    """Median seconds of analyze / xplane writing / the callback's whole end-of-epoch work on the digits model."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import lightning_digits

    logdir = tmp / "digits"
    cb = lightning_digits.main(["--logdir", str(logdir), "--epochs", "2"])
    trace = cb.trace_paths[0]
    a, x = [], []
    for i in range(reps):
        t = time.perf_counter()
        analyze(trace)
        a.append(time.perf_counter() - t)
        t = time.perf_counter()
        write_xspace(trace, tmp / "x", f"s{i}")
        x.append(time.perf_counter() - t)
    return {
        "analyze_s": statistics.median(a),
        "xplane_s": statistics.median(x),
        "callback_epoch_end_s": statistics.median(cb.analysis_seconds.values()),
        "trace_kb": trace.stat().st_size / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    configs = ["none", "fitprof", "lightning"]
    results: dict[str, list[float]] = {c: [] for c in configs}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run("none", 40, tmp)  # warm-up: imports, first-call costs
        for _ in range(args.reps):
            order = configs[:]
            rng.shuffle(order)
            for c in order:
                results[c].append(run(c, args.steps, tmp))
        base = statistics.median(results["none"])
        print(f"Step time outside any window, median of {args.reps} interleaved runs, steps {SKIP}..{args.steps}:")
        for c in configs:
            med = statistics.median(results[c])
            print(f"  {c:<10} {med:7.3f} ms/step  ({med - base:+.3f} ms vs none)   runs: "
                  + " ".join(f"{v:.3f}" for v in results[c]))  # fmt: skip
        for c in ("fitprof", "lightning"):
            diffs = [a - b for a, b in zip(results[c], results["none"], strict=True)]
            print(f"  paired difference {c} - none: median {statistics.median(diffs):+.3f} ms/step")
        print(f"FitProfiler.on_train_batch_end outside the window: {hook_cost_ns():.0f} ns per call")
        cost = analysis_cost(tmp, args.reps)
        print(
            f"Digits model, 5-step window ({cost['trace_kb']:.0f} KB gzipped trace): analyze "
            f"{cost['analyze_s'] * 1e3:.0f} ms, .xplane.pb {cost['xplane_s'] * 1e3:.0f} ms, callback end-of-epoch "
            f"work {cost['callback_epoch_end_s'] * 1e3:.0f} ms (median)"
        )


if __name__ == "__main__":
    main()

"""False-alarm rate of ``fitprof compare`` on repeated runs of one small Lightning model (and, with ``--planted``,
how often it catches a planted slower operator).

    python benchmarks/compare_false_alarms.py [--runs 6] [--planted 2] [--planted-ms 2] [--epochs 3]
                                              [--out DIR] [--reuse] [--fail-over PCT] [--min-ms MS]

Each run is a fresh process (``torch.set_num_threads(1)``) training the same tiny MLP for 3 epochs (``--epochs``)
of 40 steps with ``FitProfiler(profile_batch=(6, 15))``: 3 windows of 10 steps, one report file each. Every step
also calls a custom operator ``fitprof_bench::slow`` that copies its input (and sleeps only in the planted runs).
Then every ordered pair of same-code runs (``runs * (runs - 1)`` comparisons) goes through ``fitprof compare A B``
(default thresholds unless given): a false alarm is an exit status other than 0 (1: a regression, 2: "not
comparable"); exit 3 (inconclusive: a side CPU-contended) is counted apart. With ``--planted N``, N more runs sleep ``--planted-ms`` in that operator, and each is compared
against every same-code run as the baseline: a detection is an exit status 1 that names ``fitprof_bench::slow``.

Runs are sequential, so the machine's load at the time shows in the spread, as it would between two CI jobs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 3
STEPS = 40
WINDOW = (6, 15)


def child(run_dir: Path, sleep_ms: float, epochs: int) -> None:
    """One training run into ``run_dir``."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from fitprof.lightning import FitProfiler

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)

    # The schema is spelled out: with postponed annotations torch cannot infer it from a local function.
    @torch.library.custom_op("fitprof_bench::slow", mutates_args=(), schema="(Tensor x, float ms) -> Tensor")
    def slow(x: torch.Tensor, ms: float) -> torch.Tensor:
        if ms > 0:  # time.sleep(0) still gives up the core, which on a busy machine takes milliseconds to get back
            time.sleep(ms / 1000)
        return x.clone()

    @slow.register_fake
    def _(x: torch.Tensor, ms: float) -> torch.Tensor:
        return torch.empty_like(x)

    slow.register_autograd(lambda ctx, grad: (grad, None))

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(slow(x, sleep_ms)), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(STEPS * 32, 64, generator=g), torch.randint(0, 10, (STEPS * 32,), generator=g))
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[FitProfiler(log_dir=run_dir, profile_batch=WINDOW, verbose=False)],
    )
    trainer.fit(Model(), DataLoader(data, batch_size=32))


def _run(run_dir: Path, sleep_ms: float, epochs: int) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(
        [sys.executable, __file__, "--child", str(run_dir), "--planted-ms", str(sleep_ms), "--epochs", str(epochs)],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _compare(a: Path, b: Path, options: list[str]) -> tuple[int, dict]:
    from fitprof.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["compare", str(a), str(b), "--format", "json", *options])
    records = json.loads(out.getvalue()) if out.getvalue() else []
    return rc, {"records": records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="same-code runs (default 6: 30 ordered pairs)")
    parser.add_argument("--planted", type=int, default=0, help="runs with the slower operator (default 0)")
    parser.add_argument("--epochs", type=int, default=EPOCHS, help=f"epochs a run, one window each (default {EPOCHS})")
    parser.add_argument("--planted-ms", type=float, default=2.0, help="the planted operator's sleep (ms a step)")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument(
        "--reuse", action="store_true", help="compare the runs already in --out instead of training them again"
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args, options = parser.parse_known_args()  # the rest (--fail-over, --min-ms) goes to fitprof compare
    if args.child is not None:
        child(args.child, args.planted_ms, args.epochs)
        return
    sys.path.insert(0, str(ROOT / "src"))
    with tempfile.TemporaryDirectory(prefix="fitprof-compare-bench-") as tmp:
        root = args.out or Path(tmp)
        same = [root / f"same{i}" for i in range(args.runs)]
        planted = [root / f"planted{i}" for i in range(args.planted)]
        start = time.perf_counter()
        if not args.reuse:
            for i, run in enumerate(same):  # interleave the planted runs with the same-code ones
                _run(run, 0.0, args.epochs)
                if i < len(planted):
                    _run(planted[i], args.planted_ms, args.epochs)
            for run in planted[len(same) :]:
                _run(run, args.planted_ms, args.epochs)
            print(f"{len(same) + len(planted)} runs in {time.perf_counter() - start:.0f} s")
        alarms = []
        inconclusive = 0
        pairs = list(itertools.permutations(same, 2))
        for a, b in pairs:
            rc, doc = _compare(a, b, options)
            head = doc["records"][0] if doc["records"] else {}
            step = next((r for r in doc["records"] if r.get("name") == "step_time_ms"), {})
            print(
                f"{a.name} -> {b.name}: exit {rc}, step time {step.get('change_percent', float('nan')):+.1f}% "
                f"(ratio interval {step.get('ratio_low', float('nan')):.3f}-{step.get('ratio_high', float('nan')):.3f})"
            )
            if rc == 3:  # inconclusive (a side CPU-contended): counted apart, not an alarm
                inconclusive += 1
            elif rc != 0:  # 1: a regression; 2: "not comparable", which fails a CI job as well
                alarms.append((a.name, b.name, head.get("headline", "not comparable")))
        for a, b, headline in alarms:
            print(f"  false alarm {a} -> {b}: {headline}")
        print(
            f"false alarms: {len(alarms)} of {len(pairs)} same-code pairs ({100 * len(alarms) / len(pairs):.1f}%); "
            f"inconclusive: {inconclusive}"
        )
        if planted:
            hits = 0
            for base, cand in itertools.product(same, planted):
                rc, doc = _compare(base, cand, options)
                named = any(
                    r.get("record") == "operator" and r["name"] == "fitprof_bench::slow" and r["regression"]
                    for r in doc["records"]
                )
                hits += rc == 1 and named
            total = len(same) * len(planted)
            print(
                f"detected: {hits} of {total} pairs with fitprof_bench::slow +{args.planted_ms:g} ms/step "
                f"({100 * hits / total:.1f}%)"
            )


if __name__ == "__main__":
    main()

"""What the steps after a window pay for its ``.xplane.pb`` conversion: fresh processes, trees interleaved.

Each run is a fresh Python process: a Lightning fit of one 60-step epoch of a 32-64-4 MLP (batch 16, 1 torch
thread, CPU) with ``FitProfiler(profile_batch=(6, 10))`` (a window of about 2,000 events). A callback takes the wall
time of every step (batch end to batch end). The figure is the time steps 11-30 took beyond 20 times the median
of steps 31-60 (the steady steps, long after the conversion): where a tree converts the window in a thread of the
training process, that thread holds the GIL against those steps; where it converts in a process, that process
competes only for a core. ``FITPROF_WAIT_FOR_PROFILES=1`` in every run. The load average is printed before and
after; under load, the figure is an order of magnitude.

    python benchmarks/post_window_steps.py --repeats 3 --src /work/main/src src
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import statistics, tempfile, time
    import torch
    import lightning.pytorch as pl
    from fitprof.lightning import FitProfiler

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Mlp(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

        def training_step(self, batch, idx):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Steps(pl.Callback):
        def __init__(self):
            self.ms, self.last = [], None

        def on_train_batch_end(self, trainer, module, outputs, batch, idx):
            now = time.perf_counter()
            self.ms.append((now - self.last) * 1e3 if self.last is not None else 0.0)
            self.last = now

    log_dir, steps = tempfile.mkdtemp(), Steps()
    data = torch.utils.data.TensorDataset(torch.randn(60 * 16, 32), torch.randn(60 * 16, 4))
    pl.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=log_dir,
        callbacks=[FitProfiler(log_dir=log_dir, profile_batch=(6, 10), verbose=False), steps],
    ).fit(Mlp(), torch.utils.data.DataLoader(data, batch_size=16))
    steady = statistics.median(steps.ms[30:60])
    print(f"RESULT {sum(steps.ms[10:30]) - 20 * steady:.2f} {steady:.3f}")
    """
)


def run(src: str) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src), "FITPROF_WAIT_FOR_PROFILES": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{src}: {proc.stderr[-2000:]}")
    extra, steady = lines[-1].split()[1:]
    return float(extra), float(steady)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--src", nargs="+", default=["src"], help="fitprof source trees, one arm each")
    args = parser.parse_args()
    print("load before:", Path("/proc/loadavg").read_text().strip())
    extra: dict[str, list[float]] = {src: [] for src in args.src}
    for r in range(args.repeats):
        for src in args.src if r % 2 == 0 else list(reversed(args.src)):
            ms, steady = run(src)
            extra[src].append(ms)
            print(f"repeat {r} {src}: steps 11-30 beyond the steady step ({steady:.2f} ms): {ms:.1f} ms", flush=True)
    print("load after:", Path("/proc/loadavg").read_text().strip())
    for src, values in extra.items():
        print(f"{src}: median {statistics.median(values):.1f} ms [{min(values):.1f}, {max(values):.1f}]")


if __name__ == "__main__":
    main()

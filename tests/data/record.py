"""Re-record the real traces in ``tests/data/`` with fitprof's own callbacks (CPU only, a few seconds each).

    python tests/data/record.py [lightning] [keras] [ddp]      # all three when none is named

Each recording trains a small model on scikit-learn's digits (the examples' data and models) for one epoch with
``FitProfiler(profile_batch=(6, 8))`` (a 3-step window, so the files stay small) and copies the window's trace
here under a stable name:

* ``lightning_cpu.pt.trace.json.gz``: Lightning, one process, the DataLoader doing real per-sample augmentation
  in ``__getitem__`` (``examples/lightning_digits.py --slow-input``), so the loop waits for input;
* ``keras_tf_cpu.xplane.pb``: Keras 3 on TensorFlow, ``tf.data`` with the same kind of augmentation
  (``examples/keras_digits.py --slow-input``);
* ``ddp_gloo_rank0.pt.trace.json.gz`` and ``ddp_gloo_rank1.pt.trace.json.gz``: Lightning DDP, two CPU processes,
  gloo, rank 1's ``Dataset`` sleeping 10 ms a batch (the straggler). Lightning's ``ddp`` strategy re-launches
  this script for rank 1, which is why the ``ddp`` mode reads ``--rank-dir``.

Timings differ from run to run; the counts the tests use (steps, spans, ranks) do not. After re-recording, run
``python tests/handcount.py tests/data/*.json.gz`` and update ``tests/data/README.md``.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT / "examples"), str(HERE.parent)]  # the examples; tests/ for the shared Lightning model
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

WINDOW = (6, 8)
STEPS_PER_EPOCH = 10
DDP_SLOW_RANK = 1
DDP_SLEEP_PER_BATCH_S = 0.010


def _trainer_kwargs() -> dict[str, Any]:
    return {
        "max_epochs": 1,
        "accelerator": "cpu",
        "limit_train_batches": STEPS_PER_EPOCH,
        "limit_val_batches": 0,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
    }


def record_lightning(tmp: Path) -> Path:
    import lightning.pytorch as pl
    import lightning_digits
    import torch

    from fitprof.lightning import FitProfiler

    pl.seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    train, _ = lightning_digits.make_loaders(slow_input=True)
    profiler = FitProfiler(log_dir=tmp / "lightning", profile_batch=WINDOW)
    trainer = pl.Trainer(devices=1, callbacks=[profiler], **_trainer_kwargs())
    trainer.fit(lightning_digits.build_module(), train)
    return _copy(profiler.trace_paths[0], "lightning_cpu.pt.trace.json.gz")


def record_keras(tmp: Path) -> Path:
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras
    import keras_digits

    from fitprof.keras import FitProfiler

    keras.utils.set_random_seed(0)
    train, _ = keras_digits.make_dataset(slow_input=True)
    profiler = FitProfiler(log_dir=tmp / "keras", profile_batch=WINDOW)
    model = keras_digits.build_model()
    model.fit(train, epochs=1, steps_per_epoch=STEPS_PER_EPOCH, callbacks=[profiler], verbose=0, shuffle=False)
    (xplane,) = glob.glob(os.fspath(tmp / "keras" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    return _copy(Path(xplane), "keras_tf_cpu.xplane.pb")


def record_ddp(rank_dir: Path) -> list[Path]:
    """Runs as both ranks (Lightning re-launches ``sys.argv``); rank 0 copies both traces when done."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader

    from fitprof.lightning import FitProfiler
    from lightning_tiny import Mlp as Model
    from lightning_tiny import RegressionData

    torch.set_num_threads(1)

    class Data(RegressionData):
        def wait(self, i: int) -> None:
            if torch.distributed.get_rank() == DDP_SLOW_RANK:
                time.sleep(DDP_SLEEP_PER_BATCH_S / 8)

    profiler = FitProfiler(log_dir=rank_dir, profile_batch=WINDOW)
    trainer = pl.Trainer(devices=2, strategy="ddp", callbacks=[profiler], **_trainer_kwargs())
    trainer.fit(Model(), DataLoader(Data(2 * STEPS_PER_EPOCH * 8), batch_size=8))
    if trainer.global_rank != 0:
        return []
    out = []
    for rank in (0, 1):
        (trace,) = glob.glob(os.fspath(rank_dir / f"*_rank{rank}.*.pt.trace.json.gz"))
        out.append(_copy(Path(trace), f"ddp_gloo_rank{rank}.pt.trace.json.gz"))
    return out


def _copy(src: Path, name: str) -> Path:
    dst = HERE / name
    shutil.copyfile(src, dst)
    print(f"{dst.relative_to(ROOT)}: {dst.stat().st_size:,} bytes")
    return dst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="*", help="lightning, keras, ddp (default: all three)")
    parser.add_argument("--rank-dir", help="(ddp, internal) the folder both ranks write into")
    args = parser.parse_args(argv)
    if args.rank_dir:  # a DDP rank (rank 0 started here, rank 1 re-launched by Lightning with the same argv)
        record_ddp(Path(args.rank_dir))
        return
    what = args.what or ["lightning", "keras", "ddp"]
    if set(what) - {"lightning", "keras", "ddp"}:
        parser.error(
            f"unknown recording(s) {sorted(set(what) - {'lightning', 'keras', 'ddp'})}; allowed: lightning, keras, ddp"
        )
    with tempfile.TemporaryDirectory(prefix="fitprof-record-") as tmp:
        if "lightning" in what:
            record_lightning(Path(tmp))
        if "keras" in what:
            record_keras(Path(tmp))
        if "ddp" in what:
            import subprocess

            rank_dir = Path(tmp) / "ddp"
            cmd = [sys.executable, os.fspath(Path(__file__).resolve()), "ddp", "--rank-dir", os.fspath(rank_dir)]
            env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK")}
            subprocess.run(cmd, check=True, timeout=600, env=env)


if __name__ == "__main__":
    main()

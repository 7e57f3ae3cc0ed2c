"""The CPU a Lightning fit spends converting its window to ``.xplane.pb``, fresh processes, interleaved.

Each run is a fresh Python process (the training process) running one Lightning fit of 12 steps, 1 epoch, 1 torch
thread, CPU, with ``FitProfiler`` and one window that ends mid-epoch, under ``FITPROF_WAIT_FOR_PROFILES=1`` so that
the end of the fit waits for the conversion and reaps the converter process. Two windows:

* ``small``: an 8-layer MLP, ``profile_batch=(2, 3)``: about 10^3 events;
* ``big``: the same with 800 small operators a step (as ``benchmarks/epoch_end_gap.py``'s ``big``),
  ``profile_batch=(2, 7)``: about 10^5 events.

The conversion's CPU per fit is the converter processes' CPU (user + system, ``resource.getrusage(RUSAGE_CHILDREN)``
over the fit: the fit reaps them) plus the CPU time of the training process's converter thread
(``XplaneWorker.thread_cpu_s``, :func:`time.thread_time` in that thread; 0 on a tree without the thread). Apart:
on a tree with the thread, loading the converter into the training process (``fitprof.traces.xspace_write``, which
the fit's start does once a process), timed before the fit. The training thread's other CPU is not in it. Each ``--src`` tree (``PYTHONPATH``) is one arm; arms and windows alternate
within every repeat. Also printed: the window's events (``"ph"`` keys of its trace), the processes started, and
whether the ``.xplane.pb`` was there when ``fit`` returned with the wait switched off (a second, unwaited fit per
run would double the cost, so that column comes from ``--no-wait`` runs only). The load average is printed before
and after.

    python benchmarks/conversion_cpu.py --repeats 3 --src /work/main/src src
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

CHILD = textwrap.dedent(
    """
    import glob, gzip, json, os, resource, sys, time
    import torch
    import lightning.pytorch as pl
    from fitprof.fit import xplane_worker
    from fitprof.lightning import FitProfiler

    workload, out, log_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    workers, spawns = [], []
    init = xplane_worker.XplaneWorker.__init__

    def kept(self, *args, **kwargs):
        init(self, *args, **kwargs)
        workers.append(self)

    xplane_worker.XplaneWorker.__init__ = kept
    spawn = xplane_worker._spawn

    def counted(*args, **kwargs):
        spawns.append(1)
        return spawn(*args, **kwargs)

    xplane_worker._spawn = counted

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
            self.reps = 800 if workload == "big" else 0

        def training_step(self, batch, idx):
            x, y = batch
            h = self.body(x)
            for _ in range(self.reps):  # many small operators: a window of about 10^5 events
                h = h * 0.999 + 0.001
            return torch.nn.functional.mse_loss(h, y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(12 * 16, 64), torch.randn(12 * 16, 64))
    window = (2, 7) if workload == "big" else (2, 3)
    trainer = pl.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=log_dir,
        callbacks=[FitProfiler(log_dir=log_dir, profile_batch=window, verbose=False)],
    )
    load = 0.0
    if hasattr(xplane_worker, "IN_THREAD_BELOW"):  # a tree that converts small windows here: it loads the converter
        t0 = time.thread_time()
        import fitprof.traces.xspace_write
        load = time.thread_time() - t0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=16))
    there = bool(glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb")))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    thread = sum(getattr(w, "thread_cpu_s", 0.0) for w in workers)
    (trace,) = glob.glob(os.path.join(log_dir, "*.pt.trace.json.gz"))
    with gzip.open(trace, "rb") as fh:
        events = fh.read().count(b'"ph"')
    with open(out, "w") as fh:
        json.dump(
            {"child_s": child, "thread_s": thread, "load_s": load, "events": events, "spawns": len(spawns),
             "there": there},
            fh,
        )
    """
)


def run(src: str, workload: str, *, wait: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
        if wait:
            env["FITPROF_WAIT_FOR_PROFILES"] = "1"
        else:
            env.pop("FITPROF_WAIT_FOR_PROFILES", None)
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, workload, str(out), str(Path(tmp) / "logs")],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{src} {workload}: {proc.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
        if not wait:  # the detached converter writes into the folder about to be deleted: let it end first
            import fitprof

            with contextlib.suppress(Exception):
                fitprof.wait_for_profiles(Path(tmp) / "logs", timeout=120)
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--src", nargs="+", default=["src"], help="fitprof source trees, one arm each")
    parser.add_argument("--workloads", nargs="+", default=["small", "big"])
    parser.add_argument("--no-wait", action="store_true", help="fits that do not wait (the 'there' column)")
    args = parser.parse_args()
    print("load before:", Path("/proc/loadavg").read_text().strip())
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(args.repeats):
        order = args.src if r % 2 == 0 else list(reversed(args.src))
        for workload in args.workloads:
            for src in order:
                res = run(src, workload, wait=not args.no_wait)
                results.setdefault((workload, src), []).append(res)
                print(f"repeat {r} {workload:5} {src}: {res}", flush=True)
    print("load after:", Path("/proc/loadavg").read_text().strip())
    print()
    print(
        "| window | tree | events (median) | conversion CPU per fit, s: median [min, max] | of which process | "
        "of which thread | converter load (once a process) | processes started | file there at fit's return |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (workload, src), rs in results.items():
        total = [x["child_s"] + x["thread_s"] for x in rs]
        print(
            f"| {workload} | {src} | {statistics.median(x['events'] for x in rs):,.0f} | "
            f"{statistics.median(total):.3f} [{min(total):.3f}, {max(total):.3f}] | "
            f"{statistics.median(x['child_s'] for x in rs):.3f} | {statistics.median(x['thread_s'] for x in rs):.3f} | "
            f"{statistics.median(x['load_s'] for x in rs):.3f} | "
            f"{statistics.median(x['spawns'] for x in rs):.0f} | {sum(x['there'] for x in rs)}/{len(rs)} |"
        )


if __name__ == "__main__":
    main()

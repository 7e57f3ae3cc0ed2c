"""The epoch-end gap of a profiled Lightning epoch: the time from the epoch's last batch to the next epoch's first.

Three modes, each in a fresh process, interleaved (A B C A B C ...):

* ``none``: no profiler;
* ``torch``: torch's own profiler over the same steps, stopped and exported (``export_chrome_trace`` to ``.gz``) at
  the epoch's end, the least a profiled epoch can cost;
* ``fitprof``: ``FitProfiler(profile_batch=(2, steps))``, whose window closes at the epoch's end too (stop, export,
  analysis and report; the ``.xplane.pb`` is written in the background).

Two workloads: ``tiny`` (an 8-layer MLP, a window of a few thousand events) and ``big`` (a model that runs about
4,000 small operators a step, a window of about 10^5 events). CPU only, ``torch.set_num_threads(1)``.
``--framework keras``: the same with Keras 3 on torch (``KERAS_BACKEND=torch``, fitprof's Keras ``FitProfiler``; the
``big`` workload's small operators run in a layer's ``call``). ``--framework keras-tf``: Keras 3 on TensorFlow
(``KERAS_BACKEND=tensorflow``, ``jit_compile=False`` so that the small operators stay operators, one intra-op and
one inter-op thread), where the ``torch`` mode is TensorFlow's own profiler instead
(``tf.profiler.experimental.start`` at the first batch, ``stop()`` at the epoch's end, as Keras's
``TensorBoard(profile_batch=...)`` does): it writes the XSpace itself, and fitprof's analysis is what remains.

    python benchmarks/epoch_end_gap.py --repeats 3 [--workloads tiny big] [--src A B ...] [--framework keras|keras-tf]

Prints one row per workload and mode (median gap over the repeats, ms) and the extra gaps against ``none``; then
the same for the gap's CPU time in the training thread (``time.thread_time``), which others' load on the machine
stretches far less than the wall time; then each window's events, and each gap's time in Python's garbage
collector (a full collection lands in whichever code's allocation crosses the threshold).
``--src``: run the ``fitprof`` mode once per source tree given (each child with ``PYTHONPATH`` set to it, e.g. the
``src`` of two checkouts, before and after a change), interleaved with the other modes in every repeat; the
children of ``none`` and ``torch`` get the first one.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STEPS = 6
_GC_S = [0.0, 0.0]
"""Seconds spent in Python's garbage collector so far, and when the running collection began."""


def _time_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _GC_S[1] = time.perf_counter()
    else:
        _GC_S[0] += time.perf_counter() - _GC_S[1]


def _start_gc_clock() -> None:
    """A fit's full collections (about 0.3-0.5 s each late in the big TensorFlow fit, whose traced graph holds
    many objects) land wherever an allocation crosses the threshold; the gap's share of them is reported apart."""
    gc.callbacks.append(_time_gc)


def keras_child(mode: str, workload: str, out: str, backend: str = "torch") -> None:
    os.environ["KERAS_BACKEND"] = backend
    import keras
    import numpy as np

    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.random.set_seed(0)
    else:
        import torch

        torch.set_num_threads(1)
        torch.manual_seed(0)  # not keras.utils.set_random_seed: it imports TensorFlow where installed, which a fit
    np.random.seed(0)  # on torch otherwise never loads (fitprof's first event-file write must not either)

    # TensorFlow's executor records about a fifth as many events per small operator as torch's profiler does
    reps = 0 if workload != "big" else 4400 if backend == "tensorflow" else 800

    class SmallOps(keras.layers.Layer):
        def call(self, h: Any) -> Any:
            for _ in range(reps):  # many small operators: a window of about 10^5 events
                h = h * 0.999 + 0.001
            return h

    model = keras.Sequential([keras.Input((64,)), *[keras.layers.Dense(64) for _ in range(8)], SmallOps()])
    model.compile(optimizer="sgd", loss="mse", **({"jit_compile": False} if backend == "tensorflow" else {}))
    x = np.random.randn(STEPS * 16, 64).astype("float32")
    y = np.random.randn(STEPS * 16, 64).astype("float32")

    class Gap(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.last_end: float | None = None
            self.last_cpu = 0.0
            self.gaps: list[float] = []
            self.cpu: list[float] = []
            self.gc: list[float] = []
            self.last_gc = 0.0
            self.epoch = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.last_end, self.last_cpu, self.end_epoch = time.perf_counter(), time.thread_time(), self.epoch
            self.last_gc = _GC_S[0]

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if self.last_end is not None and self.epoch != self.end_epoch:
                self.gaps.append(time.perf_counter() - self.last_end)
                self.cpu.append(time.thread_time() - self.last_cpu)
                self.gc.append(_GC_S[0] - self.last_gc)

    class Own(keras.callbacks.Callback):
        """The backend's own profiler over the same steps: ``begin`` at the first batch, ``end`` (stop it and write
        its trace) at the first epoch's end, timed."""

        def __init__(self, begin: Any, end: Any) -> None:
            super().__init__()
            self.begin, self.end = begin, end
            self.running = False
            self.epoch = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if self.epoch == 0 and batch == 0:
                self.begin()
                self.running = True

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if self.running:
                self.running = False
                t0 = time.perf_counter()
                self.end()
                self.stop_export_s = time.perf_counter() - t0

    tmp = Path(tempfile.mkdtemp(prefix="gap-"))
    gap = Gap()
    callbacks: list[Any] = [gap]  # first: the last batch's end is timed before any profiler's hook runs
    own: Any = None
    if mode == "fitprof":
        from fitprof.keras import FitProfiler

        callbacks.append(FitProfiler(log_dir=str(tmp), profile_batch=(2, STEPS), every_n_epochs=2))
    elif mode == "torch" and backend == "tensorflow":  # stop() collects the trace and writes the .xplane.pb
        own = Own(lambda: tf.profiler.experimental.start(str(tmp)), tf.profiler.experimental.stop)
        callbacks.append(own)
    elif mode == "torch":
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])

        def stop_and_export() -> None:
            prof.stop()
            prof.export_chrome_trace(str(tmp / "own.pt.trace.json"))  # plain: torch's .gz writer is far slower

        own = Own(prof.start, stop_and_export)
        callbacks.append(own)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False, callbacks=callbacks)
    _write_result(out, tmp, gap.gaps[0], gap.cpu[0], gap.gc[0], getattr(own, "stop_export_s", None))


def _write_result(
    out: str, tmp: Path, gap_s: float, gap_cpu_s: float, gap_gc_s: float, stop_export_s: float | None
) -> None:
    events = 0
    for trace in tmp.glob("*.pt.trace.json*"):  # the window's size, in complete events
        import gzip

        with (gzip.open if trace.suffix == ".gz" else open)(trace, "rb") as fh:
            events = sum(1 for e in json.loads(fh.read())["traceEvents"] if e.get("ph") == "X")
    for trace in tmp.glob("plugins/profile/*/*.xplane.pb"):  # TensorFlow's window: the events fitprof reads
        from fitprof.traces import read_trace

        events = len(read_trace(trace))
    Path(out).write_text(
        json.dumps(
            {
                "gap_s": gap_s,
                "gap_cpu_s": gap_cpu_s,
                "gap_gc_s": gap_gc_s,
                "events": events,
                "stop_export_s": stop_export_s,
                "load": os.getloadavg()[0],
            }
        )
    )


def child(mode: str, workload: str, out: str) -> None:
    import lightning.pytorch as pl
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
            self.reps = 800 if workload == "big" else 0

        def training_step(self, batch: Any, idx: int) -> Any:
            x, y = batch
            h = self.body(x)
            for _ in range(self.reps):  # many small operators: a window of about 10^5 events
                h = h * 0.999 + 0.001
            loss = torch.nn.functional.mse_loss(h, y)
            self.log("train_loss", loss)  # as most modules do: Lightning's one-time logging set-up happens here
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Gap(pl.Callback):
        def __init__(self) -> None:
            self.last_end: float | None = None
            self.last_cpu = 0.0
            self.gaps: list[float] = []
            self.cpu: list[float] = []
            self.gc: list[float] = []
            self.last_gc = 0.0
            self.epoch_of_end = -1

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            self.last_end = time.perf_counter()
            self.last_cpu = time.thread_time()
            self.last_gc = _GC_S[0]
            self.epoch_of_end = trainer.current_epoch

        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            if self.last_end is not None and trainer.current_epoch != self.epoch_of_end:
                self.gaps.append(time.perf_counter() - self.last_end)
                self.cpu.append(time.thread_time() - self.last_cpu)
                self.gc.append(_GC_S[0] - self.last_gc)

    class TorchOwn(pl.Callback):
        def __init__(self, where: Path) -> None:
            self.where = where
            self.prof: Any = None

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
            if trainer.current_epoch == 0 and idx == 0:
                self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                self.prof.start()

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if self.prof is not None:
                prof, self.prof = self.prof, None
                t0 = time.perf_counter()
                prof.stop()
                prof.export_chrome_trace(
                    str(self.where / "own.pt.trace.json")
                )  # plain: torch's .gz writer is far slower
                self.stop_export_s = time.perf_counter() - t0

    data = torch.utils.data.TensorDataset(torch.randn(STEPS * 16, 64), torch.randn(STEPS * 16, 64))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    tmp = Path(tempfile.mkdtemp(prefix="gap-"))
    gap = Gap()
    callbacks: list[Any] = [gap]  # first: the last batch's end is timed before any profiler's hook runs
    own = None
    if mode == "fitprof":
        from fitprof.lightning import FitProfiler

        callbacks.append(FitProfiler(log_dir=str(tmp), profile_batch=(2, STEPS), every_n_epochs=2))
    elif mode == "torch":
        own = TorchOwn(tmp)
        callbacks.append(own)
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
    )
    trainer.fit(Net(), loader)
    _write_result(out, tmp, gap.gaps[0], gap.cpu[0], gap.gc[0], getattr(own, "stop_export_s", None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=["tiny", "big"])
    parser.add_argument("--src", nargs="+", default=[], help="source trees to compare (PYTHONPATH of each child)")
    parser.add_argument("--framework", choices=["lightning", "keras", "keras-tf"], default="lightning")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "WORKLOAD", "OUT"))
    args = parser.parse_args()
    if args.child:
        _start_gc_clock()
        if args.framework == "lightning":
            child(*args.child)
        else:
            mode, workload, out = args.child
            keras_child(mode, workload, out, backend="tensorflow" if args.framework == "keras-tf" else "torch")
        return
    srcs = [str(Path(s).resolve()) for s in args.src]
    modes = [("none", srcs[:1]), ("torch", srcs[:1])] + [("fitprof", [s]) for s in srcs or [""]]
    runs = [(mode, src[0] if src and src[0] else "") for mode, src in modes]
    own_name = "tensorflow" if args.framework == "keras-tf" else "torch"  # the mode of the backend's own profiler
    label = {
        run: (own_name if run[0] == "torch" else run[0])
        if len(srcs) < 2 or run[0] != "fitprof"
        else f"fitprof@{run[1]}"
        for run in runs
    }
    results: dict[tuple[str, tuple[str, str]], list[dict[str, Any]]] = {}
    base = {**os.environ, "OMP_NUM_THREADS": "1"}
    loads = []
    for workload in args.workloads:
        for _ in range(args.repeats):
            for run in runs:
                mode, src = run
                env = {**base, "PYTHONPATH": src} if src else base
                with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
                    out = fh.name
                subprocess.run([sys.executable, __file__, "--framework", args.framework, "--child", mode, workload, out],
                               check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
                results.setdefault((workload, run), []).append(json.loads(Path(out).read_text()))
                loads.append(os.getloadavg()[0])
                os.unlink(out)
    load = os.getloadavg()
    print(f"{args.framework}; load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; 1-minute load after each child: "
          f"{min(loads):.2f}-{max(loads):.2f}")  # fmt: skip
    for workload, field in ((w, f) for w in args.workloads for f in ("gap_s", "gap_cpu_s")):
        med = {run: statistics.median(r[field] for r in results[(workload, run)]) * 1e3 for run in runs}
        gaps = {label[run]: [round(r[field] * 1e3, 1) for r in results[(workload, run)]] for run in runs}
        none, torch_own = med[runs[0]], med[runs[1]]
        extra_t = torch_own - none
        fitprof = ", ".join(
            f"{label[run]} {med[run]:.1f} (extra {med[run] - none:.1f} ms, "
            f"{(med[run] - none) / extra_t if extra_t > 0 else float('nan'):.2f}x its)"
            for run in runs[2:]
        )
        own = "TensorFlow's stop" if args.framework == "keras-tf" else "torch stop+export"
        print(
            f"{workload} {'wall' if field == 'gap_s' else 'CPU'}: gap ms median none {none:.1f}, {own} "
            f"{torch_own:.1f} (extra {extra_t:.1f} ms); "
            f"{fitprof}; all gaps {gaps}"
        )
    for workload in args.workloads:
        events = {label[run]: statistics.median(r["events"] for r in results[(workload, run)]) for run in runs[1:]}
        print(f"{workload}: window events (median) {events}")
        in_gc = {label[run]: [round(r["gap_gc_s"] * 1e3, 1) for r in results[(workload, run)]] for run in runs}
        print(f"{workload}: of each gap, ms in Python's garbage collector {in_gc}")


if __name__ == "__main__":
    main()

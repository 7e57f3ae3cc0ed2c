"""The device check: every figure fitprof gives on a GPU, printed next to an independent truth from the same run.

    make gpu-check                                # = python benchmarks/gpu_check.py, on a CUDA GPU
    python benchmarks/gpu_check.py --json OUT     # also write the rows as JSON
    python benchmarks/gpu_check.py --dry          # the same logic on the CPU (tests/test_gpu_check.py runs it)

Run it first whenever a GPU is at hand. It needs torch, lightning, tensorboard and fitprof's core dependencies
(msgspec among them: on an image without it, bring the wheel, ``pip download msgspec --only-binary=:all:``, and
``pip install --target`` it there). No TensorFlow, no network. Sized for one H200 well inside 8 minutes: 56
training steps and 5 copy steps, then 10 epochs of 12 steps and 200 epochs of 4 (not yet timed on a GPU).

Five runs, each compared with what it measured itself:

1. **Lightning, float32 conv net** (``FitProfiler(profile_batch=(21, 25))``, ``DataLoader(pin_memory=True)``):
   a callback records its own CUDA event at every step boundary and reads ``torch.cuda.max_memory_allocated``.
   Rows: the epoch's median step time (fitprof's ``fitprof/epoch/step_time_ms_p50`` from its own CUDA events) and
   the window's step time (each step the longer of its ``ProfilerStep#N`` span and the device's busy time on its
   work) against the check's events over the same steps;
   FLOPs per step against a hand count of the convolutions and the classifier; MFU against the hand count over the
   event-timed steps, each op class at the peak of its precision (cuDNN's TF32 by default, cuBLAS in float32);
   the memory peak against ``max_memory_allocated`` (rows "not available" when fitprof logs no
   ``fitprof/memory_peak_mb``); ``fitprof analyze`` (the CLI, JSON) on the window's trace against a hand count of
   the same file with ``json`` alone (``tests/handcount.py``).
2. **Lightning, bf16 matrix products** (``precision="bf16-true"``, 4 ``Linear(8192, 8192)``): FLOPs and MFU
   against the hand count over event-timed steps.
3. **Host-to-device copies** under ``torch.profiler``: 64 MiB from pinned and 64 MiB from pageable memory a step,
   CUDA events around each copy: fitprof's pinned and pageable HtoD ms per step and bytes against the events.
4. **Ten windows in one process** (Lightning, one window an epoch, ``profile_batch=(6, 9)`` of 12 steps, a 16 MiB
   pinned batch a step): torch has had profiler sessions after the first that record wrong device clocks
   (pytorch/pytorch#175790, #192021). Rows for each window: its step time against CUDA events of the same steps;
   its pinned HtoD time against CUDA events around each batch's copy (``transfer_batch_to_device``) and its bytes
   against the batch's; its kernels per step (fitprof's reader) against window 1's, every step doing the same work;
   and fitprof's own device-clock check (``device_clock_ok``), which must hold on every window.
5. **200 short windows in a fresh process** (Lightning, 4-step epochs, ``keep_last_windows=1``): the host's RSS
   after each window, and its slope after the first tenth; then a control arm in another fresh process, the same
   model and schedule with plain ``torch.profiler.profile`` sessions (no fitprof) exported the same way. Each arm
   is a child (``--rss-arm fitprof|control``), so neither inherits the memory the earlier runs or the other arm
   leave and release. fitprof's slope less the control's
   must stay under 32 MiB per 1,000 windows (a tenth of what pytorch/pytorch#193348 measured for 1,000 short CUDA
   profiles, which the control arm measures on this torch).

The HtoD truths (runs 3 and 4) bracket the copy alone: the device spins ~1 ms (``torch.cuda._sleep``) before each
start event, so the stream is still busy while the host allocates and enqueues the copy.

``--dry`` runs the same code on the CPU with small sizes: the host clock instead of CUDA events, no copies, no MFU
(rows say why), the host operators per step instead of the kernels, 20 windows instead of 200 for the RSS slope;
FLOPs and the hand-counted trace still compare exactly. Exit status: 0 when every row is within
its tolerance or not available, 1 when a row is off, 2 when a dependency is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # handcount.py: the standard-library count of a trace
MIB = 1 << 20


@dataclass
class Row:
    """One figure: fitprof's value, the truth's, and whether they agree within ``tol`` (relative)."""

    run: str
    figure: str
    unit: str
    fitprof: float
    truth: float
    tol: float
    status: str = ""
    note: str = ""

    def judge(self) -> Row:
        if self.status:
            return self
        if not (math.isfinite(self.fitprof) and math.isfinite(self.truth)):
            self.status = "OFF"
        elif self.truth == 0:
            self.status = "ok" if self.fitprof == 0 else "OFF"
        else:
            self.status = "ok" if abs(self.fitprof / self.truth - 1) <= self.tol else "OFF"
        return self


def _na(run: str, figure: str, unit: str, why: str, fitprof: float = math.nan) -> Row:
    return Row(run, figure, unit, fitprof, math.nan, 0.0, "n/a", why)


class Clock:
    """Step boundaries, marked twice at each step's end: just before fitprof's hook and just after it (CUDA events
    on a GPU, ``perf_counter_ns`` on the CPU with ``--dry``). Step ``k`` (1-based) runs from the "after" mark of
    step ``k - 1`` (the epoch's start for step 1) to the "before" mark of step ``k``: fitprof's own hook, where its
    profiler starts, stops and exports, is no step's time, as fitprof leaves it out of its step spans."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.before: list[Any] = []
        self.after: list[Any] = []

    def mark(self, marks: list[Any]) -> None:
        import torch

        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            marks.append(event)
        else:
            marks.append(time.perf_counter_ns())

    def _ms(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) if self.cuda else (b - a) / 1e6

    def step_ms(self) -> list[float]:
        """``[k - 1]``: step ``k``'s time (ms), fitprof's hooks left out."""
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        return [self._ms(a, b) for a, b in zip(self.after, self.before, strict=False)]

    def boundary_ms(self) -> list[float]:
        """``[k - 2]``: from step ``k - 1``'s end to step ``k``'s (ms), as fitprof's always-on timing sees it."""
        return [self._ms(a, b) for a, b in itertools.pairwise(self.before)]


def _truth_callbacks(clock: Clock, cuda: bool) -> tuple[Any, Any]:
    """Two callbacks, placed before and after fitprof's: the check's own marks and memory reads."""
    import lightning.pytorch as pl
    import torch

    class Before(pl.Callback):
        """Runs before fitprof's hook, which may reset the allocator's peak (a window opening or closing): each
        read covers its step up to that reset."""

        def __init__(self) -> None:
            self.peaks: dict[int, float] = {}  # 1-based step -> max_memory_allocated read at its end (bytes)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
            clock.mark(clock.before)
            if cuda:
                self.peaks[i + 1] = float(torch.cuda.max_memory_allocated())

    class After(pl.Callback):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            clock.mark(clock.after)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
            clock.mark(clock.after)

    return Before(), After()


def _fit(model: Any, data: Any, *, cuda: bool, precision: str, window: tuple[int, int], logdir: Path) -> Any:
    import lightning.pytorch as pl

    from fitprof.lightning import FitProfiler

    clock = Clock(cuda)
    before, after = _truth_callbacks(clock, cuda)
    profiler = FitProfiler(log_dir=logdir, profile_batch=window)
    trainer = pl.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        max_epochs=1,
        precision=precision,  # type: ignore[arg-type]
        logger=False,
        callbacks=[before, profiler, after],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=logdir,
    )
    trainer.fit(model, data)
    return profiler, trainer, before, clock


def _window_ms(steps_ms: list[float], window: tuple[int, int]) -> float:
    first, last = window
    chosen = steps_ms[first - 1 : last]
    return sum(chosen) / len(chosen)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _peak(device_name: str, dtype: str) -> float:
    from fitprof.throughput import PEAK_FLOPS, device_key

    key = device_key(device_name)
    return math.nan if key is None else PEAK_FLOPS[key].flops_per_s.get(dtype, math.nan)


def _mfu_rows(
    run: str, report: Any, hand: dict[str, float], dtypes: dict[str, str], window_s: float, cuda: bool
) -> list[Row]:
    """FLOPs per step against the hand count, and MFU against the hand count over event-timed window steps."""
    total = sum(hand.values())
    rows = [Row(run, "FLOPs per step", "GFLOP", report.flops_per_step / 1e9, total / 1e9, 1e-9).judge()]
    if not cuda:
        rows.append(_na(run, "MFU", "ratio", f"no MFU on the CPU (fitprof: {report.mfu_note!r})", report.mfu))
        return rows
    ideal_s = sum(flops / _peak(report.device_name, dtypes[cls]) for cls, flops in hand.items() if flops)
    truth = ideal_s / window_s
    row = Row(run, f"MFU ({report.compute_dtype})", "ratio", report.mfu, truth, 0.15)
    row.judge()
    if row.status == "ok" and not (0 < report.mfu <= 1 and 0 < truth <= 1):
        row.status, row.note = "OFF", "outside (0, 1]"
    if not math.isfinite(report.mfu):
        row.note = report.mfu_note
    return [*rows, row]


def conv_run(out: Path, *, cuda: bool) -> list[Row]:
    """Run 1: a float32 conv net under Lightning (see the module docstring)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import handcount

    run = "conv fp32"
    batch, size, widths = (128, 64, (3, 64, 128, 128)) if cuda else (8, 16, (3, 8, 8, 8))
    steps, window = 40, (21, 25)
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = torch.nn.ModuleList(torch.nn.Conv2d(a, b, 3, padding=1) for a, b in itertools.pairwise(widths))
            self.head = torch.nn.Linear(widths[-1], 10)

        def forward(self, x: Any) -> Any:
            for conv in self.convs:
                x = torch.relu(conv(x))
            return self.head(x.mean(dim=(2, 3)))

    import lightning.pytorch as pl

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

        def training_step(self, b: Any, i: int) -> Any:
            x, y = b
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = TensorDataset(torch.randn(steps * batch, 3, size, size), torch.randint(0, 10, (steps * batch,)))
    loader = DataLoader(data, batch_size=batch, pin_memory=cuda)
    profiler, trainer, truth, clock = _fit(
        Model(), loader, cuda=cuda, precision="32-true", window=window, logdir=out / "conv"
    )
    steps_ms = clock.step_ms()
    report, trace, epoch = profiler.reports[0], profiler.trace_paths[0], profiler.epoch_steps[0]
    rows = []
    # Step time. fitprof's epoch figure leaves out warm-up, the window and the FLOP-counted step: the check's
    # steps are taken outside the window and its neighbours, after the first 5.
    first, last = window
    clean = [ms for k, ms in enumerate(clock.boundary_ms(), start=2) if k > 5 and not first - 2 <= k <= last + 1]
    rows.append(
        Row(run, "epoch step time p50", "ms", epoch.step_time_ms_p50, _median(clean), 0.10, note="fitprof/epoch")
    )
    window_ms = _window_ms(steps_ms, window)
    rows.append(
        Row(run, "window step time", "ms", report.step_time_ms, window_ms, 0.15, note="max(host span, device busy)")
    )
    # FLOPs and MFU: convolutions 2 * outputs * kh * kw * Cin forward, the same again for the weight gradient and
    # for the input gradient (all but the first layer, whose input needs none); the classifier likewise.
    conv = 0.0
    for n, (a, b) in enumerate(itertools.pairwise(widths)):
        forward = 2.0 * batch * b * size * size * 9 * a
        conv += forward * (2 if n == 0 else 3)
    head = 2.0 * batch * widths[-1] * 10 * 3
    dtypes = {"conv": "float32", "matmul": "float32"}
    if cuda and torch.cuda.get_device_capability()[0] >= 8:
        dtypes["conv"] = "tf32" if torch.backends.cudnn.allow_tf32 else "float32"
        dtypes["matmul"] = "float32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    rows += _mfu_rows(run, report, {"conv": conv, "matmul": head}, dtypes, window_ms / 1e3, cuda)
    rows += _memory_rows(run, trainer, truth, window, cuda)
    rows += _analyze_rows(run, trace, handcount)
    return [r.judge() for r in rows]


def matmul_run(out: Path, *, cuda: bool) -> list[Row]:
    """Run 2: bf16 matrix products under Lightning (``bf16-true``)."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader

    run = "matmul bf16"
    d, layers = (8192, 4) if cuda else (64, 4)
    steps, window = 16, (9, 11)
    torch.manual_seed(0)

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.Sequential(*(torch.nn.Linear(d, d, bias=False) for _ in range(layers)))
            self.register_buffer("x", torch.randn(d, d))  # the step's input, already on the device

        def training_step(self, b: Any, i: int) -> Any:
            return self.layers(self.x).float().pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-6)

    loader = DataLoader(list(range(steps)), batch_size=1)
    profiler, _trainer, _truth, clock = _fit(
        Model(), loader, cuda=cuda, precision="bf16-true", window=window, logdir=out / "matmul"
    )
    steps_ms = clock.step_ms()
    report = profiler.reports[0]
    # Forward, weight gradient, input gradient (not for the first layer: its input needs none), 2 * d^3 each.
    hand = 2.0 * d**3 * (3 * layers - 1)
    window_ms = _window_ms(steps_ms, window)
    rows = [
        Row(run, "window step time", "ms", report.step_time_ms, window_ms, 0.15, note="max(host span, device busy)")
    ]
    rows += _mfu_rows(run, report, {"matmul": hand}, {"matmul": "bfloat16"}, window_ms / 1e3, cuda)
    return [r.judge() for r in rows]


SPIN_MS = 1.0
"""How long the device spins (``torch.cuda._sleep``) before each timed copy's start event: longer than the host
takes to allocate the destination and enqueue the copy (0.12-0.17 ms on an H200 host), so the stream is still busy
when the copy is queued and the events bracket the copy alone, not the host's enqueueing."""
_spin_cycles: list[int] = []


def _spin() -> None:
    """Keep the current stream busy for about :data:`SPIN_MS` (a device spin, calibrated once by CUDA events)."""
    import torch

    if not _spin_cycles:
        trial = 1_000_000
        torch.cuda._sleep(trial)  # warm-up: the kernel's first launch loads it
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(trial)
        b.record()
        b.synchronize()
        _spin_cycles.append(max(1, int(trial * SPIN_MS / max(float(a.elapsed_time(b)), 1e-3))))
    torch.cuda._sleep(_spin_cycles[0])


def _timed_copy(move: Any) -> tuple[Any, tuple[Any, Any]]:
    """``move()`` between two CUDA events recorded after a device spin (:func:`_spin`), so that the start event
    fires once the copy is already queued: ``(moved, (start, end))``."""
    import torch

    _spin()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    moved = move()
    end.record()
    return moved, (start, end)


def copy_run(out: Path, *, cuda: bool) -> list[Row]:
    """Run 3: pinned and pageable host-to-device copies under ``torch.profiler``, CUDA events around each."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    import fitprof

    run = "HtoD copies"
    if not cuda:
        return [
            _na(run, f"HtoD {kind} ms per step", "ms", "no device copies on the CPU") for kind in ("pinned", "pageable")
        ]
    dev, rows_n, steps = torch.device("cuda"), 4 * MIB, 5  # 4 Mi float32 = 16 MiB a row block; 64 MiB a copy
    pinned, pageable = torch.randn(4, rows_n).pin_memory(), torch.randn(4, rows_n)
    times: dict[str, list[Any]] = {"pinned": [], "pageable": []}  # (start, end) event pairs

    def copy(kind: str, src: Any) -> None:
        times[kind].append(_timed_copy(lambda: src.to(dev, non_blocking=kind == "pinned"))[1])

    for src in (pinned, pageable):  # warm-up: context, staging buffers
        src.to(dev)
    torch.cuda.synchronize()
    path = out / "copies.pt.trace.json"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        for n in range(1, steps + 1):
            with record_function(f"ProfilerStep#{n}"):
                copy("pinned", pinned)
                copy("pageable", pageable)
                torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    report = fitprof.analyze(path)
    rows = []
    for kind, value in (("pinned", report.htod_pinned_ms_per_step), ("pageable", report.htod_pageable_ms_per_step)):
        truth = sum(float(a.elapsed_time(b)) for a, b in times[kind]) / steps
        rows.append(Row(run, f"HtoD {kind} ms per step", "ms", value, truth, 0.10 if kind == "pinned" else 0.25))
    rows.append(Row(run, "HtoD bytes per step", "MiB", report.htod_bytes_per_step / MIB, 2 * 64.0, 0.0))
    return [r.judge() for r in rows]


def _memory_rows(run: str, trainer: Any, truth: Any, window: tuple[int, int], cuda: bool) -> list[Row]:
    """fitprof's memory peaks (1 MB = 1e6 bytes) against ``max_memory_allocated`` read by the check."""
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    rows = []
    for key, steps, label in (
        ("fitprof/epoch/memory_peak_mb", sorted(truth.peaks), "epoch memory peak"),
        # The window opens before its warm-up step (first - 1) and resets the peak then.
        ("fitprof/memory_peak_mb", range(window[0] - 1, window[1] + 1), "window memory peak"),
    ):
        if key not in metrics:
            rows.append(_na(run, label, "MB", f"not available: fitprof logged no {key}"))
        elif not cuda:
            rows.append(_na(run, label, "MB", "no torch.cuda.max_memory_allocated on the CPU", metrics[key]))
        else:
            peak = max(truth.peaks[k] for k in steps if k in truth.peaks) / 1e6
            rows.append(Row(run, label, "MB", metrics[key], peak, 0.02, note="max_memory_allocated"))
    return rows


def _analyze_rows(run: str, trace: Path, handcount: Any) -> list[Row]:
    """``fitprof analyze --format json`` (a fresh process) against the standard-library count of the same file."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "fitprof.cli", "analyze", str(trace), "--format", "json", "--top-k", "5"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        return [Row(run, "fitprof analyze", "", math.nan, math.nan, 0.0, "OFF", done.stderr[-300:])]
    got = json.loads(done.stdout)[0]
    counts = handcount.count(trace, top_k=5)
    n = len(counts["steps"])
    # The hand count's step time: the host spans less fitprof's own spans, each step lengthened to its work's
    # device busy time where that is longer (docs/metrics.md, "Step time on a GPU").
    label = "analyze vs hand count:"
    step = Row(run, f"{label} step time", "ms", got["step_time_ms"], counts["window_us"] / n / 1e3, 1e-6)
    step.note = f"device adds {counts['device_excess_us'] / n / 1e3:.3g} ms/step" + (
        "" if counts["device_clock_ok"] else " (device clock wrong: host spans)"
    )
    rows = [
        Row(run, f"{label} steps", "", got["steps_analyzed"], n, 0.0),
        step,
        Row(run, f"{label} input", "ms", got["input_ms_per_step"], counts["input_us"] / n / 1e3, 1e-6),
    ]
    for kind in ("htod_pinned", "htod_pageable"):
        rows.append(
            Row(run, f"{label} {kind}", "ms", got[f"{kind}_ms_per_step"], counts[kind]["dur_us"] / n / 1e3, 1e-6)
        )
    if got["top_ops"] and counts["ops"]:
        (name, us), top = counts["ops"][0], got["top_ops"][0]
        row = Row(run, f"{label} top op", "ms", top["self_ms_per_step"], us / n / 1e3, 1e-6, note=name)
        if top["name"] != name:
            row.status, row.note = "OFF", f"fitprof {top['name']!r}, hand count {name!r}"
        rows.append(row)
    return rows


class _EpochMarks:
    """Step boundaries and host-to-device copies of every epoch of one fit, as :class:`Clock` marks them: one
    :class:`Clock` an epoch, and CUDA events around each batch's copy to the device (``transfer_batch_to_device``)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.clocks: list[Clock] = []
        self.copies: list[list[tuple[Any, Any]]] = []  # [epoch][step - 1]: (start, end) events of its copy

    def callbacks(self) -> tuple[Any, Any]:
        """Two callbacks, placed before and after fitprof's (see :class:`Clock`)."""
        import lightning.pytorch as pl

        marks = self

        class Before(pl.Callback):
            def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
                marks.clocks[-1].mark(marks.clocks[-1].before)

        class After(pl.Callback):
            def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
                marks.clocks.append(Clock(marks.cuda))
                marks.copies.append([])
                marks.clocks[-1].mark(marks.clocks[-1].after)

            def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
                marks.clocks[-1].mark(marks.clocks[-1].after)

        return Before(), After()

    def copy_ms(self, epoch: int) -> list[float]:
        """``[k - 1]``: the copy of step ``k``'s batch (ms; empty on the CPU)."""
        return [float(a.elapsed_time(b)) for a, b in self.copies[epoch]]


WINDOWS = 10
"""Windows of the many-windows run: one an epoch, in one process (the first is window 1)."""


def _kernels_per_step(trace: Path, cuda: bool) -> float:
    """The device kernels launched in the window's steps, per step, from fitprof's reader (on the CPU, ``--dry``:
    the host operators in the steps instead, the same logic on the events a CPU trace has)."""
    import numpy as np

    from fitprof.analysis import intervals
    from fitprof.traces import read_trace
    from fitprof.traces._table import Kind

    table = read_trace(trace)
    kind = table["kind"].to_numpy()
    ts = table["ts_us"].to_numpy(dtype=float)
    end = ts + table["dur_us"].to_numpy(dtype=float)
    is_step = kind == Kind.STEP
    steps = intervals.union(ts[is_step], end[is_step])
    if cuda:
        launch = table["launch_us"].to_numpy(dtype=float)
        chosen = (kind == Kind.KERNEL) & table["on_device"].to_numpy(dtype=bool)
        at = np.where(np.isnan(launch), ts, launch)
    else:
        chosen, at = (kind == Kind.OP) & ~table["on_device"].to_numpy(dtype=bool), ts
    n = int(is_step.sum())
    return float(np.count_nonzero(chosen & intervals.inside(at, steps))) / n if n else math.nan


def windows_run(out: Path, *, cuda: bool) -> list[Row]:
    """Run 4: :data:`WINDOWS` windows in one process (one an epoch, Lightning): each window's step time and
    pinned HtoD time against CUDA events of the same steps, its HtoD bytes against the batch's size, its kernels per
    step against window 1's (every step does the same work), and fitprof's own device-clock check
    (``device_clock_ok``, :mod:`fitprof.analysis.clock`), which must hold on every window of a sound run."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from fitprof.lightning import FitProfiler

    run = "windows"
    batch, features, width = (4096, 1024, 2048) if cuda else (16, 32, 32)  # 16 MiB of float32 a batch on a GPU
    steps, window = (12, (6, 9)) if cuda else (8, (4, 6))
    torch.manual_seed(0)
    marks = _EpochMarks(cuda)

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(features, width), torch.nn.ReLU(), torch.nn.Linear(width, features)
            )

        def training_step(self, b: Any, i: int) -> Any:
            (x,) = b
            return (self.net(x) - x).pow(2).mean()

        def transfer_batch_to_device(self, b: Any, device: Any, dataloader_idx: int) -> Any:
            if not cuda:
                return super().transfer_batch_to_device(b, device, dataloader_idx)
            moved, events = _timed_copy(lambda: super(Model, self).transfer_batch_to_device(b, device, dataloader_idx))
            marks.copies[-1].append(events)
            return moved

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    data = TensorDataset(torch.randn(steps * batch, features))
    loader = DataLoader(data, batch_size=batch, pin_memory=cuda)
    before, after = marks.callbacks()
    profiler = FitProfiler(log_dir=out / "windows", profile_batch=window, every_n_epochs=1, verbose=False)
    trainer = pl.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        max_epochs=WINDOWS,
        logger=False,
        callbacks=[before, profiler, after],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=out / "windows",
    )
    trainer.fit(Model(), loader)
    if cuda:
        torch.cuda.synchronize()
    rows: list[Row] = []
    first_kernels = math.nan
    first, last = window
    for epoch in range(WINDOWS):
        label = f"window {epoch + 1}"
        report = profiler.reports.get(epoch)
        if report is None:
            rows.append(Row(run, label, "", math.nan, math.nan, 0.0, "OFF", "fitprof gave no report"))
            continue
        window_ms = _window_ms(marks.clocks[epoch].step_ms(), window)
        truth_note = "CUDA events" if cuda else "host clock (--dry)"
        rows.append(Row(run, f"{label} step time", "ms", report.step_time_ms, window_ms, 0.15, note=truth_note))
        if cuda:
            copy_ms = sum(marks.copy_ms(epoch)[first - 1 : last]) / (last - first + 1)
            note = report.device_clock_note or "CUDA events"
            rows.append(
                Row(run, f"{label} HtoD pinned", "ms", report.htod_pinned_ms_per_step, copy_ms, 0.15, note=note)
            )
            rows.append(
                Row(
                    run, f"{label} HtoD bytes", "MiB", report.htod_bytes_per_step / MIB, batch * features * 4 / MIB, 0.0
                )
            )
        else:
            rows.append(_na(run, f"{label} HtoD pinned", "ms", "no device copies on the CPU"))
        kernels = _kernels_per_step(profiler.trace_paths[epoch], cuda)
        if epoch == 0:
            first_kernels = kernels
        what = "kernels" if cuda else "host ops (--dry)"
        rows.append(Row(run, f"{label} {what} per step", "", kernels, first_kernels, 0.0, note="vs window 1"))
        clock = Row(run, f"{label} device clock ok", "", float(report.device_clock_ok), 1.0, 0.0)
        clock.note = report.device_clock_note or f"launch lag {report.device_offset_us:.1f} us"
        rows.append(clock)
    return [r.judge() for r in rows]


RSS_WINDOWS = 200
"""Short windows of the host-memory run (``--dry``: :data:`RSS_WINDOWS_DRY`)."""
RSS_WINDOWS_DRY = 20
RSS_SLOPE_LIMIT = 32.0
"""The most host memory (MiB) a thousand windows may add: a tenth of the 318 MiB a thousand short CUDA profiles
added in pytorch/pytorch#193348."""


def _rss_mib() -> float:
    """This process's resident set size (MiB), from ``/proc/self/statm``; NaN where there is none."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return math.nan
    return pages * os.sysconf("SC_PAGE_SIZE") / MIB


def _slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` against their index (per index)."""
    n = len(values)
    if n < 2:
        return math.nan
    mx, my = (n - 1) / 2, sum(values) / n
    sxx = sum((i - mx) ** 2 for i in range(n))
    return sum((i - mx) * (v - my) for i, v in enumerate(values)) / sxx


RSS_ARMS = {"fitprof": "fitprof", "control": "torch.profiler"}
"""The RSS run's arms (``--rss-arm``) and the name each has in the rows."""


def rss_run(out: Path, *, cuda: bool) -> list[Row]:
    """Run 5: :data:`RSS_WINDOWS` short windows (Lightning, one a 4-step epoch, only the last trace kept): the host's
    RSS after each, and its slope over the windows after the first tenth (warm-up), in MiB per 1,000 windows; then
    a control arm: the same model and schedule with plain ``torch.profiler.profile`` sessions (no fitprof), each
    exporting its trace the same way, over as many windows. Each arm runs in a fresh process
    (:func:`_rss_arm_in_child`): in this one, the memory the earlier runs leave and give back moves the RSS by
    hundreds of MiB over the windows, in either direction. torch's own profiler grows the host's memory with every
    session (pytorch/pytorch#193348: ~320 MiB per 1,000 short CUDA profiles), so fitprof is judged by its slope less
    the control's, against :data:`RSS_SLOPE_LIMIT`; both slopes are reported."""
    run = "host RSS"
    windows = RSS_WINDOWS if cuda else RSS_WINDOWS_DRY
    slopes = []
    rows: list[Row] = []
    for arm, label in RSS_ARMS.items():
        values, profiled, error = _rss_arm_in_child(arm, out, cuda)
        kept = values[max(1, len(values) // 10) :]
        slope = _slope(kept) * 1000
        slopes.append(slope)
        row = Row(run, f"RSS slope, {label}", "MiB/1000", slope, math.nan, 0.0, "n/a")
        row.note = (
            f"{profiled} windows profiled; RSS {values[0]:.0f} -> {values[-1]:.0f} MiB over {len(kept)} windows"
            if values
            else f"no RSS read: {error}"
        )
        if profiled != windows:
            row.status = "OFF"
        rows += [Row(run, f"RSS after window {k}, {label}", "MiB", v, math.nan, 0.0, "n/a", "the slope's input") for k, v
                 in enumerate(values, start=1) if k in (1, len(values) // 2, len(values))]  # fmt: skip
        rows.append(row)
    excess = slopes[0] - slopes[1]
    row = Row(run, "RSS slope, fitprof less control", "MiB/1000", excess, 0.0, 0.0)
    row.note = f"{slopes[0]:.0f} - {slopes[1]:.0f} MiB per 1,000 windows; limit {RSS_SLOPE_LIMIT:g} MiB per 1,000"
    row.status = "ok" if math.isfinite(excess) and excess <= RSS_SLOPE_LIMIT else "OFF"
    return [*rows, row]


def _rss_arm_in_child(arm: str, out: Path, cuda: bool) -> tuple[list[float], int, str]:
    """``python gpu_check.py --rss-arm ARM`` in a fresh process: the RSS after each window, the windows profiled,
    and what went wrong ("" when nothing did)."""
    result = out / f"rss_{arm}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--rss-arm", arm, "--json", str(result), "--keep", str(out)]
    try:
        done = subprocess.run([*cmd, *([] if cuda else ["--dry"])], capture_output=True, text=True, env=env,
                              timeout=600)  # fmt: skip
    except subprocess.TimeoutExpired:
        return [], 0, "the arm's process ran past 600 s"
    if done.returncode != 0 or not result.exists():
        return [], 0, f"exit {done.returncode}: {done.stderr[-300:]}"
    got = json.loads(result.read_text())
    return [float(v) for v in got["rss"]], int(got["profiled"]), ""


def rss_arm(arm: str, out: Path, *, cuda: bool) -> tuple[list[float], int]:
    """One arm of run 5 in this process (``--rss-arm``): the RSS (MiB) after each window and the windows profiled.
    ``arm``: ``"fitprof"`` (``FitProfiler(profile_batch=(2, 3), keep_last_windows=1)``) or ``"control"`` (a plain
    ``torch.profiler.profile`` session over the same steps of each epoch)."""
    import lightning.pytorch as pl

    from fitprof.lightning import FitProfiler
    from fitprof.profilers.torch import trace_only_config

    windows = RSS_WINDOWS if cuda else RSS_WINDOWS_DRY
    first, last = 2, 3  # the profiled steps of each epoch (1-based), as fitprof's profile_batch=(2, 3)

    class Control(pl.Callback):
        """One ``torch.profiler.profile`` session over steps 2-3 of each epoch, exported as fitprof exports its
        windows (``export_chrome_trace``, the same activities and trace-only config), one trace kept."""

        def __init__(self) -> None:
            self.prof: Any = None
            self.sessions = 0

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, i: int) -> None:
            if i + 1 == first:
                from torch.profiler import ProfilerActivity, profile

                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
                config = trace_only_config()
                self.prof = profile(
                    activities=activities, **({} if config is None else {"experimental_config": config})
                )
                self.prof.start()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
            if i + 1 == last and self.prof is not None:
                self.prof.stop()
                (out / "rss_control").mkdir(parents=True, exist_ok=True)
                self.prof.export_chrome_trace(str(out / "rss_control" / "window.pt.trace.json"))
                self.prof = None
                self.sessions += 1

    if arm == "fitprof":
        profiler = FitProfiler(log_dir=out / "rss", profile_batch=(first, last), keep_last_windows=1, verbose=False)
        return _rss_fit(profiler, windows, out / "rss", cuda), len(profiler.reports)
    if arm == "control":
        control = Control()
        return _rss_fit(control, windows, out / "rss_control", cuda), control.sessions
    raise ValueError(f"arm must be one of {sorted(RSS_ARMS)}, got {arm!r}")


def _rss_fit(callback: Any, windows: int, root: Path, cuda: bool) -> list[float]:
    """One fit of ``windows`` 4-step epochs of a small model with ``callback``: the host's RSS (MiB) at each
    epoch's end, read after ``callback``'s epoch end."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    rss: list[float] = []

    class Read(pl.Callback):
        # No garbage collection before the read: a full one costs most of a second with torch and Lightning
        # loaded, and a leak shows in the slope over the windows without it.
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            rss.append(_rss_mib())

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(64, 64)

        def training_step(self, b: Any, i: int) -> Any:
            return self.net(b[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(4 * 8, 64)), batch_size=8)
    trainer = pl.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        max_epochs=windows,
        logger=False,
        callbacks=[callback, Read()],  # the read after the profiler's epoch end
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=root,
    )
    trainer.fit(Model(), loader)
    return rss


def _missing() -> list[str]:
    needed = ("torch", "lightning", "tensorboard", "msgspec", "numpy", "pandas", "google.protobuf", "fsspec")
    missing = []
    for name in needed:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except ModuleNotFoundError:
            missing.append(name)
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry", action="store_true", help="run the logic on the CPU with small sizes")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument("--keep", type=Path, help="keep the runs' traces here (default: a temporary folder)")
    parser.add_argument("--rss-arm", choices=sorted(RSS_ARMS), help=argparse.SUPPRESS)  # run 5's child process
    args = parser.parse_args(argv)
    missing = _missing()
    if missing:
        print(f"gpu_check: missing {', '.join(missing)}: pip install 'fitprof[lightning]' (msgspec is a core "
              "dependency: pip install msgspec)", file=sys.stderr)  # fmt: skip
        return 2
    import torch

    torch.set_num_threads(1 if args.dry else max(1, torch.get_num_threads()))
    cuda = not args.dry
    if cuda and not torch.cuda.is_available():
        print(f"gpu_check: torch {torch.__version__} sees no CUDA device; --dry runs the logic on the CPU",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.rss_arm:
        if args.keep is None or args.json is None:
            parser.error("--rss-arm needs --keep and --json")
        args.keep.mkdir(parents=True, exist_ok=True)
        values, profiled = rss_arm(args.rss_arm, args.keep, cuda=cuda)
        args.json.write_text(json.dumps({"arm": args.rss_arm, "rss": values, "profiled": profiled}))
        return 0
    t0 = time.perf_counter()
    # The detached converter may still write .xplane.pb files into the folder when the runs end: the rows are
    # printed and written first, each log dir waited for, and a cleanup that still races it ignored.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        rows = conv_run(out, cuda=cuda) + matmul_run(out, cuda=cuda) + copy_run(out, cuda=cuda)
        rows += windows_run(out, cuda=cuda) + rss_run(out, cuda=cuda)
        code = _print_rows(rows, args.json, cuda, time.perf_counter() - t0)
        _wait_for_conversions(out)
    return code


def _wait_for_conversions(out: Path) -> None:
    """Wait for fitprof's detached conversions under each run's log dir (a failure is reported, not raised)."""
    import fitprof

    for log_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        try:
            fitprof.wait_for_profiles(log_dir, timeout=120)
        except Exception as err:  # the rows are out already: say it and leave
            print(f"gpu_check: waiting for the conversions under {log_dir}: {err!r}", file=sys.stderr)


def _print_rows(rows: list[Row], json_path: Path | None, cuda: bool, seconds: float) -> int:
    """Print the table (and write ``json_path``); 1 when a row is OFF, else 0."""
    import torch

    device = torch.cuda.get_device_name(0) if cuda else "CPU (--dry)"
    print(f"fitprof device check on {device}, torch {torch.__version__}: {seconds:.0f} s")
    print(f"{'run':<12} {'figure':<34} {'fitprof':>12} {'truth':>12} {'unit':<6} {'tol':>6}  status  note")
    for r in rows:
        print(f"{r.run:<12} {r.figure:<34} {r.fitprof:>12.6g} {r.truth:>12.6g} {r.unit:<6} {r.tol:>6.0%}  "
              f"{r.status:<6}  {r.note}", flush=True)  # fmt: skip
    if json_path:
        json_path.write_text(json.dumps({"device": device, "rows": [asdict(r) for r in rows]}, indent=1))
    return 1 if any(r.status == "OFF" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

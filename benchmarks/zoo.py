"""Accuracy zoo: training runs whose bottleneck is known by construction, fitprof's figures against the truth.

    python benchmarks/zoo.py --framework keras|lightning|all [--quick] [--repeats N] [--epochs N] [--scenario NAME]
        [--json FILE]

Each scenario trains a small model for 12 steps with ``FitProfiler`` (default window, steps 6-10) and measures
the ground truth in the same run, independently of any profiler:

* input share, serial pipelines: the time spent producing batches, timed inside the data pipeline with
  ``time.perf_counter`` around the *whole* batch production, clipped to the wall time of the profiled steps and
  divided by it. Keras (TensorFlow backend): each batch is built by one ``tf.numpy_function`` that records its
  span; ``inject_prefetch`` is off so that the wait is serial. Lightning: the DataLoader iterator's ``__next__``
  on the main process is wrapped (sampler, ``__getitem__`` of every sample, collate), which with worker
  processes is exactly the time the main process waited. Step boundaries come from a clock callback at the
  same hooks that FitProfiler marks steps at (Keras ``on_train_batch_begin``, Lightning ``on_train_batch_end``).
* input share, tf.data hidden by prefetch (``map(num_parallel_calls=4).prefetch(4)``): the production spans
  overlap compute, so they are not the wait. The wait for batch ``k`` is how long after step ``k`` started
  (``on_train_batch_begin``) its batch became ready (the end of its production span), or 0 if it was ready
  before (it counts the step's dispatch, not the hand-back of the batch). The slowdown against the same model with a fast input (step time with the slow
  stage removed, ``(T - T0) / T``) is printed for information: on 2 cores it also holds CPU contention
  from the pipeline's Python calls, which is not waiting.
* planted operator: the truth is "the planted operator ranks first"; its share by ablation (step time with and
  without it) is printed for information (it also holds the optimizer update and layout ops of that layer).

Beside fitprof's figure: xprof's ``input_pipeline_analyzer`` on fitprof's own ``.xplane.pb`` (sum of
``infeedTimeMs`` over sum of ``stepTimeMs``), Lightning's ``SimpleProfiler`` (a separate run with
``Trainer(profiler="simple")``: ``train_dataloader_next`` over the same steps' wall time, and the percentage its
summary prints for the whole run) and the DataLoader share by torch-tb-profiler's rule (it drops every
``user_annotation`` except ``ProfilerStep#``, so the DataLoader's ``enumerate(DataLoader)#...__next__`` span
never counts), computed from fitprof's own Kineto trace.

The expected verdict is the one fitprof's own thresholds (:func:`fitprof.analysis.verdict_for`) give on the
true figure. Target: ``|fitprof - truth| <= 3`` percentage points and the expected verdict.

``--epochs N`` (default 3) trains N epochs of ``STEPS`` steps each, every epoch profiled: epoch 0's window (the
first window of a run, where the profiler starts for the first time) is reported apart from the later epochs'
(truth and figure per epoch, from the same clocks; Keras ``prefetch_hidden`` reports epoch 0 only, as its
truth needs each batch's ready time). The summary prints the largest error of epoch 0 and of later epochs.

``--quick`` runs one repeat and skips the SimpleProfiler runs; the default runs ``--repeats`` (3) repeats of each
scenario and prints the median, min and max. Functions here are also used by ``tests/test_accuracy.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np

from fitprof.analysis import verdict_for

TOLERANCE_PP = 3.0
STEPS = 12  # the default window (steps 6-10) plus the step whose start closes it, plus one
EPOCHS = 3  # default --epochs: epoch 0's window is reported apart from the later ones
FIRST, LAST = 6, 10

KERAS_SCENARIOS = ("sleep_input", "cpu_augment", "compute_bound", "mixed", "prefetch_hidden", "planted_op")
LIGHTNING_SCENARIOS = ("sleep_input", "cpu_augment", "compute_bound", "mixed", "workers_hidden", "planted_op")


# ------------------------------------------------------------------------------------------------ results
def _busy_pct(report: Any) -> float:
    """What covers the step in ``report``: the device's busy share when it has device work, else the host's."""
    device = report.device_busy_percent
    return float(device) if math.isfinite(device) else float(report.host_op_percent)


@dataclass
class Result:
    """One scenario run: the truth, fitprof's figures and the other tools' figures (percent of step time)."""

    framework: str
    scenario: str
    truth_pct: float
    truth_how: str
    fitprof_pct: float
    verdict: str
    step_ms: float
    truth_step_ms: float
    top_op: str = ""
    top_op_pct: float = float("nan")
    planted_pct_fitprof: float = float("nan")  # sum of the planted operator's entries in top ops
    planted_pct_ablation: float = float("nan")
    xprof_pct: float = float("nan")
    simple_pct: float = float("nan")  # SimpleProfiler, same steps
    simple_summary_pct: float = float("nan")  # SimpleProfiler summary, whole run
    simple_truth_pct: float = float("nan")  # the truth in the SimpleProfiler run
    tbprof_pct: float = float("nan")
    busy_pct: float = float("nan")  # fitprof's share of the step that compute covers (device busy, else host ops)
    on_device: bool = False
    contention: str = ""  # the report's CPU-contention reason ("" when the epoch did not wait for a core)
    extra: dict[str, Any] = field(default_factory=dict)
    later: list[tuple[float, float]] = field(default_factory=list)
    """(truth %, fitprof %) of the windows of epochs 1, 2, ... of the same run (``--epochs``)."""

    @property
    def later_errors_pp(self) -> list[float]:
        return [f - t for t, f in self.later]

    @property
    def expected_verdict(self) -> str:
        """The verdict fitprof's thresholds give with the truth in place of fitprof's input share (what covers the
        rest of the step, ``busy_pct``, is fitprof's own figure: no truth measures it)."""
        return verdict_for(self.truth_pct, 0.0, 1, 0.0, self.busy_pct, device=self.on_device)

    @property
    def error_pp(self) -> float:
        return self.fitprof_pct - self.truth_pct

    @property
    def ok(self) -> bool:
        right = self.verdict == self.expected_verdict
        if self.scenario == "planted_op":
            return bool(self.extra.get("planted_first")) and right
        return bool(abs(self.error_pp) <= TOLERANCE_PP and right)


def clipped_share(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Percent of ``[lo, hi]`` covered by the union of ``spans`` (seconds, same clock)."""
    if hi <= lo:
        return float("nan")
    covered, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi):
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                covered += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        covered += cur_e - cur_s
    return 100.0 * covered / (hi - lo)


def xprof_input_percent(xplane: str | os.PathLike[str]) -> float:
    """xprof's input share: sum of ``infeedTimeMs`` over sum of ``stepTimeMs`` (input_pipeline_analyzer)."""
    from xprof.convert.raw_to_tool_data import xspace_to_tool_data

    with tempfile.TemporaryDirectory() as d:  # the conversion writes cache files beside the xplane
        copy = Path(d) / Path(xplane).name
        copy.write_bytes(Path(xplane).read_bytes())
        data = xspace_to_tool_data([str(copy)], "input_pipeline_analyzer", {})
    if isinstance(data, tuple):
        data = data[0]
    table = json.loads(data)[1]
    cols = [c["id"] for c in table["cols"]]
    rows: list[list[Any]] = [[c.get("v") if c else None for c in r["c"]] for r in table["rows"]]
    step = sum(float(r[cols.index("stepTimeMs")] or 0.0) for r in rows)
    infeed = sum(float(r[cols.index("infeedTimeMs")] or 0.0) for r in rows)
    return 100.0 * infeed / step if step > 0 else float("nan")


def tbprof_dataloader_percent(trace: str | os.PathLike[str]) -> float:
    """DataLoader share by torch-tb-profiler 0.4.3's rule, from a Kineto trace.

    tb-profiler keeps ``ProfilerStep#`` but drops every other ``user_annotation``; the DataLoader's own span
    (``enumerate(DataLoader)#..__next__``) is a ``user_annotation``, so only a ``cpu_op`` of that name (older
    torch) would count. Union of those inside the steps over the steps' duration.
    """
    raw = Path(trace).read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    xs = [e for e in events if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in xs if str(e.get("name", "")).startswith("ProfilerStep#")]
    kept = [
        (e["ts"], e["ts"] + e["dur"])
        for e in xs
        if e.get("cat") != "user_annotation" and str(e.get("name", "")).startswith("enumerate(DataLoader)")
    ]
    total = sum(e - s for s, e in steps)
    inside = sum(clipped_share(kept, s, e) / 100.0 * (e - s) for s, e in steps)
    return 100.0 * inside / total if total > 0 else float("nan")


# ------------------------------------------------------------------------------------------------- Keras
class _KerasClock:
    """perf_counter at every ``on_train_batch_begin`` (index = 0-based batch), before and after FitProfiler's hook.

    ``callbacks`` go around FitProfiler (``[pre, FitProfiler, post]``): the window starts after FitProfiler has
    started the profiler and opened the first step, and ends before it closes the last and stops the profiler,
    so profiler start and stop are not counted as training time (they are not in fitprof's steps either).
    """

    def __init__(self) -> None:
        import keras

        def clock(times: list[float]) -> Any:
            class Clock(keras.callbacks.Callback):
                def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
                    times.append(time.perf_counter())

            return Clock()

        self.pre: list[float] = []
        self.post: list[float] = []
        self.before, self.after = clock(self.pre), clock(self.post)

    def window(self, epoch: int = 0) -> tuple[float, float]:
        """Start of step FIRST to start of step LAST + 1 (what FitProfiler marks as steps FIRST..LAST)."""
        o = epoch * STEPS
        return self.post[o + FIRST - 1], self.pre[o + LAST]

    def step_ms(self) -> float:
        lo, hi = self.window()
        return (hi - lo) / (LAST - FIRST + 1) * 1e3


def _keras_model(kind: str, features: int) -> Any:
    import keras

    layers: list[Any] = [keras.Input((features,))]
    if kind == "small":
        layers += [keras.layers.Dense(256, activation="relu"), keras.layers.Dense(256, activation="relu")]
    elif kind == "heavy":
        layers += [keras.layers.Dense(1024, activation="relu") for _ in range(3)]
    elif kind in ("planted", "unplanted"):
        layers += [keras.layers.Dense(2048, activation="relu", name="wide")]
        if kind == "planted":
            layers += [keras.layers.Dense(2048, activation="relu", name="planted_matmul")]
        layers += [keras.layers.Dense(128, activation="relu")]
    layers += [keras.layers.Dense(10)]
    model = keras.Sequential(layers)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _augment_batch(images: np.ndarray, rng: np.random.Generator, zoom: int) -> np.ndarray:
    """Real per-sample CPU work (SciPy): upsample, rotate, blur, downsample."""
    from scipy import ndimage

    out = np.empty_like(images)
    for k, img in enumerate(images):
        big = ndimage.zoom(img, zoom, order=3)
        big = ndimage.rotate(big, rng.uniform(-15, 15), reshape=False, order=3)
        big = ndimage.gaussian_filter(big, sigma=rng.uniform(0.2, 1.0))
        out[k] = ndimage.zoom(big, 1 / zoom, order=1)
    return out


def keras_run(
    scenario: str,
    logdir: Path,
    *,
    model_kind: str,
    batch: int,
    sleep_s: float = 0.0,
    augment: bool = False,
    parallel: bool = False,
    top_k: int = 5,
    threads: int = 4,
    epochs: int = 1,
) -> tuple[Any, _KerasClock, list[tuple[float, float]], dict[int, float]]:
    """Fit ``STEPS`` steps with FitProfiler; return the profiler, the step clock, the batch-production spans
    and when each batch (0-based) was ready.

    Every batch is produced by one ``tf.numpy_function`` (random features, optional sleep / SciPy augmentation)
    that records its perf_counter span. Serial (``parallel=False``): no prefetch, ``inject_prefetch`` off.
    Hidden (``parallel=True``): ``map(num_parallel_calls=threads)`` then ``prefetch(threads)`` (default 4).
    """
    import keras
    import tensorflow as tf

    from fitprof.keras import FitProfiler

    keras.utils.set_random_seed(0)
    side = 8
    features = side * side
    spans: list[tuple[float, float]] = []
    pool = np.random.default_rng(0).random((batch * 4, features), dtype=np.float32)
    labels = np.random.default_rng(1).integers(0, 10, batch * 4).astype(np.int32)

    starts: dict[int, float] = {}
    ready: dict[int, float] = {}

    def stamp_begin(i: Any) -> Any:
        starts[int(i)] = time.perf_counter()
        return i

    def produce(i: Any) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(int(i))
        start = (int(i) % 4) * batch
        x = pool[start : start + batch].copy()
        if augment:
            x = _augment_batch(x.reshape(-1, side, side), rng, zoom=8).reshape(batch, features)
        if sleep_s:
            time.sleep(sleep_s)
        return x, labels[start : start + batch].copy()

    def stamp_end(i: Any, x: Any) -> Any:
        ready[int(i)] = time.perf_counter()
        spans.append((starts.pop(int(i)), ready[int(i)]))
        return i

    def to_batch(i: Any) -> tuple[Any, Any]:
        # Three Python calls in a chain (data dependencies order them): the span runs from the start of the
        # first to the end of the last, so it holds produce()'s whole numpy_function call (GIL, conversions).
        i = tf.numpy_function(stamp_begin, [i], tf.int64)
        x, y = tf.numpy_function(produce, [i], [tf.float32, tf.int32])
        done = tf.numpy_function(stamp_end, [i, x], tf.int64)
        with tf.control_dependencies([done]):
            x = tf.identity(x)
        x.set_shape((batch, features))
        y.set_shape((batch,))
        return x, y

    ds = tf.data.Dataset.range(epochs * STEPS + 8)  # more batches than steps: a prefetching pipeline keeps producing
    if parallel:
        ds = ds.map(to_batch, num_parallel_calls=threads, deterministic=True).prefetch(threads)
    else:
        ds = ds.map(to_batch)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    if parallel:  # tf.data's pool has one thread per core by default: a sleeping call would hold one
        options.threading.private_threadpool_size = threads
    ds = ds.with_options(options)
    model = _keras_model(model_kind, features)
    clock = _KerasClock()
    profiler = FitProfiler(log_dir=logdir / scenario, top_k=top_k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(ds, epochs=epochs, steps_per_epoch=STEPS, verbose=0, callbacks=[clock.before, profiler, clock.after])
    return profiler, clock, spans, ready


def keras_scenario(
    scenario: str,
    logdir: Path,
    *,
    base: Result | None = None,
    side_tools: bool = True,
    sleep: float = 0.020,
    epochs: int = 1,
) -> Result:
    """Run one Keras scenario and compare.

    Args:
        epochs: epochs to train (each profiled); epochs after 0 go to ``Result.later``.
        base: the compute-bound result (calibrates ``mixed`` and ``prefetch_hidden``).
        side_tools: also compute xprof's figure.
        sleep: seconds of sleep per batch in ``sleep_input``.
    """
    kw: dict[str, Any]
    if scenario == "sleep_input":
        kw = {"model_kind": "small", "batch": 64, "sleep_s": sleep}
    elif scenario == "cpu_augment":
        kw = {"model_kind": "small", "batch": 32, "augment": True}
    elif scenario == "compute_bound":
        kw = {"model_kind": "heavy", "batch": 128}
    elif scenario == "mixed":
        compute_ms = base.truth_step_ms * (1 - base.truth_pct / 100) if base else 30.0
        kw = {"model_kind": "heavy", "batch": 128, "sleep_s": compute_ms / 1e3}
    elif scenario == "prefetch_hidden":
        # Each batch takes about twice a step to produce, four are produced at once: the pipeline keeps ahead.
        compute_ms = base.truth_step_ms * (1 - base.truth_pct / 100) if base else 30.0
        kw = {"model_kind": "heavy", "batch": 128, "sleep_s": 2 * compute_ms / 1e3, "parallel": True}
    elif scenario == "planted_op":
        kw = {"model_kind": "planted", "batch": 128, "top_k": 10}
    else:
        raise ValueError(f"unknown Keras scenario {scenario!r}; known: {KERAS_SCENARIOS}")
    profiler, clock, spans, ready = keras_run(scenario, logdir, epochs=epochs, **kw)
    report = profiler.reports[0]
    lo, hi = clock.window()
    produce_pct = clipped_share(spans, lo, hi)
    truth, how = produce_pct, "batch production spans / wall"
    extra: dict[str, Any] = {"produce_pct": produce_pct}
    # How long after step k started (on_train_batch_begin) its batch became ready (the end of its last Python
    # call), 0 if it was ready before. It counts Python's dispatch of the traced step (too much) but not the
    # hand-back from the last call to the step (too little): not a strict bound either way.
    waits = [max(0.0, ready[k] - clock.post[k]) for k in range(FIRST - 1, LAST)]
    extra["upper_pct"] = 100.0 * sum(waits) / (hi - lo)
    if scenario == "prefetch_hidden":
        truth, how = extra["upper_pct"], "batch ready after step start / wall"
        if base is not None:  # slowdown against the same model with a fast input: contention, not waiting
            t0 = base.truth_step_ms * (1 - base.truth_pct / 100)
            extra["ablation_pct"] = 100.0 * (clock.step_ms() - t0) / clock.step_ms()
    result = Result(
        framework="keras",
        scenario=scenario,
        truth_pct=truth,
        truth_how=how,
        fitprof_pct=report.input_percent,
        verdict=report.verdict,
        contention=report.contention,
        busy_pct=_busy_pct(report),
        on_device=math.isfinite(report.device_busy_percent),
        step_ms=report.step_time_ms,
        truth_step_ms=clock.step_ms(),
        top_op=report.top_ops[0].name if report.top_ops else "",
        top_op_pct=report.top_ops[0].percent if report.top_ops else float("nan"),
        extra=extra,
    )
    if scenario != "prefetch_hidden":  # its truth needs each batch's ready time: epoch 0 only
        result.later = [
            (clipped_share(spans, *clock.window(e)), profiler.reports[e].input_percent) for e in range(1, epochs)
        ]
    if scenario == "planted_op":
        planted = [op for op in report.top_ops if "planted_matmul" in op.name]
        result.planted_pct_fitprof = sum(op.percent for op in planted)
        result.extra["planted_first"] = "planted_matmul" in result.top_op
        _, clock0, _, _ = keras_run("unplanted", logdir, model_kind="unplanted", batch=256)
        result.planted_pct_ablation = 100.0 * (clock.step_ms() - clock0.step_ms()) / clock.step_ms()
        result.truth_how = "planted op ranks #1 (input: production spans)"
    if side_tools:
        result.xprof_pct = xprof_input_percent(profiler.trace_paths[0])
    return result


# --------------------------------------------------------------------------------------------- Lightning
class _NextTimer:
    """Wraps the DataLoader iterator's ``__next__`` (main process) and records perf_counter spans.

    Only iterators over ``dataset`` are timed (validation loaders are left alone).
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.spans: list[tuple[float, float]] = []

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        from torch.utils.data import dataloader

        cls = dataloader._BaseDataLoaderIter
        original = cls.__next__
        timer = self

        def timed_next(it: Any) -> Any:
            if it._dataset is not timer.dataset:
                return original(it)
            t0 = time.perf_counter()
            try:
                return original(it)
            finally:
                timer.spans.append((t0, time.perf_counter()))

        cls.__next__ = timed_next  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            cls.__next__ = original  # type: ignore[method-assign]


def _lightning_parts(
    model_kind: str,
    batch: int,
    *,
    sleep_s: float = 0.0,
    augment: bool = False,
    workers: int = 0,
) -> tuple[Any, Any, Any]:
    """(module, train loader, dataset). ``sleep_s`` is per batch, slept in the batch's first ``__getitem__``."""
    import lightning.pytorch as pl
    import torch
    from torch import nn

    side, features = 8, 64
    n = batch * STEPS

    class Data(torch.utils.data.Dataset):
        def __init__(self) -> None:
            g = np.random.default_rng(0)
            self.x = g.random((n, features), dtype=np.float32)
            self.y = g.integers(0, 10, n)
            self.rng = np.random.default_rng(1)

        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            x = self.x[i]
            if augment:
                x = _augment_batch(x.reshape(1, side, side), self.rng, zoom=8).reshape(features)
            if sleep_s and i % batch == 0:  # once per batch (no shuffling): one sleep, not many short ones
                time.sleep(sleep_s)
            return torch.from_numpy(x), int(self.y[i])

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            if model_kind == "small":
                self.net = nn.Sequential(nn.Linear(features, 256), nn.ReLU(), nn.Linear(256, 10))
            elif model_kind == "heavy":
                self.net = nn.Sequential(
                    nn.Linear(features, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                    nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10),
                )  # fmt: skip
            else:  # planted / unplanted: a big batched matmul (aten::bmm) among small Linear layers
                self.net = nn.Sequential(nn.Linear(features, 512), nn.ReLU())
                self.head = nn.Linear(512, 10)
                self.planted = nn.Parameter(torch.randn(8, 512, 512) * 0.02) if model_kind == "planted" else None

        def forward(self, x: Any) -> Any:
            h = self.net(x)
            if model_kind in ("small", "heavy"):
                return h
            if self.planted is not None:
                h = torch.bmm(h.unsqueeze(0).expand(8, -1, -1), self.planted).relu().mean(0)
            return self.head(h)

        def training_step(self, b: Any, batch_idx: int) -> Any:
            x, y = b
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = Data()
    loader = torch.utils.data.DataLoader(
        data, batch_size=batch, shuffle=False, num_workers=workers, persistent_workers=workers > 0
    )
    return Net(), loader, data


class _LightningClock:
    """perf_counter at every ``on_train_batch_end`` (index = batch_idx), before and after FitProfiler's hook.

    As for Keras, the window runs from after FitProfiler opened ``ProfilerStep#FIRST`` to before it closes
    ``ProfilerStep#LAST`` (profiler start and trace export are not training time).
    """

    def __init__(self) -> None:
        from lightning.pytorch.callbacks import Callback

        def clock(times: list[float]) -> Any:
            class Clock(Callback):
                def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
                    times.append(time.perf_counter())

            return Clock()

        self.pre: list[float] = []
        self.post: list[float] = []
        self.before, self.after = clock(self.pre), clock(self.post)

    def window(self, epoch: int = 0) -> tuple[float, float]:
        """End of step FIRST - 1 to end of step LAST (FitProfiler's ProfilerStep#FIRST..#LAST)."""
        o = epoch * STEPS
        return self.post[o + FIRST - 2], self.pre[o + LAST - 1]

    def step_ms(self) -> float:
        lo, hi = self.window()
        return (hi - lo) / (LAST - FIRST + 1) * 1e3


def lightning_run(
    scenario: str, logdir: Path, *, simple: bool = False, top_k: int = 5, epochs: int = 1, **parts: Any
) -> tuple[Any, _LightningClock, _NextTimer]:
    """Fit ``STEPS`` steps with FitProfiler (or, ``simple=True``, with ``Trainer(profiler="simple")`` instead)."""
    import lightning.pytorch as pl
    import torch

    from fitprof.lightning import FitProfiler

    pl.seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    module, loader, data = _lightning_parts(**parts)
    clock = _LightningClock()
    timer = _NextTimer(data)
    from lightning.pytorch.profilers import SimpleProfiler

    # A file name keeps its summary off stdout; the figures are read from the profiler object.
    profiler: Any = SimpleProfiler(dirpath=logdir / scenario, filename="simple") if simple else None
    callbacks: list[Any] = [clock.before, clock.after]
    fp = None
    if not simple:
        fp = FitProfiler(log_dir=logdir / scenario, top_k=top_k)
        callbacks.insert(1, fp)
    trainer = pl.Trainer(
        max_epochs=epochs,
        limit_train_batches=STEPS,
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=callbacks,
        profiler=profiler,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=logdir / scenario,
        num_sanity_val_steps=0,
    )
    with warnings.catch_warnings(), timer.installed():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader)
    return (profiler if simple else fp), clock, timer


def _simple_figures(profiler: Any, clock: _LightningClock) -> tuple[float, float]:
    """(share over the window's steps, share printed in the summary) of ``train_dataloader_next``."""
    key = next(k for k in profiler.recorded_durations if k.endswith("train_dataloader_next"))
    durations = profiler.recorded_durations[key]
    # The fetch of batch n (0-based) runs before step n; the window holds the fetches of steps FIRST..LAST.
    # Lightning prefetches one batch ahead: call k fetches batch k+1 after the first call.
    lo, hi = clock.window()
    window = sum(durations[FIRST - 1 : LAST])
    report, _, _ = profiler._make_report_extended()
    summary = next((r[4] for r in report if r[0] == key), float("nan"))
    return 100.0 * window / (hi - lo), float(summary)


def lightning_scenario(
    scenario: str,
    logdir: Path,
    *,
    base: Result | None = None,
    side_tools: bool = True,
    sleep: float = 0.020,
    epochs: int = 1,
) -> Result:
    """Run one Lightning scenario and compare.

    Args:
        epochs: epochs to train (each profiled); epochs after 0 go to ``Result.later``.
        base: the compute-bound result (calibrates ``mixed``).
        side_tools: also compute xprof's, SimpleProfiler's (a second run) and torch-tb-profiler's figures.
        sleep: seconds of sleep per batch in ``sleep_input`` and ``workers_hidden``.
    """
    parts: dict[str, Any]
    if scenario == "sleep_input":
        parts = {"model_kind": "small", "batch": 32, "sleep_s": sleep}
    elif scenario == "cpu_augment":
        parts = {"model_kind": "small", "batch": 32, "augment": True}
    elif scenario == "compute_bound":
        parts = {"model_kind": "heavy", "batch": 128}
    elif scenario == "mixed":
        compute_ms = base.truth_step_ms * (1 - base.truth_pct / 100) if base else 30.0
        parts = {"model_kind": "heavy", "batch": 128, "sleep_s": compute_ms / 1e3}
    elif scenario == "workers_hidden":
        parts = {"model_kind": "heavy", "batch": 128, "sleep_s": sleep, "workers": 2}
    elif scenario == "planted_op":
        parts = {"model_kind": "planted", "batch": 128}
    else:
        raise ValueError(f"unknown Lightning scenario {scenario!r}; known: {LIGHTNING_SCENARIOS}")
    top_k = 10 if scenario == "planted_op" else 5
    fp, clock, timer = lightning_run(scenario, logdir, top_k=top_k, epochs=epochs, **parts)
    report = fp.reports[0]
    lo, hi = clock.window()
    truth = clipped_share(timer.spans, lo, hi)
    result = Result(
        framework="lightning",
        scenario=scenario,
        truth_pct=truth,
        truth_how="main-process DataLoader __next__ spans / wall",
        fitprof_pct=report.input_percent,
        verdict=report.verdict,
        contention=report.contention,
        busy_pct=_busy_pct(report),
        on_device=math.isfinite(report.device_busy_percent),
        step_ms=report.step_time_ms,
        truth_step_ms=clock.step_ms(),
        top_op=report.top_ops[0].name if report.top_ops else "",
        top_op_pct=report.top_ops[0].percent if report.top_ops else float("nan"),
        later=[(clipped_share(timer.spans, *clock.window(e)), fp.reports[e].input_percent) for e in range(1, epochs)],
    )
    if scenario == "planted_op":
        result.planted_pct_fitprof = sum(op.percent for op in report.top_ops if op.name == "aten::bmm")
        result.extra["planted_first"] = result.top_op == "aten::bmm"
        _, clock0, _ = lightning_run("unplanted", logdir, model_kind="unplanted", batch=256)
        result.planted_pct_ablation = 100.0 * (clock.step_ms() - clock0.step_ms()) / clock.step_ms()
        result.truth_how = "planted op ranks #1 (input: __next__ spans)"
    if side_tools:
        result.tbprof_pct = tbprof_dataloader_percent(fp.trace_paths[0])
        result.xprof_pct = xprof_input_percent(fp.xplane_paths[0])
        simple, sclock, stimer = lightning_run(scenario, logdir, simple=True, **parts)
        result.simple_pct, result.simple_summary_pct = _simple_figures(simple, sclock)
        result.simple_truth_pct = clipped_share(stimer.spans, *sclock.window())
    return result


# ---------------------------------------------------------------------------------- fixes, measured again
FIX_SCENARIOS = ("sleep_input", "cpu_augment", "mixed")
"""The zoo's scenarios with a bottleneck (all input): each is run, then run again with each fix its advice names."""


@dataclass
class FixCheck:
    """One fix: fitprof's predicted step time on the bottleneck run against the fixed run's measured one (ms)."""

    framework: str
    scenario: str
    fix: str
    verdict: str
    step_ms: float  # fitprof's step time of the bottleneck run
    clock_ms: float  # the bottleneck run's step time by the independent clock
    predicted_ms: float  # fitprof's step_time_if_no_input_ms of the bottleneck run
    measured_ms: float  # the fixed run's step time by the independent clock
    fixed_fitprof_ms: float  # the fixed run's step time by fitprof
    fixed_input_ms: float  # the input wait the fixed run still has exposed (fitprof's input_exposed_ms_per_step)

    @property
    def error_pct(self) -> float:
        """(predicted - measured) / measured, percent: negative when the fix did less than the upper bound."""
        return 100.0 * (self.predicted_ms - self.measured_ms) / self.measured_ms

    @property
    def rest_error_pct(self) -> float:
        """The same with the input wait the fix left exposed added to the prediction: how well the prediction
        kept the rest of the step (everything but the input wait), percent of the measured step time."""
        return 100.0 * (self.predicted_ms + self.fixed_input_ms - self.measured_ms) / self.measured_ms


def _fix_variants(framework: str, scenario: str, sleep: float, compute_ms: float) -> tuple[dict[str, Any], Any]:
    """(the bottleneck run's arguments, [(fix, the fixed run's arguments), ...]) of one scenario.

    The fixes are those the advice names for the framework: ``map(num_parallel_calls=N)`` + ``prefetch(N)`` for
    tf.data, ``num_workers`` + ``persistent_workers`` for the DataLoader, and a smaller (zero) sleep: the input
    made free, which the prediction should match best. ``cache`` and ``pin_memory`` are left out: the augmented
    batches differ every epoch (caching them changes the training) and there is no GPU to pin memory for.
    """
    keras = framework == "keras"
    small = {"model_kind": "small", "batch": 64 if keras else 32}
    heavy = {"model_kind": "heavy", "batch": 128}
    many = {"parallel": True, "threads": 8} if keras else {"workers": 4}
    few = {"parallel": True, "threads": 2} if keras else {"workers": 2}
    many_name = "map(num_parallel_calls=8).prefetch(8)" if keras else "num_workers=4, persistent_workers=True"
    few_name = "map(num_parallel_calls=2).prefetch(2)" if keras else "num_workers=2, persistent_workers=True"
    if scenario == "sleep_input":
        slow = {**small, "sleep_s": sleep}
        return slow, [("sleep 0", small), (many_name, {**slow, **many})]
    if scenario == "cpu_augment":
        slow = {**small, "augment": True}
        return slow, [(few_name, {**slow, **few})]
    if scenario == "mixed":
        slow = {**heavy, "sleep_s": compute_ms / 1e3}
        return slow, [("sleep 0", heavy), (many_name, {**slow, **many})]
    raise ValueError(f"no fix for scenario {scenario!r}; known: {FIX_SCENARIOS}")


def fix_checks(
    framework: str, logdir: Path, *, scenarios: tuple[str, ...] = FIX_SCENARIOS, sleep: float = 0.020
) -> list[FixCheck]:
    """Run each scenario with a bottleneck and each of its fixes (all with FitProfiler); compare fitprof's
    ``step_time_if_no_input_ms`` on the bottleneck run with the fixed run's step time (independent clock)."""
    runner: Callable[..., Any] = keras_run if framework == "keras" else lightning_run
    count = iter(range(1_000_000))

    def once(kw: dict[str, Any]) -> tuple[Any, float]:
        fp, clock, *_ = runner(f"run{next(count)}", logdir, **kw)
        return fp.reports[0], clock.step_ms()

    base, base_ms = once({"model_kind": "heavy", "batch": 128})  # calibrates `mixed` as the zoo does
    compute_ms = base_ms * (1 - base.input_percent / 100)
    out = []
    for scenario in scenarios:
        slow, fixes = _fix_variants(framework, scenario, sleep, compute_ms)
        report, clock_ms = once(slow)
        for name, kw in fixes:
            fixed, fixed_ms = once(kw)
            check = FixCheck(
                framework,
                scenario,
                name,
                report.verdict,
                report.step_time_ms,
                clock_ms,
                report.step_time_if_no_input_ms,
                fixed_ms,
                fixed.step_time_ms,
                fixed.input_exposed_ms_per_step,
            )
            out.append(check)
            print(_fix_row(check), flush=True)
    return out


FIX_HEADER = (
    "| framework | scenario | verdict | step ms (fitprof; clock) | predicted ms if fixed (speedup) | fix | "
    "measured ms (fitprof) | error % | input left by the fix ms | error % with it |"
    "\n|---|---|---|---:|---:|---|---:|---:|---:|---:|"
)


def _fix_row(c: FixCheck) -> str:
    return (
        f"| {c.framework} | {c.scenario} | {c.verdict} | {c.step_ms:.1f}; {c.clock_ms:.1f} | {c.predicted_ms:.1f} "
        f"({c.step_ms / c.predicted_ms:.2f}x) | {c.fix} | {c.measured_ms:.1f} ({c.fixed_fitprof_ms:.1f}) | "
        f"{c.error_pct:+.1f} | {c.fixed_input_ms:.1f} | {c.rest_error_pct:+.1f} |"
    )


# ------------------------------------------------------------------------------------------------ driver
def run_all(
    framework: str, logdir: Path, *, scenarios: tuple[str, ...], side_tools: bool, epochs: int = 1
) -> tuple[list[Result], float]:
    runner: Callable[..., Result] = keras_scenario if framework == "keras" else lightning_scenario
    results: list[Result] = []
    base: Result | None = None
    order = sorted(scenarios, key=lambda s: s != "compute_bound")  # compute-bound first: it calibrates others
    if base is None and any(s in ("mixed", "prefetch_hidden") for s in order) and "compute_bound" not in order:
        order = ["compute_bound", *order]
    t0 = time.perf_counter()
    for s in order:
        r = runner(s, logdir, base=base, side_tools=side_tools, epochs=epochs)
        if s == "compute_bound":
            base = r
        if s in scenarios:
            results.append(r)
            print(_row(r), flush=True)
    return results, time.perf_counter() - t0


def _fmt(v: float) -> str:
    return "–" if v != v else f"{v:.1f}"


HEADER = (
    "| framework | scenario | truth % | fitprof % | error pp | verdict (expected) | xprof % | SimpleProfiler % "
    "(its run's truth; summary %) | tb-profiler % | top op | later epochs: error pp | ok |\n"
    "|---|---|---:|---:|---:|---|---:|---:|---:|---|---|---|"
)


def _row(r: Result) -> str:
    simple = "–" if r.simple_pct != r.simple_pct else (
        f"{r.simple_pct:.1f} ({r.simple_truth_pct:.1f}; {r.simple_summary_pct:.1f})"
    )  # fmt: skip
    top = f"{r.top_op} ({r.top_op_pct:.0f}%)" if r.scenario == "planted_op" else ""
    if r.scenario == "planted_op":
        top += f"; planted total {r.planted_pct_fitprof:.0f}%, ablation {r.planted_pct_ablation:.0f}%"
    truth = _fmt(r.truth_pct)
    if "upper_pct" in r.extra and r.scenario != "prefetch_hidden":
        truth += f" (≤ {r.extra['upper_pct']:.1f})"
    return (
        f"| {r.framework} | {r.scenario} | {truth} | {_fmt(r.fitprof_pct)} | {r.error_pp:+.1f} | "
        f"{r.verdict} ({r.expected_verdict}) | {_fmt(r.xprof_pct)} | {simple} | {_fmt(r.tbprof_pct)} | {top} | "
        f"{' '.join(f'{e:+.1f}' for e in r.later_errors_pp) or '–'} | {'yes' if r.ok else 'NO'} |"
    )


def _versions(framework: str) -> str:
    import fitprof

    parts = [f"Python {platform.python_version()}", f"fitprof {fitprof.__version__}"]
    if framework in ("keras", "all"):
        import keras
        import tensorflow as tf

        parts += [f"tensorflow {tf.__version__}", f"keras {keras.__version__}"]
    if framework in ("lightning", "all"):
        import lightning
        import torch

        parts += [f"torch {torch.__version__}", f"lightning {lightning.__version__}"]
    from importlib.metadata import version

    parts.append(f"xprof {version('xprof')}")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=["keras", "lightning", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="one repeat, no SimpleProfiler runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="epochs per run, each profiled (default 3)")
    parser.add_argument("--scenario", action="append", help="run only these scenarios (repeatable)")
    parser.add_argument("--json", help="write every result to this file")
    parser.add_argument(
        "--fixes", action="store_true", help="predicted vs measured step time of each fix (issue 16) instead"
    )
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    frameworks = ["keras", "lightning"] if args.framework == "all" else [args.framework]
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, no GPU; {_versions(args.framework)}")
    if args.fixes:
        return fix_main(args, frameworks, repeats)
    print(HEADER)
    everything: list[Result] = []
    with tempfile.TemporaryDirectory() as d:
        for fw in frameworks:
            known = KERAS_SCENARIOS if fw == "keras" else LIGHTNING_SCENARIOS
            chosen = tuple(s for s in known if not args.scenario or s in args.scenario)
            for rep in range(repeats):
                results, seconds = run_all(
                    fw, Path(d) / f"{fw}{rep}", scenarios=chosen, side_tools=not args.quick, epochs=args.epochs
                )
                everything += results
                print(f"<!-- {fw} repeat {rep + 1}/{repeats}: {seconds:.0f} s -->", flush=True)
    if repeats > 1:
        print("\nMedian [min, max] over repeats:")
        print("| framework | scenario | truth % | fitprof % | error pp | xprof % | verdicts right | all ok |")
        print("|---|---|---:|---:|---:|---:|---:|---|")
        keys = list(dict.fromkeys((r.framework, r.scenario) for r in everything))
        for fw, sc in keys:
            rs = [r for r in everything if (r.framework, r.scenario) == (fw, sc)]

            def spread(vals: list[float]) -> str:
                vals = [v for v in vals if v == v]
                if not vals:
                    return "–"
                return f"{statistics.median(vals):.1f} [{min(vals):.1f}, {max(vals):.1f}]"

            right = sum(r.verdict == r.expected_verdict for r in rs)
            print(
                f"| {fw} | {sc} | {spread([r.truth_pct for r in rs])} | {spread([r.fitprof_pct for r in rs])} | "
                f"{spread([r.error_pp for r in rs])} | {spread([r.xprof_pct for r in rs])} | {right}/{len(rs)} | "
                f"{'yes' if all(r.ok for r in rs) else 'NO'} |"
            )
    input_runs = [r for r in everything if r.scenario != "planted_op"]
    if input_runs:
        first = max(abs(r.error_pp) for r in input_runs)
        later = [abs(e) for r in input_runs for e in r.later_errors_pp]
        print(
            f"\nLargest |error| over {len(input_runs)} input-share runs: epoch 0 {first:.1f} pp; later epochs "
            + (f"{max(later):.1f} pp ({len(later)} windows)" if later else "– (no later epoch)")
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [
                    {
                        **asdict(r),
                        "ok": r.ok,
                        "expected_verdict": r.expected_verdict,
                        "later_errors_pp": r.later_errors_pp,
                    }
                    for r in everything
                ],
                indent=1,
                default=lambda o: o.item() if hasattr(o, "item") else str(o),
            )
        )
    print(f"\nreproduce: python benchmarks/zoo.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    return 0 if all(r.ok for r in everything) else 1


def fix_main(args: argparse.Namespace, frameworks: list[str], repeats: int) -> int:
    """``--fixes``: the predicted-vs-measured table per run, then the median and range of each error."""
    print(FIX_HEADER)
    checks: list[FixCheck] = []
    chosen = tuple(s for s in FIX_SCENARIOS if not args.scenario or s in args.scenario)
    with tempfile.TemporaryDirectory() as d:
        for fw in frameworks:
            for rep in range(repeats):
                t0 = time.perf_counter()
                checks += fix_checks(fw, Path(d) / f"{fw}{rep}", scenarios=chosen)
                print(f"<!-- {fw} repeat {rep + 1}/{repeats}: {time.perf_counter() - t0:.0f} s -->", flush=True)
    print("\nError of the prediction, median [min, max] over repeats (percent of the measured step time):")
    print(
        "| framework | scenario | fix | predicted ms | measured ms | error % | within 15% | input left ms | "
        "error % with it |\n|---|---|---|---:|---:|---:|---|---:|---:|"
    )
    for key in dict.fromkeys((c.framework, c.scenario, c.fix) for c in checks):
        cs = [c for c in checks if (c.framework, c.scenario, c.fix) == key]

        def spread(vals: list[float], spec: str = ".1f") -> str:
            return f"{statistics.median(vals):{spec}} [{min(vals):{spec}}, {max(vals):{spec}}]"

        errs = [c.error_pct for c in cs]
        within = sum(abs(e) <= 15.0 for e in errs)
        print(
            f"| {' | '.join(key)} | {spread([c.predicted_ms for c in cs])} | {spread([c.measured_ms for c in cs])} | "
            f"{spread(errs, '+.1f')} | {within}/{len(cs)} | {spread([c.fixed_input_ms for c in cs])} | "
            f"{spread([c.rest_error_pct for c in cs], '+.1f')} |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [{**asdict(c), "error_pct": c.error_pct, "rest_error_pct": c.rest_error_pct} for c in checks],
                indent=1,
                default=float,
            )
        )
    print(f"\nreproduce: python benchmarks/zoo.py {' '.join(sys.argv[1:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

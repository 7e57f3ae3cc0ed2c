"""Names, units and definitions of every figure fitprof logs, in one place.

The Keras and the Lightning callbacks log the same keys with the same meaning; ``fitprof report`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "fitprof/"


@dataclass(frozen=True)
class Compared:
    """How ``fitprof compare`` compares a figure (:data:`fitprof.compare.FIGURES`).

    Attributes:
        label: the figure's name in the comparison.
        unit: its unit there, short (``ms/step``, ``samples/s``).
        order: its place among the compared figures, smallest first (ties in the order defined in this module).
        higher_is_worse: False for a rate (throughput), where a fall is the regression.
        gate: the gate of :data:`fitprof.compare.GATES` it can fail; "" for none.
        every_step: read from the always-on timing, one value per epoch of every run (the figure's ``key``), not
            from the windows' reports (its ``field``).
    """

    label: str
    unit: str
    order: int
    higher_is_worse: bool = True
    gate: str = ""
    every_step: bool = False


@dataclass(frozen=True)
class Metric:
    """One figure: its key, its unit, what it is computed from, the group of figures it is logged with
    (:func:`in_group`; "" for a window's figures) and, for a window's figure, the
    :class:`~fitprof.analysis.BottleneckReport` field it is read from (``field``; "" for a figure that is not a
    report field). A window figure with a ``field`` is in :data:`BASE_METRICS`, and so in
    :meth:`BottleneckReport.scalars() <fitprof.analysis.BottleneckReport.scalars>`, the logged keys and the CSV
    columns of ``fitprof analyze`` / ``report``: one row here adds it to all of them. ``compared`` says how
    ``fitprof compare`` compares it (None: not compared): a row with it is in :data:`COMPARED_METRICS`, and so in
    :data:`fitprof.compare.FIGURES`. The figures compared but never logged are in their own group,
    :data:`COMPARE_ONLY_METRICS`."""

    key: str
    unit: str
    definition: str
    group: str = ""
    field: str = ""
    compared: Compared | None = None


def in_group(name: str) -> tuple[Metric, ...]:
    """The metrics of group ``name``, in the order they are defined in this module (the order they are logged in);
    a figure joins its group where it is defined."""
    return tuple(m for m in list(globals().values()) if isinstance(m, Metric) and m.group == name)


STEP_TIME_MS = Metric(
    PREFIX + "step_time_ms",
    "ms",
    "Mean wall time of an analysed training step: the duration of the step marker (Kineto `ProfilerStep#N`, "
    "an XSpace event with `_r=1`), less any validation run inside it, less checkpoint saves "
    "(`fitprof/checkpoint_ms_per_step`) and less fitprof's own time (`fitprof/self_ms_per_step`).",
    field="step_time_ms",
    compared=Compared("step time", "ms", 10, gate="step"),
)
INPUT_PERCENT = Metric(
    PREFIX + "input_percent",
    "% of step time (0-100)",
    "Time the training loop was blocked waiting for its next batch inside analysed steps (union of "
    "`enumerate(DataLoader)#...__next__` spans in PyTorch, of `IteratorGetNext` spans in TensorFlow), over "
    "the summed step time.",
    field="input_percent",
)
HTOD_MS_PER_STEP = Metric(
    PREFIX + "htod_ms_per_step",
    "ms per step",
    "Device time of host-to-device copies (Kineto `gpu_memcpy` `Memcpy HtoD ...`, XSpace device-plane "
    "`MemcpyH2D`) launched inside analysed steps, divided by the number of steps. 0 on a CPU-only run.",
    field="htod_ms_per_step",
    compared=Compared("host-to-device copies", "ms/step", 70, gate="htod"),
)
HTOD_PERCENT = Metric(
    PREFIX + "htod_percent",
    "% of step time",
    "`htod_ms_per_step` over `step_time_ms`, times 100, overlapped or not (`htod_exposed_percent`: the part that "
    "slows the step). 0 on a CPU-only run.",
    field="htod_percent",
)
COLLECTIVE_PERCENT = Metric(
    PREFIX + "collective_percent",
    "% of step time",
    "Time of collective communication (NCCL/RCCL kernels, gloo and TF collective ops) inside analysed steps "
    "over step time: device time where there are device events, host time otherwise. All of it, overlapped or "
    "not: `collective_exposed_percent` is the part that slows the step.",
    field="collective_percent",
)
HTOD_EXPOSED_PERCENT = Metric(
    PREFIX + "htod_exposed_percent",
    "% of step time",
    "The part of `htod_percent` not hidden behind compute: the device time of the host-to-device copies launched "
    "in analysed steps while no kernel (compute or collective) ran on the device, over step time. The verdict "
    "rests on it: a copy that overlaps a kernel costs the step nothing. 0 on a CPU-only run.",
    field="htod_exposed_percent",
)
COLLECTIVE_EXPOSED_PERCENT = Metric(
    PREFIX + "collective_exposed_percent",
    "% of step time",
    "The part of `collective_percent` not hidden behind compute: collective kernels' device time while no compute "
    "kernel ran (without device collectives: host time blocked in collectives while no host operator ran on "
    "another thread), over step time. The verdict rests on it: DDP overlaps its gradient all-reduce with the "
    "backward pass by design, and only the exposed part slows the step.",
    field="collective_exposed_percent",
)
STEPS_ANALYZED = Metric(
    PREFIX + "steps_analyzed",
    "steps",
    "Number of training steps the figures of this epoch are computed from.",
    field="steps_analyzed",
)
TOP_OP_RANKED = Metric(
    PREFIX + "top_op_<i>_ms",
    "ms per step",
    "Self time per step of the i-th operator (1 = the largest, i = 1..`top_k`) ranked by self time: device "
    "self time (kernels attributed to the operator that launched them) when the trace has device events, host "
    "self time (duration less nested operators) otherwise. Step markers and user annotations are never "
    "operators. The key names the rank, not the operator, so the same keys come every epoch (History, CSV "
    "columns, monitors); the names are in the text summary and in `fitprof/top_ops/<op name>`.",
)
_UPPER = (
    " An upper bound on the gain: it assumes the hidden time costs nothing else (overlapped input still takes CPU "
    "time, an overlapped copy still takes bandwidth), so a measured fix lands at or below it."
)
SPEEDUP_IF_NO_INPUT = Metric(
    PREFIX + "speedup_if_no_input",
    "x (ratio >= 1)",
    "`step_time_ms / step_time_if_no_input_ms`: how many times faster steps would be with the input wait hidden."
    + _UPPER,
    field="speedup_if_no_input",
)
SPEEDUP_IF_NO_HTOD = Metric(
    PREFIX + "speedup_if_no_htod",
    "x (ratio >= 1)",
    "`step_time_ms / step_time_if_no_htod_ms`: how many times faster steps would be with the HtoD copies "
    "overlapped." + _UPPER,
    field="speedup_if_no_htod",
)
SPEEDUP_IF_NO_COLLECTIVES = Metric(
    PREFIX + "speedup_if_no_collectives",
    "x (ratio >= 1)",
    "`step_time_ms / step_time_if_no_collectives_ms`: how many times faster steps would be with the collectives "
    "overlapped." + _UPPER,
    field="speedup_if_no_collectives",
)
STEP_TIME_IF_NO_INPUT_MS = Metric(
    PREFIX + "step_time_if_no_input_ms",
    "ms",
    "`step_time_ms` less the exposed input wait per step: the input spans inside analysed steps when no device "
    "work and no host operator on another thread ran (on a trace without device events, the whole input wait)."
    + _UPPER,
    field="step_time_if_no_input_ms",
)
STEP_TIME_IF_NO_HTOD_MS = Metric(
    PREFIX + "step_time_if_no_htod_ms",
    "ms",
    "`step_time_ms` less the exposed host-to-device copy time per step: the device time of the copies launched in "
    "analysed steps when no kernel ran on the device. Equal to `step_time_ms` on a CPU-only run." + _UPPER,
    field="step_time_if_no_htod_ms",
)
STEP_TIME_IF_NO_COLLECTIVES_MS = Metric(
    PREFIX + "step_time_if_no_collectives_ms",
    "ms",
    "`step_time_ms` less the exposed collective time per step: collective kernels' device time when no compute "
    "kernel ran (without device collectives: host time blocked in collectives when no host operator ran on "
    "another thread)." + _UPPER,
    field="step_time_if_no_collectives_ms",
)
SAMPLES_PER_S = Metric(
    PREFIX + "samples_per_s",
    "samples/s",
    "Samples in the analysed steps over their summed step time (`samples per step / step_time_ms * 1000`), the "
    "samples of each profiled step read from its batch (the leading dimension its arrays agree on, "
    "`fitprof._batch.batch_size`). NaN, with one warning, where the batch gives no count (docs/metrics.md).",
    field="samples_per_s",
    compared=Compared("throughput", "samples/s", 100, higher_is_worse=False),
)
ITEMS_PER_S = Metric(
    PREFIX + "items_per_s",
    "items/s",
    "The same with the user's `count_items(batch)` (tokens, pixels, ...) in place of the samples; NaN without it.",
    field="items_per_s",
    compared=Compared("items throughput", "items/s", 110, higher_is_worse=False),
)
FLOPS_PER_STEP = Metric(
    PREFIX + "flops_per_step",
    "FLOP",
    "FLOPs of one training step (forward and backward), counted by the callback on a step outside the analysed "
    "ones: 2 per multiply-add of matrix products and convolutions (torch `FlopCounterMode`; on TensorFlow the same "
    "rule on the traced step's graph); element-wise ops, the loss and the optimizer count 0.",
    field="flops_per_step",
)
FLOPS_PER_S = Metric(
    PREFIX + "flops_per_s",
    "FLOP/s",
    "`flops_per_step / step_time_ms * 1000`: achieved FLOP rate of the analysed steps.",
    field="flops_per_s",
    compared=Compared("FLOP rate", "FLOP/s", 120, higher_is_worse=False),
)
MFU = Metric(
    PREFIX + "mfu",
    "ratio (0-1)",
    "`flops_per_s` over the device's dense peak FLOP/s (`fitprof.throughput.PEAK_FLOPS`, from the vendors' "
    "datasheets), matrix products and convolutions each at the peak of the precision they run in (torch on NVIDIA "
    "compute capability 8.0+: float32 convolutions in TF32 unless `torch.backends.cudnn.allow_tf32` is False, "
    "float32 matrix products in TF32 only when `torch.set_float32_matmul_precision` allows it): model FLOPs "
    "utilisation. NaN on a CPU, on a device or dtype not in the table, and above 1 (a wrong peak or count; "
    "`mfu_note` gives the ratio).",
    field="mfu",
)
SELF_MS_PER_STEP = Metric(
    PREFIX + "self_ms_per_step",
    "ms per step",
    "fitprof's own time inside the analysed steps: the total duration of its `fitprof/overhead` annotations "
    "(its batch-hook bodies and step-marker transitions) inside analysed steps, divided by the number of steps. "
    "This time is already left out of `step_time_ms` and every share of it.",
    field="self_ms_per_step",
)
CHECKPOINT_MS_PER_STEP = Metric(
    PREFIX + "checkpoint_ms_per_step",
    "ms per step",
    "Checkpoint saves inside the analysed steps: the total duration of the callbacks' `fitprof/checkpoint` "
    "annotations (a `ModelCheckpoint` save run inside a window), divided by the number of steps. This time is "
    "already left out of `step_time_ms` and every share of it; 0 when no save ran in the window.",
    field="checkpoint_ms_per_step",
)
OPTIMIZER_MS_PER_STEP = Metric(
    PREFIX + "optimizer_ms_per_step",
    "ms per step",
    "Host time of the optimizer's step inside analysed steps: the union of torch's `Optimizer.step#<class>.step` "
    "spans, less validation, checkpoint saves and fitprof's own spans, divided by the number of steps. NaN where "
    "the trace has no such span (TensorFlow and JAX traces, a torch optimizer that is not profiled).",
    field="optimizer_ms_per_step",
)
VS_BASELINE_STEP_TIME_PERCENT = Metric(
    PREFIX + "vs_baseline/step_time_percent",
    "% (signed: + slower, - faster)",
    "With `baseline=PATH`: the window's `step_time_ms` over the baseline's (the mean over the baseline run's "
    "windows, `fitprof.compare`), less 1, times 100. Not logged when the two are not comparable (another framework, "
    "world size, device, precision or batch size).",
)
TOP_OPS_PREFIX = PREFIX + "top_ops/"
TOP_OP = Metric(
    TOP_OPS_PREFIX + "<op name>",
    "ms per step",
    "The same self time per step under the operator's name: TensorBoard only (the Keras event file, the "
    "Lightning `TensorBoardLogger`), where a key that comes and goes between epochs costs nothing and each "
    "operator keeps its own curve. Never in Keras `logs` nor Lightning's logged metrics.",
)
SUMMARY_TAG = PREFIX + "summary"
ADVICE_TAG = PREFIX + "advice"
"""The Text-tab tag of the verdicts and advice each epoch said first in its fit (:class:`fitprof.fit.voice.Voice`)."""

EPOCH_PREFIX = PREFIX + "epoch/"
_CLEAN = (
    " Over the epoch's clean steps: every training step timed by wall clock at its step boundary "
    "(`fitprof.fit.steps.StepRecorder`), less the excluded ones (the first steps of the epoch, the step holding "
    "validation and the step after, the steps of a profiling window and the step after it); a checkpoint save is "
    "taken out of the step it ran in, which stays timed."
)
EPOCH_STEP_TIME_MS_P50 = Metric(
    EPOCH_PREFIX + "step_time_ms_p50",
    "ms",
    "Median wall time of a training step, from one step boundary to the next (Lightning: `on_train_batch_end` to "
    "`on_train_batch_end`, so it holds the batch fetch and the host-to-device copy); no device synchronisation."
    + _CLEAN,
    group="epoch",
    compared=Compared("step time, every step (median)", "ms", 20, gate="step", every_step=True),
)
EPOCH_STEP_TIME_MS_P90 = Metric(
    EPOCH_PREFIX + "step_time_ms_p90",
    "ms",
    "90th percentile of the step wall time (numpy's linear interpolation)." + _CLEAN,
    group="epoch",
)
EPOCH_STEP_TIME_MS_MAX = Metric(EPOCH_PREFIX + "step_time_ms_max", "ms", "The slowest step." + _CLEAN, group="epoch")
EPOCH_INPUT_PERCENT = Metric(
    EPOCH_PREFIX + "input_percent",
    "% of step time (0-100)",
    "Time from the end of the previous step to the start of this one (Lightning: `on_train_batch_end` of step "
    "N-1 to `on_train_batch_start` of step N: the batch fetch, `DataLoader` and collate included, and the "
    "host-to-device copy), summed, over the summed step time. Measured by wall clock without a profiler, so "
    "it is the exact wait, not a sample; absent where the adapter cannot see the fetch." + _CLEAN,
    group="epoch",
    compared=Compared("input wait, every step", "%", 30, every_step=True),
)
EPOCH_SAMPLES_PER_S = Metric(
    EPOCH_PREFIX + "samples_per_s",
    "samples/s",
    "Samples over seconds, summed over the steps whose batch size is known (`fitprof._batch.batch_size`: the "
    "leading dimension the batch's arrays agree on, as Lightning's extract_batch_size reads it)." + _CLEAN,
    group="epoch",
    compared=Compared("throughput, every step", "samples/s", 50, higher_is_worse=False, every_step=True),
)
EPOCH_STEPS_TIMED = Metric(
    EPOCH_PREFIX + "steps_timed",
    "steps",
    "The clean steps the `fitprof/epoch/*` figures come from." + _CLEAN,
    group="epoch",
)
_SPAN = (
    " The epoch's span runs from the previous epoch's close to its own, the first epoch of a fit from its start; an "
    "epoch closes after every callback's epoch-end hook (Lightning: at the next epoch's start or `on_train_end`; "
    "Keras: before `History` records the logs), so a save made at its end by a hook that runs after fitprof's is "
    "its own (`fitprof.fit.epoch_close`)."
)
_PART = " One of the parts that add up to `fitprof/epoch/wall_s` exactly."
EPOCH_WALL_S = Metric(
    EPOCH_PREFIX + "wall_s",
    "s",
    "Wall time of the epoch, by `time.perf_counter_ns` at the callback's epoch events; the sum of `train_steps_s`, "
    "`validation_s`, `checkpoint_s`, `callbacks_s`, `startup_s`, `profiling_s` and `other_s`." + _SPAN,
    group="epoch parts",
)
EPOCH_TRAIN_STEPS_S = Metric(
    EPOCH_PREFIX + "train_steps_s",
    "s",
    "Time in training steps: from each step's start (Lightning `on_train_batch_start`, Keras "
    "`on_train_batch_begin`) to its end, plus the gap from the previous step's end (its batch fetch, the loop's "
    "own work), less the time of other callbacks' hooks, saves and fitprof inside them, and less a profiling "
    "window's extra cost (see `profiling_s`)." + _PART,
    group="epoch parts",
)
EPOCH_INPUT_S = Metric(
    EPOCH_PREFIX + "input_s",
    "s",
    "The batch-fetch wait inside `train_steps_s` (not a separate part): Lightning's "
    "`[_TrainingEpochLoop].train_dataloader_next`, Keras's fetch on the torch backend; the first step's fetch is "
    "`startup_s`. Absent where the adapter cannot see the fetch (Keras on TensorFlow and JAX).",
    group="epoch parts",
)
EPOCH_VALIDATION_S = Metric(
    EPOCH_PREFIX + "validation_s",
    "s",
    "Time inside validation runs (`on_validation_start` to `on_validation_end`, Keras `on_test_begin` to "
    "`on_test_end`), less checkpoint saves, other callbacks' hooks and fitprof's hooks inside them." + _PART,
    group="epoch parts",
    compared=Compared("validation, every epoch", "s", 170, gate="validation", every_step=True),
)
EPOCH_CHECKPOINT_S = Metric(
    EPOCH_PREFIX + "checkpoint_s",
    "s",
    "Time inside checkpoint saves: the hooks of checkpointing callbacks (Lightning `ModelCheckpoint`, Keras "
    "`ModelCheckpoint` and `BackupAndRestore`), with every hook they call; a save at the epoch's end is the epoch's "
    "own even when its hook runs after fitprof's." + _PART,
    group="epoch parts",
    compared=Compared("checkpoint saves, every epoch", "s", 180, gate="checkpoint", every_step=True),
)
EPOCH_CALLBACKS_S = Metric(
    EPOCH_PREFIX + "callbacks_s",
    "s",
    "Time inside other callbacks' hooks (Lightning: the `[Callback]<name>.<hook>` profiler actions; Keras: each "
    "callback's hook in the fit's callback list), the innermost hook counted once." + _PART,
    group="epoch parts",
)
EPOCH_STARTUP_S = Metric(
    EPOCH_PREFIX + "startup_s",
    "s",
    "From the epoch's start to its first step's start: loader workers spawned (`worker_init_fn` included), the "
    "iterator built, the first batch fetched." + _PART,
    group="epoch parts",
    compared=Compared("epoch start-up, every epoch", "s", 190, gate="startup", every_step=True),
)
EPOCH_PROFILING_S = Metric(
    EPOCH_PREFIX + "profiling_s",
    "s",
    "fitprof's own time: its hooks (window start, stop and export, analysis), plus a profiling window's extra "
    "cost: the time of the steps it held less as many of the epoch's median step outside windows." + _PART,
    group="epoch parts",
)
EPOCH_OTHER_S = Metric(
    EPOCH_PREFIX + "other_s",
    "s",
    "The rest of the epoch: the framework's loop between the last step and validation or the epoch's end, the "
    "time between two epochs outside any hook." + _PART,
    group="epoch parts",
)
EPOCH_CPU_PERCENT = Metric(
    EPOCH_PREFIX + "cpu_percent",
    "% of wall time (can exceed 100)",
    "User plus system CPU time of the training process's threads (`getrusage(RUSAGE_SELF)`) over the epoch's "
    "wall time, times 100; loader worker processes not counted." + _SPAN,
    group="epoch parts",
)
EPOCH_INVOLUNTARY_SWITCHES_PER_S = Metric(
    EPOCH_PREFIX + "involuntary_switches_per_s",
    "1/s",
    "Context switches the scheduler forced on the training process's threads (`ru_nivcsw`) per second of the "
    "epoch's wall time: many with little CPU time means threads waited for a core." + _SPAN,
    group="epoch parts",
)
EPOCH_RUN_WAIT_PERCENT = Metric(
    EPOCH_PREFIX + "run_wait_percent",
    "% of wall time (0-100)",
    "Time the training thread was ready to run but waited for a core (`/proc/thread-self/schedstat`, Linux) over "
    "the epoch's wall time, times 100; 20 or more makes the epoch CPU-contended. Absent where Linux does not give "
    "it." + _SPAN,
    group="epoch parts",
)
EPOCH_OWN_THREADS_CPU_PERCENT = Metric(
    EPOCH_PREFIX + "own_threads_cpu_percent",
    "% of wall time (can exceed 100)",
    "CPU time of the training process's threads other than the training thread (the intra-op pool, the "
    "framework's and fitprof's threads): the process's (`getrusage(RUSAGE_SELF)`) less the training thread's "
    "(`/proc/thread-self/schedstat`, Linux), over the epoch's wall time, times 100; a CPU-contended epoch's verdict "
    "names these threads as the cause when they (with the loader workers) used at least as much of the cores as "
    "other processes. Absent where Linux does not give it." + _SPAN,
    group="epoch parts",
)
_LOADER = (
    " Read once per epoch from the training loader's workers (`fitprof.fit.loader.LoaderProbe`: a PyTorch "
    "`DataLoader`'s fetch of each batch, its samples and its collate, or a Keras `PyDataset`'s `__getitem__`, timed "
    "inside each worker process or thread into shared memory); NaN where the callback has no such loader or the "
    "epoch had no steady steps. Several train loaders (Lightning's `CombinedLoader`, a list or dict) are read "
    "together: workers summed, the busy share over all of them, the batch time per step (one batch from each)."
)
LOADER_WORKERS = Metric(
    EPOCH_PREFIX + "loader_workers",
    "workers",
    "The training loader's worker processes (`num_workers`), or a `PyDataset`'s worker threads or processes "
    "(`workers`); 0 when the main process loads the batches (as Keras does with one worker thread)." + _LOADER,
    group="loader",
)
LOADER_BUSY_PERCENT = Metric(
    EPOCH_PREFIX + "loader_busy_percent",
    "% of the workers' time (0-100)",
    "Time the workers spent producing batches (fetch and collate, wall clock in the worker) over the workers' count "
    "times the epoch's wall time (epoch start to epoch end); the rest they idled (a full prefetch queue, or start-up). "
    "With 0 workers: the main process's input wait over the epoch's wall time." + _LOADER,
    group="loader",
)
LOADER_BATCH_MS = Metric(
    EPOCH_PREFIX + "loader_batch_ms",
    "ms per batch",
    "W: the workers' wall time per batch produced this epoch (their summed busy time over the batches they "
    "produced; several loaders feeding each step: over the steps' worth of batches). With 0 workers: the mean input "
    "wait of the steady steps." + _LOADER,
    group="loader",
)
LOADER_WORKERS_NEEDED = Metric(
    EPOCH_PREFIX + "loader_workers_needed",
    "workers",
    "The smallest worker count N (from 0 to the usable cores, `len(os.sched_getaffinity(0))`, when the loading is "
    "CPU-bound: the worker ran or waited for a core at least half its wall time; else to 4 times the cores) whose "
    "predicted input wait is under 5% of the predicted step time, the step time with N workers predicted as "
    "max(S + M, W/N, W_cpu/min(N, F), (W_cpu + S_cpu)/cores) (with 0 workers S + W): S the steady steps' time "
    "without their input wait, M the main process's own per-batch wait (the measured wait less max(0, W/N - S) at "
    "the current N, at least the main thread's CPU time while the loop waited), W_cpu and S_cpu the CPU times of a batch and of a step's main thread "
    "(`fitprof.fit.loader.StepModel`), F the cores CPU-bound workers could have had (their CPU time plus the "
    "usable cores' idle time from `/proc/stat`, over the epoch's wall time; other processes hold the rest; F = cores "
    "for loading that is not CPU-bound; F = 1 for worker threads, which share the GIL). The count is chosen as if "
    "batches took 10% longer (a count whose workers only just keep pace makes the loop wait at every late batch); "
    "when no count up to the bound reaches the target, the smallest within 1% of the best. A thread count of 1 is "
    "never given (Keras loads in the main thread). NaN for worker threads whose CPU time fills a quarter of a core or "
    "more: the loop's own Python waits for the same GIL, so its step grows with the thread count and no count is "
    "predicted." + _LOADER,
    group="loader",
)
LOADER_STEP_TIME_IF_ENOUGH_WORKERS_MS = Metric(
    EPOCH_PREFIX + "step_time_if_enough_workers_ms",
    "ms",
    "The predicted step time with `loader_workers_needed` workers (the model above). A prediction, checked by "
    "re-measuring with that many workers in `tests/test_loader_torch.py`, `tests/test_loader_pydataset.py` and "
    "`benchmarks/loader_prediction.py`; NaN where `loader_workers_needed` is." + _LOADER,
    group="loader",
)
TRIGGER_PREFIX = PREFIX + "trigger/"
TRIGGER_SUMMARY_TAG = TRIGGER_PREFIX + "summary"
"""TensorBoard text tag of each triggered window's summary (the Text tab), in both callbacks."""
TRIGGER_STEP = Metric(
    TRIGGER_PREFIX + "step",
    "step (1-based, in the epoch)",
    'The step after which the slowdown trigger fired (`trigger="slowdown"`); its window opens at the next step.',
    group="trigger",
)
TRIGGER_STEP_TIME_MS = Metric(
    TRIGGER_PREFIX + "step_time_ms",
    "ms",
    "Median wall time of the run of slow steps that fired the trigger (`fitprof.fit.steps.TriggerEvent`).",
    group="trigger",
)
TRIGGER_BASELINE_MS = Metric(
    TRIGGER_PREFIX + "baseline_ms",
    "ms",
    "The baseline the slow steps were compared with: the median of the last clean steps' wall times "
    "(`fitprof.fit.steps.SlowdownTrigger`, `baseline_steps`).",
    group="trigger",
)
_MB = " 1 MB = 1e6 bytes."
_MEMORY_WHERE = (
    " Where it comes from, by training device (`fitprof.profilers.memory.BACKENDS`): CUDA "
    "`torch.cuda.max_memory_allocated`; TensorFlow GPU `tf.config.experimental.get_memory_info()['peak']`; JAX "
    "`memory_stats()['peak_bytes_in_use']` (JAX cannot reset it: the process's peak so far); a CPU-only run the "
    "process's peak resident memory (Linux `VmHWM` in `/proc/self/status`, reset through `/proc/self/clear_refs`; "
    "elsewhere `getrusage` `ru_maxrss`, the process's peak so far)."
)
MEMORY_PEAK_MB = Metric(
    PREFIX + "memory_peak_mb",
    "MB",
    "The most memory the framework held on the training device during the profiled window (the peak is reset "
    "when the window opens and read when it stops)." + _MEMORY_WHERE + _MB,
    group="memory",
)
MEMORY_RESERVED_PEAK_MB = Metric(
    PREFIX + "memory_reserved_peak_mb",
    "MB",
    "The allocator's reserved peak during the window, its cache included: CUDA `torch.cuda.max_memory_reserved`, "
    "JAX `peak_bytes_reserved`; NaN where the framework does not say (TensorFlow, the host)." + _MB,
    group="memory",
)
MEMORY_HEADROOM_PERCENT = Metric(
    PREFIX + "memory_headroom_percent",
    "% of capacity (0-100)",
    "`100 * (capacity - held) / capacity` at the window's peak, `held` the larger of `memory_peak_mb` and "
    "`memory_reserved_peak_mb`. Capacity: CUDA `get_device_properties().total_memory`, JAX `bytes_limit`, the host "
    "(Linux) the process's resident memory plus `MemAvailable` from `/proc/meminfo` at the read (what it could "
    "hold, other processes' memory left out), elsewhere the physical RAM; NaN on TensorFlow (no capacity given). "
    "Under 10% fitprof warns once.",
    group="memory",
)
EPOCH_MEMORY_PEAK_MB = Metric(
    EPOCH_PREFIX + "memory_peak_mb",
    "MB",
    "`memory_peak_mb` over the whole epoch, profiled or not: the peak is reset at the epoch's start and read at "
    "its end (and around a window; the epoch's peak is the largest read). Read a few times an epoch, never per "
    "step." + _MB,
    group="epoch memory",
    compared=Compared("memory peak, every epoch", "MB", 160, gate="memory", every_step=True),
)
EPOCH_MEMORY_IN_USE_MB = Metric(
    EPOCH_PREFIX + "memory_in_use_mb",
    "MB",
    "Memory held at the epoch's end: CUDA `torch.cuda.memory_allocated`, TensorFlow `get_memory_info()['current']`, "
    "JAX `bytes_in_use`, the host (Linux) `VmRSS`; NaN where the host gives no current figure (not Linux)." + _MB,
    group="epoch memory",
)
EPOCH_MEMORY_GROWTH_MB = Metric(
    EPOCH_PREFIX + "memory_growth_mb",
    "MB",
    "`memory_in_use_mb` at this epoch's end minus the previous epoch's (NaN for the first epoch of a fit). "
    "When it is at least 10 MB in each of 3 epochs in a row, fitprof warns once that something keeps tensors "
    "alive." + _MB,
    group="epoch memory",
)
EPOCH_MEMORY_HEADROOM_PERCENT = Metric(
    EPOCH_PREFIX + "memory_headroom_percent",
    "% of capacity (0-100)",
    "`memory_headroom_percent` at the epoch's peak (`fitprof/epoch/memory_peak_mb`). Under 10% fitprof warns once.",
    group="epoch memory",
)
ALLOCS_PER_STEP = Metric(
    PREFIX + "allocs_per_step",
    "allocations per step",
    "Memory allocations on the training device inside the analysed steps, divided by their number: the trace's "
    "`[memory]` events with `Bytes > 0` (torch `profile_memory=True`; CUDA events where the trace has any, CPU "
    "events otherwise), less those inside validation and fitprof's own spans. NaN without memory events.",
    group="churn",
    field="allocs_per_step",
    compared=Compared("allocations", "per step", 130),
)
ALLOC_MB_PER_STEP = Metric(
    PREFIX + "alloc_mb_per_step",
    "MB per step",
    "The bytes those allocations asked for, summed, divided by the number of steps: the allocator's churn. NaN "
    "without memory events." + _MB,
    group="churn",
    field="alloc_mb_per_step",
    compared=Compared("memory allocated", "MB/step", 140),
)


_COMPARE_ONLY = " Compared by `fitprof compare`, never logged."
COMPARED_INPUT_MS_PER_STEP = Metric(
    PREFIX + "input_ms_per_step",
    "ms per step",
    "The input wait inside analysed steps (the spans `input_percent` counts: `enumerate(DataLoader)#...__next__` "
    "in PyTorch, `IteratorGetNext` in TensorFlow), divided by the number of steps." + _COMPARE_ONLY,
    group="compare only",
    field="input_ms_per_step",
    compared=Compared("input wait", "ms/step", 60, gate="input"),
)
COMPARED_DTOH_MS_PER_STEP = Metric(
    PREFIX + "dtoh_ms_per_step",
    "ms per step",
    "Device time of device-to-host copies launched inside analysed steps, divided by the number of steps. 0 on a "
    "CPU-only run." + _COMPARE_ONLY,
    group="compare only",
    field="dtoh_ms_per_step",
    compared=Compared("device-to-host copies", "ms/step", 80),
)
COMPARED_COLLECTIVE_MS_PER_STEP = Metric(
    PREFIX + "collective_ms_per_step",
    "ms per step",
    "Time of collective communication inside analysed steps (what `collective_percent` counts, overlapped or not), "
    "divided by the number of steps." + _COMPARE_ONLY,
    group="compare only",
    field="collective_ms_per_step",
    compared=Compared("collectives", "ms/step", 90, gate="collectives"),
)
COMPARED_ALLOCATED_PEAK_MB = Metric(
    PREFIX + "allocated_peak_mb",
    "MB",
    "The most the steps' allocations held at once: the largest rise of the running sum of the bytes of the "
    "allocations and frees `allocs_per_step` counts. NaN without memory events." + _MB + _COMPARE_ONLY,
    group="compare only",
    field="allocated_peak_mb",
    compared=Compared("memory held at once by the steps' allocations", "MB", 150, gate="memory"),
)
EPOCH_INPUT_MS_PER_STEP = Metric(
    EPOCH_PREFIX + "input_ms_per_step",
    "ms per step",
    "Derived per epoch from the logged figures: `fitprof/epoch/input_percent` / 100 x "
    "`fitprof/epoch/step_time_ms_p50`, the input wait in ms per step." + _COMPARE_ONLY,
    group="compare only",
    compared=Compared("input wait, every step", "ms/step", 40, gate="input", every_step=True),
)


FIT_PREFIX = PREFIX + "fit/"
_FIT_PART = " One of the parts that add up to `fitprof/fit/wall_s`."
FIT_WALL_S = Metric(
    FIT_PREFIX + "wall_s",
    "s",
    "The fit's wall time as fitprof saw it: from the callback's first hook (Lightning `setup`, Keras "
    "`on_train_begin`) to the fit's end (Lightning: fitprof's `teardown` hook, after the loops' teardown; Keras "
    "`on_train_end`). Logged once, at the fit's end.",
    group="fit",
)
FIT_SETUP_S = Metric(
    FIT_PREFIX + "setup_s",
    "s",
    "From the callback's first hook to the first epoch's start: Lightning's sanity check (also given on its own, "
    "`fitprof/fit/sanity_check_s`) and whatever runs before the first epoch's loader is built." + _FIT_PART,
    group="fit",
)
FIT_EPOCHS_S = Metric(
    FIT_PREFIX + "epochs_s",
    "s",
    "The sum of the fit's epochs' `fitprof/epoch/wall_s`: from the first epoch's start to the last epoch's close."
    + _FIT_PART,
    group="fit",
)
FIT_TEARDOWN_S = Metric(
    FIT_PREFIX + "teardown_s",
    "s",
    "From the last epoch's close (after every callback's epoch-end hook: Lightning `on_train_end`, Keras before "
    "`History`) to the fit's end: the framework's end of training, fitprof's own end of the fit." + _FIT_PART,
    group="fit",
)
FIT_PROFILING_S = Metric(
    FIT_PREFIX + "profiling_s",
    "s",
    "fitprof's own time over the whole fit, inside the setup, epochs and teardown (not added to them again): the "
    "epochs' `fitprof/epoch/profiling_s` plus fitprof's hooks before the first epoch and after the last.",
    group="fit",
)
FIT_SANITY_CHECK_S = Metric(
    FIT_PREFIX + "sanity_check_s",
    "s",
    "Lightning's sanity check (validation before the first epoch, its loader's start-up included), inside "
    "`fitprof/fit/setup_s`; 0 without one (Keras).",
    group="fit",
)
FIT_CHECKPOINT_S = Metric(
    FIT_PREFIX + "checkpoint_s",
    "s",
    "Every checkpoint save of the fit: the epochs' `fitprof/epoch/checkpoint_s` (the last epoch's save included, "
    "whatever the callbacks' order) plus any save in the teardown (one made in `on_train_end`).",
    group="fit",
)


EPOCH_METRICS: tuple[Metric, ...] = in_group("epoch")
"""The whole-epoch step-timing figures, logged at every epoch end, profiled or not."""
EPOCH_PARTS_METRICS: tuple[Metric, ...] = in_group("epoch parts")
"""Where each epoch's wall time went and its CPU use (`fitprof.fit.epoch_parts`), logged at every epoch end."""
LOADER_METRICS: tuple[Metric, ...] = in_group("loader")
"""The training loader's figures, logged at every epoch end by the loader probe."""
TRIGGER_METRICS: tuple[Metric, ...] = in_group("trigger")
"""The figures of one triggered window, logged at the end of the epoch it was taken in."""
MEMORY_METRICS: tuple[Metric, ...] = in_group("memory")
"""The memory figures of a profiled window (`fitprof.fit.memory.MemoryProbe.window_figures`)."""
EPOCH_MEMORY_METRICS: tuple[Metric, ...] = in_group("epoch memory")
"""The memory figures of every epoch (`fitprof.fit.memory.MemoryProbe.epoch_figures`)."""
FIT_METRICS: tuple[Metric, ...] = in_group("fit")
"""Where the fit's wall time went (`fitprof.fit.fit_wall`), logged once, at the fit's end."""
CHURN_METRICS: tuple[Metric, ...] = in_group("churn")
"""The allocation churn of a window whose trace holds memory events (`fitprof.analysis` report fields)."""
COMPARE_ONLY_METRICS: tuple[Metric, ...] = in_group("compare only")
"""The figures ``fitprof compare`` compares that are never logged: report fields left out of the logs, and one
derived from the logged epoch figures. Not in :data:`BASE_METRICS` nor :data:`ALL`."""

BASE_METRICS: tuple[Metric, ...] = tuple(m for m in in_group("") if m.field)
"""The figures every analysed window logs, whatever its operators, in the order they are logged: each window
figure read from a report field, in the order defined here."""

ALL: tuple[Metric, ...] = (
    *BASE_METRICS,
    TOP_OP_RANKED,
    VS_BASELINE_STEP_TIME_PERCENT,
    TOP_OP,
    *EPOCH_METRICS,
    *EPOCH_PARTS_METRICS,
    *LOADER_METRICS,
    *TRIGGER_METRICS,
    *MEMORY_METRICS,
    *EPOCH_MEMORY_METRICS,
    *CHURN_METRICS,
    *FIT_METRICS,
)

BASE_KEYS: tuple[str, ...] = tuple(m.key for m in BASE_METRICS)
"""The keys every analysed window logs, whatever its operators."""


def compared_metrics() -> tuple[Metric, ...]:
    """Every metric of this module with a ``compared``, logged or not, in their ``compared.order`` (ties in the
    order they are defined in)."""
    found = [m for m in list(globals().values()) if isinstance(m, Metric) and m.compared is not None]
    return tuple(sorted(found, key=lambda m: m.compared.order if m.compared else 0))


COMPARED_METRICS: tuple[Metric, ...] = compared_metrics()
"""Every figure ``fitprof compare`` compares (those with ``compared``), logged or not, in their ``compared.order``
(:data:`fitprof.compare.FIGURES` is built from it)."""


def top_op_rank_key(i: int) -> str:
    """The stable key of the i-th operator by self time (1-based): ``fitprof/top_op_<i>_ms``."""
    return f"{PREFIX}top_op_{i}_ms"


def top_op_key(op_name: str) -> str:
    """The scalar key of one top operator: ``fitprof/top_ops/<op name>`` (``/`` kept, spaces to ``_``)."""
    return TOP_OPS_PREFIX + op_name.strip().replace(" ", "_")

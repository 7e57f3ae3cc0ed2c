"""The verdict of a window and the advice that goes with it, from its figures alone.

Every threshold the verdict uses is a named constant here, in percent of step time. HtoD copies and collectives
count by their *exposed* share (``htod_exposed_percent``, ``collective_exposed_percent``: the part no compute ran
beside, :mod:`fitprof.analysis.speedups`), not their total: DDP overlaps its gradient all-reduce with the backward
pass by design, and a copy that runs beside a kernel costs the step nothing, so only the exposed part can make a
step slow. The input wait counts whole (the loop is blocked while it waits).

* ``input-bound``: ``input_percent >= INPUT_BOUND_PERCENT`` (20) and input is the larger of input and HtoD;
* ``host-to-device-bound``: exposed HtoD ``>= HTOD_BOUND_PERCENT`` (15);
* ``communication-bound``: exposed collectives ``>= COMMUNICATION_BOUND_PERCENT`` (20) and larger than input and
  HtoD: collectives (all-reduce, ...) are not mistaken for compute;
* with ``input_percent < COMPUTE_BOUND_MAX_PERCENT`` (10) and exposed HtoD ``< COMPUTE_BOUND_MAX_PERCENT``, what
  covers the step decides (``busy_percent``: the device's busy share on a trace with device work, the host
  operators' share otherwise):

  - ``compute-bound``: ``busy_percent >= COMPUTE_COVERS_PERCENT`` (50): the operators hold most of the step; the
    headline gives their share and the top operator's;
  - ``host-bound`` (device traces): the device is idle more than half of the step, waiting for the host;
  - ``overhead-bound`` (host-only traces): more than half of the step runs outside any operator (framework and
    Python overhead between operators, ``unattributed_percent``);

* ``balanced``: anything in between (some input or copy wait, none dominant);
* ``no-steps``: the trace holds no event inside an analysed step;
* ``cpu-contended`` (:data:`CPU_CONTENDED`): not from the trace: the callback found the window's epoch starved of
  CPU (:func:`fitprof.fit.epoch_parts.contention_verdict`), so its step and operator times measure waiting for a
  core; :func:`cpu_contended` puts that in place of a verdict that would send the user to the operators
  (:data:`OPERATOR_VERDICTS`).

docs/metrics.md documents the same thresholds.
"""

from __future__ import annotations

import dataclasses
import math

from fitprof.analysis.report import BottleneckReport, OpStat

CPU_CONTENDED = "cpu-contended"
"""The verdict of a window whose epoch was starved of CPU (see the module docstring)."""
OPERATOR_VERDICTS = frozenset({"compute-bound", "host-bound", "overhead-bound", "balanced"})
"""The verdicts whose advice is to speed up the operators or the code between them: the ones a CPU-starved epoch
turns into ``cpu-contended``. A wait the trace shows (input, host-to-device copies, collectives) is still named:
it happened, contended or not."""

INPUT_BOUND_PERCENT = 20.0
HTOD_BOUND_PERCENT = 15.0
COMMUNICATION_BOUND_PERCENT = 20.0
COMPUTE_BOUND_MAX_PERCENT = 10.0
"""Input and HtoD both below this share of the step: what covers the step decides the verdict."""
COMPUTE_COVERS_PERCENT = 50.0
"""Share of the step (percent) that compute must cover for ``compute-bound``: the device's busy time on a trace
with device work, else the host operators' (their union over threads)."""
PAGEABLE_ADVICE_SHARE = 0.5
"""Share of the HtoD copy time (ratio 0-1) from pageable memory above which the advice asks for pinned memory."""


def verdict_for(
    input_percent: float,
    htod_percent: float,
    steps: int,
    collective_percent: float = 0.0,
    busy_percent: float = math.nan,
    *,
    device: bool = False,
) -> str:
    """The verdict label from the figures, by the thresholds in this module's docstring.

    Args:
        htod_percent, collective_percent: the *exposed* shares of HtoD copies and collectives (% of step time;
            :attr:`~fitprof.analysis.BottleneckReport.htod_exposed_percent`, ``collective_exposed_percent``).
        busy_percent: the share of the step that compute covers (the device's busy share when ``device``, else
            the host operators'); NaN (unknown) never turns ``compute-bound`` into another verdict.
        device: the trace has device work (``host-bound`` rather than ``overhead-bound``).
    """
    if steps <= 0:
        return "no-steps"
    if input_percent >= INPUT_BOUND_PERCENT and input_percent >= max(htod_percent, collective_percent):
        return "input-bound"
    if htod_percent >= HTOD_BOUND_PERCENT and htod_percent >= collective_percent:
        return "host-to-device-bound"
    if collective_percent >= COMMUNICATION_BOUND_PERCENT:
        return "communication-bound"
    if input_percent < COMPUTE_BOUND_MAX_PERCENT and htod_percent < COMPUTE_BOUND_MAX_PERCENT:
        if busy_percent < COMPUTE_COVERS_PERCENT:
            return "host-bound" if device else "overhead-bound"
        return "compute-bound"
    return "balanced"


TF_DATA_PARALLEL_MAP = frozenset({"ParallelMap", "ParallelMapV2"})
"""``tf.data`` stages (``Iterator::...::<stage>`` events) that map in parallel already. A ``MapAndBatch`` stage (a
``map`` fused with its ``batch``) may or may not: its name does not say."""


def tf_data_advice(stages: frozenset[str]) -> list[str]:
    """The ``tf.data`` tips the pipeline in the trace does not follow yet (``stages``: its ``Iterator::``
    stage names, e.g. ``{"Root", "Prefetch", "ParallelMapV2", "Cache"}``); a tip it follows is never given."""
    tips = []
    if "Prefetch" not in stages:
        tips.append("Overlap input with compute: end the `tf.data` pipeline with `.prefetch(tf.data.AUTOTUNE)`.")
    if stages & {"Map", "MapAndBatch"} and not stages & TF_DATA_PARALLEL_MAP:
        tips.append("Map in parallel: give `map` `num_parallel_calls=tf.data.AUTOTUNE` where it has none.")
    if "Cache" not in stages:
        tips.append("`.cache()` what does not change between epochs (decoding, resizing) before random augmentation.")
    if not tips:
        tips.append(
            "The `tf.data` pipeline already prefetches, maps in parallel and caches: its source is the limit; read "
            "from faster storage, or `interleave` many files with `num_parallel_calls=tf.data.AUTOTUNE`."
        )
    return tips


JAX_BLOCK_UNTIL_READY = (
    "JAX dispatches each jitted step asynchronously: call `jax.block_until_ready` only where a result is needed on "
    "the host (logging a loss, timing a span of steps), not after every step, so the next batch is fetched while "
    "the device still runs."
)


def advice_for(
    verdict: str,
    framework: str,
    *,
    pageable_share: float,
    top: OpStat | None,
    tf_data: frozenset[str] | None = None,
) -> list[str]:
    """What to try for ``verdict``, worded for ``framework`` (``"pytorch"``, ``"tensorflow"`` or ``"jax"``).

    Args:
        pageable_share: the share of HtoD copy time from pageable memory (ratio 0-1; 0 without copies).
        top: the top operator, named in the ``compute-bound`` advice (None: none recorded).
        tf_data: the ``tf.data`` stages in the trace (:func:`tf_data_advice`; empty: no ``tf.data`` there, so no
            ``tf.data`` advice; None: not known, the general ``tf.data`` advice).
    """
    torch_like = framework == "pytorch"
    jax = framework == "jax"
    if verdict == "input-bound":
        if torch_like:
            return [
                "Load batches in parallel: raise `DataLoader(num_workers=...)` and keep them alive with "
                "`persistent_workers=True`.",
                "Move per-sample work (augmentation, decoding) out of `__getitem__` or precompute it.",
            ]
        if jax:
            return [
                "Have the next batch ready before the jitted step asks for it: feed NumPy arrays, a "
                "`keras.utils.PyDataset` with `workers` and `use_multiprocessing=True`, or a grain `DataLoader` "
                "with `worker_count` > 0.",
                JAX_BLOCK_UNTIL_READY,
            ]
        if tf_data is not None and not tf_data:
            return [
                "The input does not come from `tf.data` (a Python generator or `PyDataset`): load in parallel with "
                "`keras.utils.PyDataset(workers=..., use_multiprocessing=True)`, or feed NumPy arrays that fit in "
                "memory.",
                "Move per-sample work (augmentation, decoding) out of `__getitem__` or precompute it.",
            ]
        return tf_data_advice(tf_data or frozenset())
    if verdict == "host-to-device-bound":
        tips = []
        if pageable_share > PAGEABLE_ADVICE_SHARE:
            tips.append(
                "Most copies come from pageable memory: use `DataLoader(pin_memory=True)` (PyTorch) so "
                "copies run from pinned memory at full bandwidth."
            )
        tips.append(
            "Copy less: send compact dtypes (uint8 images) and convert on the device; "
            "use `non_blocking=True` copies that overlap compute."
        )
        return tips
    if verdict == "communication-bound":
        if torch_like:
            return [
                "Overlap gradient communication with backward: tune DDP `bucket_cap_mb`, and use "
                "`no_sync()` / gradient accumulation to all-reduce less often.",
                "Raise the per-device batch size so each all-reduce serves more compute.",
            ]
        if jax:
            return [
                "All-reduce less often: larger per-device batches; shard parameters and batch with `jax.sharding` "
                "so XLA can overlap the collectives with compute.",
                "Check the interconnect: collectives should overlap the backward pass.",
            ]
        return [
            "All-reduce less often: larger per-replica batches, or `steps_per_execution` on TPUs.",
            "Check the interconnect: collectives should overlap the backward pass.",
        ]
    if verdict == "compute-bound":
        name = f"`{top.name}`" if top else "the top operator"
        return [
            f"The input pipeline keeps up; speed up the model itself, starting with {name}.",
            "Try mixed precision and larger batches where the device is not full.",
        ]
    if verdict in ("host-bound", "overhead-bound") and jax:
        return [
            "Most of the step is the host between jitted calls: jit the whole training step (loss, gradient and "
            "update in one `jax.jit`) and use larger batches.",
            JAX_BLOCK_UNTIL_READY,
        ]
    if verdict == "host-bound":
        tips = [
            "The device waits for the host: give it more work per launch (larger batches) and fewer launches "
            "(`torch.compile`, CUDA graphs, `jit_compile=True` in Keras).",
        ]
        if pageable_share > PAGEABLE_ADVICE_SHARE:
            tips.append("Copy from pinned memory (`DataLoader(pin_memory=True)`) so copies overlap compute.")
        return tips
    if verdict == "overhead-bound":
        if torch_like:
            return [
                "Most of the step is Python and framework overhead between operators: use larger batches, and move "
                "per-step work (logging, `.item()`, metrics) out of `training_step`; `torch.compile` fuses small ops.",
            ]
        return [
            "Most of the step is framework overhead between operators: use larger batches, run several steps per "
            "call (`steps_per_execution`) and compile the step (`jit_compile=True`).",
        ]
    if verdict == "balanced":
        return ["No single bottleneck: input and compute both matter; check the top operators and the input wait."]
    return ["Profile a later window with more steps (`profile_batch`)."]


def cpu_contended(report: BottleneckReport, evidence: str, fix: str) -> BottleneckReport:
    """``report`` with the ``cpu-contended`` verdict when its own is one of :data:`OPERATOR_VERDICTS` (else
    ``report`` as it is): ``evidence`` (the wait, switches, threads and cores) becomes its headline's reason and
    ``fix`` its first advice, ahead of the trace's own advice, kept (it holds once the cores are free) and said to
    be for then: read right after "the figures measure waiting for a core", a bare "speed up the model itself"
    contradicts it. The trace's verdict is kept in the headline as what the window measured."""
    if report.verdict not in OPERATOR_VERDICTS:
        return report
    return dataclasses.replace(
        report,
        verdict=CPU_CONTENDED,
        contention=f"{evidence}; the window's figures measure waiting for a core, not the operators (the trace "
        f"alone says {report.verdict})",
        advice=[fix, *(_once_free(text) for text in report.advice)],
    )


def _once_free(advice: str) -> str:
    """``advice`` as what to do once the cores are free; its first letter lowered unless its first word is a name
    (``PyTorch``, ``XLA``: capitals after the first letter)."""
    first = advice.split(" ", 1)[0]
    if first[:1].isupper() and (first[1:].islower() or len(first) == 1):
        advice = advice[0].lower() + advice[1:]
    return f"once the cores are free, {advice}"

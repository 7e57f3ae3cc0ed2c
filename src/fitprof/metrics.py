"""Names, units and definitions of every figure fitprof logs, in one place.

The Keras and the Lightning callbacks log the same keys with the same meaning; ``fitprof report`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "fitprof/"


@dataclass(frozen=True)
class Metric:
    """One logged scalar: its key, its unit and what it is computed from."""

    key: str
    unit: str
    definition: str


STEP_TIME_MS = Metric(
    PREFIX + "step_time_ms",
    "ms",
    "Mean wall time of an analysed training step: the duration of the step marker (Kineto `ProfilerStep#N`, "
    "an XSpace event with `_r=1`), less any validation run inside it.",
)
INPUT_PERCENT = Metric(
    PREFIX + "input_percent",
    "% of step time (0-100)",
    "Time the training loop was blocked waiting for its next batch inside analysed steps (union of "
    "`enumerate(DataLoader)#...__next__` spans in PyTorch, of `IteratorGetNext` spans in TensorFlow), over "
    "the summed step time.",
)
HTOD_MS_PER_STEP = Metric(
    PREFIX + "htod_ms_per_step",
    "ms per step",
    "Device time of host-to-device copies (Kineto `gpu_memcpy` `Memcpy HtoD ...`, XSpace device-plane "
    "`MemcpyH2D`) launched inside analysed steps, divided by the number of steps. 0 on a CPU-only run.",
)
HTOD_PERCENT = Metric(
    PREFIX + "htod_percent",
    "% of step time",
    "`htod_ms_per_step` over `step_time_ms`, times 100. 0 on a CPU-only run.",
)
COLLECTIVE_PERCENT = Metric(
    PREFIX + "collective_percent",
    "% of step time",
    "Time of collective communication (NCCL/RCCL kernels, gloo and TF collective ops) inside analysed steps "
    "over step time: device time where there are device events, host time otherwise.",
)
STEPS_ANALYZED = Metric(
    PREFIX + "steps_analyzed",
    "steps",
    "Number of training steps the figures of this epoch are computed from.",
)
TOP_OPS_PREFIX = PREFIX + "top_ops/"
TOP_OP = Metric(
    TOP_OPS_PREFIX + "<op name>",
    "ms per step",
    "Self time per step of each of the `top_k` operators ranked by self time: device self time (kernels "
    "attributed to the operator that launched them) when the trace has device events, host self time "
    "(duration less nested operators) otherwise. Step markers and user annotations are never operators.",
)
SUMMARY_TAG = PREFIX + "summary"

ALL: tuple[Metric, ...] = (
    STEP_TIME_MS,
    INPUT_PERCENT,
    HTOD_MS_PER_STEP,
    HTOD_PERCENT,
    COLLECTIVE_PERCENT,
    STEPS_ANALYZED,
    TOP_OP,
)


def top_op_key(op_name: str) -> str:
    """The scalar key of one top operator: ``fitprof/top_ops/<op name>`` (``/`` kept, spaces to ``_``)."""
    return TOP_OPS_PREFIX + op_name.strip().replace(" ", "_")

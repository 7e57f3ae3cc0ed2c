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
TOP_OP_RANKED = Metric(
    PREFIX + "top_op_<i>_ms",
    "ms per step",
    "Self time per step of the i-th operator (1 = the largest, i = 1..`top_k`) ranked by self time: device "
    "self time (kernels attributed to the operator that launched them) when the trace has device events, host "
    "self time (duration less nested operators) otherwise. Step markers and user annotations are never "
    "operators. The key names the rank, not the operator, so the same keys come every epoch (History, CSV "
    "columns, monitors); the names are in the text summary and in `fitprof/top_ops/<op name>`.",
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

ALL: tuple[Metric, ...] = (
    STEP_TIME_MS,
    INPUT_PERCENT,
    HTOD_MS_PER_STEP,
    HTOD_PERCENT,
    COLLECTIVE_PERCENT,
    STEPS_ANALYZED,
    TOP_OP_RANKED,
    TOP_OP,
)

BASE_KEYS: tuple[str, ...] = (
    STEP_TIME_MS.key,
    INPUT_PERCENT.key,
    HTOD_MS_PER_STEP.key,
    HTOD_PERCENT.key,
    COLLECTIVE_PERCENT.key,
    STEPS_ANALYZED.key,
)
"""The keys every analysed window logs, whatever its operators."""


def top_op_rank_key(i: int) -> str:
    """The stable key of the i-th operator by self time (1-based): ``fitprof/top_op_<i>_ms``."""
    return f"{PREFIX}top_op_{i}_ms"


def top_op_key(op_name: str) -> str:
    """The scalar key of one top operator: ``fitprof/top_ops/<op name>`` (``/`` kept, spaces to ``_``)."""
    return TOP_OPS_PREFIX + op_name.strip().replace(" ", "_")

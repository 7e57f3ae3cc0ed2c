"""The verdict of a window and the advice that goes with it, from its figures alone.

Every threshold the verdict uses is a named constant here, in percent of step time:

* ``input-bound``: ``input_percent >= INPUT_BOUND_PERCENT`` (20) and input is the larger of input and HtoD;
* ``host-to-device-bound``: ``htod_percent >= HTOD_BOUND_PERCENT`` (15);
* ``communication-bound``: ``collective_percent >= COMMUNICATION_BOUND_PERCENT`` (20) and larger than input and
  HtoD: collectives (all-reduce, ...) are not mistaken for compute;
* with ``input_percent < COMPUTE_BOUND_MAX_PERCENT`` (10) and ``htod_percent < COMPUTE_BOUND_MAX_PERCENT``, what
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

The README documents the same thresholds.
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


def advice_for(verdict: str, framework: str, *, pageable_share: float, top: OpStat | None) -> list[str]:
    """What to try for ``verdict``, worded for ``framework`` (``"pytorch"`` or ``"tensorflow"``).

    Args:
        pageable_share: the share of HtoD copy time from pageable memory (ratio 0-1; 0 without copies).
        top: the top operator, named in the ``compute-bound`` advice (None: none recorded).
    """
    torch_like = framework == "pytorch"
    if verdict == "input-bound":
        if torch_like:
            return [
                "Load batches in parallel: raise `DataLoader(num_workers=...)` and keep them alive with "
                "`persistent_workers=True`.",
                "Move per-sample work (augmentation, decoding) out of `__getitem__` or precompute it.",
            ]
        return [
            "Overlap input with compute: end the `tf.data` pipeline with `.prefetch(tf.data.AUTOTUNE)` and "
            "give `map` `num_parallel_calls=tf.data.AUTOTUNE`.",
            "`.cache()` what does not change between epochs (decoding, resizing) before random augmentation.",
        ]
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
    ``fix`` its first advice, ahead of the trace's own advice (kept: it holds once the cores are free). The trace's
    verdict is kept in the headline as what the window measured."""
    if report.verdict not in OPERATOR_VERDICTS:
        return report
    return dataclasses.replace(
        report,
        verdict=CPU_CONTENDED,
        contention=f"{evidence}; the window's figures measure waiting for a core, not the operators (the trace "
        f"alone says {report.verdict})",
        advice=[fix, *report.advice],
    )

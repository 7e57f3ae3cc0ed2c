"""fitprof's input share against a ground truth, in two layers.

1. **Planted spans (deterministic).** Traces built here, Kineto JSON and XSpace bytes (written with
   ``tests/gputrace.py``'s wire-format encoder, not fitprof's), whose steps hold input waits of known length: the
   share is exact, whatever the machine is doing, at every level from 0 to 95% and on both sides of each verdict
   threshold; fetches split in pieces, overlapping on two threads, or straddling a step boundary count once and
   only inside the steps.
2. **Real runs (the quick cases of ``benchmarks/zoo.py``).** Each trains 12 steps with ``FitProfiler`` (window:
   steps 6-10) and times the whole batch production inside the data pipeline with ``time.perf_counter``,
   independently of any profiler (Keras: the span of the ``tf.numpy_function`` chain that builds each batch,
   serial; Lightning: the DataLoader iterator's ``__next__``), clipped to the profiled steps' wall time. fitprof's
   error against that truth has a spread that depends on the machine's load; the tolerances below are the range
   measured over 30 runs of each case on this project's 2-core machine while other work ran (load average
   4-8), widened on each side by three standard deviations of those runs (:data:`MEASURED`). The sleep-based
   scenario zoo with every tool side by side stays in ``benchmarks/zoo.py``; ``benchmarks/accuracy_spread.py``
   re-measures the spread.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import fitprof
import gputrace
from fitprof.analysis import verdict_for

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
STEP_US = 20_000.0
REL = 1e-9

# ------------------------------------------------------------------------------------------ planted spans


def _kineto(waits: list[list[tuple[float, float]]], tmp: Path, *, tid2: bool = False) -> Path:
    """Steps of ``STEP_US`` each; step k holds DataLoader spans at ``(offset, length)`` pairs ``waits[k]``
    (offsets relative to the step start, may be negative or run past the end), then ``aten::addmm`` to the end.
    ``tid2`` puts every second span on another thread (overlaps across threads count once)."""
    events: list[dict[str, Any]] = []
    t = 500_000.0
    for k, spans in enumerate(waits):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k + 1}", "pid": 1, "tid": 1,
                       "ts": t, "dur": STEP_US})  # fmt: skip
        for i, (offset, length) in enumerate(spans):
            tid = 2 if tid2 and i % 2 else 1
            events.append({"ph": "X", "cat": "user_annotation", "name": DATALOADER, "pid": 1, "tid": tid,
                           "ts": t + offset, "dur": length})  # fmt: skip
        busy = max((o + n for o, n in spans), default=0.0)
        if busy < STEP_US:
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1,
                           "ts": t + max(busy, 0.0), "dur": STEP_US - max(busy, 0.0)})  # fmt: skip
        t += STEP_US
    path = tmp / "planted.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _xspace(waits: list[list[tuple[float, float]]], tmp: Path) -> Path:
    """The same steps as an XSpace: ``train`` markers (``step_num``, ``_r=1``) and ``IteratorGetNextOp::DoCompute``
    spans, with an op on a ``tf_Compute`` line filling the rest."""
    plane = gputrace.PlaneBuilder(1, "/host:CPU")
    python = plane.line(1, "python3", 1_000)
    get_next = plane.line(2, "tf_data_iterator_get_next", 1_000)
    compute = plane.line(3, "tf_Compute", 1_000)
    t = 0.0
    for k, spans in enumerate(waits):
        plane.event(python, "train", round(t * 1e6), round(STEP_US * 1e6), step_num=k + 1, _r=1)
        for offset, length in spans:
            plane.event(get_next, "IteratorGetNextOp::DoCompute", round((t + offset) * 1e6), round(length * 1e6))
        busy = max((o + n for o, n in spans), default=0.0)
        if busy < STEP_US:
            plane.event(compute, "model/dense/MatMul:MatMul", round((t + busy) * 1e6), round((STEP_US - busy) * 1e6))
        t += STEP_US
    path = tmp / "planted.xplane.pb"
    path.write_bytes(gputrace.field_bytes(gputrace.XSPACE_PLANES, plane.encode()))
    return path


SHARES = [0.0, 5.0, 9.995, 10.0, 15.0, 19.995, 20.0, 33.0, 50.0, 80.0, 95.0]


@pytest.mark.parametrize("fmt", ["kineto", "xspace"])
@pytest.mark.parametrize("share", SHARES)
def test_planted_input_share_is_exact(tmp_path: Path, share: float, fmt: str) -> None:
    """Four steps with input waits of ``share``% of the step, spread differently in each step (one fetch, two
    pieces, at the start or the end): fitprof's share is the planted one, and so is the verdict."""
    w = STEP_US * share / 100
    waits = [
        [(0.0, w)],
        [(STEP_US - w, w)],
        [(0.0, w / 2), (STEP_US / 2, w / 2)],
        [(100.0, w / 4), (5_000.0, 3 * w / 4)],
    ]
    waits = [[s for s in step if s[1] > 0] for step in waits]
    path = (_kineto if fmt == "kineto" else _xspace)(waits, tmp_path)
    report = fitprof.analyze(path)
    assert report.steps_analyzed == 4
    assert report.step_time_ms == pytest.approx(STEP_US / 1e3, rel=REL)
    assert report.input_percent == pytest.approx(share, rel=REL, abs=1e-9)
    assert report.input_ms_per_step == pytest.approx(w / 1e3, rel=REL, abs=1e-12)
    expected = "input-bound" if share >= 20 else "compute-bound" if share < 10 else "balanced"
    assert report.verdict == expected == verdict_for(share, 0.0, 4)


def test_planted_overlaps_and_step_boundaries_count_once(tmp_path: Path) -> None:
    """Step 1: a fetch that began 3 ms before the first step (only its 4 ms inside count); step 2: two fetches
    overlapping by 1 ms on two threads (5 + 5 ms, 9 ms of wait); step 3: a fetch running 2 ms past the last step's
    end (6 ms of it inside)."""
    waits = [[(-3_000.0, 7_000.0)], [(0.0, 5_000.0), (4_000.0, 5_000.0)], [(STEP_US - 6_000.0, 8_000.0)]]
    report = fitprof.analyze(_kineto(waits, tmp_path, tid2=True))
    assert report.input_ms_per_step == pytest.approx((4 + 9 + 6) / 3, rel=REL)
    assert report.input_percent == pytest.approx(100 * 19_000 / (3 * STEP_US), rel=REL)


# ----------------------------------------------------------------------------------------------- real runs

MEASURED: dict[tuple[str, str], tuple[float, float]] = {
    # error = fitprof - truth (pp), 30 runs each, 2026-11-30, 2 cores shared with other work (load average 4.0-8.1):
    ("lightning", "sleep_input"): (-2.3, 5.7),  # measured -0.22..+3.60, mean -0.01, sd 0.68; truth 56-89%
    ("lightning", "compute_bound"): (-2.8, 1.1),  # measured -1.63..-0.01, mean -0.15, sd 0.37; truth 1.0-8.5%
    ("lightning", "workers_hidden"): (-3.3, 1.2),  # measured -2.10..+0.03, mean -0.14, sd 0.38; truth 3.4-18.4%
    ("keras", "sleep_input"): (-2.8, 7.3),  # measured +0.45..+4.12, mean +1.49, sd 1.05; truth 77-95%
}
"""(framework, scenario) -> (lowest, highest) allowed error of fitprof's input share, percentage points: the
range measured over 30 runs, widened by three standard deviations on each side, rounded outwards to 0.1 pp.
Keras's compute-bound case is not here: on the loaded machine its error reached +11.4 pp (mean +1.35, sd 1.98;
the ``numpy_function`` spans, the truth, cannot see tf.data's thread waiting for a core) and its verdict once
came out ``balanced``: a band wide enough to hold that would test nothing. It stays in ``benchmarks/zoo.py``."""
STEP_TIME_REL = 0.075
"""fitprof's step time against the clock callbacks' (the same steps): within 7.5%. Measured over the same 150
runs: at most 5.7% apart (a Lightning run at load 5.9), standard deviation 0.56%; 5.7 + 3 x 0.56 = 7.4."""


def _check(result: Any) -> None:
    import zoo

    assert isinstance(result, zoo.Result)
    low, high = MEASURED[result.framework, result.scenario]
    detail = (
        f"{result.framework}/{result.scenario}: truth {result.truth_pct:.2f}% ({result.truth_how}), "
        f"fitprof {result.fitprof_pct:.2f}% (error {result.error_pp:+.2f} pp, allowed {low:+.2f}..{high:+.2f}), "
        f"verdict {result.verdict}, step {result.step_ms:.1f} ms (clock {result.truth_step_ms:.1f} ms)"
    )
    assert low <= result.error_pp <= high, detail
    if min(abs(result.truth_pct - t) for t in (10.0, 20.0)) > max(-low, high):
        if result.verdict == "cpu-contended":  # a loaded machine: the epoch waited for a core; the trace's own verdict
            assert f"the trace alone says {result.expected_verdict})" in result.contention, detail  # is kept in it
        else:
            assert result.verdict == result.expected_verdict, detail
    assert result.step_ms == pytest.approx(result.truth_step_ms, rel=STEP_TIME_REL), detail


@pytest.fixture(scope="module")
def zoo() -> Any:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import zoo

    return zoo


@pytest.fixture(scope="module")
def keras_backend() -> None:
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    keras = pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs KERAS_BACKEND=tensorflow")


@pytest.mark.slow
def test_keras_real_run(keras_backend: None, zoo: Any, tmp_path: Path) -> None:
    """80 ms of sleep a batch, so tf.data's own per-batch overhead (which the truth's spans cannot see) stays
    small against it."""
    result = zoo.keras_scenario("sleep_input", tmp_path, side_tools=False, sleep=0.080)
    assert result.truth_pct > 60  # the construction worked: input-bound (measured 77-95% over 30 runs)
    _check(result)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["sleep_input", "compute_bound", "workers_hidden"])
def test_lightning_real_run(zoo: Any, tmp_path: Path, scenario: str) -> None:
    pytest.importorskip("lightning")
    result = zoo.lightning_scenario(scenario, tmp_path, side_tools=False)
    # The construction worked (truths measured over the 30 runs: 56-89%, 1.0-8.5%, 3.4-18.4%).
    if scenario == "sleep_input":
        assert result.truth_pct > 40
    elif scenario == "compute_bound":
        assert result.truth_pct < 20
    # workers_hidden: how much two workers hide of a 20 ms/batch production depends on the two cores' load (the
    # wait was 3.4-18.4% of the step over 30 runs, about 11.4 ms a step in one loaded CI run, and 35.1 ms, more than
    # the serial 20 ms, at a load average of 7), so benchmarks/accuracy_spread.py measures it; here, as for every
    # scenario, fitprof's figure is checked against the truth measured in the same run.
    _check(result)

"""fitprof's input share against a ground truth measured in the same run (the quick cases of benchmarks/zoo.py).

Each case trains 12 steps with ``FitProfiler`` (window: steps 6-10) and times the whole batch production inside
the data pipeline with ``time.perf_counter``, independently of any profiler (see ``benchmarks/zoo.py`` for how):
Keras (TensorFlow backend): the span of a chain of ``tf.numpy_function`` calls that builds each batch, serial
(``inject_prefetch`` off); Lightning: the DataLoader iterator's ``__next__`` on the main process. The truth is
that time clipped to the profiled steps' wall time (from clock callbacks at the hooks FitProfiler marks steps
at), over that wall time.

Tolerances: ``|fitprof - truth| <= 3`` percentage points; the verdict is the one fitprof's thresholds give on
the truth, checked when the truth is more than 3 pp from a threshold (10%, 20%: within the error bound a verdict
may fall either side); fitprof's step time equals the clocks' within 5%. Keras also: fitprof is not below the
production spans less 1 pp. The spans are a lower bound there: tf.data's own C++ iteration and the
``numpy_function`` entry and exit, 0.4-1.5 ms a batch on a quiet machine, are waiting the spans cannot see;
hence 80 ms of sleep a batch in the Keras test, so that overhead stays under 2 pp. When the 2 cores are busy
with other work those thread hand-offs grow (8 ms a step seen in a compute-bound run), and the Keras cases can
miss. Errors measured by benchmarks/zoo.py (2 cores, shared): Keras sleep input +1.6..+2.6 pp at 20 ms of sleep
a batch, compute-bound +1.3..+1.6 pp; Lightning -0.3..0 pp.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

pytestmark = pytest.mark.slow

TOLERANCE_PP = 3.0


def _check(result: object) -> None:
    import zoo

    assert isinstance(result, zoo.Result)
    detail = (
        f"{result.framework}/{result.scenario}: truth {result.truth_pct:.1f}% ({result.truth_how}), "
        f"fitprof {result.fitprof_pct:.1f}%, verdict {result.verdict}, expected {result.expected_verdict}, "
        f"step {result.step_ms:.1f} ms (clock {result.truth_step_ms:.1f} ms)"
    )
    assert abs(result.fitprof_pct - result.truth_pct) <= TOLERANCE_PP, detail
    if min(abs(result.truth_pct - t) for t in (10.0, 20.0)) > TOLERANCE_PP:
        assert result.verdict == result.expected_verdict, detail
    # The same steps: fitprof's step markers and the clock callbacks agree on the step time.
    assert result.step_ms == pytest.approx(result.truth_step_ms, rel=0.05), detail
    if result.framework == "keras":
        assert result.fitprof_pct >= result.truth_pct - 1.0, detail


@pytest.fixture(scope="module")
def keras_backend() -> None:
    keras = pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs KERAS_BACKEND=tensorflow")


def test_keras_sleep_input(keras_backend: None, tmp_path: Path) -> None:
    import zoo

    result = zoo.keras_scenario("sleep_input", tmp_path, side_tools=False, sleep=0.080)
    assert result.truth_pct > 70  # the construction worked: the run is input-bound
    _check(result)


def test_keras_compute_bound(keras_backend: None, tmp_path: Path) -> None:
    import zoo

    result = zoo.keras_scenario("compute_bound", tmp_path, side_tools=False)
    assert result.truth_pct < 5
    _check(result)


def test_lightning_sleep_input(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    import zoo

    result = zoo.lightning_scenario("sleep_input", tmp_path, side_tools=False)
    assert result.truth_pct > 70
    _check(result)


def test_lightning_workers_hide_the_input(tmp_path: Path) -> None:
    """Two persistent workers produce batches faster than the model consumes them: the main process barely
    waits (5% on a quiet machine, 11-16% seen under load: queue reads and unpickling, which workers cannot
    hide), although producing one batch sleeps 20 ms (25-40% of the step when serial)."""
    pytest.importorskip("lightning")
    import zoo

    result = zoo.lightning_scenario("workers_hidden", tmp_path, side_tools=False)
    # A sanity check of the scenario, not of fitprof: below the 25-40% the same pipeline costs when serial.
    # (15.8% was seen in a CI check of a fresh clone, where the 2 workers and the main process share 2 cores.)
    assert result.truth_pct < 25
    _check(result)

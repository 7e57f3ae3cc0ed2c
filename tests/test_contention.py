"""``tests/contention.py``: a timing test that fails on a contended machine is retried once and then skipped with the
measured contention; on a quiet machine its failure is raised. The waits are planted (the schedstat and pressure
readers replaced), the test bodies real."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

import contention
from contention import Contention, Span, measured, tolerates_load


def _plant(monkeypatch: pytest.MonkeyPatch, *, wait_share: float, pressure_share: float) -> None:
    """Each read of the waits moves them on by the given share of the wall time since the last read."""
    start = time.perf_counter()

    def wait_ns() -> int:  # a clock running at the planted share of the wall clock
        return int(wait_share * (time.perf_counter() - start) * 1e9)

    def psi_us() -> int:
        return int(pressure_share * (time.perf_counter() - start) * 1e6)

    monkeypatch.setattr(contention, "_schedstat_ns", wait_ns)
    monkeypatch.setattr(contention, "_pressure_us", psi_us)


def test_a_span_measures_this_threads_wait_for_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    _plant(monkeypatch, wait_share=0.5, pressure_share=0.0)
    span = Span()
    time.sleep(0.02)
    got = span.stop()
    assert got.wait_percent == pytest.approx(50.0, abs=5.0) and got.contended
    assert "run-queue wait" in got.describe()


def test_the_real_readers_give_numbers_here() -> None:
    span = Span()
    sum(i * i for i in range(100_000))
    got = span.stop()
    assert got.wall_s > 0 and got.load_per_core >= 0
    assert got.wait_percent != got.wait_percent or 0.0 <= got.wait_percent <= 100.0 + 1e-6  # NaN off Linux


def _flaky(calls: list[int], fail_times: int) -> Any:
    @tolerates_load
    def timing_test(x: int) -> int:
        calls.append(x)
        assert len(calls) > fail_times, f"missed by {len(calls)}"
        return x

    return timing_test


def test_a_failure_under_contention_is_retried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _plant(monkeypatch, wait_share=0.0, pressure_share=0.6)
    calls: list[int] = []
    assert _flaky(calls, fail_times=1)(7) == 7 and calls == [7, 7]


def test_a_second_failure_under_contention_skips_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _plant(monkeypatch, wait_share=0.3, pressure_share=0.0)
    calls: list[int] = []
    with pytest.raises(
        pytest.skip.Exception, match=r"timing_test: machine contended \(run-queue wait \d+% .*missed by 1"
    ):
        _flaky(calls, fail_times=2)(1)
    assert calls == [1, 1]


def test_a_failure_on_a_quiet_machine_is_raised_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _plant(monkeypatch, wait_share=0.05, pressure_share=0.1)
    calls: list[int] = []
    with pytest.raises(AssertionError, match="missed by 1"):
        _flaky(calls, fail_times=5)(1)
    assert calls == [1]


def test_a_quiet_retry_that_fails_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    # the first try's span (reads 0 and 1) stalls a planted second, the retry's (reads 2 and 3) not at all
    reads = itertools.count()
    stalled = [0.0]

    def psi_us() -> int:
        if next(reads) == 1:
            stalled[0] += 1e6
        return int(stalled[0])

    monkeypatch.setattr(contention, "_schedstat_ns", lambda: 0)
    monkeypatch.setattr(contention, "_pressure_us", psi_us)
    calls: list[int] = []
    with pytest.raises(AssertionError, match="missed by 2"):
        _flaky(calls, fail_times=5)(1)
    assert calls == [1, 1]


def test_a_module_run_recorded_contended_counts_for_its_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    _plant(monkeypatch, wait_share=0.8, pressure_share=0.8)
    with measured(__name__):
        time.sleep(0.01)
    _plant(monkeypatch, wait_share=0.0, pressure_share=0.0)  # the test itself runs quiet
    calls: list[int] = []
    try:
        with pytest.raises(pytest.skip.Exception, match="machine contended"):
            _flaky(calls, fail_times=2)(3)
    finally:
        contention._RECORDED.pop(__name__)
    assert calls == [3, 3]


def test_no_files_falls_back_to_the_load_average() -> None:
    nan = float("nan")
    assert Contention(1.0, nan, nan, nan, 1.5).contended
    assert not Contention(1.0, nan, nan, 100.0, 0.5).contended
    assert not Contention(1.0, 5.0, nan, nan, 3.0).contended  # schedstat read and quiet: the thread did not wait

"""The "nothing was profiled" reasons (``fitprof.fit.coverage``), shared by both callbacks; framework-free."""

from __future__ import annotations

import re

import pytest

from fitprof.fit.config import make_config, parse_profile_batch
from fitprof.fit.coverage import FitCoverage, suggest_profile_batch


@pytest.mark.parametrize("window", [(1, 1), (2, 3), (6, 10), (12, 15), (3, 50)])
@pytest.mark.parametrize("steps", range(1, 41))
def test_the_suggested_window_fits_the_epochs_that_ran(steps: int, window: tuple[int, int]) -> None:
    cfg = make_config(window, 1, 5)
    suggested = suggest_profile_batch(steps, cfg.num_steps)
    first, last = parse_profile_batch(eval(suggested))  # written as the user would pass it
    assert 1 <= first <= last == steps and last - first + 1 <= cfg.num_steps


def _coverage(window: object = (6, 10), every: int = 1, epochs: tuple[int, ...] = (0,), steps: int = 3) -> FitCoverage:
    cov = FitCoverage(make_config(window, every, 5))
    for e in epochs:
        cov.epoch(e)
        if cov.config.profiles_epoch(e):
            cov.steps(steps)
    return cov


def test_short_epochs_name_the_count_and_a_window_that_fits() -> None:
    msg = _coverage(steps=3).message("fitprof: ")
    assert msg is not None and msg.startswith("fitprof: nothing was profiled: ")
    assert "the epochs had 3 training steps" in msg and "profile_batch=(2, 3)." in msg
    suggested = re.search(r"profile_batch=(\(\d+, \d+\)|\d+)\.", msg)
    assert suggested is not None
    first, _ = parse_profile_batch(eval(suggested.group(1)))
    assert first <= 3  # following it opens a window in epochs of 3 steps


def test_each_reason_in_turn() -> None:
    off = _coverage(window=0)
    assert off.message("") is None  # profile_batch=0: off, no warning
    skipped = _coverage(every=3, epochs=(1, 2))
    assert "every_n_epochs=3" in (skipped.message("") or "") and "epochs 1-2" in (skipped.message("") or "")
    blocked = _coverage(steps=20)
    blocked.blocked = "Another profiler is running"
    assert "another profiler held the profiler" in (blocked.message("") or "")
    limited = _coverage(steps=1)
    limited.limit = "Trainer(fast_dev_run=True) runs 1 training step(s)"
    assert "1 training step (Trainer(fast_dev_run=True)" in (limited.message("") or "")
    assert "profile_batch=1." in (limited.message("") or "")
    left_out = _coverage()
    left_out.left_out = True
    assert left_out.message("") is None
    profiled = _coverage()
    profiled.windows = 1
    assert profiled.message("") is None
    assert FitCoverage(make_config((6, 10), 1, 5)).message("") is None  # no epoch ran

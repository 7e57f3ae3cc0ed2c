"""A big window's read allocates columns, not one Python object per event or per distinct event: the peak of live
gc-tracked objects while ``fitprof.analyze`` reads and analyses a generated TensorFlow GPU XSpace stays below
what sets off one young collection (700, Python's default threshold), and does not grow with the window.

Measured with the collector off, the young generation's count (gc-tracked objects allocated less those freed)
sampled at every Python call and return: deterministic for a given trace, whatever the load."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import fitprof
import gputrace
from fitprof.traces import read_trace


def _peak_live_objects(path: Path) -> int:
    read_trace(path)  # imports and caches first
    peak = [0]

    def sample(frame: FrameType, event: str, arg: Any) -> None:
        peak[0] = max(peak[0], gc.get_count()[0])

    gc.collect()
    gc.disable()
    try:
        start = gc.get_count()[0]
        sys.setprofile(sample)
        try:
            fitprof.analyze(path)
        finally:
            sys.setprofile(None)
    finally:
        gc.enable()
    return peak[0] - start


@pytest.fixture(scope="module")
def peaks(tmp_path_factory: pytest.TempPathFactory) -> dict[int, int]:
    out = {}
    for steps in (200, 1200):
        data, _ = gputrace.xspace_trace(steps=steps, seed=1)
        path = tmp_path_factory.mktemp("x") / f"steps{steps}.xplane.pb"
        path.write_bytes(data)
        out[steps] = _peak_live_objects(path)
    return out


def test_big_window_read_sets_off_no_collection(peaks: dict[int, int]) -> None:
    # 1,200 steps: about 15,600 events, 1,200 distinct (one step_num each); one object per distinct event held
    # until the table is built (main c702406) peaked at 1,500, against 567 at 200 steps.
    assert peaks[1200] < gc.get_threshold()[0], peaks


def test_live_objects_do_not_grow_with_the_window(peaks: dict[int, int]) -> None:
    assert peaks[1200] - peaks[200] < 100, peaks

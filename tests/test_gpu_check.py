"""``benchmarks/gpu_check.py --dry``: the device check's logic on the CPU, so that its first run on a GPU does not
fail on a bug a CPU could have shown. Its exact rows must agree (FLOPs against the hand count, ``fitprof analyze``
against the standard-library count of the same trace); its timing rows must be measured (on a shared 2-core machine
they are noisy, so their tolerance is the GPU run's business); the rows a CPU cannot give say why."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning.pytorch")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_device_check_runs_dry_on_the_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # In this process: the script's own work is a few seconds; a child would spend most of its time importing
    # torch and Lightning again.
    import torch

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", gpu_check)  # its dataclass looks its module up there
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    spec.loader.exec_module(gpu_check)
    out = tmp_path / "rows.json"
    threads = torch.get_num_threads()
    try:
        returncode = gpu_check.main(["--dry", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)  # --dry sets one thread; the session's other tests keep theirs
    printed = capsys.readouterr().out
    assert returncode in (0, 1), printed[-3000:]
    rows = json.loads(out.read_text())["rows"]
    by = {(r["run"], r["figure"]): r for r in rows}
    assert returncode == (1 if any(r["status"] == "OFF" for r in rows) else 0)
    exact = [r for r in rows if r["status"] != "n/a" and r["tol"] <= 1e-6 and r["run"] in ("conv fp32", "matmul bf16")]
    assert len(exact) == 8  # two FLOP counts, six analyze-vs-hand-count figures
    assert all(r["status"] == "ok" for r in exact), [r for r in exact if r["status"] != "ok"]
    for key in (("conv fp32", "FLOPs per step"), ("matmul bf16", "FLOPs per step")):
        assert by[key]["fitprof"] == by[key]["truth"] > 0
    assert by[("conv fp32", "analyze vs hand count: step time")]["status"] == "ok"
    for key in (
        ("conv fp32", "epoch step time p50"),
        ("conv fp32", "window step time"),
        ("matmul bf16", "window step time"),
    ):
        assert math.isfinite(by[key]["fitprof"]) and by[key]["truth"] > 0, by[key]
    # What the CPU cannot give: MFU, device copies, max_memory_allocated (or fitprof's memory figure itself).
    for key in (("conv fp32", "MFU"), ("HtoD copies", "HtoD pinned ms per step"), ("conv fp32", "epoch memory peak")):
        assert by[key]["status"] == "n/a" and by[key]["note"], by[key]
    assert "fitprof device check on CPU (--dry)" in printed
    # Many windows in one process: each window's rows, measured, and the same work per step in every window.
    assert gpu_check.WINDOWS >= 10
    for k in range(1, gpu_check.WINDOWS + 1):
        step = by[("windows", f"window {k} step time")]
        assert math.isfinite(step["fitprof"]) and step["truth"] > 0, step
        ops = by[("windows", f"window {k} host ops (--dry) per step")]
        assert ops["status"] == "ok" and ops["fitprof"] == ops["truth"] > 0, ops
        assert by[("windows", f"window {k} device clock ok")]["status"] == "ok"
        assert by[("windows", f"window {k} HtoD pinned")]["status"] == "n/a"
    # Short windows: the RSS read after each, fitprof's arm and a torch.profiler-only control arm, and the slope
    # of each; fitprof is judged by the difference.
    n = gpu_check.RSS_WINDOWS_DRY
    rss = [r for r in rows if r["run"] == "host RSS"]
    for arm in ("fitprof", "torch.profiler"):
        slope = by[("host RSS", f"RSS slope, {arm}")]
        assert math.isfinite(slope["fitprof"]) and slope["note"].startswith(f"{n} windows profiled"), slope
        assert [r["figure"] for r in rss if r["figure"].startswith("RSS after") and r["figure"].endswith(arm)] == [
            f"RSS after window 1, {arm}",
            f"RSS after window {n // 2}, {arm}",
            f"RSS after window {n}, {arm}",
        ]
    excess = by[("host RSS", "RSS slope, fitprof less control")]
    fitprof_slope, control_slope = (
        by[("host RSS", f"RSS slope, {a}")]["fitprof"] for a in ("fitprof", "torch.profiler")
    )
    assert excess["fitprof"] == pytest.approx(fitprof_slope - control_slope)
    assert excess["status"] == ("ok" if excess["fitprof"] <= gpu_check.RSS_SLOPE_LIMIT else "OFF")

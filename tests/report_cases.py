"""Every trace whose whole report is pinned, bit for bit, in ``tests/data/reports.json``.

The shipped traces (``tests/data``), the real GPU traces of ``../shared/fixtures/kineto`` (when present), the
generated GPU-shaped traces of :mod:`gputrace` (Kineto and XSpace), a planted CPU-only trace (:mod:`planted`) and
the XSpace fitprof converts from a Kineto trace. A report's floats are written with ``float.hex``, so a figure
that moves by one unit in the last place fails the comparison.

    PYTHONPATH=src python tests/report_cases.py   # re-records tests/data/reports.json from this checkout
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import gputrace
import planted

DATA = Path(__file__).parent / "data"
SHARED = Path(__file__).resolve().parent.parent / ".." / "shared" / "fixtures" / "kineto"
GOLDEN = DATA / "reports.json"


def _gpu_kineto(tmp: Path, seed: int, **kw: Any) -> Path:
    doc, _ = gputrace.kineto_trace(seed=seed, **kw)
    return gputrace.write_kineto(tmp / f"gpu_seed{seed}.pt.trace.json.gz", doc)


def _gpu_xspace(tmp: Path, seed: int) -> Path:
    data, _ = gputrace.xspace_trace(seed=seed)
    path = tmp / f"gpuhost_seed{seed}.xplane.pb"
    path.write_bytes(data)
    return path


def _planted_cpu(tmp: Path) -> Path:
    ms = planted.MS
    events = [
        planted.kx("user_annotation", "ProfilerStep#3", 0, 10),
        planted.kx("user_annotation", planted.NEXT, 0, 4),
        planted.kx("cpu_op", "aten::mm", 4, 5),
        planted.kx("cpu_op", "aten::add", 5, 2),
        planted.kx("cpu_op", "gloo:all_reduce", 9, 1),
        planted.kx("cpu_op", "gloo:all_reduce", 9.2, 0.5, tid=2),
        planted.kx("user_annotation", "ProfilerStep#4", 10, 8),
        planted.kx("user_annotation", planted.NEXT, 10, 1),
        planted.kx("cpu_op", "aten::mm", 11, 6),
        planted.kx("user_annotation", "fitprof/overhead", 17, 0.5),
    ]
    assert ms == 1000.0
    return planted.write_kineto(tmp / "planted_cpu.pt.trace.json.gz", events)


def _converted(tmp: Path) -> Path:
    from fitprof.traces.xspace_write import kineto_to_xspace

    path = tmp / "lightning_cpu.xplane.pb"
    path.write_bytes(kineto_to_xspace(DATA / "lightning_cpu.pt.trace.json.gz", host="cpuhost").SerializeToString())
    return path


def cases() -> dict[str, Callable[[Path], Path]]:
    """Name -> a function of a scratch folder that gives the trace's path."""
    out: dict[str, Callable[[Path], Path]] = {}
    for p in sorted(DATA.glob("*.json.gz")) + sorted(DATA.glob("*.xplane.pb")):
        out[p.name] = lambda _tmp, p=p: p
    for p in sorted(SHARED.glob("*.json.gz")):
        out[f"shared/{p.name}"] = lambda _tmp, p=p: p
    out["gputrace/kineto_seed0"] = lambda tmp: _gpu_kineto(tmp, 0)
    out["gputrace/kineto_seed3"] = lambda tmp: _gpu_kineto(
        tmp, 3, pageable_us=(4_000, 6_000), nccl_us=(50, 100), validation_step=None, rank=None, world_size=None
    )
    out["gputrace/xspace_seed0"] = lambda tmp: _gpu_xspace(tmp, 0)
    out["gputrace/xspace_seed2"] = lambda tmp: _gpu_xspace(tmp, 2)
    out["planted/cpu_collectives"] = _planted_cpu
    out["converted/lightning_cpu.xplane.pb"] = _converted
    return out


def encode(value: Any) -> Any:
    """A report's value as JSON that keeps every float's bits (``float.hex``)."""
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, frozenset, set)):
        items = sorted(value) if isinstance(value, (frozenset, set)) else value
        return [encode(v) for v in items]
    return value


def report_fields(report: Any, tmp: Path) -> dict[str, Any]:
    """Every field of ``report``, encoded, with the scratch folder taken out of ``source``."""
    d = report.to_dict()
    d["source"] = (
        str(d["source"]).replace(str(tmp), "<tmp>").replace(str(DATA), "<data>").replace(str(SHARED), "<shared>")
    )
    return encode(d)


def main() -> None:
    import tempfile

    import fitprof

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, make in cases().items():
            out[name] = report_fields(fitprof.analyze(make(tmp), top_k=8), tmp)
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{len(out)} reports -> {GOLDEN}")


if __name__ == "__main__":
    main()

"""Allocation churn from real torch traces recorded with ``profile_memory=True``: planted allocations of known sizes
are read back, per step and per operator, through the memory-event reader and the churn analysis."""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
from pathlib import Path

import pytest

import fitprof
from fitprof import metrics
from fitprof.analysis.memory import HEAVY_CHURN_RATIO, OUTSIDE_OPS, churn_advice, memory_churn
from fitprof.cli import main
from fitprof.report_files import read_report_file, write_report_file
from fitprof.traces import TraceError, read_trace
from fitprof.traces._limits import wait_written
from fitprof.traces.kineto_memory import COLUMNS, read_memory_events

torch = pytest.importorskip("torch")

TEMP_BYTES = 2_000_000
TEMPS_PER_STEP = 10
STEPS = 4
MM = 256  # a MM x MM float32 product: 262,144 bytes of output


def _record(
    directory: Path, name: str, *, memory: bool = True, temps: int = TEMPS_PER_STEP, keep: bool = False
) -> Path:
    """``STEPS`` steps, each making ``temps`` temporaries of ``TEMP_BYTES`` (freed at once, or kept when ``keep``),
    one matrix product, and 50 MB inside a validation annotation (not step time)."""
    from fitprof.profilers.torch import TorchProfiler
    from fitprof.traces._table import VALIDATION_ANNOTATION

    torch.set_num_threads(1)
    a = torch.ones(MM, MM)
    kept = []
    w = TorchProfiler(profile_memory=memory)
    assert w.start(directory, name, rank=0)
    for step in range(STEPS):
        w.begin_step(step)
        for _ in range(temps):
            t = torch.ones(TEMP_BYTES, dtype=torch.uint8)
            if keep:
                kept.append(t)
            del t
        torch.mm(a, a)
        w.begin_annotation(VALIDATION_ANNOTATION)
        v = torch.ones(50_000_000, dtype=torch.uint8)
        del v
        w.end_annotation()
    path = w.stop()
    assert path is not None and wait_written(path) is None  # compressed in the background: wait for the whole file
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("churn")
    return {
        "churn": _record(d, "churn"),
        "kept": _record(d, "kept", temps=1, keep=True),
        "plain": _record(d, "plain", memory=False),
    }


def test_the_reader_reads_every_memory_event_of_the_file(traces: dict[str, Path]) -> None:
    mem = read_memory_events(traces["churn"])
    with gzip.open(traces["churn"], "rt") as f:
        raw = [e for e in json.load(f)["traceEvents"] if e.get("name") == "[memory]"]
    assert list(mem.columns) == list(COLUMNS)
    assert len(mem) == len(raw) > 0
    assert mem["bytes"].tolist() == [float(e["args"]["Bytes"]) for e in raw]
    assert mem["ts_us"].tolist() == [float(e["ts"]) for e in raw]
    assert set(mem["device_type"]) == {0}
    # Every planted temporary is one allocation of its size and one free.
    assert (mem["bytes"] == TEMP_BYTES).sum() == STEPS * TEMPS_PER_STEP
    assert (mem["bytes"] == -TEMP_BYTES).sum() == STEPS * TEMPS_PER_STEP


def test_planted_allocations_per_step_and_by_operator(traces: dict[str, Path]) -> None:
    churn = memory_churn(read_trace(traces["churn"]), read_memory_events(traces["churn"]))
    assert churn is not None
    by_name = {o.name: o for o in churn.top_alloc_ops}
    top = churn.top_alloc_ops[0]
    # torch.ones allocates through aten::empty, inside aten::ones: the innermost operator counts.
    assert top.name == "aten::empty"
    assert top.allocs_per_step == TEMPS_PER_STEP
    assert top.mb_per_step == pytest.approx(TEMPS_PER_STEP * TEMP_BYTES / 1e6)
    assert by_name["aten::mm"].mb_per_step == pytest.approx(MM * MM * 4 / 1e6)
    # The 50 MB made under the validation annotation are not step allocations.
    assert churn.alloc_mb_per_step == pytest.approx((TEMPS_PER_STEP * TEMP_BYTES + MM * MM * 4) / 1e6)
    assert churn.allocs_per_step == TEMPS_PER_STEP + 1
    assert sum(o.percent for o in churn.top_alloc_ops) == pytest.approx(100.0)
    assert churn.device == "cpu"
    # Held at most: one temporary and the product's output at a time (the profile counts from its start).
    assert churn.allocated_peak_mb < 2 * TEMP_BYTES / 1e6


def test_heavy_churn_is_told_with_advice_and_kept_memory_is_not(traces: dict[str, Path]) -> None:
    churn = memory_churn(read_trace(traces["churn"]), read_memory_events(traces["churn"]))
    assert churn is not None and churn.heavy
    assert churn.alloc_mb_per_step / churn.allocated_peak_mb >= HEAVY_CHURN_RATIO
    (advice,) = churn_advice(churn)
    assert "most by `aten::empty`" in advice and "set_to_none=True" in advice
    kept = memory_churn(read_trace(traces["kept"]), read_memory_events(traces["kept"]))
    assert kept is not None and not kept.heavy and churn_advice(kept) == []
    assert kept.alloc_mb_per_step == pytest.approx((TEMP_BYTES + MM * MM * 4) / 1e6)


def test_the_report_its_summary_scalars_and_report_file_carry_the_churn(
    traces: dict[str, Path], tmp_path: Path
) -> None:
    report = fitprof.analyze(traces["churn"])
    assert report.memory_device == "cpu" and report.heavy_churn
    assert report.allocs_per_step == TEMPS_PER_STEP + 1
    assert report.alloc_mb_per_step == pytest.approx((TEMPS_PER_STEP * TEMP_BYTES + MM * MM * 4) / 1e6)
    assert report.top_alloc_ops[0].name == "aten::empty"
    line = report.churn_line()
    assert (
        line.startswith("Memory churn (cpu): 11.0 allocations, 20.3 MB allocated per step") and "Heavy churn." in line
    )
    summary = report.summary_markdown()
    assert line in summary and "| aten::empty | 10.0 | 20.000 |" in summary
    assert any("set_to_none=True" in a for a in report.advice)
    assert report.scalars()[metrics.ALLOCS_PER_STEP.key] == TEMPS_PER_STEP + 1
    path = write_report_file(tmp_path / "run", session="s", epoch=0, report=report, trace=traces["churn"])
    assert read_report_file(path).report == report
    plain = fitprof.analyze(traces["plain"])
    assert plain.memory_device == "" and plain.churn_line() == "" and plain.top_alloc_ops == []
    assert metrics.ALLOCS_PER_STEP.key not in plain.scalars()


def test_fitprof_analyze_and_report_print_the_churn(
    traces: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = fitprof.analyze(traces["churn"])
    assert main(["analyze", str(traces["churn"])]) == 0
    assert report.churn_line() in capsys.readouterr().out
    write_report_file(tmp_path / "run", session="s", epoch=3, report=report, trace=traces["churn"])
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"epoch 3: {report.churn_line()}" in out
    assert main(["report", str(tmp_path), "--format", "csv"]) == 0
    cells = next(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert cells["top_allocator"] == "aten::empty" and float(cells["allocs_per_step"]) == TEMPS_PER_STEP + 1


def test_a_trace_without_memory_events_has_no_churn(traces: dict[str, Path]) -> None:
    mem = read_memory_events(traces["plain"])
    assert mem.empty and list(mem.columns) == list(COLUMNS)
    assert memory_churn(read_trace(traces["plain"]), mem) is None


def test_allocations_outside_operators_have_their_own_name(traces: dict[str, Path]) -> None:
    table = read_trace(traces["churn"])
    ops_removed = table[table["kind"] != "op"]
    churn = memory_churn(ops_removed, read_memory_events(traces["churn"]))
    assert churn is not None and [o.name for o in churn.top_alloc_ops] == [OUTSIDE_OPS]


def test_the_bounds_and_bad_files(traces: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="max-trace-mb"):
        read_memory_events(traces["churn"], max_trace_mb=0.001)
    bad = tmp_path / "bad.pt.trace.json"
    bad.write_text('{"traceEvents": [{"name": "[memory]", "ph": "i", "ts": ')
    with pytest.raises(TraceError, match="not valid JSON"):
        read_memory_events(bad)
    with pytest.raises(TraceError, match="no such file"):
        read_memory_events(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="top_k"):
        memory_churn(read_trace(traces["churn"]), read_memory_events(traces["churn"]), top_k=0)


@pytest.mark.slow
def test_lightning_with_profile_memory_logs_and_summarises_the_churn(tmp_path: Path) -> None:
    """A real Lightning fit with ``FitProfiler(profile_memory=True)``: ten 2 MB temporaries a step reach the logged
    scalars, the TensorBoard text summary and the report file that ``fitprof report`` reads."""
    pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import lightning_tiny
    from fitprof.lightning import FitProfiler
    from fitprof.report_files import find_report_files

    torch.set_num_threads(1)

    class Net(lightning_tiny.Planted):
        def plant(self, batch_idx: int) -> None:
            for _ in range(TEMPS_PER_STEP):
                t = torch.ones(TEMP_BYTES, dtype=torch.uint8)
                del t

    trainer = lightning_tiny.trainer(
        tmp_path,
        [FitProfiler(profile_batch=(3, 5), profile_memory=True, verbose=False)],
        logger=TensorBoardLogger(tmp_path, name="tb"),
        accelerator="cpu",
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(Net(), lightning_tiny.loader16(10))
    (run,) = {p.parent for p in (tmp_path / "tb").rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    (mb,) = [e.value for e in acc.Scalars(metrics.ALLOC_MB_PER_STEP.key)]
    # The planted temporaries, and the step's own small tensors (the batch's slices, the loss, the gradients).
    assert TEMPS_PER_STEP * TEMP_BYTES / 1e6 <= mb <= TEMPS_PER_STEP * TEMP_BYTES / 1e6 + 0.1
    (text,) = [
        e.tensor_proto.string_val[0].decode()
        for t in acc.Tags()["tensors"]
        if t.startswith(metrics.SUMMARY_TAG)
        for e in acc.Tensors(t)
    ]
    assert "Memory churn (cpu): " in text and "Heavy churn." in text
    assert re.search(r"\| aten::empty \| 1\d\.0 \| 20\.0\d\d \| ", text), text  # ten temporaries and the step's own
    (path,) = find_report_files(tmp_path)
    report = read_report_file(path).report
    assert report.heavy_churn and report.top_alloc_ops[0].name == "aten::empty"
    assert report.alloc_mb_per_step == pytest.approx(mb, rel=1e-6)

"""``fitprof compare`` over every step, and comparable from the recorded setup. Planted per-epoch files (written
with fitprof's own writer, :func:`fitprof.report_files.append_epoch_record`) whose every step time is set, beside
planted report files (:func:`test_compare.run_dir`): no timing of real fits, so every number is known."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fitprof.compare import DEFAULT_STEP_FAIL_OVER_PERCENT, compare, load_side, step_bootstrap
from fitprof.fit.setup import describe_setup, keras_model_setup, structure_fingerprint, torch_module_setup
from fitprof.metrics import EPOCH_STEP_TIME_MS_P50
from fitprof.report_files import MAX_STEP_TIMES, append_epoch_record, epoch_file_path, read_epoch_file
from test_compare import BASE_OPS, as_json, row, run_cli, run_dir

P50 = EPOCH_STEP_TIME_MS_P50.key
SETUP = describe_setup(
    backend="torch", parameters=8_906, classes=["Model", "Linear", "ReLU"], precision="32-true", device="cpu"
)


def step_times(scale: float, *, steps: int = 17, phase: int = 0) -> list[float]:
    """One epoch's clean step times (ms): 10 ms times ``scale``, with a fixed +-3% pattern (a step-to-step spread
    wider than the effects the tests plant between runs' medians, and the same pattern on every side)."""
    return [10.0 * scale * (1 + 0.03 * math.sin(1.7 * (i + phase))) for i in range(steps)]


def planted_run(
    root: Path,
    scales: list[float],
    *,
    seed: int,
    epochs: int = 3,
    setup: dict[str, str] | None = SETUP,
    keep_steps: bool = True,
) -> Path:
    """A folder of ``len(scales)`` runs (``run<i>``), each with 3 windows and ``epochs`` epochs whose every step is
    10 ms times its run's scale (:func:`step_times`); ``keep_steps`` False writes lines without ``step_ms`` (a file
    of a fitprof that did not keep them), ``setup`` None lines without ``setup``."""
    for i, scale in enumerate(scales):
        run = run_dir(root / f"run{i}", BASE_OPS, seed=seed * 10 + i)
        for epoch in range(epochs):
            times = step_times(scale, phase=epoch)
            append_epoch_record(
                run,
                epoch=epoch,
                rank=0,
                framework="lightning",
                figures={P50: float(np.median(times))},
                verdicts=[],
                step_ms=times if keep_steps else (),
                setup=setup,
            )
    return root


# ------------------------------------------------------------------------------------------ the file's fields


def test_the_epoch_line_keeps_its_step_times_and_setup_and_caps_them(tmp_path: Path) -> None:
    """The line keeps every step time to the microsecond and the setup; an epoch of more steps keeps
    MAX_STEP_TIMES of them, the first and the last included; a line without them reads as none."""
    append_epoch_record(
        tmp_path, epoch=0, rank=0, framework="keras", figures={}, verdicts=[], step_ms=[1.23456, 2.0], setup=SETUP
    )
    long = [float(i) for i in range(1000)]
    append_epoch_record(tmp_path, epoch=1, rank=0, framework="keras", figures={}, verdicts=[], step_ms=long)
    append_epoch_record(tmp_path, epoch=2, rank=0, framework="keras", figures={}, verdicts=[])
    first, second, third = read_epoch_file(epoch_file_path(tmp_path))
    assert first.step_ms == (1.235, 2.0) and first.setup == SETUP
    assert len(second.step_ms) == MAX_STEP_TIMES and second.step_ms[0] == 0.0 and second.step_ms[-1] == 999.0
    assert second.setup == {}
    assert third.step_ms == () and third.setup == {}
    raw = epoch_file_path(tmp_path).read_text().splitlines()
    assert "step_ms" not in json.loads(raw[2]) and "setup" not in json.loads(raw[2])


def test_the_setup_is_read_off_torch_and_keras_shaped_models() -> None:
    """Parameter count and structure from a torch module (duck-typed: numel, modules) and a Keras model
    (count_params, _flatten_layers, dtype policy); Keras's auto-numbered layer names do not change the fingerprint,
    a model not built yet has no parameter count."""
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    got = torch_module_setup(net, precision="bf16-mixed", device="cpu")
    assert got["parameters"] == str(4 * 3 + 3 + 3 * 2 + 2)
    assert got["structure"] == structure_fingerprint(["Sequential", "Linear", "ReLU", "Linear"])
    assert got["precision"] == "bf16-mixed" and got["device"] == "cpu" and got["backend"] == "torch"
    other = torch_module_setup(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)))
    assert other["structure"] != got["structure"]

    class Policy:
        name = "mixed_float16"

    class Layer:
        def __init__(self, name: str) -> None:
            self.name = name

    class Dense(Layer):
        pass

    class KerasModel(Layer):
        dtype_policy = Policy()

        def __init__(self, name: str, built: bool = True) -> None:
            super().__init__(name)
            self.built = built

        def count_params(self) -> int:
            if not self.built:
                raise ValueError("not built")
            return 42

        def _flatten_layers(self, include_self: bool = True, recursive: bool = True) -> list[Layer]:
            return [self, Dense(f"dense_{self.name}")]

    a, b = keras_model_setup(KerasModel("1"), backend="tensorflow"), keras_model_setup(KerasModel("2"))
    assert a["parameters"] == "42" and a["precision"] == "mixed_float16" and a["structure"] == b["structure"]
    assert "parameters" not in keras_model_setup(KerasModel("3", built=False))


# ------------------------------------------------------------------------------------------ every step


def test_a_ten_percent_step_is_caught_over_every_step_and_same_code_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three runs a side, 17 clean steps an epoch with a +-3% step-to-step spread, runs apart by up to 2%: the same
    code passes; +10% fails on the step time, its ratio and interval printed, with the test named in a note. The
    per-epoch medians alone (three runs' files without step times: 9 medians a side) are compared with the 10%
    threshold, and a +10% step sits on it."""
    base = planted_run(tmp_path / "base", [1.0, 1.01, 0.99], seed=1)
    same = planted_run(tmp_path / "same", [1.005, 0.995, 1.015], seed=2)
    slower = planted_run(tmp_path / "slower", [1.10, 1.11, 1.09], seed=3)
    rc, records = as_json(capsys, base, same)
    step = row(records, P50)
    assert rc == 0 and not step["regression"], records[0]["headline"]
    assert step["threshold"] == DEFAULT_STEP_FAIL_OVER_PERCENT
    assert step["baseline_windows"] == 3 * 3 * 17  # every step of every run
    rc, records = as_json(capsys, base, slower)
    step = row(records, P50)
    assert rc == 1 and step["regression"] and step["significant"], records[0]["headline"]
    assert step["ratio"] == pytest.approx(1.10, abs=0.01)
    assert 1.0 < step["ratio_low"] < step["ratio"] < step["ratio_high"] < 1.15
    assert any("resampling the runs, then the steps" in n and "of 3 run(s)" in n for n in records[0]["notes"])
    rc, out, _ = run_cli(capsys, base, slower)
    headline = out.splitlines()[1]
    assert rc == 1 and headline.startswith("regression: step time") and "ratio 1.1" in headline and "at 99%" in headline


def test_runs_count_as_runs_not_their_steps(tmp_path: Path) -> None:
    """Same code whose runs shift by up to 10% from one another (steps tight within each run): the candidate's three
    runs sit 7% above the baseline's median, past the 6% threshold. Resampling the pooled steps alone would call that
    significant; with the runs resampled first the interval holds no change, and nothing fails."""
    base = load_side(planted_run(tmp_path / "base", [0.96, 1.0, 1.04], seed=1))
    cand = load_side(planted_run(tmp_path / "cand", [1.02, 1.07, 1.12], seed=2))
    assert base.runs == cand.runs == 3 and len(base.steps) == 3
    step = compare(base, cand).step_time()
    assert step is not None and step.change_percent > DEFAULT_STEP_FAIL_OVER_PERCENT
    assert step.significant is False and not step.regression, step
    pooled_b = np.asarray([v for r in base.steps for v in r])
    pooled_c = np.asarray([v for r in cand.steps for v in r])
    lo, _, _, _ = step_bootstrap([pooled_b], [pooled_c])  # one "run" a side: the steps alone
    assert lo > 0  # the steps alone would have called it


def test_older_files_without_step_times_or_setup_still_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A baseline written before the step times and the setup were kept, against a new candidate: compared (not
    refused) on the per-epoch medians, with the step gate's usual threshold, and the same +20% caught."""
    old = planted_run(tmp_path / "old", [1.0, 1.01, 0.99], seed=1, keep_steps=False, setup=None)
    new = planted_run(tmp_path / "new", [1.20, 1.21, 1.19], seed=2)
    assert load_side(old).steps == [] and load_side(old).setup == {}
    rc, records = as_json(capsys, old, new)
    step = row(records, P50)
    assert rc == 1 and step["regression"] and step["baseline_windows"] == 9, records[0]["headline"]
    assert step["threshold"] == 10.0
    assert not any("resampling the runs" in n for n in records[0]["notes"])
    rc, records = as_json(capsys, old, planted_run(tmp_path / "same", [1.0, 1.0, 1.0], seed=3))
    assert rc == 0, records[0]["headline"]


# ------------------------------------------------------------------------------------------ the setup


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("parameters", "9000", "parameter count 8906 vs 9000"),
        ("structure", "0123456789ab", "model structure"),
        ("precision", "bf16-mixed", "precision 32-true vs bf16-mixed"),
        ("device", "NVIDIA H200", "device cpu vs NVIDIA H200"),
    ],
)
def test_another_setup_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: str, named: str
) -> None:
    base = planted_run(tmp_path / "base", [1.0, 1.0], seed=1, epochs=2)
    cand = planted_run(tmp_path / "cand", [1.0, 1.0], seed=2, epochs=2, setup={**SETUP, field: value})
    rc, _, err = run_cli(capsys, base, cand)
    assert rc == 2 and "not comparable" in err and named in err, err
    assert "Traceback" not in err
    # the same setup, and a side that records none (an older file), are comparable
    rc, _, err = run_cli(capsys, base, planted_run(tmp_path / "same", [1.0, 1.0], seed=3, epochs=2))
    assert rc == 0, err
    rc, _, err = run_cli(capsys, cand, planted_run(tmp_path / "old", [1.0, 1.0], seed=4, epochs=2, setup=None))
    assert rc == 0, err

"""What a user reads during a fit and after it: one headline per profiled epoch on its own line naming where the
profile is, each verdict and advice said once a fit, the advice kept for ``fitprof report`` and the Text tab, and
a Keras monitor warned off a key that is NaN in unprofiled epochs. Read back from real fits' stdout, per-epoch files
and the CLI."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest

from fitprof.fit.result import EpochLog, EpochResult
from fitprof.fit.voice import Voice, gist
from keras_child import child_env, run_result

MAX_ADVICE = 3
"""The most advice lines a 3-epoch fit prints."""


def _fitprof_lines(out: str) -> tuple[list[str], list[str]]:
    """The headlines and the other ``fitprof:`` lines of ``out``; asserts that no ``fitprof`` text starts mid-line
    (glued to a progress bar) and that no line is said twice word for word."""
    lines = out.replace("\r", "\n").splitlines()
    glued = [line for line in lines if "fitprof epoch " in line and not line.startswith("fitprof epoch ")]
    assert not glued, glued
    said = [line for line in lines if line.startswith("fitprof")]
    assert len(said) == len(set(said)), said
    heads = [line for line in said if line.startswith("fitprof epoch ")]
    return heads, [line for line in said if line.startswith("fitprof: ")]


def _heads_name_their_profile(heads: list[str], epochs: list[int]) -> None:
    assert [int(h.split()[2].rstrip(":")) for h in heads] == epochs, heads
    for head in heads:
        assert "% of the window's steps" in head, head  # the input share says what it covers
        place = head.split("; profile in ")[1]
        assert Path(place).is_dir() and place.endswith(f"_epoch{head.split()[2].rstrip(':')}"), head


def _no_newcomer_told_to_profile_less(advice: list[str]) -> None:
    """A short fit's epochs are far under :data:`~fitprof.fit.epoch_parts.PROFILING_LONG_EPOCH_S`: fitprof's own
    share, where said, is a fact, never the advice to profile less."""
    assert not [a for a in advice if "profile fewer" in a or "profile_batch=" in a], advice
    own = [a for a in advice if "fitprof's own profiling" in a]
    assert all(a.endswith("so its share falls as epochs get longer") for a in own), own


def test_each_sentence_is_said_once_a_fit_and_contention_overrides_worker_advice() -> None:
    voice = Voice()
    contention = "CPU-contended: the training thread waited for a core 37% of epoch 1 (777 switches/s)"
    first = EpochResult(
        verdicts=["fitprof's own profiling took 12% of epoch 0 (0.03 s of 0.25 s)"],
        advice=["num_workers=3 would bring steps to about 16.6 ms (now 30.1 ms)"],
        log=EpochLog(0, {}, line="fitprof epoch 0: 3.00 ms/step"),
    )
    assert voice.lines(0, first, "/logs/plugins/profile/s_epoch0") == [
        "fitprof epoch 0: 3.00 ms/step; profile in /logs/plugins/profile/s_epoch0",
        "fitprof: fitprof's own profiling took 12% of epoch 0 (0.03 s of 0.25 s)",  # one sentence an epoch
    ]
    assert voice.new == [*first.verdicts, *first.advice]  # what the Text tab gets
    contended = EpochResult(
        verdicts=[contention, "fitprof's own profiling took 19% of epoch 1 (0.11 s of 0.56 s)"],
        advice=["num_workers=3 would bring steps to about 7.1 ms (now 7.8 ms)"],
        contended=True,
    )
    assert voice.lines(1, contended) == [f"fitprof: {contention}"]  # contention first, no worker count
    assert voice.new == [contention]  # its own-profiling sentence was said
    noise = EpochResult(advice=["num_workers=4 would bring steps to about 7.0 ms (now 9.0 ms); only 2 cores: ..."])
    assert voice.lines(2, noise) == [f"fitprof: {noise.advice[0]}"]  # left unprinted in epoch 0: printed now
    assert voice.lines(3, noise) == []  # the same advice, its count moved with the epoch's noise
    changed = EpochResult(advice=["the loader keeps up (input wait 1% of a 10.1 ms step): num_workers=1 would do"])
    assert voice.lines(4, changed) == [f"fitprof: {changed.advice[0]}"]  # another advice: said
    assert voice.lines(5, changed) == [] and voice.new == []
    voice.begin_fit()
    assert voice.lines(0, changed) == [f"fitprof: {changed.advice[0]}"]  # a new fit says it again
    assert gist("num_workers=3 took 12.5% of epoch 4 (0.03 s)") == "num_workers=# took #% of epoch #"
    assert (
        gist("waited 286 switches/s, 2 cores")
        == gist("waited 4,015 switches/s, 2 cores")
        == "waited # switches/s, # cores"
    )


KERAS_TORCH = textwrap.dedent(
    """
    import json, os, warnings
    os.environ["KERAS_BACKEND"] = "torch"
    import numpy as np, keras, torch
    torch.set_num_threads(1)
    from fitprof.keras import FitProfiler

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
        m.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    x = np.random.default_rng(0).random((512, 16), dtype="float32")
    y = np.random.default_rng(1).integers(0, 2, 512)
    fp = FitProfiler(log_dir={logs!r})
    model().fit(x, y, batch_size=8, epochs=3, verbose=1, callbacks=[fp])
    print("END OF THE FIT", flush=True)
    m = model()
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="fitprof/step_time_ms", mode="min", patience=1, factor=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m.fit(x, y, batch_size=8, epochs=3, verbose=0,
              callbacks=[FitProfiler(log_dir={logs2!r}, every_n_epochs=2), plateau])
    m2 = model()
    steady = keras.callbacks.ReduceLROnPlateau(monitor="fitprof/epoch/step_time_ms_p50", mode="min", patience=1,
                                               factor=0.5)
    with warnings.catch_warnings(record=True) as caught2:
        warnings.simplefilter("always")
        history = m2.fit(x, y, batch_size=8, epochs=3, verbose=0,
                         callbacks=[FitProfiler(log_dir={logs3!r}, every_n_epochs=2), steady])
    print("RESULT" + json.dumps({{
        "feed": fp._engine.parts.feed,
        "warnings": [str(w.message) for w in caught if "fitprof" in str(w.message)],
        "lr": float(keras.ops.convert_to_numpy(m.optimizer.learning_rate)),
        "p50_warnings": [str(w.message) for w in caught2 if "monitor" in str(w.message)],
        "p50": [float(v) for v in history.history["fitprof/epoch/step_time_ms_p50"]],
        "window": [float(v) for v in history.history["fitprof/step_time_ms"]],
    }}))
    """
)


@pytest.mark.slow
def test_keras_on_torch_fit_prints_one_headline_per_epoch_on_its_own_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    logs, logs2, logs3 = tmp_path / "logs", tmp_path / "logs2", tmp_path / "logs3"
    code = KERAS_TORCH.format(logs=str(logs), logs2=str(logs2), logs3=str(logs3))
    result, proc = run_result(["-c", code], cwd=tmp_path)
    fit_out = proc.stdout.split("END OF THE FIT")[0]
    heads, advice = _fitprof_lines(fit_out)
    _heads_name_their_profile(heads, [0, 1, 2])
    assert len(advice) <= MAX_ADVICE, advice
    _no_newcomer_told_to_profile_less(advice)
    # fed NumPy arrays: no DataLoader advice (Keras builds that loader itself)
    assert result["feed"] == "arrays"  # what the start-up sentence fits its advice to
    assert not [a for a in advice if "num_workers" in a or "DataLoader" in a], advice
    # a monitor on a key NaN in unprofiled epochs: one warning naming the always-on key
    (warned,) = result["warnings"]
    assert "ReduceLROnPlateau(monitor='fitprof/step_time_ms')" in warned
    assert "watch fitprof/epoch/step_time_ms_p50 instead (mode='min')" in warned  # Keras's auto mode raises on it
    # the key it names is there every epoch, profiled or not: a monitor on it is not warned and never sees NaN
    assert result["p50_warnings"] == [], result["p50_warnings"]
    assert len(result["p50"]) == 3 and all(math.isfinite(v) and v > 0 for v in result["p50"]), result
    assert math.isnan(result["window"][1]), result  # the window key of the unprofiled epoch: what fooled the monitor


BACKEND_FIT = textwrap.dedent(
    """
    import json, os
    os.environ["KERAS_BACKEND"] = {backend!r}
    import numpy as np, keras
    from fitprof.keras import FitProfiler

    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
    m.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).random((320, 16), dtype="float32")
    y = np.random.default_rng(1).integers(0, 2, 320)
    fp = FitProfiler(log_dir={logs!r})
    m.fit(x, y, batch_size=16, epochs=3, verbose=1, callbacks=[fp])
    print("RESULT" + json.dumps({{"backend": keras.backend.backend(), "feed": fp._engine.parts.feed}}), flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_keras_on_jax_and_tensorflow_headlines_name_their_profile(backend: str, tmp_path: Path) -> None:
    """One child a backend (Keras picks its backend once per process; the test process imports neither)."""
    import importlib.util

    for name in ("keras", backend):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed")
    code = BACKEND_FIT.format(backend=backend, logs=str(tmp_path / "logs"))
    result, proc = run_result(["-c", code], cwd=tmp_path)
    assert result["backend"] == backend and result["feed"] == "arrays"
    heads, advice = _fitprof_lines(proc.stdout)
    _heads_name_their_profile(heads, [0, 1, 2])
    assert len(advice) <= MAX_ADVICE, advice
    _no_newcomer_told_to_profile_less(advice)


class _Slow:
    """A map-style dataset whose every sample takes 2 ms to load: the main process waits for its batches."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> tuple[object, object]:
        import time

        import torch

        time.sleep(0.002)
        return torch.ones(8) * (i % 5), torch.tensor(i % 2)


@pytest.mark.slow
def test_lightning_fit_prints_once_and_keeps_the_worker_advice_for_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("lightning.pytorch")
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing import event_accumulator

    from fitprof.cli import main
    from fitprof.lightning import FitProfiler
    from lightning_tiny import QUIET, Tiny

    torch.set_num_threads(1)
    capsys.readouterr()
    fp = FitProfiler(log_dir=tmp_path, profile_batch=(3, 5))
    loader = torch.utils.data.DataLoader(_Slow(), batch_size=4)  # no workers: loading in the main process
    tb = TensorBoardLogger(tmp_path / "tb", name="", version="")
    quiet = {**QUIET, "logger": tb}
    pl.Trainer(max_epochs=3, callbacks=[fp], accelerator="cpu", **quiet).fit(Tiny(), loader)
    heads, advice = _fitprof_lines(capsys.readouterr().out)
    _heads_name_their_profile(heads, [0, 1, 2])
    assert len(advice) <= MAX_ADVICE, advice
    _no_newcomer_told_to_profile_less(advice)
    # the worker advice of each epoch is kept in the per-epoch file and shown by `fitprof report`
    lines = (tmp_path / "plugins/fitprof/epochs.rank0.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r.get("kind") != "fit"]  # the epochs' lines, not the fit's
    last = fp._loader.advice(waiting_only=True)  # the last epoch's worker advice (the wait is 80-90% of a step)
    assert last and last in records[-1]["verdicts"], records
    assert main(["report", str(tmp_path)]) == 0
    report = capsys.readouterr().out
    assert last in report, report
    # the Text tab holds each sentence the fit said first, the worker advice among them
    acc = event_accumulator.EventAccumulator(tb.log_dir, size_guidance={event_accumulator.TENSORS: 0}).Reload()
    texts = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("fitprof/advice/text_summary")]
    assert texts, texts
    kept = {v for r in records for v in r["verdicts"]}
    assert all(part in kept for t in texts for part in t.split("\n\n")), (texts, kept)


DDP = textwrap.dedent(
    """
    import json, sys, warnings
    import lightning.pytorch as pl, torch
    torch.set_num_threads(1)
    sys.path.insert(0, {tests!r})
    from lightning_tiny import QUIET, Tiny
    from fitprof.lightning import FitProfiler

    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = pl.Trainer(max_epochs=2, strategy="ddp", devices=1, accelerator="cpu",
                             callbacks=[FitProfiler(log_dir={logs!r}, profile_batch=(3, 5))], **QUIET)
        trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
    print("RESULT" + json.dumps({{
        "asked": [str(w.message) for w in caught if "sync_dist=True" in str(w.message)],
        "logged": sorted(k for k in trainer.callback_metrics if k.startswith("fitprof/")),
    }}))
    """
)


@pytest.mark.slow
def test_a_distributed_lightning_fit_is_not_asked_for_sync_dist_per_key(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    code = DDP.format(tests=str(Path(__file__).parent), logs=str(tmp_path / "logs"))
    result, _ = run_result(["-c", code], cwd=tmp_path)
    assert len(result["logged"]) > 20  # the keys were logged (through a DDP strategy: a process group)
    assert result["asked"] == []


SPAWN = textwrap.dedent(
    """
    import json, sys, warnings
    # this top level runs again in each spawned rank (as __mp_main__): every warning shown each time, in every rank
    warnings.simplefilter("always")
    import lightning.pytorch as pl, torch
    torch.set_num_threads(1)
    sys.path.insert(0, {tests!r})
    from lightning_tiny import QUIET, Tiny
    from fitprof.lightning import FitProfiler


    class Logs(Tiny):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("tiny_loss", loss, on_step=False, on_epoch=True)  # the user's own key: Lightning asks for it
            return loss


    if __name__ == "__main__":
        data = torch.utils.data.TensorDataset(torch.randn(48, 8), torch.randint(0, 2, (48,)))
        trainer = pl.Trainer(max_epochs=1, strategy="ddp_spawn", devices=2, accelerator="cpu",
                             callbacks=[FitProfiler(log_dir={logs!r}, profile_batch=(3, 5))], **QUIET)
        trainer.fit(Logs(), torch.utils.data.DataLoader(data, batch_size=4))
        print("RESULT" + json.dumps({{
            "world": trainer.world_size,
            "logged": sorted(k for k in trainer.callback_metrics if k.startswith("fitprof/")),
        }}))
    """
)


@pytest.mark.slow
def test_a_ddp_spawn_fit_of_two_ranks_is_not_asked_for_sync_dist_for_fitprofs_keys(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    script = tmp_path / "spawn_fit.py"  # a file, not -c: the spawned ranks import it as their __mp_main__
    script.write_text(SPAWN.format(tests=str(Path(__file__).parent), logs=str(tmp_path / "logs")))
    env = {k: v for k, v in child_env().items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK")}
    result, proc = run_result([str(script)], env=env, cwd=tmp_path, timeout_s=300)
    assert result["world"] == 2
    assert len(result["logged"]) > 20  # rank 0's keys, sent back to the launching process
    asked = [line for line in proc.stderr.splitlines() if "sync_dist=True" in line]
    assert any("'tiny_loss'" in line for line in asked), proc.stderr[-3000:]  # the ranks' warnings are read here
    assert not [line for line in asked if "fitprof/" in line], asked


@pytest.mark.slow
def test_the_lightning_example_prints_its_headlines_and_no_tensorflow_start_up_lines(tmp_path: Path) -> None:
    """``examples/lightning_digits.py`` as a user runs it: Lightning's TensorBoardLogger imports TensorFlow where it
    is installed, whose C++ lines the example holds back; its epoch's headline names the profile's place."""
    pytest.importorskip("lightning.pytorch")
    example = Path(__file__).resolve().parents[1] / "examples" / "lightning_digits.py"
    code = f"import runpy, sys; sys.argv = ['x', '--logdir', 'logs', '--epochs', '1']; runpy.run_path({str(example)!r}"
    code += ", run_name='__main__'); print('RESULT{}')"
    _, proc = run_result(["-c", code], cwd=tmp_path)
    noise = [line for line in proc.stderr.splitlines() if "absl::InitializeLog" in line or "oneDNN custom" in line]
    assert noise == [], proc.stderr[-3000:]
    heads, advice = _fitprof_lines(proc.stdout)
    assert len(heads) == 1 and len(advice) <= 1, (heads, advice)
    place = heads[0].split("; profile in ")[1]
    assert (tmp_path / place).is_dir() and place.startswith("logs"), heads


def test_tensorflow_import_lines_are_held_back_and_nothing_else() -> None:
    from fitprof.profilers.quiet import kept

    captured = (
        b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        b"I0000 00:00:1796327747.469903   21479 port.cc:153] oneDNN custom operations are on. You may see slightly "
        b"different numerical results due to floating-point round-off errors from different computation orders. "
        b"To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n"
        b"W0000 00:00:1796327747.469903   21479 port.cc:153] oneDNN custom operations are on.\n"
        b"a line of the user's\n"
    )
    assert kept(captured) == (
        b"W0000 00:00:1796327747.469903   21479 port.cc:153] oneDNN custom operations are on.\na line of the user's\n"
    )


def test_the_plot_draws_each_epochs_wall_time_split_and_hatches_contended_epochs(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    pytest.importorskip("matplotlib")
    from PIL import Image

    from fitprof.cli.plot import plot_breakdown

    window = {"run": "r", "fit": 0, "epoch": 0, "rank": 0, "step_time_ms": 10.0, "input_ms_per_step": 2.0}
    window |= {"htod_ms_per_step": 0.0, "verdict": "cpu-contended"}
    parts = {"train_steps_s": 2.0, "input_s": 0.5, "validation_s": 0.5, "other_s": 0.1}
    calm = {"run": "r", "fit": 0, "epoch": 0, "rank": 0, **parts, "verdicts": []}
    busy = {**calm, "epoch": 1, "verdicts": ["CPU-contended: the training thread waited for a core 40% of epoch 1"]}
    png = tmp_path / "plot.png"
    plot_breakdown([window], png, [calm, busy])
    with Image.open(png) as img:
        rgb = np.asarray(img.convert("RGB")).astype(int)
    cyan = np.abs(rgb - (23, 190, 207)).sum(axis=2) <= 6  # the epoch's training steps (tab:cyan)
    columns = np.flatnonzero(cyan.sum(axis=0) > 20)  # bar columns (legend patches are a few rows tall)
    split = np.flatnonzero(np.diff(columns) > 1)
    assert len(split) == 1, columns  # two epoch bars
    left, right = columns[: split[0] + 1], columns[split[0] + 1 :]
    for bar, hatched in ((left, False), (right, True)):
        mid = int(bar[len(bar) // 4])
        rows = np.flatnonzero(cyan[:, mid])
        dark = (rgb[rows.min() : rows.max() + 1, mid].sum(axis=1) < 200).sum()
        assert (dark > 0) == hatched, (mid, dark)

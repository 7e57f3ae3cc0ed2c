"""fitprof's own time is never the user's step time.

Planted-span runs: the input sleeps a known time per batch (and, on Lightning, the training step too), so step
time and input share are set by the test. A 40 ms delay is then injected into fitprof's own step-marker
transition inside the window (monkeypatch): step time and input share must stay within the run-to-run noise,
measured here from two undisturbed runs, and ``self_ms_per_step`` must show the delays. The first window of a
run (epoch 0) must agree with the later ones within the same noise.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fitprof

DELAY_S = 0.040
EPOCHS = 3
BATCHES = 10
FIRST, LAST = 3, 7
STEPS = LAST - FIRST + 1
FLOOR_PP = 0.5  # the smallest input-share tolerance: the noise bound on a planted-span run


def _noise(a: list[Any], b: list[Any], attr: str) -> float:
    """The largest run-to-run and epoch-to-epoch difference of ``attr`` over two undisturbed runs."""
    va = [getattr(r, attr) for r in a]
    vb = [getattr(r, attr) for r in b]
    diffs = [abs(x - y) for x, y in zip(va, vb, strict=True)] + [max(va[1:]) - min(va[1:]), max(vb[1:]) - min(vb[1:])]
    return max(diffs)


def _delay(monkeypatch: pytest.MonkeyPatch, cls: type, method: str, after: int = 0) -> list[float]:
    """Wrap ``cls.method`` with a 40 ms sleep, taken while a step span is open (so inside an analysed step) and,
    for ``begin_step(n)``, only when ``n > after`` (the step it closes is an analysed one, not a warm-up step);
    returns the list the measured sleeps are appended to."""
    original: Callable[..., Any] = getattr(cls, method)
    slept: list[float] = []

    def delayed(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._step is not None and (not args or args[0] > after):
            t0 = time.perf_counter()
            time.sleep(DELAY_S)
            slept.append(time.perf_counter() - t0)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, delayed)
    return slept


def _check(base: list[Any], again: list[Any], delayed: list[Any], slept: list[float], per_epoch: int) -> None:
    # The question is whether the delays were counted as step time, and a yes moves every delayed window by the
    # delays' share of it (40 ms x per_epoch / STEPS a step): the tolerance is half that, so either answer sits a
    # half-effect from the cut. A multiple of the noise of two undisturbed runs is no bound: two runs are a small
    # sample of a loaded machine's noise (twice it was exceeded by 6-10% in 2 of 4 runs at a load of 3-5). The
    # noise is printed beside it.
    undisturbed = base + again
    step_ms = statistics.median(r.step_time_ms for r in undisturbed)
    input_share = statistics.median(r.input_percent for r in undisturbed)
    delay_ms = 1e3 * DELAY_S * per_epoch / STEPS
    step_tol = delay_ms / 2
    input_pp = max(FLOOR_PP, input_share * delay_ms / (step_ms + delay_ms) / 2)
    noise = (_noise(base, again, "step_time_ms"), _noise(base, again, "input_percent"))
    print(f"tolerance (half the delays' effect): step {step_tol:.3f} ms, input {input_pp:.3f} pp; noise {noise}")
    for e in range(EPOCHS):
        b, d = base[e], delayed[e]
        print(
            f"epoch {e}: step {b.step_time_ms:.3f} / {again[e].step_time_ms:.3f} / delayed {d.step_time_ms:.3f} ms; "
            f"input {b.input_percent:.3f} / {again[e].input_percent:.3f} / delayed {d.input_percent:.3f} %; "
            f"self {b.self_ms_per_step:.3f} / delayed {d.self_ms_per_step:.3f} ms"
        )
    # Step time and input share: the median of the delayed run's three windows against the median of the
    # undisturbed windows. One window of a run can be off by more than the undisturbed runs showed (a neighbour's
    # burst: 26.5 ms against 24.0 ms in one of three delayed windows under a full-suite load, the other two within
    # 0.3 ms); the median of three is not moved by one such window.
    for attr, tol in (("step_time_ms", step_tol), ("input_percent", input_pp)):
        got = statistics.median(getattr(r, attr) for r in delayed)
        want = statistics.median(getattr(r, attr) for r in undisturbed)
        assert abs(got - want) <= tol, (attr, got, want, tol)
    for e in range(EPOCHS):
        b, d = base[e], delayed[e]
        assert b.steps_analyzed == d.steps_analyzed == STEPS
        # fitprof's own time is reported: the measured sleeps of this epoch over its steps, plus the hooks' usual
        # cost (bounded by three times the largest undisturbed figure) and up to 5% of the sleeps: the span around
        # a sleep also holds the scheduler's delay in waking the thread, which ``slept`` does not always see under
        # load (41.64 ms seen against 41.28 ms with no such margin). Without the report it would be 0.
        expected = 1e3 * sum(slept[e * per_epoch : (e + 1) * per_epoch]) / STEPS
        usual = 3 * max(r.self_ms_per_step for r in base + again)
        assert expected <= d.self_ms_per_step <= 1.05 * expected + usual + 0.5
    # The first window agrees with the later ones. A first window that differs by itself (a warm-up cost) does so in
    # both undisturbed runs; a neighbour's burst lands in one window of one run (a first window of 56.9 ms and 36.4%
    # input against the other run's 42.9 ms and 47.7%, with another test process beside it), so the closer of the
    # two runs is held to the tolerance.
    step_off, input_off = [], []
    for run in (base, again):
        step_off.append(abs(run[0].step_time_ms - sum(r.step_time_ms for r in run[1:]) / (EPOCHS - 1)))
        input_off.append(abs(run[0].input_percent - sum(r.input_percent for r in run[1:]) / (EPOCHS - 1)))
    assert min(step_off) <= step_tol, (step_off, step_tol)
    assert min(input_off) <= input_pp, (input_off, input_pp)


# ----------------------------------------------------------------------------------------------------- Lightning
def _lightning_run(tmp_path: Path) -> list[Any]:
    torch = pytest.importorskip("torch")
    pl = pytest.importorskip("lightning.pytorch")
    from fitprof.lightning import FitProfiler

    class Slow(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return BATCHES

        def __getitem__(self, i: int) -> Any:
            time.sleep(0.020)  # planted input span: 20 ms per batch
            return torch.ones(4), torch.tensor(i % 2)

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            time.sleep(0.020)  # planted compute span: 20 ms per step
            x, y = batch
            return torch.nn.functional.cross_entropy(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    cb = FitProfiler(log_dir=tmp_path, profile_batch=(FIRST, LAST))
    import lightning_tiny

    trainer = lightning_tiny.trainer(tmp_path, [cb], max_epochs=EPOCHS)
    trainer.fit(Tiny(), torch.utils.data.DataLoader(Slow(), batch_size=None))
    reports = [cb.reports[e] for e in range(EPOCHS)]
    for e in range(EPOCHS):  # `fitprof analyze` on the written files gives the logged figures
        again = fitprof.analyze(cb.trace_paths[e])
        assert again.steps_analyzed == STEPS
        assert again.self_ms_per_step == pytest.approx(reports[e].self_ms_per_step)
        xs = fitprof.analyze(cb.xplane_paths[e])  # the XSpace copy keeps the exclusion
        assert xs.steps_analyzed == STEPS
        assert xs.step_time_ms == pytest.approx(reports[e].step_time_ms, rel=0.01)
        assert xs.self_ms_per_step == pytest.approx(reports[e].self_ms_per_step, rel=0.01, abs=0.01)
        _warm_up_recorded_not_analysed(cb.trace_paths[e])
    return reports


def _warm_up_recorded_not_analysed(path: Path) -> None:
    """The window's warm-up step (``FIRST - 1``) is in the trace, unmarked: an input span ends before the first
    analysed step begins, and the steps are exactly ``FIRST..LAST``."""
    from fitprof.traces import read_trace

    table = read_trace(path)
    steps = table[table["kind"] == "step"]
    assert sorted(steps["step_num"]) == list(range(FIRST, LAST + 1))
    first_start = steps["ts_us"].min()
    inputs = table[table["kind"] == "input"]
    assert ((inputs["ts_us"] + inputs["dur_us"]) <= first_start).any()


@pytest.mark.slow
def test_lightning_own_delay_is_not_step_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lightning.pytorch")
    from fitprof.profilers.torch import TorchProfiler as TorchProfileWindow

    base = _lightning_run(tmp_path / "a")
    again = _lightning_run(tmp_path / "b")
    # begin_step(n + 1) at the end of step n: the delay lands inside ProfilerStep#n, inside the hook's own span.
    slept = _delay(monkeypatch, TorchProfileWindow, "begin_step")
    delayed = _lightning_run(tmp_path / "c")
    assert len(slept) == EPOCHS * (STEPS - 1)
    _check(base, again, delayed, slept, STEPS - 1)


# -------------------------------------------------------------------------------------------- Keras, TensorFlow
def _keras_run(tmp_path: Path) -> list[Any]:
    keras = pytest.importorskip("keras")
    tf = pytest.importorskip("tensorflow")
    from fitprof.keras import FitProfiler

    def slow(i: Any) -> Any:
        time.sleep(0.020)  # planted input span: 20 ms per batch
        return i

    # No prefetch anywhere (tf.data injects one by default): the training loop fetches each batch synchronously,
    # so a pause in a hook cannot let the pipeline run ahead and the planted input span stays in every step.
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False
    ds = (
        tf.data.Dataset.range(BATCHES)
        .map(lambda i: tf.py_function(slow, [i], tf.int64))
        .map(lambda i: (tf.ones((4, 4)), tf.zeros((4,))))
        .with_options(options)
    )
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    cb = FitProfiler(tmp_path, profile_batch=(FIRST, LAST))
    model.fit(ds, epochs=EPOCHS, verbose=0, callbacks=[cb])
    reports = [cb.reports[e] for e in range(EPOCHS)]
    for e in range(EPOCHS):
        again = fitprof.analyze(cb.trace_paths[e])
        assert again.steps_analyzed == STEPS
        assert again.self_ms_per_step == pytest.approx(reports[e].self_ms_per_step)
        assert not math.isnan(again.self_ms_per_step)
        _warm_up_recorded_not_analysed(cb.trace_paths[e])
    return reports


@pytest.mark.slow
def test_keras_tensorflow_own_delay_is_not_step_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs KERAS_BACKEND=tensorflow")
    from fitprof.profilers.tensorflow import TFProfileWindow

    base = _keras_run(tmp_path / "a")
    again = _keras_run(tmp_path / "b")
    # end_step() at the start of step n + 1's hook: the delay lands inside step n, inside the hook's own span.
    slept = _delay(monkeypatch, TFProfileWindow, "end_step")
    delayed = _keras_run(tmp_path / "c")
    assert len(slept) == EPOCHS * STEPS
    _check(base, again, delayed, slept, STEPS)

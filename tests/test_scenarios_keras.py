"""Keras's own TensorBoard-callback profiling scenarios, re-made with fitprof's ``FitProfiler``: one row each, on both
Keras backends.

The conditions come from the scenarios of ``keras/src/callbacks/tensorboard_test.py`` (profile ranges, argument
forms, validation, several fits), the TF/tf-keras ``profile_batch`` callback tests and
``keras/src/trainers/trainer_test.py`` (``steps_per_execution``), written here from each condition; no code copied.
Each row of ``ROWS`` is one scenario: the callback's arguments, the fit's, what else runs, and the outcome read back
from the callback, the warnings and the files: the steps analysed per profiled epoch and each fitprof warning (a
tuple of substrings that one warning holds; the number of fitprof warnings must match). The next scenario is one
more row.

Keras picks its backend when it is imported, so every row of one backend runs in one child process (this file, run
as a script with ``KERAS_BACKEND`` set): two processes in all, each importing Keras once.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contention import measured, tolerates_load
from keras_child import run_backend_child, write_results

BATCH = 16
BACKENDS = ("tensorflow", "torch")
TF_ONLY = ("tensorflow",)  # TensorBoard(profile_batch=...) and its profiler exist on TensorFlow (and JAX) only


@dataclass(frozen=True)
class Row:
    """One scenario: its conditions and the outcome fitprof must give.

    Attributes:
        id: the scenario's name.
        cb: ``FitProfiler`` arguments (``log_dir`` is the row's folder).
        fit: ``model.fit`` arguments (default: 1 epoch).
        batches: batches of 16 in the data; ``data``: ``array`` (Keras knows the step count), ``generator`` (a
            Python generator) or ``filter`` (a filtered ``tf.data.Dataset``): Keras reports no step count.
        nan_from: the inputs hold NaN from this batch on (for ``TerminateOnNaN``).
        other: ``tensorboard-after`` / ``tensorboard-before`` (``keras.callbacks.TensorBoard(profile_batch=tb)``
            listed after / before), ``fitprof-after`` / ``fitprof-before`` (a second FitProfiler, another folder).
        tb: the TensorBoard callback's ``profile_batch``.
        extra: other Keras callbacks: ``terminate-on-nan``, ``early-stopping`` (loss, patience 1, never improving),
            ``backup-and-restore`` (the first fit is interrupted in epoch 1; the second resumes from the backup),
            ``fit-twice`` (the same callback in two fits; the reports are the second's).
        stages: ``evaluate`` / ``predict`` with the callback, after the fit (``fit`` absent: instead of it).
        copy: ``deepcopy-before`` / ``pickle-before`` (the copy fits) or ``deepcopy-after`` / ``pickle-after`` (the
            copy made after the fit keeps the reports and fits again).
        spe: ``compile(steps_per_execution=...)``.
        backends: the Keras backends the row runs on.
        reports: expected steps analysed per profiled epoch; ``epochs``: expected epochs run (``len(History)``).
        warns: one tuple of substrings per expected fitprof warning.
        tb_profile: whether the TensorBoard callback's profile must exist.
        tb_copies: whether the TensorBoard callback copies fitprof's ``logs`` keys as ``train/epoch_fitprof/*``
            (the README says so: it logs every key it is handed, so only when listed after FitProfiler).
    """

    id: str
    cb: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)
    batches: int = 10
    data: str = "array"
    nan_from: int | None = None
    other: str | None = None
    tb: Any = None
    extra: str | None = None
    stages: tuple[str, ...] = ("fit",)
    copy: str | None = None
    spe: int = 1
    backends: tuple[str, ...] = BACKENDS
    reports: dict[int, int] = field(default_factory=dict)
    epochs: int | None = None
    warns: tuple[tuple[str, ...], ...] = ()
    tb_profile: bool | None = None
    tb_copies: bool | None = None


NOTHING = "nothing was profiled"


def _tensorboard(id: str, order: str, *, tb: Any, window: tuple[int, int] = (2, 3), **kw: Any) -> Row:
    """A TensorFlow-only row with Keras's TensorBoard callback profiling ``tb`` too, listed ``order`` ("after" or
    "before") FitProfiler; its profile must exist."""
    return Row(
        id, cb={"profile_batch": window}, other=f"tensorboard-{order}", tb=tb, backends=TF_ONLY, tb_profile=True, **kw
    )


ROWS = [
    # argument forms
    Row("int", cb={"profile_batch": 2}, reports={0: 1}),
    Row("tuple", cb={"profile_batch": (2, 3)}, reports={0: 2}),
    Row("list", cb={"profile_batch": [2, 3]}, reports={0: 2}),
    Row("string", cb={"profile_batch": "2,3"}, reports={0: 2}),
    Row(
        "int-two-epochs-validated",
        cb={"profile_batch": 1},
        fit={"epochs": 2, "validation_freq": 1},
        reports={0: 1, 1: 1},
    ),
    Row(
        "fit-twice-same-callback",
        cb={"profile_batch": (2, 3)},
        fit={"epochs": 2},
        extra="fit-twice",
        reports={0: 2, 1: 2},
    ),
    Row("zero-is-off", cb={"profile_batch": 0}, fit={"epochs": 2}),
    Row("string-zero-is-off", cb={"profile_batch": "0,0"}),
    # the window's last step is the epoch's last: complete, no warning (also every other epoch validated)
    Row("window-ends-with-epoch", reports={0: 5}),
    Row("window-ends-with-epoch-validation-freq-2", fit={"epochs": 2, "validation_freq": 2}, reports={0: 5, 1: 5}),
    Row(
        "window-ends-with-epoch-two-profilers",
        other="fitprof-after",
        reports={0: 5},
        warns=(("profiling skipped",), (NOTHING, "another profiler held")),
    ),
    Row(
        "epoch-ends-inside-window",
        batches=8,
        reports={0: 3},
        warns=(("epoch 0 ended after step 8, inside the window",),),
    ),
    # which stages profile: fit only
    Row(
        "evaluate-and-predict-after-fit",
        cb={"profile_batch": (2, 3)},
        stages=("fit", "evaluate", "predict"),
        reports={0: 2},
    ),
    Row("evaluate-and-predict-without-fit", cb={"profile_batch": (2, 3)}, stages=("evaluate", "predict")),
    # epochs shorter than the window: the real step count, counted when Keras gives none, and a window that fits
    Row("short-epochs", batches=3, warns=((NOTHING, "3 training steps", "profile_batch=(2, 3)."),)),
    Row("short-epochs-suggestion-followed", cb={"profile_batch": (2, 3)}, batches=3, reports={0: 2}),
    # the epoch ends on the window's warm-up step: that recorded step is dropped, nothing is written
    Row("epoch-ends-on-warm-up-step", batches=5, warns=((NOTHING, "5 training steps", "profile_batch=(3, 5)."),)),
    Row(
        "generator-short", batches=3, data="generator", warns=((NOTHING, "3 training steps", "profile_batch=(2, 3)."),)
    ),
    Row("generator-suggestion-followed", cb={"profile_batch": (2, 3)}, batches=3, data="generator", reports={0: 2}),
    Row(
        "tf-data-filter-short",
        batches=3,
        data="filter",
        backends=TF_ONLY,
        warns=((NOTHING, "3 training steps", "profile_batch=(2, 3)."),),
    ),
    Row(
        "steps-per-epoch",
        cb={"profile_batch": (2, 3)},
        fit={"epochs": 2, "steps_per_epoch": 4},
        batches=8,
        reports={0: 2, 1: 2},
    ),
    # every_n_epochs skipped every epoch of a resumed fit (initial_epoch)
    Row(
        "initial-epoch-skips-every-profiled-epoch",
        cb={"every_n_epochs": 3},
        fit={"epochs": 3, "initial_epoch": 1},
        warns=((NOTHING, "every_n_epochs=3", "epochs 1-2"),),
    ),
    Row(
        "initial-epoch-profiles-its-epochs",
        cb={"profile_batch": (2, 3)},
        fit={"epochs": 3, "initial_epoch": 1},
        reports={1: 2, 2: 2},
    ),
    # another profiling callback on the same steps, both orders: its profile is kept and fitprof says so once
    _tensorboard(
        "tensorboard-after",
        "after",
        tb=(2, 3),
        warns=(("leaves those steps to TensorBoard",), (NOTHING, "TensorBoard")),
    ),
    _tensorboard(
        "tensorboard-before",
        "before",
        tb=(2, 3),
        warns=(("leaves those steps to TensorBoard",), (NOTHING, "TensorBoard")),
    ),
    _tensorboard(
        "tensorboard-next-epoch",
        "after",
        tb=(12, 13),
        fit={"epochs": 2},
        reports={0: 2},
        warns=(("leaves those steps to TensorBoard", "epoch 1"),),
    ),
    _tensorboard("tensorboard-other-steps", "after", tb=(2, 3), window=(6, 8), reports={0: 3}),
    # TensorBoard's profile ends on the window's warm-up step: fitprof takes no warm-up step there
    _tensorboard("tensorboard-after-ends-on-warm-up-step", "after", tb=(2, 5), window=(6, 8), reports={0: 3}),
    _tensorboard("tensorboard-before-ends-on-warm-up-step", "before", tb=(2, 5), window=(6, 8), reports={0: 3}),
    Row(
        "second-fitprof-before",
        cb={"profile_batch": (2, 3)},
        other="fitprof-before",
        warns=(("profiling skipped",), (NOTHING, "another profiler held")),
    ),
    # Keras's TensorBoard logs every ``logs`` key it is handed: after FitProfiler it copies the figures
    Row(
        "tensorboard-after-copies-the-figures",
        cb={"profile_batch": (2, 3)},
        other="tensorboard-after",
        tb=0,
        backends=TF_ONLY,
        reports={0: 2},
        tb_copies=True,
    ),
    Row(
        "tensorboard-before-does-not",
        cb={"profile_batch": (2, 3)},
        other="tensorboard-before",
        tb=0,
        backends=TF_ONLY,
        reports={0: 2},
        tb_copies=False,
    ),
    # copies: before and after a fit
    Row("deepcopy-before-fit", cb={"profile_batch": (2, 3)}, copy="deepcopy-before", reports={0: 2}),
    Row("pickle-before-fit", cb={"profile_batch": (2, 3)}, copy="pickle-before", reports={0: 2}),
    Row("deepcopy-after-fit", cb={"profile_batch": (2, 3)}, copy="deepcopy-after", reports={0: 2}),
    Row("pickle-after-fit", cb={"profile_batch": (2, 3)}, copy="pickle-after", reports={0: 2}),
    # other Keras callbacks that end or resume training
    Row(
        "terminate-on-nan",
        cb={"profile_batch": (1, 3)},
        fit={"shuffle": False},  # the NaN batch is step 2
        nan_from=1,
        extra="terminate-on-nan",
        epochs=1,
        reports={0: 2},
        warns=(("epoch 0 ended after step 2, inside the window",),),
    ),
    Row(
        "early-stopping",
        cb={"profile_batch": (2, 3)},
        fit={"epochs": 5},
        extra="early-stopping",
        epochs=2,
        reports={0: 2, 1: 2},
    ),
    Row(
        "backup-and-restore",
        cb={"profile_batch": (2, 3)},
        fit={"epochs": 3},
        extra="backup-and-restore",
        epochs=2,
        reports={1: 2, 2: 2},
    ),
    # steps_per_execution: each marked step holds that many batches; the default window is calls 6-10 (5 steps)
    Row(
        "steps-per-execution",
        spe=2,
        batches=24,
        backends=TF_ONLY,
        reports={0: 5},
        warns=(("steps_per_execution=2", "calls 6-10 (batches 11-20)"),),
    ),
    Row(
        "steps-per-execution-given-window",
        spe=2,
        cb={"profile_batch": (6, 10)},
        batches=24,
        backends=TF_ONLY,
        reports={0: 2},  # a window the user gave counts batches, as TensorBoard's: calls at batches 7 and 9
        warns=(("steps_per_execution=2",),),
    ),
]


# ------------------------------------------------------------------------------------------------ the child process
_MODELS: dict[int, Any] = {}


def _model(spe: int, *, fresh: bool) -> Any:
    """A tiny compiled model; rows share one per ``steps_per_execution`` (its train function is traced once), except
    rows that poison the weights with NaN."""
    import keras

    if fresh or spe not in _MODELS:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse", steps_per_execution=spe)
        if fresh:
            return model
        _MODELS[spe] = model
    return _MODELS[spe]


def _in_thread(cb: Any) -> Any:
    """``cb`` writing its ``.xplane.pb`` in the training thread: on the torch backend the background converter's
    process (tested in ``tests/test_xplane_worker.py`` and ``tests/test_keras_torch.py``) cost about 2 s a fit,
    most of this file's time; these rows check which windows are profiled, not how the file is written."""
    for pipeline in (cb._engine.pipeline, cb._engine.trigger_pipeline):
        pipeline.converter = None
    return cb


def _run_row(row: Row, folder: Path) -> dict[str, Any]:
    """Run one row's scenario (in the child, with Keras imported) and return what was observed."""
    import copy
    import pickle
    import warnings

    import keras
    import numpy as np

    from fitprof.keras import FitProfiler

    keras.utils.set_random_seed(0)
    x = np.ones((row.batches * BATCH, 8), "float32")
    if row.nan_from is not None:
        x[row.nan_from * BATCH :] = np.nan
    y = np.ones((row.batches * BATCH, 1), "float32")
    model = _model(row.spe, fresh=row.nan_from is not None)

    def data() -> dict[str, Any]:
        if row.data == "filter":  # tf.data of unknown length: Keras reports no step count
            import tensorflow as tf

            return {"x": tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(BATCH)}
        if row.data == "generator":
            return {"x": ((x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(x), BATCH))}
        return {"x": x, "y": y, "batch_size": BATCH}

    cb = FitProfiler(log_dir=str(folder / "fp"), **row.cb)
    if row.copy in ("deepcopy-before", "pickle-before"):
        cb = copy.deepcopy(cb) if row.copy == "deepcopy-before" else pickle.loads(pickle.dumps(cb))
    cb = _in_thread(cb)
    callbacks: list[Any] = [cb]
    if row.other in ("tensorboard-after", "tensorboard-before"):
        tb = keras.callbacks.TensorBoard(str(folder / "tb"), profile_batch=row.tb, write_graph=False)
        callbacks = [cb, tb] if row.other == "tensorboard-after" else [tb, cb]
    if row.other in ("fitprof-after", "fitprof-before"):
        second = _in_thread(FitProfiler(log_dir=str(folder / "fp2"), **row.cb))
        callbacks = [cb, second] if row.other == "fitprof-after" else [second, cb]
    if row.extra == "terminate-on-nan":
        callbacks.append(keras.callbacks.TerminateOnNaN())
    if row.extra == "early-stopping":
        callbacks.append(keras.callbacks.EarlyStopping(monitor="loss", min_delta=1e9, patience=1))
    fit_kwargs = dict(row.fit)
    if row.fit.get("validation_freq"):
        fit_kwargs["validation_data"] = (x[:BATCH], y[:BATCH])
    history: Any = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if row.extra == "backup-and-restore":
            backup = keras.callbacks.BackupAndRestore(str(folder / "backup"))

            class Interrupt(keras.callbacks.Callback):
                def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                    if epoch == 1:
                        raise KeyboardInterrupt("interrupted in epoch 1")

            try:
                model.fit(**data(), verbose=0, callbacks=[backup, Interrupt(), *callbacks], **fit_kwargs)
            except KeyboardInterrupt:
                pass
            callbacks = [backup, *callbacks]  # the same command again: it resumes from the backup
        if row.extra == "fit-twice":  # the same callback in two fits (its event file and windows start again)
            model.fit(**data(), verbose=0, callbacks=callbacks, **fit_kwargs)
        if "fit" in row.stages:
            history = model.fit(**data(), verbose=0, callbacks=callbacks, **fit_kwargs)
        if "evaluate" in row.stages:
            model.evaluate(x, y, batch_size=BATCH, verbose=0, callbacks=[cb])
        if "predict" in row.stages:
            model.predict(x, batch_size=BATCH, verbose=0, callbacks=[cb])
    seen: dict[str, Any] = {
        "reports": {str(e): r.steps_analyzed for e, r in cb.reports.items()},
        "warnings": [str(w.message) for w in caught if "fitprof" in str(w.message).lower()],
        "epochs": None if history is None else len(history.history.get("loss", [])),
        "tb_profiles": len(list((folder / "tb").rglob("*.xplane.pb"))),
        "sessions": len([p for p in (folder / "fp").glob("plugins/profile/*") if p.is_dir()]),
        "event_dirs": sorted({str(p.parent.relative_to(folder / "fp")) for p in (folder / "fp").rglob("events.out.*")}),
    }
    if row.tb_copies is not None:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.util.tensor_util import make_ndarray

        events = EventAccumulator(str(folder / "tb" / "train"), size_guidance={"tensors": 0})
        events.Reload()
        tag = "epoch_fitprof/step_time_ms"
        copies = events.Tensors(tag) if tag in events.Tags()["tensors"] else []
        seen["tb_copy"] = [float(make_ndarray(e.tensor_proto)) for e in copies]
        seen["step_time_ms"] = [r.step_time_ms for _, r in sorted(cb.reports.items())]
    if row.copy in ("deepcopy-after", "pickle-after"):
        copied = _in_thread(copy.deepcopy(cb) if row.copy == "deepcopy-after" else pickle.loads(pickle.dumps(cb)))
        seen["copy_reports"] = {str(e): r.steps_analyzed for e, r in copied.reports.items()}
        model.fit(**data(), verbose=0, callbacks=[copied], **fit_kwargs)
        seen["copy_refit_reports"] = {str(e): r.steps_analyzed for e, r in copied.reports.items()}
    return seen


def _child(out: Path) -> None:
    import keras

    backend = keras.backend.backend()
    runs: dict[str, Any] = {row.id: functools.partial(_run_row, row) for row in ROWS if backend in row.backends}
    if backend == "tensorflow":  # last: the loop module ignores warnings, which the rows count
        runs[PYDATASET_LOADER] = _pydataset_loader
    write_results(out, runs)


PYDATASET_LOADER = "pydataset-loader"
"""The run of :func:`pydataset_loop.step_pulls` in the TensorFlow child (it needs a Keras child of its own backend,
and this one is started anyway)."""


def _pydataset_loader(folder: Path) -> dict[str, Any]:
    import pydataset_loop

    result: dict[str, Any] = pydataset_loop.step_pulls(str(folder))
    return result


# ----------------------------------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module", params=BACKENDS)
def backend_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """Every row of one backend, in one child process; returns the backend and each row's observations."""
    backend = str(request.param)
    with measured(__name__):  # the timings its tests read are made here
        return backend, run_backend_child(__file__, backend, tmp_path_factory.mktemp(f"keras_{backend}"))


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_scenario(row: Row, backend_run: tuple[str, dict]) -> None:
    backend, results = backend_run
    if backend not in row.backends:
        pytest.skip(f"{row.id}: not on the {backend} backend")
    seen = results[row.id]
    assert "error" not in seen, seen.get("error")
    assert {int(e): n for e, n in seen["reports"].items()} == row.reports
    msgs = seen["warnings"]
    assert len(msgs) == len(row.warns), msgs
    for parts in row.warns:
        assert sum(all(p in m for p in parts) for m in msgs) == 1, (parts, msgs)
    # one session folder per window (an interrupted or earlier fit's windows stay), event files in log_dir only
    earlier = {"backup-and-restore": 1, "fit-twice": len(row.reports)}.get(row.extra or "", 0)
    assert seen["sessions"] == len(row.reports) + earlier
    assert set(seen["event_dirs"]) <= {"."}
    if row.epochs is not None:
        assert seen["epochs"] == row.epochs
    if row.tb_profile is not None:
        assert (seen["tb_profiles"] > 0) == row.tb_profile
    if row.tb_copies is not None:  # the copy holds the very figures fitprof logged, or nothing
        expected = seen["step_time_ms"] if row.tb_copies else []
        assert seen["tb_copy"] == pytest.approx(expected, rel=1e-6)
    if row.copy in ("deepcopy-after", "pickle-after"):
        assert seen["copy_reports"] == seen["reports"]  # the reports survive the copy
        assert seen["copy_refit_reports"] == seen["reports"]  # and the copy profiles a new fit the same way


@pytest.mark.slow
@tolerates_load
def test_pydataset_workers_are_timed_where_the_step_pulls_its_batch(backend_run: tuple[str, dict]) -> None:
    """The loader figures of a ``PyDataset(workers=N)`` on TensorFlow, which pulls each batch inside the traced step
    (``tf.data.Dataset.from_generator``): the wait is timed around the adapter's generator, and the prediction holds
    for 2, 3 and 4 threads re-measured (tests/step_pulls.py)."""
    from step_pulls import check_step_pulls

    backend, results = backend_run
    if backend != "tensorflow":
        pytest.skip("torch: tests/test_loader_pydataset.py")
    seen = results[PYDATASET_LOADER]
    assert "error" not in seen, seen.get("error")
    check_step_pulls(seen, backend)


if __name__ == "__main__":  # the child process: every row of the backend KERAS_BACKEND names
    _child(Path(sys.argv[1]))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (TensorFlow's can take seconds)

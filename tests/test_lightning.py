"""Lightning FitProfiler: the example's outputs read back (traces, XSpace, TensorBoard HTTP, event files, CSV),
the step window, the other-profiler guard, bad arguments and exceptions."""

from __future__ import annotations

import csv
import gzip
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

import fitprof

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

import lightning_tiny  # noqa: E402
from contention import measured, tolerates_load  # noqa: E402
from fitprof.lightning import FitProfiler  # noqa: E402
from fitprof.traces import read_trace  # noqa: E402
from lightning_tiny import Boom as _Boom  # noqa: E402
from lightning_tiny import Tiny as _Tiny  # noqa: E402

EPOCHS = 2


# ------------------------------------------------------------------------------------------------ example runs
@pytest.fixture(autouse=True)
def _every_fitprof_warning_is_asserted() -> Any:
    """A fitprof warning that a test does not catch with ``pytest.warns`` fails it: a warning is part of what the
    callback does, so each test says which ones it expects (and none leaks into pytest's warning summary)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", fitprof.FitProfilerWarning)
        yield
    leaked = [str(w.message) for w in seen if issubclass(w.category, fitprof.FitProfilerWarning)]
    assert not leaked, f"fitprof warnings no test asserted: {leaked}"


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """The digits example, default and ``--slow-input``, run once each (in this process, through ``main``)."""
    import lightning_digits

    out = {}
    for name, extra in (("fast", []), ("slow", ["--slow-input"])):
        logdir = tmp_path_factory.mktemp(name)
        epochs = EPOCHS if name == "fast" else 1
        with measured(__name__):  # the timings its tests read are made here
            profiler = lightning_digits.main(["--logdir", str(logdir), "--epochs", str(epochs), *extra])
        out[name] = (logdir, profiler)
    return out


@pytest.mark.slow
def test_example_writes_a_trace_and_an_xplane_per_window(example_runs: dict[str, tuple[Path, Any]]) -> None:
    logdir, profiler = example_runs["fast"]
    traces = sorted(logdir.glob("*.pt.trace.json.gz"))
    xplanes = sorted(logdir.glob("plugins/profile/*/*.xplane.pb"))
    assert len(traces) == EPOCHS and len(xplanes) == EPOCHS
    assert len({p.parent.name for p in xplanes}) == EPOCHS  # one session folder per window
    for p in traces:
        assert p.read_bytes()[:2] == b"\x1f\x8b"
        assert "_rank0." in p.name
        data = json.loads(gzip.decompress(p.read_bytes()))
        assert data["traceEvents"]
    assert set(profiler.trace_paths) == set(profiler.xplane_paths) == set(range(EPOCHS))


@pytest.mark.slow
def test_each_step_holds_one_fetch_and_the_window_has_its_length(
    example_runs: dict[str, tuple[Path, Any]],
) -> None:
    _, profiler = example_runs["fast"]
    for epoch, path in profiler.trace_paths.items():
        report = fitprof.analyze(path)
        assert report.steps_analyzed == 5  # default profile_batch=(6, 10)
        assert report.step_time_ms == pytest.approx(profiler.reports[epoch].step_time_ms)
        table = read_trace(path)
        steps = table[table["kind"] == "step"]
        assert sorted(steps["name"]) == sorted(f"ProfilerStep#{n}" for n in range(6, 11))
        fetches = table[(table["kind"] == "input") & table["name"].str.contains("DataLoader")]
        for _, step in steps.iterrows():
            inside = (fetches["ts_us"] >= step["ts_us"]) & (fetches["ts_us"] < step["ts_us"] + step["dur_us"])
            assert int(inside.sum()) == 1, step["name"]


@pytest.mark.slow
def test_xplane_renders_in_xprof_with_steps(example_runs: dict[str, tuple[Path, Any]]) -> None:
    from xprof.convert.raw_to_tool_data import xspace_to_tool_data

    _, profiler = example_runs["fast"]
    path = str(profiler.xplane_paths[0])
    trace, _ = xspace_to_tool_data([path], "trace_viewer", {})
    names = [e.get("name", "") for e in json.loads(trace)["traceEvents"]]
    assert sum(n.startswith("ProfilerStep#") for n in names) == 5
    assert any("DataLoader" in n for n in names)
    ipa, _ = xspace_to_tool_data([path], "input_pipeline_analyzer", {})
    assert len(json.loads(ipa)[1]["rows"]) >= 3  # xprof found the steps (it may drop the first and last)


@pytest.mark.slow
def test_tensorboard_lists_the_profile_and_serves_the_trace(example_runs: dict[str, tuple[Path, Any]]) -> None:
    from tbserver import get, tensorboard, wait_for

    logdir, _ = example_runs["fast"]
    with tensorboard(logdir) as base:
        runs = wait_for(
            lambda: get(base, "/data/plugin/profile/runs"), timeout_s=90, until=lambda runs: len(runs or []) >= EPOCHS
        )
        assert len(runs) == EPOCHS, runs
        run = runs[0]
        tools = get(base, "/data/plugin/profile/run_tools", run=run)
        assert "trace_viewer" in {t.rstrip("@") for t in tools}  # "trace_viewer@": xprof's streaming viewer
        hosts = get(base, "/data/plugin/profile/hosts", run=run, tag="trace_viewer")
        host = hosts[0]["hostname"] if isinstance(hosts[0], dict) else hosts[0]
        data = get(base, "/data/plugin/profile/data", run=run, tag="trace_viewer", host=host)
        assert any(str(e.get("name", "")).startswith("ProfilerStep#") for e in data["traceEvents"])


@pytest.mark.slow
def test_scalars_reach_tensorboard_event_files_and_csv(example_runs: dict[str, tuple[Path, Any]]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir, profiler = example_runs["fast"]
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    for key in ("fitprof/step_time_ms", "fitprof/input_percent", "fitprof/htod_ms_per_step"):
        assert key in tags["scalars"], tags["scalars"]
        events = acc.Scalars(key)
        assert len(events) == EPOCHS
    logged = [e.value for e in acc.Scalars("fitprof/step_time_ms")]
    expected = [profiler.reports[e].step_time_ms for e in range(EPOCHS)]
    assert logged == pytest.approx(expected, rel=1e-5)
    assert any(t.startswith("fitprof/top_ops/") for t in tags["scalars"])
    # torch's SummaryWriter.add_text stores a text-plugin tensor under "<tag>/text_summary"
    (text_tag,) = [t for t in tags["tensors"] if t.startswith("fitprof/summary")]
    text = acc.Tensors(text_tag)[0].tensor_proto.string_val[0].decode()
    assert profiler.reports[0].verdict in text

    with open(logdir / "csv" / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("fitprof/input_percent")]
    assert len(rows) == EPOCHS
    assert float(rows[0]["fitprof/input_percent"]) == pytest.approx(profiler.reports[0].input_percent, rel=1e-5)
    # Potential speedups: logged every epoch; on a CPU the whole input wait is exposed.
    report = profiler.reports[0]
    assert float(rows[0]["fitprof/speedup_if_no_input"]) == pytest.approx(report.speedup_if_no_input, rel=1e-5)
    assert float(rows[0]["fitprof/step_time_if_no_input_ms"]) == pytest.approx(
        report.step_time_ms - report.input_ms_per_step, rel=1e-5
    )
    assert [e.value for e in acc.Scalars("fitprof/speedup_if_no_collectives")] == [1.0] * EPOCHS


@pytest.mark.slow
@tolerates_load
def test_slow_input_is_input_bound(example_runs: dict[str, tuple[Path, Any]]) -> None:
    fast = example_runs["fast"][1].reports[0]
    slow = example_runs["slow"][1].reports[0]
    assert slow.verdict == "input-bound"
    assert slow.input_percent > fast.input_percent + 30
    # The fast run's own verdict is not checked: a CPU hog pushed a run like it to 18-26% input; the contrast above
    # is what the example shows.


# --------------------------------------------------------------------------------------- small, direct trainer
def _loader(batches: int = 16) -> Any:
    return lightning_tiny.loader(batches)


def _fit(tmp_path: Path, callback: FitProfiler, module: Any = None, **kwargs: Any) -> Any:
    trainer = lightning_tiny.trainer(tmp_path, [callback], **{"limit_val_batches": 2, **kwargs})
    trainer.fit(module or _Tiny(), _loader(), _loader(4))
    return trainer


@pytest.mark.slow
def test_validation_inside_the_window_is_excluded_and_epochs_are_skipped(tmp_path: Path) -> None:
    cb = FitProfiler(profile_batch="3,7", every_n_epochs=2)
    _fit(tmp_path, cb, max_epochs=3, val_check_interval=5)  # validation after step 5: inside the window
    assert set(cb.reports) == {0, 2}
    for epoch, path in cb.trace_paths.items():
        table = read_trace(path)
        validation = (table["kind"] == "not_training") & (table["name"] == "fitprof/validation")
        assert validation.sum() == 1, epoch  # the sanity check is not in the window
        assert cb.reports[epoch].steps_analyzed == 5
        assert sorted(table.loc[table["kind"] == "step", "step_num"]) == [3, 4, 5, 6, 7]
    assert not torch.autograd._profiler_enabled()


@pytest.mark.slow
def test_an_epoch_shorter_than_the_window_flushes_what_it_has(tmp_path: Path) -> None:
    cb = FitProfiler(profile_batch=(6, 10))
    with pytest.warns(fitprof.FitProfilerWarning, match="ended after step 8"):
        _fit(tmp_path, cb, limit_train_batches=8)
    assert cb.reports[0].steps_analyzed == 3
    assert not torch.autograd._profiler_enabled()


@pytest.mark.slow
def test_first_step_one_starts_at_epoch_start(tmp_path: Path) -> None:
    cb = FitProfiler(profile_batch=1)
    _fit(tmp_path, cb, limit_train_batches=4)
    assert cb.reports[0].steps_analyzed == 1


@pytest.mark.slow
def test_lightning_pytorch_profiler_trains_to_the_end(tmp_path: Path) -> None:
    cb = FitProfiler(profile_batch=(3, 7))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _fit(tmp_path, cb, profiler="pytorch", max_epochs=2, val_check_interval=5)
    assert trainer.state.finished
    assert any("profiler='pytorch'" in str(w.message) for w in caught)
    assert cb.reports == {}
    assert not torch.autograd._profiler_enabled()


@pytest.mark.slow
def test_a_running_user_profiler_is_left_alone(tmp_path: Path) -> None:
    cb = FitProfiler(profile_batch=(3, 4))
    with torch.profiler.profile() as prof, pytest.warns(fitprof.FitProfilerWarning) as seen:
        _fit(tmp_path, cb, limit_train_batches=6)
        assert torch.autograd._profiler_enabled()  # still the user's, still running
    # when the window was to start, and at the fit's end the one "nothing was profiled" with its real reason
    messages = [str(w.message) for w in seen if issubclass(w.category, fitprof.FitProfilerWarning)]
    assert len(messages) == 2 and "already running" in messages[0], messages
    assert messages[1].startswith("fitprof: nothing was profiled: another profiler held the profiler"), messages
    assert cb.reports == {}
    assert any(e.name == "aten::linear" for e in prof.events())
    assert not torch.autograd._profiler_enabled()


@pytest.mark.slow
def test_an_exception_inside_the_window_reaches_the_user_and_stops_the_profiler(tmp_path: Path) -> None:
    cb = FitProfiler(profile_batch=(3, 8))
    with pytest.raises(_Boom, match="boom at 4"):
        _fit(tmp_path, cb, module=_Tiny(fail_at=4))
    assert not torch.autograd._profiler_enabled()
    assert not cb._window.started_here
    # The partial window is flushed and analysed: steps 3 and 4 finished, step 5 (batch_idx 4) raised.
    assert cb.reports[0].steps_analyzed == 2
    assert fitprof.analyze(cb.trace_paths[0]).steps_analyzed == 2
    assert len(list(Path(cb.trace_paths[0]).parent.glob("plugins/fitprof/*.rank0.json"))) == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"profile_batch": (0, 3)}, ValueError, r"profile_batch must be .*got \(0, 3\)"),
        ({"profile_batch": (5, 2)}, ValueError, r"got \(5, 2\)"),
        ({"profile_batch": "a,b"}, ValueError, r"got 'a,b'"),
        ({"profile_batch": 2.5}, TypeError, r"got 2.5 of type float"),
        ({"every_n_epochs": 0}, ValueError, r"every_n_epochs must be an int >= 1; got 0"),
        ({"top_k": True}, TypeError, r"top_k must be an int >= 1; got True"),
        ({"log_dir": 3}, TypeError, r"log_dir must be a str or os.PathLike; got 3"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        FitProfiler(**kwargs)


def test_good_arguments_are_normalised() -> None:
    assert FitProfiler(profile_batch="2, 4").profile_batch == (2, 4)
    assert FitProfiler(profile_batch=3).profile_batch == (3, 3)

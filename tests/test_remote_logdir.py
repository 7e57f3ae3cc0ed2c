"""URL log dirs: fsspec's ``memory://`` for Lightning and Keras-torch, TensorFlow's ``ram://`` for Keras
on TensorFlow, a ``file://`` URL, and schemes that cannot be written (warning path).

Each test runs in an empty working directory and asserts it gained no file (never a ``./memory:/`` folder),
that the staging folder is gone, and reads the files back from the remote filesystem: traces with the
project's own reader (on a local copy), report files with fsspec / gfile, scalars with tensorboard's reader
or the logger's CSV.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
import textwrap
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

import fitprof
from fitprof import _fs
from fitprof.cli import main as cli_main
from keras_child import child_env, run_result

fsspec = pytest.importorskip("fsspec")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _files(root: Path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(r, f), root) for r, _, fs in os.walk(root) for f in fs)


def _staging() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("fitprof-remote-*")}


def _memory_url() -> str:
    return f"memory://fitprof-test-{uuid.uuid4().hex[:8]}"


def _fetch(fs: Any, remote: str, dest: Path) -> Path:
    local = dest / remote.rpartition("/")[2]
    fs.get_file(remote, str(local))
    return local


# ------------------------------------------------------------------------------------------------- Lightning
torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

import lightning_tiny  # noqa: E402
from fitprof.lightning import FitProfiler as LightningProfiler  # noqa: E402


def _fit_lightning(callback: LightningProfiler, logger: Any, root: Path, epochs: int = 1) -> Any:
    trainer = lightning_tiny.trainer(root, [callback], max_epochs=epochs, logger=logger)
    trainer.fit(lightning_tiny.Tiny(), lightning_tiny.loader(12))
    return trainer


@pytest.mark.slow
def test_lightning_writes_through_fsspec_to_the_loggers_url(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    url = _memory_url()
    before = _staging()
    profiler = LightningProfiler(profile_batch=(2, 4), keep_last_windows=1)
    trainer = _fit_lightning(profiler, CSVLogger(url, name="csv"), work, epochs=2)
    assert _files(work) == []  # nothing local, no ./memory:/ folder
    assert _staging() == before  # the staging folder is deleted
    run = trainer.log_dir
    assert run == f"{url}/csv/version_0"
    fs, root = _fs.open_fsspec(run)
    names = [p[len(root) + 1 :] for p in fs.find(root)]
    traces = [n for n in names if n.endswith(".pt.trace.json.gz")]
    xplanes = [n for n in names if n.endswith(".xplane.pb")]
    reports = sorted(n for n in names if n.startswith("plugins/fitprof/") and n.endswith(".json"))
    assert len(traces) == len(xplanes) == 1  # keep_last_windows=1: epoch 0's trace removed remotely too
    assert len(reports) == 2 and all(r.endswith(".rank0.json") for r in reports)
    assert "plugins/fitprof/epochs.rank0.jsonl" in names  # the per-epoch records reach the URL too
    assert "_epoch1" in traces[0] and "_epoch1" in xplanes[0]
    copies = tmp_path_factory.mktemp("copies")
    for name in (traces[0], xplanes[0]):
        report = fitprof.analyze(_fetch(fs, f"{root}/{name}", copies))
        assert report.steps_analyzed == 3
        assert report.step_time_ms == pytest.approx(profiler.reports[1].step_time_ms, rel=0.05)
    for epoch, name in enumerate(reports):
        with fs.open(f"{root}/{name}", "r") as f:
            doc = json.load(f)
        assert doc["epoch"] == epoch
        assert doc["report"]["step_time_ms"] == pytest.approx(profiler.reports[epoch].step_time_ms)
    with fs.open(f"{root}/metrics.csv", "r") as f:
        rows = [r for r in csv.DictReader(f) if r.get("fitprof/step_time_ms")]
    assert [float(r["fitprof/step_time_ms"]) for r in rows] == pytest.approx(
        [profiler.reports[0].step_time_ms, profiler.reports[1].step_time_ms]
    )
    # The command reads the same URL.
    capsys.readouterr()
    assert cli_main(["report", url, "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [(r["run"], r["epoch"]) for r in records if r["record"] == "epoch"] == [
        ("csv/version_0", 0),
        ("csv/version_0", 1),
    ]
    records = [r for r in records if r["record"] == "window"]
    assert [(r["run"], r["epoch"]) for r in records] == [("csv/version_0", 0), ("csv/version_0", 1)]
    assert [r["step_time_ms"] for r in records] == pytest.approx([profiler.reports[e].step_time_ms for e in (0, 1)])
    assert all(r["report_file"].startswith(f"{run}/plugins/fitprof/") for r in records)
    assert records[1]["source"] == f"{run}/{traces[0]}"
    assert cli_main(["analyze", f"{run}/{traces[0]}", "--format", "json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["run"] == f"{run}/{traces[0]}" and record["steps_analyzed"] == 3
    assert cli_main(["analyze", f"{run}/{xplanes[0].rpartition('/')[0]}", "--format", "json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["run"] == f"{run}/{xplanes[0]}" and record["steps_analyzed"] == 3
    assert _files(work) == []


@pytest.mark.slow
def test_lightning_file_url_is_a_local_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work, logs = tmp_path / "work", tmp_path / "logs dir"
    work.mkdir()
    monkeypatch.chdir(work)
    url = logs.as_uri()
    assert url.startswith("file://")
    profiler = LightningProfiler(log_dir=url, profile_batch=(2, 4))
    _fit_lightning(profiler, False, work)
    fitprof.wait_for_profiles(url, timeout=120)  # a file:// URL is a local folder: the .xplane.pb comes after fit
    assert _files(work) == []
    written = _files(logs)
    assert len([n for n in written if n.endswith(".pt.trace.json.gz")]) == 1
    (xplane,) = [n for n in written if n.endswith(".xplane.pb")]
    assert fitprof.analyze(logs / xplane).steps_analyzed == 3
    assert profiler.reports[0].steps_analyzed == 3


def _lightning_warnings(url: str, work: Path) -> tuple[LightningProfiler, list[str], Path]:
    profiler = LightningProfiler(log_dir=url, profile_batch=(2, 4))
    csv_dir = work.parent / "csv"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit_lightning(profiler, CSVLogger(str(csv_dir)), work)
    return profiler, [str(w.message) for w in caught if str(w.message).startswith("fitprof")], csv_dir


@pytest.mark.slow
def test_lightning_unknown_scheme_warns_once_and_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = _staging()
    profiler, messages, csv_dir = _lightning_warnings("nosuchfs://bucket/run", work)
    assert messages == [
        "fitprof: cannot write the profile to nosuchfs://bucket/run: no filesystem is known for 'nosuchfs://' "
        "(install the fsspec filesystem for 'nosuchfs://'). The figures are still logged; no profile file is kept."
    ]
    assert _files(work) == [] and _staging() == before
    (metrics,) = csv_dir.rglob("metrics.csv")
    rows = csv.DictReader(io.StringIO(metrics.read_text()))
    # the window's rows: the fit's own line (fitprof/fit/*) has no window figure
    logged = [float(r["fitprof/step_time_ms"]) for r in rows if r.get("fitprof/step_time_ms")]
    assert logged == pytest.approx([profiler.reports[0].step_time_ms])


@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib.util").util.find_spec("s3fs") is not None, reason="s3fs is installed")
def test_lightning_missing_package_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    profiler, messages, _ = _lightning_warnings("s3://bucket/run", work)
    assert len(messages) == 1 and "s3://bucket/run" in messages[0] and "pip install s3fs" in messages[0]
    assert profiler.reports[0].steps_analyzed == 3
    assert _files(work) == []


class _ReadOnlyFS(MemoryFileSystem):
    """A filesystem that refuses every write, as a bucket without write permission does."""

    protocol = "fitprof-readonly"

    def put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied", rpath)


@pytest.mark.slow
def test_lightning_failing_remote_write_warns_once_naming_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsspec.register_implementation("fitprof-readonly", _ReadOnlyFS, clobber=True)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = _staging()
    profiler, messages, csv_dir = _lightning_warnings("fitprof-readonly://bucket/run", work)
    assert len(messages) == 1
    assert messages[0].startswith("fitprof: could not write to fitprof-readonly://bucket/run (PermissionError(")
    assert profiler.reports[0].steps_analyzed == 3
    (metrics,) = csv_dir.rglob("metrics.csv")
    assert "fitprof/step_time_ms" in metrics.read_text()
    assert _files(work) == [] and _staging() == before


# --------------------------------------------------------------------------------------------- Keras on torch
KERAS_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, warnings
    import fsspec, keras
    sys.path.insert(0, {examples!r})
    import keras_digits
    from fitprof.keras import FitProfiler
    from sklearn.datasets import load_digits

    assert keras.backend.backend() == "torch"
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None][:320]
    y = digits.target[:320]
    results = {{}}
    for url, out in {cases!r}:
        keras.utils.set_random_seed(0)
        profiler = FitProfiler(url, profile_batch=(2, 4))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            keras_digits.build_model().fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[profiler])
        copied = []
        if out:
            fs, root = fsspec.core.url_to_fs(url)
            for path in fs.find(root):
                rel = path[len(root) + 1 :]
                local = os.path.join(out, *rel.split("/"))
                os.makedirs(os.path.dirname(local), exist_ok=True)
                fs.get_file(path, local)
                copied.append(rel)
        results[url] = {{
            "reports": {{str(e): r.step_time_ms for e, r in profiler.reports.items()}},
            "copied": sorted(copied),
            "warnings": [str(w.message) for w in caught if str(w.message).startswith("fitprof")],
        }}
    print("RESULT" + json.dumps(results))
    """
)
TORCH_URL = "memory://keras-torch/run"
UNKNOWN_URL = "nosuchfs://bucket/run"


@pytest.fixture(scope="module")
def keras_torch(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Path]:
    """One Keras-on-torch child for both URLs, fitting in turn: the memory filesystem (copied back to ``out``) and
    an unknown scheme. Returns each URL's result, the child's working folder and ``out``."""
    pytest.importorskip("keras")
    pytest.importorskip("sklearn")
    tmp = tmp_path_factory.mktemp("keras_torch_remote")
    work, out = tmp / "work", tmp / "out"
    work.mkdir()
    out.mkdir()
    code = KERAS_SCRIPT.format(examples=str(EXAMPLES), cases=[(TORCH_URL, str(out)), (UNKNOWN_URL, "")])
    before = _staging()
    result, _ = run_result(["-c", code], cwd=work, env=child_env(KERAS_BACKEND="torch"))
    assert _staging() == before
    assert _files(work) == []
    return result, work, out


@pytest.mark.slow
def test_keras_torch_writes_through_fsspec(keras_torch: tuple[dict[str, Any], Path, Path]) -> None:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    results, _, out = keras_torch
    result = results[TORCH_URL]
    assert result["warnings"] == []
    copied = result["copied"]
    assert len([n for n in copied if n.endswith(".pt.trace.json.gz")]) == 2
    assert len([n for n in copied if n.endswith(".xplane.pb")]) == 2
    assert len([n for n in copied if n.startswith("plugins/fitprof/") and n.endswith(".json")]) == 2
    assert "plugins/fitprof/epochs.rank0.jsonl" in copied
    assert len([n for n in copied if ".tfevents." in n]) == 1  # scalars and profile in one run directory
    for epoch, step_ms in result["reports"].items():
        (trace,) = sorted(out.glob(f"*_epoch{epoch}.pt.trace.json.gz"))
        assert fitprof.analyze(trace).step_time_ms == pytest.approx(step_ms)
    acc = event_accumulator.EventAccumulator(str(out), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    logged = [float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors("fitprof/step_time_ms")]
    assert logged == pytest.approx([result["reports"]["0"], result["reports"]["1"]])


@pytest.mark.slow
def test_keras_torch_unknown_scheme_warns_once(keras_torch: tuple[dict[str, Any], Path, Path]) -> None:
    result = keras_torch[0][UNKNOWN_URL]
    assert len(result["warnings"]) == 1 and UNKNOWN_URL in result["warnings"][0]
    assert set(result["reports"]) == {"0", "1"}


# ----------------------------------------------------------------------------------------- Keras on TensorFlow
TF_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, warnings
    import keras, tensorflow as tf
    sys.path.insert(0, {examples!r})
    import keras_digits
    from fitprof.keras import FitProfiler
    from sklearn.datasets import load_digits
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    assert keras.backend.backend() == "tensorflow"
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None][:320]
    y = digits.target[:320]
    results = {{}}
    for url in {urls!r}:
        keras.utils.set_random_seed(0)
        profiler = FitProfiler(url, profile_batch=(2, 4))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            keras_digits.build_model().fit(x, y, batch_size=32, epochs=2, verbose=2, callbacks=[profiler])
        files, logged = [], []
        if url.startswith("ram://"):
            for folder, _, names in tf.io.gfile.walk(url):
                for name in names:
                    rel = (folder + "/" + name)[len(url) + 1 :]
                    files.append(rel)
                    if rel.endswith(".xplane.pb"):
                        local = os.path.join({out!r}, rel.replace("/", "__"))
                        tf.io.gfile.copy(url + "/" + rel, local)
            acc = event_accumulator.EventAccumulator(url, size_guidance={{event_accumulator.TENSORS: 0}})
            acc.Reload()
            logged = [float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors("fitprof/step_time_ms")]
        results[url] = {{
            "reports": {{str(e): r.step_time_ms for e, r in profiler.reports.items()}},
            "files": sorted(files),
            "logged": logged,
            "warnings": [str(w.message) for w in caught if str(w.message).startswith("fitprof")],
        }}
    print("RESULT" + json.dumps(results))
    """
)
RAM_URL = "ram://fitprof-keras/run"


@pytest.fixture(scope="module")
def keras_tf(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    """One Keras-on-TensorFlow child for both URLs, fitting in turn: TensorFlow's ``ram://`` filesystem (each
    ``.xplane.pb`` copied to ``out``) and an unknown scheme. Returns each URL's result, ``out`` and the stdout."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("sklearn")
    tmp = tmp_path_factory.mktemp("keras_tf_remote")
    work, out = tmp / "work", tmp / "out"
    work.mkdir()
    out.mkdir()
    before = _staging()
    code = TF_SCRIPT.format(examples=str(EXAMPLES), urls=[RAM_URL, UNKNOWN_URL], out=str(out))
    result, proc = run_result(["-c", code], cwd=work, env=child_env(KERAS_BACKEND="tensorflow"))
    assert _staging() == before
    assert _files(work) == []
    return result, out, proc.stdout


@pytest.mark.slow
def test_keras_tensorflow_writes_through_gfile(keras_tf: tuple[dict[str, Any], Path, str]) -> None:
    results, out, stdout = keras_tf
    result = results[RAM_URL]
    assert result["warnings"] == []
    files = result["files"]
    xplanes = [n for n in files if n.endswith(".xplane.pb")]
    assert len(xplanes) == 2 and all(n.startswith("plugins/profile/") for n in xplanes)
    assert len([n for n in files if n.startswith("plugins/fitprof/") and n.endswith(".json")]) == 2
    assert "plugins/fitprof/epochs.rank0.jsonl" in files
    assert len([n for n in files if ".tfevents." in n and "/" not in n]) == 1  # one run directory
    for epoch, step_ms in result["reports"].items():
        (copy,) = [p for p in out.iterdir() if f"_epoch{epoch}__" in p.name]
        assert fitprof.analyze(copy).step_time_ms == pytest.approx(step_ms)
    assert result["logged"] == pytest.approx([result["reports"]["0"], result["reports"]["1"]])
    # TensorFlow names only its temporary folder ("Collecting XSpace to repository: ..."): the headline names the URL
    heads = [line for line in stdout.splitlines() if line.startswith("fitprof epoch")]
    for name in xplanes:
        epoch = name.split("_epoch")[1][0]
        assert any(
            h.startswith(f"fitprof epoch {epoch}: ") and f"; profile in {RAM_URL}/plugins/profile/" in h for h in heads
        )


@pytest.mark.slow
def test_keras_tensorflow_unknown_scheme_warns_once(keras_tf: tuple[dict[str, Any], Path, str]) -> None:
    result = keras_tf[0][UNKNOWN_URL]
    assert len(result["warnings"]) == 1 and UNKNOWN_URL in result["warnings"][0]
    assert set(result["reports"]) == {"0", "1"}


# ---------------------------------------------------------------------------------------------------- the core
@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("s3://bucket/a\\b", "s3://bucket/a\\b"),  # a URL is kept as it is: no backslash or ~ rewriting
        ("gs://bucket/~run", "gs://bucket/~run"),
        ("file:///tmp/logs%20dir", "/tmp/logs dir"),
    ],
)
def test_normalize_log_dir_keeps_urls(given: str, kept: str) -> None:
    from fitprof.fit.config import normalize_log_dir

    assert normalize_log_dir(given) == kept


def test_windows_drive_is_not_a_scheme() -> None:
    assert _fs.scheme("C:\\logs") is None and _fs.scheme("C://logs") is None
    assert _fs.scheme("S3://b") == "s3" and _fs.is_remote("memory://x") and not _fs.is_remote("file:///x")


def test_report_follows_folder_links_as_tensorboard_does(tmp_path: Path, capsys: Any) -> None:
    """A run reached through a symbolic link is a run for TensorBoard (its walk follows links), so for fitprof."""
    from tensorboard.backend.event_processing import io_wrapper

    from fitprof.report_files import write_report_file
    from shared_fixtures import LIGHTNING_CPU

    real = tmp_path / "elsewhere" / "run"
    write_report_file(real, session="s", epoch=0, report=fitprof.analyze(LIGHTNING_CPU), trace=LIGHTNING_CPU)
    (real / "events.out.tfevents.1.host").write_bytes(b"")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "linked").symlink_to(real, target_is_directory=True)
    tb_runs = {os.path.relpath(d, logs) for d in io_wrapper.GetLogdirSubdirectories(str(logs))}
    assert tb_runs == {"linked"}
    (real / "loop").symlink_to(real.parent, target_is_directory=True)  # fitprof does not walk a loop forever
    assert cli_main(["report", str(logs), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert {r["run"] for r in records} == tb_runs


def test_cli_names_the_url_and_the_missing_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli_main(["report", "nosuchfs://bucket/logs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "fitprof: error: nosuchfs://bucket/logs: no filesystem is known for 'nosuchfs://' (install the fsspec "
        "filesystem for 'nosuchfs://')"
    ]
    missing = _memory_url() + "/run/x.xplane.pb"
    empty = _memory_url() + "/run/session"
    fsspec.filesystem("memory").makedirs(empty.removeprefix("memory://"), exist_ok=True)
    fsspec.filesystem("memory").pipe_file(empty.removeprefix("memory://") + "/notes.txt", b"x")
    assert cli_main(["analyze", missing, empty]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"fitprof: error: {missing}: no such file or folder",
        f"fitprof: error: {empty}: no trace file in this folder (analyze takes trace files, a "
        "plugins/profile/<session> folder of .xplane.pb, or a folder of .pt.trace.json[.gz] such as "
        "torch.profiler.tensorboard_trace_handler writes; for a log folder of fitprof runs use 'fitprof report')",
    ]
    assert _files(tmp_path) == []

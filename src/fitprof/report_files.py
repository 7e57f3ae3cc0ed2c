"""The per-window report file, ``<run>/plugins/fitprof/<session>.rank<r>.json``, and the per-epoch file,
``<run>/plugins/fitprof/epochs.rank<r>.jsonl``: written by the callbacks, found and read back by ``fitprof report``.

The per-epoch file holds one JSON line per epoch and rank (appended at each epoch's end, profiled or not): the
epoch, the rank, the framework, the time it was written, the epoch's ``fitprof/epoch/*`` figures (where its wall time
went, :mod:`fitprof.fit.epoch_parts`), its verdict lines, its clean step times (``step_ms``, at most
:data:`MAX_STEP_TIMES`) and the setup the run was measured on (``setup``: backend, parameter count, model structure,
precision, device). A later fit into the same run appends to it: its
epochs start again from 0.

Each callback writes one per window and rank. It holds the epoch, the framework, the rank, the session, the
trace the figures came from (relative to the run directory) and the full
:class:`~fitprof.analysis.BottleneckReport` as a dict, so ``fitprof report`` prints exactly what was logged.
It lives outside ``plugins/profile/`` so that removing an old window's profile (``keep_last_windows``) never
leaves an empty session in the Profile tab, and the report of every window stays.

Files written before the 0.1 renames are still read: ``htod_gbps`` is read as ``htod_gb_per_s``, and the
framework values ``"torch"`` / ``"lightning"`` as ``"pytorch"``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

from fitprof._atomic import write_text
from fitprof._session import REPORTS_DIR, check_session, report_file_name
from fitprof.analysis import FRAMEWORKS, AllocStat, BottleneckReport, OpStat

SCHEMA = 1
MAX_REPORT_BYTES = 4_000_000
"""Bound on a report file's size when it is read: one window's figures take a few KB."""
_Stat = TypeVar("_Stat", OpStat, AllocStat)
_LEGACY_KEYS = {"htod_gbps": "htod_gb_per_s"}
_LEGACY_FRAMEWORKS = {"torch": "pytorch", "lightning": "pytorch"}
_FLOAT_FIELDS = frozenset(f.name for f in dataclasses.fields(BottleneckReport) if f.type == "float")
_REQUIRED_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(BottleneckReport)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)


class ReportFileError(ValueError):
    """A file that is not a readable fitprof report file; the message names it and says what is wrong."""


@dataclasses.dataclass(frozen=True)
class ReportFile:
    """One report file read back.

    Attributes:
        path: the file.
        run: the run directory it belongs to (``<run>/plugins/fitprof/<file>``).
        epoch: the 0-based epoch of the window.
        rank: the global rank that wrote it (None when the file does not say).
        session: the session folder name of the window ("" when the file does not say).
        trace: the trace the figures came from, as a path (the report's ``source`` when the file names none).
        report: the report, as the callback logged it.
        written: when the file was written (seconds since the Unix epoch; NaN for files written before fitprof
            recorded it): the order of windows, also within one second, where session names cannot tell it.
    """

    path: Path
    run: Path
    epoch: int
    rank: int | None
    session: str
    trace: str
    report: BottleneckReport
    written: float = math.nan


def clean_json(value: Any) -> Any:
    """NaN/inf -> None, so the file is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


def report_path(run_dir: str | os.PathLike[str], session: str, rank: int = 0) -> Path:
    """``<run_dir>/plugins/fitprof/<session>.rank<rank>.json``.

    Raises:
        ValueError: if ``session`` is not a plain folder name (:func:`fitprof._session.check_session`).
    """
    return Path(run_dir).joinpath(*REPORTS_DIR, report_file_name(session, rank))


def write_report_file(
    run_dir: str | os.PathLike[str],
    *,
    session: str,
    epoch: int,
    report: BottleneckReport,
    trace: str | os.PathLike[str],
    rank: int = 0,
) -> Path:
    """Write the report of one window and rank; returns its path (see :func:`report_path`).

    Raises:
        OSError: if the file cannot be written.
        ValueError: if ``session`` is not a plain folder name (:func:`fitprof._session.check_session`).
    """
    path = report_path(run_dir, session, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        **_head(epoch, rank),
        "session": session,
        "framework": report.framework,
        "trace": Path(os.path.relpath(trace, run_dir)).as_posix(),
        "report": clean_json(report.to_dict()),
        "written": time.time(),
    }
    write_text(path, json.dumps(record, indent=1))  # a killed run leaves the whole file or none
    return path


def is_report_file(rel: str) -> bool:
    """Whether the ``/``-separated path ``rel`` names a report file (``.../plugins/fitprof/<name>.json``)."""
    parts = rel.split("/")
    return len(parts) >= 3 and tuple(parts[-3:-1]) == REPORTS_DIR and parts[-1].endswith(".json")


def find_report_files(logdir: str | os.PathLike[str]) -> list[Path]:
    """Every ``<run>/plugins/fitprof/*.json`` report file below ``logdir`` (any depth), sorted.

    ``logdir`` is walked as TensorBoard walks a log dir to find its runs (``tf.io.gfile.walk``: every folder at
    any depth, symbolic links to folders followed), so every run TensorBoard lists is found; a link back to
    one of its own parent folders is not entered again.
    """
    return _find(logdir, is_report_file)


def _find(logdir: str | os.PathLike[str], wanted: Callable[[str], bool]) -> list[Path]:
    found = []
    for folder, dirs, names in os.walk(logdir, followlinks=True):
        here = Path(folder)
        real = os.path.realpath(here)
        if any(os.path.realpath(parent) == real for parent in list(here.parents)[: len(here.parts) - 1]):
            dirs[:] = []  # a symbolic link loop
            continue
        found += [here / name for name in names if wanted(f"{here.parent.name}/{here.name}/{name}")]
    return sorted(p for p in found if p.is_file())


def read_report_file(path: str | os.PathLike[str], *, logdir: str | os.PathLike[str] | None = None) -> ReportFile:
    """Read one report file back, with bounds: it may have been damaged or tampered with.

    A report file that is itself a symbolic link must point inside ``logdir`` (default: its run folder); folders
    reached through links count as inside, as TensorBoard's log-dir walk lists them. The file must be at most
    :data:`MAX_REPORT_BYTES`; its ``session``, when present, must be a plain name
    (:func:`fitprof._session.check_session`). Its ``trace`` is joined to the run folder only where the result stays
    inside ``logdir`` (the path is computed, never opened); else the report's own ``source`` stands for it (a
    window whose trace went to a temporary folder records such a path; so may a tampered file).

    Raises:
        ReportFileError: if it is not UTF-8 JSON holding a fitprof report, is too big, nests deeper than the
            parser's limit or leads outside ``logdir`` (each message names the file).
        OSError: if it cannot be read.
    """
    path = Path(path)
    run, root, text = _read_inside(
        path, logdir, MAX_REPORT_BYTES, "not a fitprof report", "a report file holds one window's figures, a few KB"
    )
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ReportFileError(f"{path}: not a fitprof report (not valid JSON: {err})") from None
    except RecursionError:
        raise ReportFileError(f"{path}: not a fitprof report (JSON nested deeper than the parser's limit)") from None
    if not isinstance(doc, dict):
        raise ReportFileError(f"{path}: not a fitprof report (not a JSON object)")
    if not isinstance(doc.get("report"), dict):
        raise ReportFileError(f"{path}: not a fitprof report (no 'report' object)")
    session = doc.get("session")
    if session is not None:
        try:
            check_session(session)
        except ValueError as err:
            raise ReportFileError(f"{path}: not a fitprof report ({err})") from None
    data_ = dict(doc["report"])
    if doc.get("framework"):
        data_["framework"] = doc["framework"]
    report = report_from_dict(data_, path)
    epoch, rank = doc.get("epoch"), doc.get("rank", report.rank)
    if not isinstance(epoch, int) or not (rank is None or isinstance(rank, int)):
        raise ReportFileError(f"{path}: not a fitprof report ('epoch' or 'rank' is not an integer)")
    source = trace_inside(run, doc.get("trace"), root) or report.source
    written = doc.get("written")
    written = float(written) if isinstance(written, (int, float)) and not isinstance(written, bool) else math.nan
    return ReportFile(path, run, epoch, rank, session if isinstance(session, str) else "", source, report, written)


def trace_inside(run_dir: Path, trace: object, root: str | os.PathLike[str]) -> str | None:
    """A report's ``trace`` (relative to its run folder) as a path, if it stays inside ``root``; else ``None``.

    The path is only computed, never opened: an absolute path, or one whose ``..`` leave ``root``, gives ``None``.
    """
    if not isinstance(trace, str) or not trace or "\0" in trace or os.path.isabs(trace):
        return None
    if ".." in Path(trace).parts:
        return None
    joined = os.path.normpath(run_dir / trace)
    # Without `..` the path stays inside the run folder; the run folder must lie inside root by its own words (it
    # was found by walking root, following folder links as TensorBoard does).
    top = os.path.normpath(os.path.abspath(root))
    if not (os.path.commonpath([os.path.abspath(joined), top]) == top or _walked_into(run_dir, root)):
        return None
    return joined


def _walked_into(run_dir: Path, root: str | os.PathLike[str]) -> bool:
    """Whether ``run_dir`` lies inside ``root`` once both are resolved, or was reached from it through links."""
    real_root = os.path.realpath(root)
    return os.path.commonpath([os.path.realpath(run_dir), real_root]) == real_root or os.path.abspath(
        run_dir
    ).startswith(os.path.abspath(root) + os.sep)


def report_from_dict(data: dict[str, Any], path: str | os.PathLike[str]) -> BottleneckReport:
    """Rebuild a :class:`BottleneckReport` from its ``to_dict()`` (``null`` -> NaN; unknown keys ignored; the
    old names of :data:`_LEGACY_KEYS` and framework values accepted).

    Raises:
        ReportFileError: naming ``path`` when a field is missing or has the wrong type.
    """
    data = {_LEGACY_KEYS.get(k, k): v for k, v in data.items()}
    missing = [name for name in _REQUIRED_FIELDS if name not in data]
    if missing:
        raise ReportFileError(f"{path}: not a fitprof report (the report lacks {', '.join(missing)})")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(BottleneckReport):
        if f.name not in data:
            continue
        value = data[f.name]
        if f.name in _FLOAT_FIELDS:
            value = _float(value, f.name, path)
        kwargs[f.name] = value
    framework = _LEGACY_FRAMEWORKS.get(str(kwargs["framework"]), kwargs["framework"])
    if framework not in FRAMEWORKS:
        raise ReportFileError(f"{path}: not a fitprof report ('framework' is {framework!r}; allowed: {FRAMEWORKS})")
    kwargs["framework"] = framework
    kwargs["top_ops"] = _operators(kwargs.get("top_ops"), "top_ops", OpStat, path)
    kwargs["top_alloc_ops"] = _operators(kwargs.get("top_alloc_ops", []), "top_alloc_ops", AllocStat, path)
    if not isinstance(kwargs.get("advice"), list) or not isinstance(kwargs.get("steps_analyzed"), int):
        raise ReportFileError(f"{path}: not a fitprof report ('advice' or 'steps_analyzed' has the wrong type)")
    return BottleneckReport(**kwargs)


def _head(epoch: int, rank: int) -> dict[str, Any]:
    """The fields every record fitprof writes starts with: the file format's version, the epoch and the rank."""
    return {"schema": SCHEMA, "epoch": int(epoch), "rank": int(rank)}


@overload
def _read_inside(
    path: Path, logdir: str | os.PathLike[str] | None, limit: int, refusal: str, typical: str
) -> tuple[Path, Path, str]: ...
@overload
def _read_inside(
    path: Path, logdir: str | os.PathLike[str] | None, limit: int, refusal: str, typical: str, *, decode: Literal[False]
) -> tuple[Path, Path, bytes]: ...
def _read_inside(
    path: Path, logdir: str | os.PathLike[str] | None, limit: int, refusal: str, typical: str, *, decode: bool = True
) -> tuple[Path, Path, str | bytes]:
    """The run folder of the file ``path`` (three levels up), the log folder (``logdir``, default that run folder,
    resolved) and the file's text. A folder reached through a link is part of the log folder, as TensorBoard's
    walk has it; a file that is itself a link may only point inside it.

    Raises:
        ReportFileError: for a link outside the log folder; ``"{path}: {refusal} (...)"`` for more than ``limit``
            bytes (no more than ``limit + 1`` are read; ``typical`` says what such a file usually holds) or for
            text that is not UTF-8 (``decode`` False: the bytes are returned undecoded).
        OSError: if it cannot be read.
    """
    run = path.parent.parent.parent
    root = Path(run if logdir is None else logdir).resolve()
    real = path.resolve()
    if path.is_symlink() and not real.is_relative_to(root):
        raise ReportFileError(f"{path}: a link to {real}, outside the log folder {root}; not read")
    with open(real, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ReportFileError(f"{path}: {refusal} (bigger than {limit / 1e6:g} MB; {typical})")
    if not decode:
        return run, root, data
    try:
        return run, root, data.decode("utf-8")
    except UnicodeDecodeError:
        raise ReportFileError(f"{path}: {refusal} (not UTF-8 text)") from None


def _operators(ops: Any, key: str, stat: type[_Stat], path: str | os.PathLike[str]) -> list[_Stat]:
    """``ops``, the report's list ``key`` of operator dicts, as ``stat`` records: the name, then each of the
    record's number fields in order, read with :func:`_float`; :class:`ReportFileError` for anything else."""
    if not isinstance(ops, list) or not all(isinstance(o, dict) and "name" in o for o in ops):
        raise ReportFileError(f"{path}: not a fitprof report ({key!r} is not a list of operators)")
    numbers = [f.name for f in dataclasses.fields(stat)[1:]]
    return [stat(str(o["name"]), *(_float(o.get(n), n, path) for n in numbers)) for o in ops]


def _float(value: Any, name: str, path: str | os.PathLike[str]) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportFileError(f"{path}: not a fitprof report ({name!r} is {value!r}, not a number)")
    return float(value)


# ---------------------------------------------------------------------------------------------- epoch files
EPOCH_FILE_PREFIX = "epochs.rank"
EPOCH_FILE_SUFFIX = ".jsonl"
MAX_EPOCH_FILE_BYTES = 32_000_000
"""Bound on a per-epoch file's size when it is read: one epoch's line takes about 1 KB."""


@dataclasses.dataclass(frozen=True)
class EpochRecord:
    """One line of a per-epoch file read back.

    Attributes:
        run: the run directory it belongs to.
        epoch: the 0-based epoch.
        rank: the global rank that wrote it.
        framework: ``"keras"`` or ``"lightning"`` as written ("" when the line does not say).
        fit: 1 for the file's first fit, 2 for the next (a line whose epoch is not after the previous line's
            starts a new fit).
        figures: the ``fitprof/epoch/*`` figures (NaN for ``null``).
        verdicts: the epoch's verdict lines.
        written: when the line was written (seconds since the Unix epoch; NaN when unknown).
        step_ms: the epoch's clean step times (ms), in order, at most :data:`MAX_STEP_TIMES` of them (an evenly
            spaced pick of the steps when the epoch timed more); empty in files written before they were kept, or
            when the line's list is not one of numbers.
        setup: what the run was measured on, as the callback found it (:data:`SETUP_FIELDS`: parameter count,
            model structure, precision, device, backend; values as text); empty in older files.
    """

    run: Path
    epoch: int
    rank: int
    framework: str
    fit: int
    figures: dict[str, float]
    verdicts: list[str]
    written: float = math.nan
    step_ms: tuple[float, ...] = ()
    setup: dict[str, str] = dataclasses.field(default_factory=dict)


MAX_STEP_TIMES = 200
"""Step times an epoch's line keeps at most (about 8 bytes each): more are picked evenly spaced from the epoch's."""

SETUP_FIELDS = ("backend", "parameters", "structure", "precision", "device")
"""The setup keys an epoch's line may hold (``"setup"``), each compared by ``fitprof compare``."""


def step_times_kept(step_ms: Sequence[float], cap: int = MAX_STEP_TIMES) -> list[float]:
    """``step_ms`` as an epoch's line keeps them: every one when there are at most ``cap``, else ``cap`` of them at
    evenly spaced positions (the first and the last included), each rounded to the microsecond (ms, 3 decimals)."""
    n = len(step_ms)
    if n > cap > 1:
        picked = [step_ms[round(i * (n - 1) / (cap - 1))] for i in range(cap)]
    else:
        picked = list(step_ms)
    return [round(float(v), 3) for v in picked if math.isfinite(v)]


def epoch_file_path(run_dir: str | os.PathLike[str], rank: int = 0) -> Path:
    """``<run_dir>/plugins/fitprof/epochs.rank<rank>.jsonl``."""
    return Path(run_dir).joinpath(*REPORTS_DIR, f"{EPOCH_FILE_PREFIX}{int(rank)}{EPOCH_FILE_SUFFIX}")


def append_epoch_record(
    run_dir: str | os.PathLike[str],
    *,
    epoch: int,
    rank: int,
    framework: str,
    figures: dict[str, float],
    verdicts: list[str],
    kind: str = "epoch",
    step_ms: Sequence[float] = (),
    setup: Mapping[str, Any] | None = None,
) -> Path:
    """Append one epoch's line to the rank's per-epoch file (created with its folder); returns its path.

    ``kind="fit"`` writes the fit's line instead (``epoch``: its last epoch, ``figures``: the ``fitprof/fit/*``
    figures), once at the fit's end; :func:`read_epoch_file` hands it out apart from the epochs.

    ``step_ms``: the epoch's clean step times (ms), kept as :func:`step_times_kept` keeps them (``"step_ms"``, left
    out when empty). ``setup``: what the run was measured on (:data:`SETUP_FIELDS`; ``"setup"``, left out when
    empty; other keys and empty values are dropped).

    The line is appended whole or not at all: a write that fails part way (a full disk) is cut back off, and a file
    this call created is removed again, so the file never holds a torn line that the next epoch's line would be
    joined to. A file whose last line was torn by a killed writer gets a line break first.

    Raises:
        OSError: if the file cannot be written.
    """
    path = epoch_file_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {
        **_head(epoch, rank),
        "framework": framework,
        "written": time.time(),
        "figures": clean_json({str(k): float(v) for k, v in figures.items()}),
        "verdicts": [str(v) for v in verdicts],
    }
    if step_ms:
        line["step_ms"] = step_times_kept(step_ms)
    kept = {k: str(v) for k, v in (setup or {}).items() if k in SETUP_FIELDS and v is not None and str(v) != ""}
    if kept:
        line["setup"] = kept
    if kind != "epoch":
        line["kind"] = str(kind)
    data = (json.dumps(line, allow_nan=False) + "\n").encode("utf-8")
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.fstat(fd).st_size
        if start and os.pread(fd, 1, start - 1) != b"\n":
            data = b"\n" + data
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            os.ftruncate(fd, start)
            if created and start == 0:
                path.unlink(missing_ok=True)
            raise
    finally:
        os.close(fd)
    return path


def is_epoch_file(rel: str) -> bool:
    """Whether the ``/``-separated path ``rel`` names a per-epoch file (``.../plugins/fitprof/epochs.rank<r>.jsonl``)."""
    parts = rel.split("/")
    name = parts[-1]
    return (
        len(parts) >= 3
        and tuple(parts[-3:-1]) == REPORTS_DIR
        and name.startswith(EPOCH_FILE_PREFIX)
        and name.endswith(EPOCH_FILE_SUFFIX)
        and name[len(EPOCH_FILE_PREFIX) : -len(EPOCH_FILE_SUFFIX)].isdigit()
    )


def find_epoch_files(logdir: str | os.PathLike[str]) -> list[Path]:
    """Every per-epoch file below ``logdir`` (any depth, walked as :func:`find_report_files` walks it), sorted."""
    return _find(logdir, is_epoch_file)


def read_epoch_file(
    path: str | os.PathLike[str],
    *,
    logdir: str | os.PathLike[str] | None = None,
    warn: Callable[[str], None] | None = None,
    fits: list[EpochRecord] | None = None,
) -> list[EpochRecord]:
    """Read one per-epoch file back (the epochs' lines; each fit's own line, written at its end, is appended to
    ``fits`` when given, numbered as the fit whose epochs came before it), with bounds (at most :data:`MAX_EPOCH_FILE_BYTES`; a link only inside
    ``logdir``, default its run folder, as :func:`read_report_file`).

    Every line that is a whole epoch record is kept. A line that is not (a last line cut mid-write by a killed run
    or a full disk, or a damaged line) is left out, and ``warn`` is called once for the file with one line that
    names it and says what was left out (default: :func:`warnings.warn`).

    Raises:
        ReportFileError: naming the file and the line when it is too big, or when no line of it is a fitprof epoch
            record while some line holds something else.
        OSError: if it cannot be read.
    """
    path = Path(path)
    run, _, data = _read_inside(
        path, logdir, MAX_EPOCH_FILE_BYTES, "not a fitprof epoch file", "a line takes about 1 KB", decode=False
    )
    out: list[EpochRecord] = []
    bad: list[tuple[int, str]] = []  # (line number, why it was left out)
    fit, last = 1, None
    lines = data.split(b"\n")
    torn = lines[-1].strip() != b""  # the last line has no line break: the writer stopped in it
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            rec = _epoch_record(raw, run)
        except ReportFileError as err:
            bad.append((number, str(err)))
            continue
        if b'"kind": "fit"' in raw:
            if fits is not None:
                fits.append(dataclasses.replace(rec, fit=fit))
            continue
        if last is not None and rec.epoch <= last:
            fit += 1
        last = rec.epoch
        out.append(dataclasses.replace(rec, fit=fit))
    if not bad:
        return out
    first, why = bad[0]
    if not out:
        raise ReportFileError(f"{path}, line {first}: {why}")
    cut = torn and bad[-1][0] == len(lines)
    if cut and len(bad) == 1:
        note = (
            f"{path}: its last line (line {first}, {len(lines[-1]):,} bytes) was cut while it was written (a run "
            f"stopped or a full disk); the {len(out)} whole line(s) before it are read"
        )
    else:
        note = (
            f"{path}: {len(bad)} line(s) are not whole fitprof epoch records and were left out (line {first}: {why}"
            f"{'; the last line was cut while it was written' if cut else ''}); the {len(out)} whole line(s) are read"
        )
    (warn or _warn)(note)
    return out


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def _epoch_record(raw: bytes, run: Path) -> EpochRecord:
    """One line of a per-epoch file as a record (``fit`` 1: the caller numbers the fits).

    Raises:
        ReportFileError: saying why the line is not a fitprof epoch record (without the file and line, which the
            caller names).
    """
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ReportFileError("not a fitprof epoch record (not UTF-8 text)") from None
    except (json.JSONDecodeError, RecursionError) as err:
        raise ReportFileError(f"not a fitprof epoch record (not valid JSON: {err})") from None
    epoch, rank = (doc.get("epoch"), doc.get("rank")) if isinstance(doc, dict) else (None, None)
    if not (isinstance(epoch, int) and isinstance(rank, int)) or isinstance(epoch, bool):
        raise ReportFileError("not a fitprof epoch record ('epoch' or 'rank' is not an integer)")
    figures = doc.get("figures")
    verdicts = doc.get("verdicts", [])
    if not isinstance(figures, dict) or not isinstance(verdicts, list):
        raise ReportFileError("not a fitprof epoch record (no 'figures' object or 'verdicts' list)")
    values = {str(k): _epoch_float(v, str(k)) for k, v in figures.items()}
    written = doc.get("written")
    written = float(written) if isinstance(written, (int, float)) and not isinstance(written, bool) else math.nan
    framework = doc.get("framework")
    return EpochRecord(
        run,
        epoch,
        rank,
        framework if isinstance(framework, str) else "",
        1,
        values,
        [str(v) for v in verdicts],
        written,
        _step_times(doc.get("step_ms")),
        _setup(doc.get("setup")),
    )


def _step_times(value: Any) -> tuple[float, ...]:
    """A line's ``step_ms``: finite non-negative numbers only; anything else (an older line, a damaged list) is no
    step times, and the line's figures are read all the same."""
    if not isinstance(value, list):
        return ()
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return ()
    return tuple(float(v) for v in value if math.isfinite(v) and v >= 0)


def _setup(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {k: str(v) for k, v in value.items() if k in SETUP_FIELDS and isinstance(v, (str, int, float))}


def _epoch_float(value: Any, name: str) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportFileError(f"not a fitprof epoch record ({name!r} is {value!r}, not a number)")
    return float(value)

"""Named baselines for ``fitprof compare --against NAME``: a store (a local folder or a URL, through the same
fsspec layer as the log folders, :mod:`fitprof._fs`) holding one folder per name.

``<store>/<name>/`` holds a copy of what ``fitprof compare`` reads from a run: its report files, its per-epoch
files and its TensorBoard event files (not its traces), with their paths kept, plus:

* ``baseline.json``: the name, the run it was saved from, when (seconds since the Unix epoch);
* ``decisions.jsonl``: one JSON line per decision (``fitprof compare --accept --reason``): when, the candidate
  accepted, the reason, the comparison's status and headline, and the figures that regressed. An accepted
  candidate becomes the baseline under that name, so the next comparison is against it, and prints the last
  decision.

Framework-free.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from fitprof import _fs
from fitprof.report_files import is_epoch_file, is_report_file

DEFAULT_STORE = ".fitprof/baselines"
"""The store when neither ``--store`` nor :data:`STORE_ENV` names one (relative to the working folder)."""
STORE_ENV = "FITPROF_BASELINE_STORE"
"""The environment variable naming the store (a folder or a URL)."""
META = "baseline.json"
DECISIONS = "decisions.jsonl"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_EVENTS = "events.out.tfevents."


class BaselineError(ValueError):
    """A baseline that cannot be saved or found; the message names it and says what is wrong."""


def store_location(store: str | None = None) -> str:
    """The store to use: ``store``, else the :data:`STORE_ENV` variable, else :data:`DEFAULT_STORE`."""
    return store or os.environ.get(STORE_ENV) or DEFAULT_STORE


def check_name(name: str) -> str:
    """``name`` when it is a plain name (letters, digits, ``.``, ``_``, ``-``; at most 128).

    Raises:
        BaselineError: it is not.
    """
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise BaselineError(
            f"baseline name {name!r}: use letters, digits, '.', '_' and '-' (at most 128, not starting with one of "
            "the last three)"
        )
    return name


def wanted(rel: str) -> bool:
    """Whether the ``/``-separated path ``rel`` of a run is kept in a baseline: a report file, a per-epoch file or
    a TensorBoard event file."""
    return is_report_file(rel) or is_epoch_file(rel) or rel.rpartition("/")[2].startswith(_EVENTS)


def save(
    name: str,
    run: str | os.PathLike[str],
    store: str | None = None,
    *,
    decisions: list[dict[str, Any]] | None = None,
    source: str | None = None,
) -> tuple[str, int]:
    """Save the local run directory ``run`` as the baseline ``name`` in ``store``, replacing what that name held.

    Args:
        name: the baseline's name (:func:`check_name`).
        run: a local run directory (or a folder of runs).
        store: the store (:func:`store_location`).
        decisions: the decision lines the saved baseline carries (``decisions.jsonl``); none by default.
        source: the run as the user named it (a URL), for ``baseline.json``; default ``run``.

    Returns:
        Where the baseline now is (``<store>/<name>``) and how many files were copied.

    Raises:
        BaselineError: a bad name, or no report file below ``run``.
        OSError: the store cannot be written (:class:`fitprof._fs.FsUnavailable` for a URL without its package).
    """
    check_name(name)
    root = Path(run)
    files = [
        (p.relative_to(root).as_posix(), p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and wanted(p.relative_to(root).as_posix())
    ]
    if not any(is_report_file(rel) for rel, _ in files):
        raise BaselineError(
            f"{source or os.fspath(run)}: no fitprof report file below this folder (a run directory holds "
            "plugins/fitprof/<session>.rank<r>.json); a baseline is a run directory"
        )
    with tempfile.TemporaryDirectory(prefix="fitprof-baseline-") as tmp:
        meta = Path(tmp, META)
        meta.write_text(json.dumps({"name": name, "run": source or os.fspath(run), "saved": time.time()}) + "\n")
        extra = [(META, meta)]
        if decisions:
            lines = Path(tmp, DECISIONS)
            lines.write_text("".join(json.dumps(d, allow_nan=False) + "\n" for d in decisions))
            extra.append((DECISIONS, lines))
        where = _fs.join(store_location(store), name)
        if _fs.is_remote(where):
            target = _fs.FsspecStore(where)
            fs, path = _fs.open_fsspec(where)
            if fs.exists(path):
                fs.rm(path, recursive=True)
            for rel, local in [*files, *extra]:
                target.put(local, rel)
        else:
            folder = Path(_fs.local_path(where))
            staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=_mkdir(folder.parent)))
            for rel, local in [*files, *extra]:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(local, staging / rel)
            if folder.exists():  # replaced whole: the old run's files never mix with the new one's
                shutil.rmtree(folder)
            staging.rename(folder)
    return where, len(files)


def _mkdir(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def fetch(name: str, store: str | None, dest: Path) -> Path:
    """The baseline ``name`` as a local folder: in a local store, its own folder; from a URL, copied into ``dest``.

    Raises:
        BaselineError: a bad name, or no such baseline in the store (the message names the store).
        OSError, ValueError: the store cannot be read.
    """
    check_name(name)
    where = _fs.join(store_location(store), name)
    if not _fs.is_remote(where):
        folder = Path(_fs.local_path(where))
        if not (folder / META).is_file():
            raise BaselineError(f"no baseline {name!r} in {store_location(store)} (save one: fitprof baseline save)")
        return folder
    dest.mkdir(parents=True, exist_ok=True)
    try:
        _fs.fetch(where, dest, lambda rel: wanted(rel) or rel in (META, DECISIONS))
    except FileNotFoundError:
        pass
    if not (dest / META).is_file():
        raise BaselineError(f"no baseline {name!r} in {store_location(store)} (save one: fitprof baseline save)")
    return dest


def decisions(folder: Path) -> list[dict[str, Any]]:
    """The decision lines of a fetched baseline folder, oldest first (none when it has no ``decisions.jsonl``;
    a line that is not a JSON object is left out)."""
    try:
        text = (folder / DECISIONS).read_text(encoding="utf-8")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def decision_text(doc: dict[str, Any]) -> str:
    """One line for a decision: ``accepted 2026-12-03 18:40 UTC: <reason> (candidate <path>, it was: <status>)``."""
    when = doc.get("time")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(when)) if isinstance(when, (int, float)) else "?"
    regressed = doc.get("regressions") or []
    what = f"; regressed: {', '.join(map(str, regressed))}" if regressed else ""
    return (
        f"{doc.get('decision', 'accepted')} {stamp}: {doc.get('reason', '')} "
        f"(candidate {doc.get('candidate', '?')}, it was {doc.get('status', '?')}{what})"
    )

"""Log directories that are URLs (``s3://``, ``gs://``, ``hdfs://``, ``abfs://``, ``memory://``...).

The profilers write local files, so a run whose log directory is a URL records into a local staging folder
(:class:`Mirror`) that is copied to the URL at each profiled epoch's end (off the training step) and deleted
when the fit ends. The copy goes through fsspec (:class:`FsspecStore`, as Lightning's loggers write) or,
for Keras on TensorFlow, through ``tf.io.gfile`` (a store the adapter hands in, as Keras's ``TensorBoard``
callback writes). ``file://`` URLs are plain local paths (:func:`local_path`). Nothing is ever written to a
local folder named after a scheme.

Files are copied whole or not at all (:data:`OBJECT_STORES`). Stdlib only at import; fsspec is imported when a URL is first opened.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

from fitprof._atomic import is_temporary, temporary_name
from fitprof._profile_jobs import DEFAULT_TIMEOUT_S, wait_for_profiles
from fitprof.traces._limits import wait_all_written

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+)://")
"""``scheme://``; two letters or more, so a Windows drive (``C:\\``, ``C://``) is never a scheme."""

PACKAGES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
    "az": "adlfs",
    "adl": "adlfs",
    "hdfs": "pyarrow",
    "http": "aiohttp",
    "https": "aiohttp",
    "sftp": "paramiko",
    "ssh": "paramiko",
}
"""The package that gives fsspec each common scheme (``memory``, ``file`` need none)."""

OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl"})
"""Schemes whose upload is atomic (an object appears only once its upload completes) and whose rename is a copy:
a file is uploaded straight to its name there; on every other filesystem it is uploaded to a temporary name
beside it and renamed into place, so a copy cut short leaves no half file under a final name."""


class FsUnavailable(OSError):
    """No filesystem for a URL's scheme; the message names the URL and the package to install."""


def scheme(path: str | os.PathLike[str]) -> str | None:
    """The URL scheme of ``path`` (lower case), None for a plain path."""
    m = _URL.match(os.fspath(path))
    return m.group(1).lower() if m else None


def is_remote(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a URL other than ``file://`` (fitprof then records locally and copies)."""
    return scheme(path) not in (None, "file", "local")


def local_path(path: str) -> str:
    """``file:///a/b`` -> ``/a/b``; any other string unchanged."""
    if scheme(path) not in ("file", "local"):
        return path
    parsed = urlparse(path)
    where = unquote(parsed.path) if parsed.netloc in ("", "localhost") else f"//{parsed.netloc}{parsed.path}"
    return url2pathname(where)


def join(url: str, *parts: str) -> str:
    """``url/part/part`` with single slashes between the parts."""
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts if p)])


def open_fsspec(url: str) -> tuple[Any, str]:
    """fsspec's filesystem for ``url`` and the path in it.

    Raises:
        FsUnavailable: fsspec is not installed, it knows no filesystem for the scheme, or the scheme's package
            (e.g. ``s3fs``) is not installed; the message names the URL and the package.
    """
    name = scheme(url) or "file"
    package = PACKAGES.get(name)
    hint = f"pip install {package}" if package else f"install the fsspec filesystem for '{name}://'"
    try:
        import fsspec
    except ImportError:
        raise FsUnavailable(f"{url}: fsspec is not installed (pip install fsspec {package or ''})".rstrip()) from None
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as err:
        raise FsUnavailable(
            f"{url}: the '{name}://' filesystem needs a package that is missing ({err}; {hint})"
        ) from None
    except ValueError as err:
        if "Protocol not known" not in str(err):
            raise
        raise FsUnavailable(f"{url}: no filesystem is known for '{name}://' ({hint})") from None


class Store(Protocol):
    """Where a :class:`Mirror` copies to: one remote run directory."""

    url: str

    def put(self, local: Path, rel: str) -> None: ...

    def remove(self, rel: str) -> None: ...


class FsspecStore:
    """A remote run directory through fsspec.

    Raises:
        FsUnavailable: see :func:`open_fsspec`.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._fs, self._root = open_fsspec(url)

    def put(self, local: Path, rel: str) -> None:
        target = join(self._root, rel)
        self._fs.makedirs(target.rpartition("/")[0], exist_ok=True)
        if scheme(self.url) in OBJECT_STORES:
            self._fs.put_file(os.fspath(local), target)
            return
        folder, _, name = target.rpartition("/")
        part = f"{folder}/{temporary_name(name).name}"
        self._fs.put_file(os.fspath(local), part)
        self._fs.mv(part, target)

    def remove(self, rel: str) -> None:
        target = join(self._root, rel)
        if self._fs.exists(target):
            self._fs.rm_file(target)


def _files(root: Path) -> Iterator[tuple[str, Path]]:
    for folder, _, names in os.walk(root):
        for name in names:
            if is_temporary(name):  # still being written (or left by a killed writer): never copied
                continue
            path = Path(folder, name)
            yield path.relative_to(root).as_posix(), path


class Mirror:
    """A local staging folder whose files are copied to a remote run directory ``url``.

    ``sync`` copies every new or changed file and removes from the remote the files it copied earlier that
    are gone locally (``keep_last_windows``); ``close`` syncs and deletes the staging folder. A filesystem
    that cannot be opened or written gives one warning (``warn(key, message)``, naming the URL or the package
    to install) and no further copy; the staging folder is still deleted at ``close``.

    Args:
        url: the remote run directory.
        warn: the adapter's warn-once (key, message).
        store: opens the remote directory (default :class:`FsspecStore`); called at the first ``sync``.

    Attributes:
        local: the staging folder (``fitprof-remote-*`` in the system's temp folder).
    """

    def __init__(self, url: str, warn: Callable[[str, str], None], store: Callable[[str], Store] = FsspecStore):
        self.url = url.rstrip("/")
        self.local = Path(tempfile.mkdtemp(prefix="fitprof-remote-"))
        self._warn = warn
        self._open = store
        self._store: Store | None = None
        self._failed = False
        self._sent: dict[str, tuple[int, int]] = {}

    def sync(self) -> bool:
        """Copy what changed; True when the remote directory is up to date. A trace still being compressed in the
        background is waited for first (:func:`fitprof.traces._limits.wait_all_written`): it is copied whole."""
        if self._failed or not self.local.is_dir():
            return False
        wait_all_written()
        try:
            if self._store is None:
                self._store = self._open(self.url)
        except Exception as err:
            self._failed = True
            what = str(err) if str(err).startswith(self.url) else f"{self.url}: {err}"
            self._warn(
                "remote-open",
                f"fitprof: cannot write the profile to {what}. The figures are still logged; no profile file is kept.",
            )
            return False
        try:
            now: dict[str, tuple[int, int]] = {}
            for rel, path in _files(self.local):
                st = path.stat()
                now[rel] = (st.st_size, st.st_mtime_ns)
                if self._sent.get(rel) != now[rel]:
                    self._store.put(path, rel)
                    self._sent[rel] = now[rel]
            for rel in [r for r in self._sent if r not in now]:
                self._store.remove(rel)
                del self._sent[rel]
        except Exception as err:
            self._failed = True
            self._warn(
                "remote-write",
                f"fitprof: could not write to {self.url} ({err!r}). The figures are still logged; the profile "
                "files are not kept.",
            )
            return False
        return True

    def close(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Wait up to ``timeout_s`` for the ``.xplane.pb`` conversions still running in the staging folder
        (:func:`fitprof.wait_for_profiles`: the background converter writes there, and the folder goes once this
        copy is done, and the converter would write into a deleted folder), sync, then delete the staging folder. A
        conversion not done in time is named in one warning and never reaches the URL."""
        if self.local.is_dir():
            try:
                wait_for_profiles(self.local, timeout=timeout_s)
            except (TimeoutError, OSError) as err:
                self._warn(
                    "remote-xplane",
                    f"fitprof: {err}; those .xplane.pb files are not copied to {self.url} (their traces, reports and "
                    "figures are).",
                )
        self.sync()
        shutil.rmtree(self.local, ignore_errors=True)


def fetch(url: str, dest: Path, select: Callable[[str], bool]) -> list[tuple[str, Path]]:
    """Download the files below ``url`` (a folder, searched at any depth, or one file) whose path relative to
    it passes ``select``, into ``dest`` with the same relative paths.

    Returns:
        ``(remote URL, local copy)`` of each file, sorted.

    Raises:
        FsUnavailable: see :func:`open_fsspec`.
        FileNotFoundError: if ``url`` does not exist.
    """
    fs, root = open_fsspec(url)
    if not fs.exists(root):
        raise FileNotFoundError(f"{url}: no such file or folder")
    out = []
    if fs.isfile(root):
        local = dest / root.rstrip("/").rpartition("/")[2]
        fs.get_file(root, os.fspath(local))
        return [(url, local)]
    base = root.rstrip("/")
    for folder, _, names in fs.walk(root):  # as TensorBoard walks a log dir: every folder, any depth
        for name in names:
            path = f"{folder.rstrip('/')}/{name}"
            rel = path[len(base) :].lstrip("/")
            if select(rel) and not is_temporary(rel):
                local = dest.joinpath(*rel.split("/"))
                local.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(path, os.fspath(local))
                out.append((join(url, rel), local))
    return sorted(out)

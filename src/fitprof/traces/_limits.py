"""Bounds on what one trace file may make a reader spend, checked before the memory is spent.

Trace files come from other people and other tools (a team's shared log folder, a bug report). A damaged or
hostile file must end in one :class:`~fitprof.traces.TraceError` that names the file, the bound and how to raise
it, never in a machine out of memory. The bounds, and their defaults:

* ``max_trace_mb`` (default :data:`DEFAULT_MAX_TRACE_MB` = 512 MB, 10**6 bytes each): the bytes a reader parses:
  the file's size, or for a gzip file its inflated size. A gzip file is inflated in a stream that stops at the
  bound, so a file that inflates to 1 GB holds at most the bound in memory. The largest real trace seen by this
  project is 33 MB of JSON (105k events, an A100 rank of an 8-GPU DDP job).
* ``max_events`` (default :data:`DEFAULT_MAX_EVENTS` = 10,000,000): for a Kineto trace, its events, counted as
  their ``"ph"`` keys (every Chrome trace event has one, its phase; an ``args`` object has none) while the text is
  read or inflated, so that a trace over the bound is refused as soon as the count passes it, before the rest is
  read and before anything is parsed (:class:`EventCounter`); for an XSpace, its events, counted before the event
  table is built. The 33 MB trace above holds 105k events. A Kineto trace that only the slower three-pass reader
  can read (invalid JSON that must be repaired first) holds about 80 bytes per JSON object while it is read: there
  the bound also applies to its JSON objects (:func:`count_objects`), each of which could be an event.
* :data:`MAX_XSPACE_STRING_BYTES` (1 MB): the longest name or string value in an XSpace (event and stat names,
  string stats). Not raisable: no profiler writes names that long.
* JSON nesting: deeper than the parser's recursion limit (about 1,000 levels) is refused; a Chrome trace nests
  four levels (document, ``traceEvents``, event, ``args``).

Raise the first two with ``fitprof analyze --max-trace-mb N --max-events N``, or ``max_trace_mb=`` /
``max_events=`` of :func:`fitprof.analyze` and :func:`fitprof.traces.read_trace`.
"""

from __future__ import annotations

import dataclasses
import io
import math
import mmap
import os
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import BinaryIO, Literal, overload

import numpy as np

INFLATERS: tuple[ModuleType, ...] = (zlib,)
"""The modules a gzip file may be inflated with, the one :func:`read_bounded` uses first (``isal.isal_zlib`` when
installed, else :mod:`zlib`): the same ``decompressobj`` interface, the same output, each checks the gzip CRC-32
and length."""
try:  # ISA-L's inflate, zlib's interface: about 40% less time than zlib's own on a trace
    from isal import isal_zlib

    INFLATERS = (isal_zlib, zlib)
except ImportError:  # pragma: no cover - a platform without its wheel: zlib gives the same bytes
    pass

DEFAULT_MAX_TRACE_MB = 512.0
"""Default bound on the (inflated) size of one trace file, in MB (10**6 bytes)."""
DEFAULT_MAX_EVENTS = 10_000_000
"""Default bound on the events of one trace (``"ph"`` keys of a Kineto trace, events of an XSpace)."""
MAX_XSPACE_STRING_BYTES = 1_000_000
"""Longest string (name, string stat) accepted in an XSpace."""
_CHUNK = 1 << 20
"""Bytes read from the compressed file, and inflated, per step."""
_COUNT_STEP = 1 << 20
"""Bytes compared at a time when counting ``{`` (a boolean temporary of that size, not of the whole text), and
bytes searched at a time when counting events."""
EVENT_KEY = b'"ph"'
"""What :class:`EventCounter` counts: the key every Chrome trace event has (its phase), and no ``args`` has."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """The bounds one read works under (see the module docstring).

    Raises:
        ValueError: if a bound is not a positive number (``max_events``: integer).
    """

    max_trace_mb: float = DEFAULT_MAX_TRACE_MB
    max_events: int = DEFAULT_MAX_EVENTS

    def __post_init__(self) -> None:
        mb = self.max_trace_mb
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not math.isfinite(mb) or mb <= 0:
            raise ValueError(f"max_trace_mb must be a number of MB > 0, got {mb!r}")
        ev = self.max_events
        if isinstance(ev, bool) or not isinstance(ev, int) or ev < 1:
            raise ValueError(f"max_events must be an integer >= 1, got {ev!r}")

    @classmethod
    def of(cls, max_trace_mb: float | None = None, max_events: int | None = None) -> Limits:
        """The limits with these bounds, the defaults for ``None``."""
        return cls(
            DEFAULT_MAX_TRACE_MB if max_trace_mb is None else max_trace_mb,
            DEFAULT_MAX_EVENTS if max_events is None else max_events,
        )

    @property
    def max_bytes(self) -> int:
        return int(self.max_trace_mb * 1e6)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.6g} MB"


def too_big(path: str | os.PathLike[str], what: str, limits: Limits) -> str:
    """The message of a file over the size bound; ``what`` ends in "more than" (the bound follows)."""
    return (
        f"{os.fspath(path)}: {what} {_mb(limits.max_bytes)}, the bound on one trace; if the file is genuine, raise "
        "it with --max-trace-mb (max_trace_mb= in Python)"
    )


def too_many(path: str | os.PathLike[str], what: str, limits: Limits) -> str:
    """The message of a file over the events bound."""
    return (
        f"{os.fspath(path)}: {what}, more than the bound of {limits.max_events:,} events; if the file is genuine, "
        "raise it with --max-events (max_events= in Python)"
    )


Text = bytearray | mmap.mmap
"""A trace's text as :func:`read_bounded` returns it: a ``bytearray``, or the copy-on-write map of a plain file that a
trace's writer handed over (:func:`map_copy`). Both are writable buffers with ``find`` and ``rfind``; a map has no
``decode`` (``str(text, encoding)`` reads either) and its ``in`` looks for one byte, not a substring."""

_FileKey = tuple[int, int, int, int]
_handed: tuple[str, _FileKey, Text] | None = None


def _key(st: os.stat_result) -> _FileKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _name(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.fspath(path))


def map_copy(path: str | os.PathLike[str]) -> mmap.mmap:
    """A private, copy-on-write map of the whole file ``path`` (``mmap.ACCESS_COPY``): its pages are the page cache's
    until written, and what is written through it never reaches the file. Mapping a 28 MB trace just written costs
    about 0.1 ms of CPU, where reading it into a new ``bytearray`` took 20-25 ms (measured), and the map stays
    valid after the file is deleted. The file must not be truncated while the map is used (the pages past its new
    end could no longer be read); fitprof maps only the temporary files of its own exports.

    Raises:
        OSError: if the file cannot be opened or mapped (an empty file cannot be mapped: ``ValueError`` is raised
            as ``OSError``).
    """
    with open(path, "rb") as fh:
        try:
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        except ValueError as err:  # an empty file
            raise OSError(str(err)) from None


def hand_over(path: str | os.PathLike[str], text: Text) -> None:
    """Keep ``text``, the inflated content of the gzip file ``path`` that the caller has just written from it (or is
    writing from it: :func:`write_in_background`), for the :func:`read_bounded` of that file, which then returns
    it instead of inflating the file again (a profiled window's trace is read back at once: inflating a 28 MB
    window took 95-150 ms of CPU, measured).

    A file already written keeps one text, for one read, and only while the file is unchanged (same device,
    inode, size and modification time); else it is read as usual. A file still being written in the background
    keeps its own text, matched by its path, for every read until the write ends: a window's analysis may read it
    twice (its memory events), and several windows may wait for their analysis at once. A write that succeeds
    leaves the text as for a file already written; one that fails leaves it readable until :func:`wait_written`
    returns the failure, so the window's figures are still read. The caller must not change ``text`` afterwards
    (a reader changes bytes only while it decodes, and puts them back); ``text`` may be the :func:`map_copy` of
    the plain file the gzip file is written from.
    """
    global _handed
    name = _name(path)
    with _writing_lock:
        job = _writing.get(name)
        if job is not None and (not job.ended or job.error is not None):  # running, or failed before the hand-over
            job.text = text
            return
    try:
        key = _key(os.stat(path))
    except OSError:
        return
    with _writing_lock:
        _handed = (name, key, text)


def _take(path: str | os.PathLike[str], st: os.stat_result) -> Text | None:
    """The text handed over for the written file at ``path`` (``st``: its status), once; None if none, another
    file's, or the file changed since."""
    global _handed
    with _writing_lock:
        handed, _handed = _handed, None
    if handed is None or handed[0] != _name(path) or handed[1] != _key(st):
        return None
    return handed[2]


def _drop_handed(name: str) -> None:
    """Forget the text handed over for the written file ``name`` (its window is done with it: a map of a 28 MB
    trace holds 28 MB of memory)."""
    global _handed
    with _writing_lock:
        if _handed is not None and _handed[0] == name:
            _handed = None


# ------------------------------------------------------------------------------------ files written in the background
class _Write:
    """One file being written by a thread of its own; ``error``: what the write raised, once it has ended;
    ``text``: the file's text handed over meanwhile (:func:`hand_over`), kept after a failed write."""

    def __init__(self, name: str, write: Callable[[], None]) -> None:
        self.name = name
        self.error: BaseException | None = None
        self.text: Text | None = None
        self.ended = False
        self.thread = threading.Thread(target=self._run, args=(write,), name="fitprof-trace-write")

    def _run(self, write: Callable[[], None]) -> None:
        global _handed
        try:
            write()
        except BaseException as err:  # kept for the waiter, who warns: a thread's exception would be printed
            self.error = err
        with _writing_lock:
            self.ended = True
            if self.error is None and self.text is not None:
                # The file is whole: its text is now the one of a written file, for one read while it is unchanged.
                text, self.text = self.text, None
                try:
                    _handed = (self.name, _key(os.stat(self.name)), text)
                except OSError:
                    pass


_writing: dict[str, _Write] = {}
_writing_lock = threading.Lock()


def _forget_writes() -> None:  # a forked child has none of its parent's threads
    global _writing_lock
    _writing.clear()
    _writing_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_writes)


def write_in_background(path: str | os.PathLike[str], write: Callable[[], None]) -> None:
    """Run ``write``, which writes the file ``path`` (whole or not at all, renamed into place), in a thread of its
    own, and have every :func:`read_bounded` of ``path`` and every :func:`wait_written` wait for it first (a read
    returns the text handed over for it instead, :func:`hand_over`).

    For work that releases the GIL (compressing a trace: zlib and ISA-L do), so that the training thread goes on
    meanwhile. The thread is not a daemon: the interpreter waits for it at exit. An exception of ``write`` is
    kept and returned by :func:`wait_written`. A second write of the same path waits for the first (and drops
    what it raised: the file is written anew).

    Raises:
        RuntimeError: if the thread cannot be started (nothing is then registered, and ``write`` has not run).
    """
    name = _name(path)
    wait_written(name)
    job = _Write(name, write)
    job.thread.start()  # registered once started: no wait ever joins a thread that never ran
    with _writing_lock:
        _writing[name] = job


def _job(path: str | os.PathLike[str]) -> _Write | None:
    with _writing_lock:
        return _writing.get(_name(path))


def wait_written(path: str | os.PathLike[str]) -> BaseException | None:
    """Wait until the background write of ``path`` (:func:`write_in_background`) has ended, and forget it and the
    text handed over for it; at once when there is none.

    Returns:
        What the write raised (then the file is not there), once: later calls return None. None when it
        succeeded and when there was none.
    """
    name = _name(path)
    job = _job(name)
    owner = False
    if job is not None:
        job.thread.join()
        with _writing_lock:
            owner = _writing.get(name) is job  # of two waiters, the one that forgets the write is told
            if owner:
                del _writing[name]
            job.text = None
    _drop_handed(name)
    return job.error if job is not None and owner else None


def being_written(path: str | os.PathLike[str]) -> bool:
    """Whether a background write of ``path`` (:func:`write_in_background`) has not been waited for yet (it may
    have ended)."""
    return _job(path) is not None


def wait_ended(path: str | os.PathLike[str]) -> BaseException | None:
    """Wait until the background write of ``path`` has ended, leaving it and its handed-over text to
    :func:`wait_written` (for a second reader of the file, e.g. the ``.xplane.pb`` converter, that must not take
    the failure or the text from the window's own analysis).

    Returns:
        What the write raised (then the file is not there); None when it succeeded and when there was none (or
        :func:`wait_written` has already taken it: then the file's presence says how it went).
    """
    job = _job(path)
    if job is None:
        return None
    job.thread.join()
    return job.error


def wait_all_written() -> None:
    """Wait until every background write (:func:`write_in_background`) has ended. What a write raised is kept for
    :func:`wait_written` of its path, whose caller warns about it."""
    with _writing_lock:
        jobs = list(_writing.values())
    for job in jobs:
        job.thread.join()


class EventCounter:
    """The events of a Kineto trace's text, counted as it is read (``"ph"`` keys, :data:`EVENT_KEY`), refused as
    soon as they pass ``limits.max_events``.

    An upper bound of the events a reader can decode: a string value ``"ph"`` counts too; a key spelled with a
    ``\\u`` escape is not counted, and the reader that relies on the count falls back to one that does not
    (:func:`fitprof.traces.kineto._load`).

    Attributes:
        n: the events counted so far.
    """

    def __init__(self, path: str | os.PathLike[str], limits: Limits, error: type[Exception]) -> None:
        self.path, self.limits, self.error = path, limits, error
        self.n = 0
        self._pos = 0  # the text before it is counted

    def feed(self, text: bytes | Text, end: int | None = None) -> None:
        """Count the events in ``text[:end]`` (default: all of it) not counted yet; ``text`` is the same growing
        text at every call, its first bytes unchanged (a key cut by the previous end is counted once whole).

        Raises:
            error: once the count passes ``limits.max_events`` (the message names the file, the bound and the flag).
        """
        end = len(text) if end is None else end
        key = len(EVENT_KEY)
        with memoryview(text) as view:  # released at once: the caller may grow a bytearray again
            at = self._pos
            while at < end:
                stop = min(at + _COUNT_STEP, end)
                # from key - 1 bytes back: a key begun before ``at`` that did not end there was not counted
                self.n += bytes(view[max(at - key + 1, 0) : stop]).count(EVENT_KEY)
                at = stop
                if self.n > self.limits.max_events:  # refused here: the rest is neither read nor counted
                    what = f"the trace holds at least {self.n:,} events (in its first {_mb(stop)} of text)"
                    raise self.error(too_many(self.path, what, self.limits))
        self._pos = max(self._pos, end)


@overload
def read_bounded(
    path: Path,
    limits: Limits,
    error: type[Exception],
    *,
    inflate: Literal[False],
    count: EventCounter | None = None,
) -> bytearray: ...
@overload
def read_bounded(
    path: Path, limits: Limits, error: type[Exception], *, inflate: bool = True, count: EventCounter | None = None
) -> Text: ...
def read_bounded(
    path: Path, limits: Limits, error: type[Exception], *, inflate: bool = True, count: EventCounter | None = None
) -> Text:
    """The file's bytes, at most ``limits.max_bytes`` of them; inflated when it starts with the gzip magic bytes
    and ``inflate`` is true.

    A plain file's size is checked before it is read; a gzip file is inflated in 1 MB steps that stop as soon as
    the output passes the bound, so at most the bound (plus one step) is ever held; or, when its writer handed over
    its inflated text (:func:`hand_over`) and the file is unchanged since, that text (a ``bytearray`` or a map,
    :data:`Text`) is returned; any other read returns a ``bytearray``. Concatenated gzip members are read as one
    stream, as :func:`gzip.decompress` does. A file still being written in the background
    (:func:`write_in_background`) is read once it is whole, unless its text was handed over.

    ``count``: fed every part of the text as it is read or inflated (:meth:`EventCounter.feed`), so that a trace
    over the events bound is refused as soon as its count passes the bound, with the rest of it neither read nor
    held.

    Raises:
        error: (a :class:`~fitprof.traces.TraceError`) if the file is missing or unreadable, is a truncated or
            corrupt gzip, or is bigger than the bound; or if its background write failed and left no text (the
            write's own error is still returned by :func:`wait_written`); or from ``count``, over the events bound.
    """
    text = _read_bounded(path, limits, error, inflate, count)
    if count is not None:
        count.feed(text)  # what was not counted as it was read: a handed-over text, the rest of a short read
    return text


def _read_bounded(
    path: Path, limits: Limits, error: type[Exception], inflate: bool, count: EventCounter | None
) -> Text:
    job = _job(path) if _writing else None
    if job is not None:
        with _writing_lock:
            text = job.text  # set while the write runs, and after it failed
        if text is not None and inflate and len(text) <= limits.max_bytes:
            return text
        # A file still being written is read once it is whole. The failure stays with the write, for its owner's
        # wait_written (which warns once); this read names it.
        job.thread.join()
        if job.error is not None:  # chained: the write's owner knows the analysis failed for this reason
            raise error(f"{path}: the file could not be written ({job.error!r})") from job.error
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(2)
            if head != b"\x1f\x8b" or not inflate:
                if size > limits.max_bytes:
                    raise error(too_big(path, f"the file is {_mb(size)}, more than", limits))
                data = bytearray(size)  # read in place: one copy of the file in memory, never two
                fh.seek(0)
                got = _read_into(fh, data, count)
                del data[got:]  # a file that shrank meanwhile; one that grew is read up to its size at the check
                return data
            handed = _take(path, os.fstat(fh.fileno())) if _handed is not None else None
            if handed is not None and len(handed) <= limits.max_bytes:
                return handed
            fh.seek(0)
            return _inflate(fh, path, limits, error, count=count)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as err:
        raise error(f"{path}: cannot read the file ({err.strerror or err})") from None


def _read_into(fh: io.BufferedIOBase, data: bytearray, count: EventCounter | None) -> int:
    """Read ``fh`` into ``data`` (at most its length), ``_CHUNK`` bytes at a time when ``count`` is fed as it goes
    (whole at once without it); the bytes read."""
    if count is None:
        return fh.readinto(data)
    got = 0
    with memoryview(data) as view:
        while got < len(data):
            n = fh.readinto(view[got : got + _CHUNK])
            if not n:
                break
            got += n
            count.feed(data, got)
    return got


def _inflate(
    fh: BinaryIO,
    path: Path,
    limits: Limits,
    error: type[Exception],
    lib: ModuleType | None = None,
    count: EventCounter | None = None,
) -> bytearray:
    """The inflated stream, ``lib`` (one of :data:`INFLATERS`, default the first) in ``_CHUNK`` steps, each fed to
    ``count`` as it comes."""
    lib = INFLATERS[0] if lib is None else lib
    out = bytearray()
    cap = limits.max_bytes
    inflater = lib.decompressobj(wbits=31)  # the gzip wrapper: its header, CRC-32 and length are checked
    buf = fh.read(_CHUNK)
    _check_flags(buf, path, error)
    try:
        while buf:
            out += inflater.decompress(buf, min(_CHUNK, cap + 1 - len(out)))  # never more than the bound + 1
            if len(out) > cap:
                raise error(too_big(path, "it inflates to more than", limits))
            if count is not None:
                count.feed(out)
            if inflater.eof:  # one member done; another may follow, as gzip.decompress reads them
                buf = inflater.unused_data or fh.read(_CHUNK)
                if 0 < len(buf) < 4:  # enough of the next member's header for its magic bytes and flags
                    buf += fh.read(4 - len(buf))
                if buf and buf[:2] != b"\x1f\x8b":
                    raise error(f"{path}: truncated or corrupt gzip (data after the end of the gzip stream)")
                if buf:
                    _check_flags(buf, path, error)
                    inflater = lib.decompressobj(wbits=31)
                continue
            buf = inflater.unconsumed_tail or fh.read(_CHUNK)
        if not inflater.eof:  # output zlib still holds when the input ended exactly at a step's end
            out += inflater.flush()
    except (zlib.error, lib.error) as err:
        raise error(f"{path}: truncated or corrupt gzip ({err})") from None
    if not inflater.eof:
        raise error(f"{path}: truncated or corrupt gzip (the file ends before the gzip stream does)")
    return out


def _check_flags(head: bytes, path: Path, error: type[Exception]) -> None:
    """Refuse a gzip member whose header sets a reserved flag bit (RFC 1952: bits 5-7 of FLG), as zlib does:
    ISA-L's inflate ignores them, and a file must read the same whichever inflater is installed."""
    if len(head) >= 4 and head[3] & 0xE0:
        raise error(f"{path}: truncated or corrupt gzip (unknown header flags set)")


def count_objects(data: bytes | Text, path: str | os.PathLike[str], limits: Limits, error: type[Exception]) -> int:
    """The number of ``{`` in a JSON text: an upper bound of the objects it holds (one inside a string counts too),
    and so of the events a reader that decodes every array element at once may have to hold (the three-pass reader
    of :func:`fitprof.traces.kineto._load`, for a file that is not valid JSON as written, and the memory events'
    reader), where an element without a ``"ph"`` costs as much as an event.

    Raises:
        error: if it passes ``limits.max_events``.
    """
    view = np.frombuffer(data, dtype=np.uint8)  # numpy compares 16-32 bytes an instruction; bytes.count one
    n = 0
    for at in range(0, len(view), _COUNT_STEP):
        n += int(np.count_nonzero(view[at : at + _COUNT_STEP] == 0x7B))  # "{"
    del view  # the buffer export: the caller may resize a bytearray again
    if n > limits.max_events:
        raise error(
            too_many(
                path,
                f"the trace may hold up to {n:,} events (read whole at once here, where its events cannot be counted "
                f"apart: it holds {n:,} JSON objects, events and their args)",
                limits,
            )
        )
    return n

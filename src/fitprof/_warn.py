"""Warn once per problem: the one warning channel of both callbacks (stdlib only).

Every fitprof warning is a :class:`FitProfilerWarning` whose message starts with ``"fitprof: "``, issued once per
problem per ``fit`` with ``warnings.warn`` at a ``stacklevel`` that points at the user's code (the first frame
outside fitprof, Keras, Lightning, TensorFlow and torch). A warning that cannot be issued (``python -W error``
turns it into an exception) goes to ``logging`` instead: a warning never breaks training.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "fitprof: "
"""The start of every fitprof warning."""

_INTERNAL_PACKAGES = (
    "fitprof",
    "keras",
    "tf_keras",
    "lightning",
    "lightning_fabric",
    "pytorch_lightning",
    "tensorflow",
    "torch",
)


class FitProfilerWarning(UserWarning):
    """The category of every warning fitprof issues (filter it with ``warnings.filterwarnings``)."""


def _internal_dirs() -> tuple[str, ...]:
    dirs = []
    for name in _INTERNAL_PACKAGES:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(dirs)


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn``, called by the caller of this function, point at the first
    frame outside fitprof, Keras, Lightning, TensorFlow and torch (the user's ``fit`` call); 2 when there is none."""
    internal = _internal_dirs()
    frame = sys._getframe(2)  # the frame that calls warnings.warn is level 1
    level = 2
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (filename.startswith(internal) or filename.startswith("<frozen")):
            return level
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return 2


_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')
_TRACE_MARK = re.compile(r'Traceback \(most recent call last\)|in user code:|File "[^"]*", line \d+')
_ERROR_LINE = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b:?")
MAX_REASON_CHARS = 300
"""Where a traceback was dropped, the error text left is cut to this many characters: the reason, never a dump."""


def no_traceback(text: str) -> str:
    """``text`` with any traceback in it reduced to its error lines: Python's ``Traceback (most recent call
    last):`` blocks and TensorFlow's ``in user code:`` frames (``File "...", line N`` and the code line under each)
    are dropped, also inside an exception's ``repr`` (newlines escaped), and what is left is put on one line and cut
    to :data:`MAX_REASON_CHARS`. Text without a traceback is returned unchanged. A user-facing note or warning says
    what went wrong, never where in a framework's source."""
    if not _TRACE_MARK.search(text):
        return text
    kept: list[str] = []
    skip_code = False
    if "\n" not in text:  # an exception's repr: its newlines are escaped
        text = text.replace("\\n", "\n")
    for line in text.splitlines():
        stripped = line.strip()
        if set(stripped) <= set("^~ ") and stripped:  # Python 3.11's markers under a frame's code line
            continue
        if _FRAME.match(line):
            skip_code = True  # the source line printed under a frame goes too
            continue
        if skip_code and stripped and not _ERROR_LINE.match(line):
            skip_code = False
            continue
        skip_code = False
        if stripped and stripped not in ("Traceback (most recent call last):", "in user code:"):
            kept.append(stripped)
    out = " ".join(kept).replace("in user code: ", "")
    return out if len(out) <= MAX_REASON_CHARS else out[: MAX_REASON_CHARS - 1] + "…"


def describe_error(err: BaseException) -> str:
    """``TypeName: message`` of ``err`` on one line, without any traceback it carries (:func:`no_traceback`)."""
    text = no_traceback(str(err))
    name = type(err).__name__
    return f"{name}: {text}" if text and not text.startswith(name) else (text or name)


def with_prefix(message: str) -> str:
    """``message`` starting with :data:`PREFIX`, any traceback in it reduced to its error line
    (:func:`no_traceback`)."""
    message = no_traceback(message)
    return message if message.startswith(PREFIX) else PREFIX + message


def warn(message: str) -> None:
    """Issue ``message`` as one :class:`FitProfilerWarning` pointing at the user's code; when warnings are errors
    (``-W error``) or the warning cannot be issued, log it instead. Never raises."""
    message = with_prefix(message)
    try:
        warnings.warn(message, FitProfilerWarning, stacklevel=user_stacklevel())
    except Exception:  # -W error: the warning was raised as an exception; training must go on
        log.warning(message)


class WarnOnce:
    """Warn each distinct problem once until :meth:`reset` (each callback resets it when a ``fit`` starts, so a
    later ``fit`` warns again when the cause repeats): ``warn_once(key, message)``.

    Args:
        emit: how to warn; default :func:`warn` (a :class:`FitProfilerWarning`, or ``logging`` under
            ``-W error``). An ``emit`` that raises falls back to ``logging``: a warning never breaks training.

    Attributes:
        rank: this process's global rank; on a rank other than 0 the message goes to ``logging`` as
            ``[rank N] fitprof: ...`` (only rank 0 issues Python warnings, as Lightning's ``rank_zero_warn``).
        keys: the problems warned about since the last :meth:`reset`.
    """

    def __init__(self, emit: Callable[[str], Any] | None = None) -> None:
        self._emit = emit or warn
        self.rank = 0
        self.keys: set[str] = set()

    def reset(self) -> None:
        """Forget which problems were warned about (a new ``fit``)."""
        self.keys.clear()

    def __call__(self, key: str, message: str) -> None:
        if key in self.keys:
            return
        self.keys.add(key)
        message = with_prefix(message)
        if self.rank != 0:
            log.warning("[rank %d] %s", self.rank, message)
            return
        try:
            self._emit(message)
        except Exception:
            log.warning(message)

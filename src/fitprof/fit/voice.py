"""What one fit prints, framework-free: per profiled epoch one headline on its own line (step time, the window's
input share, the verdict, where the profile is), then at most one verdict or advice, each kind said once per fit
and again only when it changes (all of them go to the Text tab and the per-epoch file). Both adapters print what
:meth:`Voice.lines` returns, on rank 0, when ``verbose``.

A sentence's kind is its wording up to its first ``(`` or ``:``, its numbers left out (:func:`gist`):
``the training thread waited for a core 37% of epoch 1`` and ``... 50% of epoch 2`` say the same thing, and so do
``num_workers=6 would bring steps to about 2.1 ms`` and ``num_workers=7 ...`` (the count needed moves with the
epoch's noise); ``the loader keeps up`` after ``num_workers=6 would ...`` is a change, and is said."""

from __future__ import annotations

import os
import re
from pathlib import Path

from fitprof import _fs
from fitprof.fit.result import EpochResult

_NUMBER = re.compile(r"(?<![\w.,])\d+(?:,\d{3})*(?:\.\d+)?")
"""A number (``4,015``, ``0.03``, the ``3`` of ``num_workers=3``): digits not right after a letter (``aten::mm2``)."""

_KIND_END = re.compile(r"[(:]")


def gist(line: str) -> str:
    """The kind of ``line``: its wording up to its first ``(`` or ``:``, each number replaced by ``#``, so that two
    epochs saying the same thing with other figures compare equal."""
    return _NUMBER.sub("#", _KIND_END.split(line, maxsplit=1)[0]).strip()


def profile_place(log_dir: str | None, session_dir: Path | None) -> str | None:
    """Where a window's profile is, as the headline names it: ``session_dir`` itself, or under a URL
    ``log_dir`` its copy there (``<url>/plugins/profile/<session>``); None without one."""
    if session_dir is None or log_dir is None:
        return None
    if _fs.is_remote(log_dir):
        return _fs.join(log_dir, "plugins", "profile", session_dir.name)
    return os.fspath(session_dir)


class Voice:
    """The lines one callback prints over a fit (see the module docstring); :meth:`begin_fit` forgets what was
    said.

    Attributes:
        new: the verdicts and advice of the last :meth:`lines` whose kind is new in this fit (for the Text tab; the
            per-epoch file keeps them all).
    """

    def __init__(self) -> None:
        self._said: set[str] = set()  # the kinds printed
        self._written: set[str] = set()  # the kinds handed to the Text tab
        self.new: list[str] = []

    def begin_fit(self) -> None:
        """A ``fit`` begins: every sentence may be said once again."""
        self._said.clear()
        self._written.clear()

    def lines(self, epoch: int, result: EpochResult, where: str | None = None) -> list[str]:
        """What to print for epoch ``epoch``'s ``result``: the headline of its window (rank 0's
        :attr:`~fitprof.fit.result.EpochLog.line`, with ``where``: the place of the epoch's profile), each triggered
        window's line, then one verdict or advice: the first whose kind was not printed before in this fit
        (:func:`gist`), CPU contention first. One an epoch: a short fit reads a few lines, each sentence left
        unprinted is printed in a later epoch that says it again, and all are in the per-epoch file (``fitprof
        report``). In a CPU-contended epoch the loader's worker-count advice is left out: contention is the
        epoch's one verdict, and step times that measure waiting for a core say nothing about workers.

        Returns:
            The lines, each without a line break, in print order.
        """
        out: list[str] = []
        if result.log is not None and result.log.line:
            out.append(result.log.line + (f"; profile in {where}" if where else ""))
        out += [t.line for t in result.triggered]
        advice = [] if result.contended else result.advice
        said = sorted((*result.verdicts, *advice), key=lambda text: not text.startswith("CPU-contended"))
        self.new = [text for text in said if gist(text) not in self._written]
        self._written.update(gist(text) for text in self.new)
        for text in said:
            if gist(text) not in self._said:
                self._said.add(gist(text))
                return [*out, f"fitprof: {text}"]
        return out

"""What the engine and its adapters hand each other, besides the events: the adapter's throughput counts
(:class:`Work`), another profiler's steps (:class:`Busy`), and the one result of an epoch's end
(:class:`EpochResult`, with its :class:`EpochLog` and :class:`Triggered` windows), which the adapter only logs and
prints. Framework-free."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fitprof.analysis import BottleneckReport
from fitprof.fit.steps import EpochSteps, TriggerEvent
from fitprof.throughput import StepWork


class Work(Protocol):
    """What the adapter counts for a scheduled window's throughput (:mod:`fitprof.throughput`); every method is
    called by the engine at the moment named."""

    def epoch_start(self) -> None:
        """A new epoch: forget the last window's counts."""

    def count_flops(self, step: int, batch: Any) -> None:
        """Count the FLOPs of step ``step``, which begins now (its batch, None where the hook has none); the
        adapter stops counting when the step ends."""

    def window_opened(self) -> None:
        """The scheduled window's first analysed step begins."""

    def window_step(self, batch: Any) -> None:
        """An analysed step of the scheduled window ended (``LIGHTNING`` boundary only: its batch)."""

    def window_closed(self) -> None:
        """The scheduled window stops (its last analysed step ended)."""

    def work(self) -> StepWork | None:
        """The window's samples, items and FLOPs, for its report."""
        ...


@dataclass
class Busy:
    """Steps of this epoch during which another profiler runs (1-based, inclusive): ``who`` it is, as the user
    wrote it, and its short ``name``."""

    first: int
    last: int
    who: str
    name: str


Gather = Callable[[list[float]], list[list[float]]]
"""All-gather one rank's vector; returns every rank's (index = global rank). Raises on failure."""


@dataclass(frozen=True)
class EpochLog:
    """What rank 0 logs at the end of one profiled epoch.

    Attributes:
        epoch: the 0-based epoch.
        scalars: the figures under the stable keys of :func:`fitprof.fit.pipeline.logged_keys` (finite values only).
        op_scalars: the top operators under their names, ``fitprof/top_ops/<op name>`` (ms per step), for
            TensorBoard only.
        text: the Markdown summary (verdict, advice, operator table) for TensorBoard's Text tab.
        line: the one-line summary printed on rank 0 (:func:`fitprof.fit.pipeline.summary_line`).
    """

    epoch: int
    scalars: dict[str, float]
    op_scalars: dict[str, float] = field(default_factory=dict)
    text: str = ""
    line: str = ""


Log = Callable[[EpochLog], None]
"""Log one epoch's :class:`EpochLog` (rank 0 only)."""


@dataclass
class Triggered:
    """A triggered window published at its epoch's end: its firing, report (None when its analysis failed), the
    one line and the Markdown text the adapter logs (``fitprof/trigger/summary``)."""

    epoch: int
    event: TriggerEvent
    report: BottleneckReport | None
    line: str
    text: str


@dataclass
class EpochResult:
    """What :meth:`FitEngine.epoch_end` published: the adapter logs it its own way.

    Attributes:
        window: the window's scalars (empty when the epoch had none; the same on every rank that gathered).
        epoch: the ``fitprof/epoch/*`` figures (NaN where none) and every probe's epoch figures.
        trigger: the ``fitprof/trigger/*`` figures of the epoch's last triggered window (NaN when none).
        triggered: the triggered windows of this epoch.
        figures: the always-on step timing of the epoch.
        profiled: the epoch had a window (this rank's or, for the gather, any rank's).
        session_dir: the session folder of this rank's scheduled window (None: none, or not written).
        verdicts: the epoch's verdicts (where its wall time went, CPU contention), as the per-epoch file keeps them.
        advice: the probes' advice for this epoch (the loader's when its wait is worth acting on), as the per-epoch
            file keeps it; :class:`fitprof.fit.voice.Voice` prints each once a fit.
        contended: the epoch was CPU-contended (its verdict says so and overrides the worker-count advice).
        log: what rank 0 logs for the epoch's window (None: no window, or not rank 0); the engine hands it to the
            adapter's ``log`` as it publishes the result.
    """

    window: dict[str, float] = field(default_factory=dict)
    epoch: dict[str, float] = field(default_factory=dict)
    trigger: dict[str, float] = field(default_factory=dict)
    triggered: list[Triggered] = field(default_factory=list)
    figures: EpochSteps | None = None
    profiled: bool = False
    session_dir: Path | None = None
    verdicts: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    contended: bool = False
    log: EpochLog | None = None

"""The arguments both ``FitProfiler`` adapters share, checked in one place, and the engine settings they make.

The Keras and the Lightning ``FitProfiler`` take the same keywords with the same meaning (``profile_batch``,
``every_n_epochs``, ``top_k``, the limits, ``ranks``, ``verbose``, the four torch profiler options,
``count_items``, the trigger and its limits, ``probes``, ``baseline``). Each adapter passes them to
:func:`check_arguments`, which refuses a bad value with one error naming it and what is allowed, and builds its
:class:`~fitprof.fit.engine.FitEngine` from :meth:`FitArguments.engine_settings` and its own parts.

``log_dir`` stays with each adapter: its check is shared (:func:`fitprof._config.normalize_log_dir`), but Keras
needs a folder while Lightning's None means the trainer's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypedDict

from fitprof import _config
from fitprof._config import ProfileConfig
from fitprof.fit.probes import Probe
from fitprof.steps import SlowdownTrigger


class EngineSettings(TypedDict):
    """What the shared arguments set of :class:`~fitprof.fit.engine.FitEngine`, by its keyword names."""

    max_trace_mb: float | None
    keep_last_windows: int | None
    ranks: frozenset[int] | None
    trigger: SlowdownTrigger | None
    baseline: str | os.PathLike[str] | None


@dataclass(frozen=True)
class FitArguments:
    """The checked shared arguments of one ``FitProfiler`` (the adapters' docstrings say what each means).

    Attributes:
        config: ``profile_batch``, ``every_n_epochs`` and ``top_k`` (:class:`~fitprof._config.ProfileConfig`).
        max_trace_mb: warn when a window's trace is larger than this many MB (None: never).
        keep_last_windows: keep the trace files of only the last N windows (None: all).
        ranks: the global ranks that profile (None: every rank).
        verbose: print one line per profiled epoch.
        torch_options: ``record_shapes``, ``profile_memory``, ``with_stack`` and ``with_flops`` by name.
        count_items: ``count_items(batch) -> float`` (items, e.g. tokens, in one batch), or None.
        trigger: None or ``"slowdown"``.
        trigger_max_windows: the most triggered windows per ``fit`` (>= 1).
        trigger_min_spacing: the fewest clean steps between two triggered windows (>= 0).
        probes: the user's probes, in the order given.
        baseline: as given; read (and refused when it cannot be) when the engine is built.
    """

    config: ProfileConfig
    max_trace_mb: float | None
    keep_last_windows: int | None
    ranks: frozenset[int] | None
    verbose: bool
    torch_options: dict[str, bool]
    count_items: Callable[[Any], float] | None
    trigger: str | None
    trigger_max_windows: int
    trigger_min_spacing: int
    probes: tuple[Probe, ...]
    baseline: str | os.PathLike[str] | None

    def engine_settings(self) -> EngineSettings:
        """The keywords of :class:`~fitprof.fit.engine.FitEngine` these arguments set, the slowdown trigger built
        (a new one each call; None without ``trigger``). The adapter adds its own: how it opens a window, its
        warning channel, where its steps begin and end, its throughput counts, and its probes before
        :attr:`probes`. The engine reads ``baseline`` when it is built: a missing or unreadable one raises
        ``ValueError``, one that is not a path ``TypeError``."""
        trigger = None
        if self.trigger is not None:
            trigger = SlowdownTrigger(max_windows=self.trigger_max_windows, min_spacing=self.trigger_min_spacing)
        return EngineSettings(
            max_trace_mb=self.max_trace_mb,
            keep_last_windows=self.keep_last_windows,
            ranks=self.ranks,
            trigger=trigger,
            baseline=self.baseline,
        )


def check_arguments(
    *,
    profile_batch: Any,
    every_n_epochs: Any,
    top_k: Any,
    max_trace_mb: Any,
    keep_last_windows: Any,
    ranks: Any,
    verbose: Any,
    record_shapes: Any,
    profile_memory: Any,
    with_stack: Any,
    with_flops: Any,
    count_items: Any,
    trigger: Any,
    trigger_max_windows: Any,
    trigger_min_spacing: Any,
    probes: Iterable[Probe],
    baseline: str | os.PathLike[str] | None,
) -> FitArguments:
    """Check the arguments both adapters share, each by the rule :mod:`fitprof._config` gives it.

    Raises:
        ValueError: a malformed or out-of-range ``profile_batch``; ``every_n_epochs``, ``top_k`` or
            ``trigger_max_windows`` < 1; ``max_trace_mb`` or ``keep_last_windows`` <= 0; ``ranks`` empty or
            holding a rank < 0; ``trigger`` not None or ``"slowdown"``; ``trigger_min_spacing`` < 0. Each message
            names the argument, the value received and what is allowed.
        TypeError: an argument of the wrong type (a bool where a number is wanted, a non-bool flag, a
            ``count_items`` that cannot be called), named the same way.
    """
    return FitArguments(
        config=_config.make_config(profile_batch, every_n_epochs, top_k),
        max_trace_mb=_config.check_optional_limit("max_trace_mb", max_trace_mb, integer=False),
        keep_last_windows=_config.check_optional_limit("keep_last_windows", keep_last_windows, integer=True),
        ranks=_config.check_ranks(ranks),
        verbose=_config.check_flag("verbose", verbose),
        torch_options=_config.torch_options(
            record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops
        ),
        count_items=_config.check_count_items(count_items),
        trigger=_config.check_trigger(trigger, trigger_max_windows, trigger_min_spacing),
        trigger_max_windows=int(trigger_max_windows),
        trigger_min_spacing=int(trigger_min_spacing),
        probes=tuple(probes),
        baseline=baseline,
    )

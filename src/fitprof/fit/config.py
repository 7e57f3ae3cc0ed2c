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

import inspect
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from fitprof import _config
from fitprof._config import ProfileConfig
from fitprof._retention import DEFAULT_MAX_TRACE_MB
from fitprof.fit.probes import Probe
from fitprof.steps import SlowdownTrigger


class EngineSettings(TypedDict):
    """What the shared arguments set of :class:`~fitprof.fit.engine.FitEngine`, by its keyword names."""

    max_trace_mb: float | None
    keep_last_windows: int | None
    ranks: frozenset[int] | None
    trigger: SlowdownTrigger | None
    baseline: str | os.PathLike[str] | None


class SharedAttributes:
    """The attributes the shared arguments set on each ``FitProfiler`` (:meth:`FitArguments.bind`), declared once
    for both: a base class with annotations only."""

    config: ProfileConfig
    verbose: bool
    ranks: frozenset[int] | None
    trigger: str | None
    torch_options: dict[str, bool]
    count_items: Callable[[Any], float] | None
    max_trace_mb: float | None
    keep_last_windows: int | None


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

    def bind(self, callback: SharedAttributes) -> None:
        """Set the checked arguments on ``callback`` under the attribute names both ``FitProfiler`` classes document:
        ``config``, ``verbose``, ``ranks``, ``trigger``, ``torch_options``, ``count_items``, ``max_trace_mb``,
        ``keep_last_windows``."""
        callback.config, callback.verbose, callback.ranks, callback.trigger = (
            self.config,
            self.verbose,
            self.ranks,
            self.trigger,
        )
        callback.torch_options, callback.count_items = self.torch_options, self.count_items
        callback.max_trace_mb, callback.keep_last_windows = self.max_trace_mb, self.keep_last_windows


def check_arguments(
    *,
    profile_batch: int | tuple[int, int] | str = _config.DEFAULT_PROFILE_BATCH,
    every_n_epochs: int = 1,
    top_k: int = 5,
    max_trace_mb: float | None = DEFAULT_MAX_TRACE_MB,
    keep_last_windows: int | None = None,
    ranks: int | Collection[int] | None = None,
    verbose: bool = True,
    record_shapes: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
    with_flops: bool = False,
    count_items: Callable[[Any], float] | None = None,
    trigger: str | None = None,
    trigger_max_windows: int = 3,
    trigger_min_spacing: int = 200,
    probes: Iterable[Probe] = (),
    baseline: str | os.PathLike[str] | None = None,
) -> FitArguments:
    """Check the arguments both adapters share, each by the rule :mod:`fitprof._config` gives it.

    This signature is the one declaration of the shared arguments: each ``FitProfiler.__init__`` spells them out
    for its users and their IDEs, after ``log_dir``, with the same names, order, types and defaults
    (``tests/test_fit_config.py`` checks both against it), and hands them over with :func:`shared`.

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


SHARED = ("log_dir", *inspect.signature(check_arguments).parameters)
"""The names of the arguments both ``FitProfiler`` classes take, in their order: ``log_dir``, then those of
:func:`check_arguments`."""


def shared(values: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of :func:`check_arguments` picked out of an ``__init__``'s ``locals()``."""
    return {name: values[name] for name in SHARED[1:]}

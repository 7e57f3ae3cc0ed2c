"""The arguments both ``FitProfiler`` adapters share, checked in one place (each by its rule
below), and the engine settings they make.

The Keras and the Lightning ``FitProfiler`` take the same keywords with the same meaning (``profile_batch``,
``every_n_epochs``, ``top_k``, the limits, ``ranks``, ``verbose``, the four torch profiler options,
``count_items``, the trigger and its limits, ``probes``, ``baseline``). Each adapter passes them to
:func:`check_arguments`, which refuses a bad value with one error naming it and what is allowed, and builds its
:class:`~fitprof.fit.engine.FitEngine` from :meth:`FitArguments.engine_settings` and its own parts.

``log_dir`` stays with each adapter: its check is shared (:func:`fitprof.fit.config.normalize_log_dir`), but Keras
needs a folder while Lightning's None means the trainer's.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PureWindowsPath
from typing import Any, TypedDict

from fitprof import _fs
from fitprof.fit.probes import Probe
from fitprof.fit.steps import SlowdownTrigger

DEFAULT_PROFILE_BATCH = (6, 10)
"""Steps 6-10 of every profiled epoch (1-based, inclusive): skips 5 steps of compilation and warm-up."""


@dataclass(frozen=True)
class ProfileConfig:
    """Checked settings.

    Attributes:
        first_step: first profiled step of an epoch, 1-based (step 1 is the epoch's first batch).
        last_step: last profiled step of an epoch, 1-based, inclusive (``>= first_step``).
        every_n_epochs: profile epochs 0, N, 2N, ... (0-based epoch index).
        top_k: how many operators to log.
        default: ``profile_batch`` was not given (the default window): under Keras's ``steps_per_execution`` it
            then means calls, not batches (:meth:`in_calls`).
    """

    first_step: int
    last_step: int
    every_n_epochs: int
    top_k: int
    default: bool = False

    def in_calls(self, spe: int) -> ProfileConfig:
        """The window in batches when one call runs ``spe`` batches: the default window is steps (calls) 6-10 of
        an epoch whatever ``spe`` is, so it analyses 5 calls (batches ``5 * spe + 1`` to ``10 * spe``), not the one
        call that batches 6-10 fall in; a ``profile_batch`` the user gave is in batches, as Keras's
        ``TensorBoard(profile_batch=...)`` counts them, and is kept."""
        if not self.default or spe <= 1 or not self.enabled:
            return self
        return dataclasses.replace(self, first_step=(self.first_step - 1) * spe + 1, last_step=self.last_step * spe)

    @property
    def num_steps(self) -> int:
        return self.last_step - self.first_step + 1

    @property
    def enabled(self) -> bool:
        """False for ``profile_batch=0``: profiling is off (as in Keras's ``TensorBoard``), with no warning."""
        return self.first_step > 0

    def profiles_epoch(self, epoch: int) -> bool:
        """Whether the 0-based ``epoch`` gets a window."""
        return epoch % self.every_n_epochs == 0


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def parse_profile_batch(value: Any) -> tuple[int, int]:
    """Parse ``profile_batch`` into a 1-based inclusive ``(first, last)`` pair of steps in an epoch.

    Accepts an int ``n`` (profile step ``n`` only), a ``(first, last)`` pair, or the string ``"first,last"``
    that Keras's ``TensorBoard(profile_batch=...)`` takes. ``0`` (or ``(0, 0)``, ``"0"``, ``"0,0"``) turns
    profiling off, as in Keras's ``TensorBoard``: it returns ``(0, 0)``.

    Raises:
        TypeError: for a value of another type.
        ValueError: for steps < 1, a reversed pair, or a malformed string.
    """
    allowed = "0 (off), an int >= 1, a (first, last) pair with 1 <= first <= last, or a 'first,last' string"
    raw = value
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"profile_batch must be {allowed}; got {raw!r}") from None
        if len(nums) == 1:
            nums = nums * 2
        if len(nums) != 2:
            raise ValueError(f"profile_batch must be {allowed}; got {raw!r}")
        value = tuple(nums)
    if _is_int(value):
        value = (int(value), int(value))
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or not all(_is_int(v) for v in value):
            raise ValueError(f"profile_batch must be {allowed}; got {raw!r}")
        first, last = int(value[0]), int(value[1])
        if first == last == 0:
            return 0, 0
        if first < 1 or last < first:
            raise ValueError(f"profile_batch must be {allowed}; got {raw!r}")
        return first, last
    raise TypeError(f"profile_batch must be {allowed}; got {raw!r} of type {type(raw).__name__}")


def normalize_log_dir(value: Any) -> str:
    """Check ``log_dir`` and return it as a string path or URL.

    A URL (``s3://bucket/run``, ``gs://...``, ``memory://...``) is kept as it is (fitprof records locally and
    copies there, see :mod:`fitprof._fs`); a ``file://`` URL becomes its local path. For local paths,
    Windows-style separators are accepted on every system: on POSIX, ``logs\\run1`` means ``logs/run1`` (a
    backslash in a folder name is almost never meant). ``~`` is expanded. Spaces and non-ASCII names are kept.

    Raises:
        TypeError: if it is not a ``str`` or ``os.PathLike``.
        ValueError: if it is empty.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"log_dir must be a str or os.PathLike; got {value!r} of type {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        raise ValueError(f"log_dir must be a non-empty path; got {value!r}")
    if _fs.is_remote(text):
        return text
    text = _fs.local_path(text)
    if os.sep == "/" and "\\" in text:
        text = PureWindowsPath(text).as_posix()
    return os.path.expanduser(text)


def check_positive_int(name: str, value: Any) -> int:
    """Return ``value`` if it is an int >= 1.

    Raises:
        TypeError: if it is not an int (bools are refused).
        ValueError: if it is < 1.
    """
    if not _is_int(value):
        raise TypeError(f"{name} must be an int >= 1; got {value!r} of type {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1; got {value!r}")
    return int(value)


TORCH_OPTIONS = ("record_shapes", "profile_memory", "with_stack", "with_flops")
"""The ``torch.profiler.profile`` options both torch-backed callbacks pass through (off by default)."""


def check_flag(name: str, value: Any) -> bool:
    """Return ``value`` if it is a bool.

    Raises:
        TypeError: if it is not a bool (``0`` / ``1`` / ``None`` are refused: say ``True`` or ``False``).
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {value!r} of type {type(value).__name__}")
    return value


def torch_options(**options: Any) -> dict[str, bool]:
    """Check the torch profiler options (:data:`TORCH_OPTIONS`, each a bool) and return them by name.

    Raises:
        TypeError: for a value that is not a bool, or a name not in :data:`TORCH_OPTIONS`.
    """
    unknown = set(options) - set(TORCH_OPTIONS)
    if unknown:
        raise TypeError(f"unknown torch profiler options {sorted(unknown)}; allowed: {list(TORCH_OPTIONS)}")
    return {name: check_flag(name, value) for name, value in options.items()}


def check_optional_limit(name: str, value: Any, *, integer: bool) -> Any:
    """``None``, or a number > 0 (an int >= 1 when ``integer``).

    Raises:
        TypeError: for a value of another type (bools are refused).
        ValueError: for a value <= 0.
    """
    if value is None:
        return None
    allowed = "None or an int >= 1" if integer else "None or a number > 0"
    ok_type = _is_int(value) if integer else (isinstance(value, numbers.Real) and not isinstance(value, bool))
    if not ok_type:
        raise TypeError(f"{name} must be {allowed}; got {value!r} of type {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be {allowed}; got {value!r}")
    return int(value) if integer else float(value)


def check_ranks(value: Any) -> frozenset[int] | None:
    """``ranks``: ``None`` (every rank profiles), one global rank, or a non-empty collection of global ranks.

    Raises:
        TypeError: for a value of another type, or a member that is not an int (bools are refused).
        ValueError: for an empty collection or a rank < 0.
    """
    if value is None:
        return None
    allowed = "None, an int >= 0 or a non-empty list of ints >= 0 (global ranks)"
    members = [value] if _is_int(value) else value
    if isinstance(value, (str, bytes)) or not isinstance(members, (list, tuple, set, frozenset, range)):
        raise TypeError(f"ranks must be {allowed}; got {value!r} of type {type(value).__name__}")
    if not all(_is_int(r) for r in members):
        raise TypeError(f"ranks must be {allowed}; got {value!r}")
    if not members or any(r < 0 for r in members):
        raise ValueError(f"ranks must be {allowed}; got {value!r}")
    return frozenset(int(r) for r in members)


def profiles_rank(ranks: frozenset[int] | None, rank: int) -> bool:
    """Whether global rank ``rank`` profiles under ``ranks`` (None: every rank does)."""
    return ranks is None or rank in ranks


def unknown_ranks_message(ranks: frozenset[int] | None, world_size: int) -> str | None:
    """The warning for ``ranks`` that names no rank of a run of ``world_size`` ranks (nothing is profiled), else
    None."""
    if ranks is None or min(ranks) < world_size:
        return None
    return f"ranks={sorted(ranks)} names no rank of this run (ranks 0-{world_size - 1}); nothing is profiled."


def make_config(profile_batch: Any, every_n_epochs: Any, top_k: Any) -> ProfileConfig:
    """Check the shared arguments of both callbacks (see :class:`ProfileConfig`)."""
    first, last = parse_profile_batch(profile_batch)
    return ProfileConfig(
        first_step=first,
        last_step=last,
        every_n_epochs=check_positive_int("every_n_epochs", every_n_epochs),
        top_k=check_positive_int("top_k", top_k),
        default=profile_batch is DEFAULT_PROFILE_BATCH,
    )


def check_count_items(value: Any) -> Any:
    """``count_items`` if it is None or callable (``count_items(batch) -> float``: the items, e.g. tokens, in one
    batch, for ``fitprof/items_per_s``).

    Raises:
        TypeError: for anything else.
    """
    if value is None or callable(value):
        return value
    raise TypeError(
        f"count_items must be None or a function of one batch returning its number of items (e.g. tokens); "
        f"got {value!r} of type {type(value).__name__}"
    )


TRIGGERS = ("slowdown",)
"""The values ``trigger`` takes besides None (no triggered windows)."""


def check_trigger(trigger: Any, max_windows: Any, min_spacing: Any) -> str | None:
    """``trigger`` (None or ``"slowdown"``), with ``trigger_max_windows`` (an int >= 1) and
    ``trigger_min_spacing`` (an int >= 0, in steps) checked alongside.

    Raises:
        ValueError: for a ``trigger`` other than None or ``"slowdown"``, or a limit out of range.
        TypeError: for a limit that is not an int (bools are refused).
    """
    if trigger is not None and trigger not in TRIGGERS:
        raise ValueError(f"trigger must be None or one of {list(TRIGGERS)}; got {trigger!r}")
    check_positive_int("trigger_max_windows", max_windows)
    if not _is_int(min_spacing):
        raise TypeError(
            f"trigger_min_spacing must be an int >= 0; got {min_spacing!r} of type {type(min_spacing).__name__}"
        )
    if min_spacing < 0:
        raise ValueError(f"trigger_min_spacing must be an int >= 0; got {min_spacing!r}")
    return None if trigger is None else str(trigger)


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
        config: ``profile_batch``, ``every_n_epochs`` and ``top_k`` (:class:`~fitprof.ProfileConfig`).
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


@dataclass(frozen=True)
class Argument:
    """One shared argument as each ``FitProfiler.__init__`` spells it: its name, its annotation and its default
    (source text)."""

    name: str
    annotation: str
    default: str


ARGUMENTS: tuple[Argument, ...] = (
    Argument("log_dir", "str | os.PathLike[str]", ""),  # the default is each adapter's own ("logs", None)
    Argument("profile_batch", "int | tuple[int, int] | str", "DEFAULT_PROFILE_BATCH"),
    Argument("every_n_epochs", "int", "1"),
    Argument("top_k", "int", "5"),
    Argument("max_trace_mb", "float | None", "DEFAULT_MAX_TRACE_MB"),
    Argument("keep_last_windows", "int | None", "None"),
    Argument("ranks", "int | Collection[int] | None", "None"),
    Argument("verbose", "bool", "True"),
    Argument("record_shapes", "bool", "False"),
    Argument("profile_memory", "bool", "False"),
    Argument("with_stack", "bool", "False"),
    Argument("with_flops", "bool", "False"),
    Argument("count_items", "Callable[[Any], float] | None", "None"),
    Argument("trigger", "str | None", "None"),
    Argument("trigger_max_windows", "int", "3"),
    Argument("trigger_min_spacing", "int", "200"),
    Argument("probes", "Iterable[Probe]", "()"),
    Argument("baseline", "str | os.PathLike[str] | None", "None"),
)
"""The one declaration of the 18 arguments both ``FitProfiler`` classes take, in their order. Each adapter's
``__init__`` spells them out for its users and their IDEs, with these names, annotations and defaults
(``tests/test_fit_config.py`` holds both to it), and hands all but ``log_dir`` to :func:`check_arguments` with
:func:`shared`."""

SHARED = tuple(a.name for a in ARGUMENTS)
"""The names of :data:`ARGUMENTS`, in their order."""


def check_arguments(**given: Any) -> FitArguments:
    """Check the arguments both adapters share (:data:`ARGUMENTS` but ``log_dir``, by keyword), each by its rule
    in this module.

    Raises:
        ValueError: a malformed or out-of-range ``profile_batch``; ``every_n_epochs``, ``top_k`` or
            ``trigger_max_windows`` < 1; ``max_trace_mb`` or ``keep_last_windows`` <= 0; ``ranks`` empty or
            holding a rank < 0; ``trigger`` not None or ``"slowdown"``; ``trigger_min_spacing`` < 0. Each message
            names the argument, the value received and what is allowed.
        TypeError: an argument of the wrong type (a bool where a number is wanted, a non-bool flag, a
            ``count_items`` that cannot be called), named the same way; an argument missing or unknown.
    """
    names = set(SHARED[1:])
    if set(given) != names:
        missing, unknown = sorted(names - set(given)), sorted(set(given) - names)
        raise TypeError(f"check_arguments: missing {missing}, unknown {unknown}")
    g = given
    return FitArguments(
        config=make_config(g["profile_batch"], g["every_n_epochs"], g["top_k"]),
        max_trace_mb=check_optional_limit("max_trace_mb", g["max_trace_mb"], integer=False),
        keep_last_windows=check_optional_limit("keep_last_windows", g["keep_last_windows"], integer=True),
        ranks=check_ranks(g["ranks"]),
        verbose=check_flag("verbose", g["verbose"]),
        torch_options=torch_options(**{name: g[name] for name in TORCH_OPTIONS}),
        count_items=check_count_items(g["count_items"]),
        trigger=check_trigger(g["trigger"], g["trigger_max_windows"], g["trigger_min_spacing"]),
        trigger_max_windows=int(g["trigger_max_windows"]),
        trigger_min_spacing=int(g["trigger_min_spacing"]),
        probes=tuple(g["probes"]),
        baseline=g["baseline"],
    )


def shared(values: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of :func:`check_arguments` (:data:`SHARED` but ``log_dir``) picked out of an ``__init__``'s
    ``locals()``."""
    return {name: values[name] for name in SHARED[1:]}

"""The arguments both callbacks share, checked in one place (``fitprof.fit.config``), without a framework."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from fitprof._warn import WarnOnce
from fitprof.fit import FitEngine
from fitprof.fit.boundary import LIGHTNING
from fitprof.fit.config import ARGUMENTS, SHARED, check_arguments
from fitprof.fit.steps import SlowdownTrigger

DEFAULTS: dict[str, Any] = {
    "profile_batch": (6, 10),
    "every_n_epochs": 1,
    "top_k": 5,
    "max_trace_mb": 500.0,
    "keep_last_windows": None,
    "ranks": None,
    "verbose": True,
    "record_shapes": False,
    "profile_memory": False,
    "with_stack": False,
    "with_flops": False,
    "count_items": None,
    "trigger": None,
    "trigger_max_windows": 3,
    "trigger_min_spacing": 200,
    "probes": (),
    "baseline": None,
}


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ({"profile_batch": (5, 2)}, ValueError, r"profile_batch must be .*; got \(5, 2\)"),
        ({"every_n_epochs": 0}, ValueError, r"every_n_epochs must be an int >= 1; got 0"),
        ({"top_k": True}, TypeError, r"top_k must be an int >= 1; got True"),
        ({"max_trace_mb": 0}, ValueError, r"max_trace_mb must be None or a number > 0; got 0"),
        ({"keep_last_windows": 1.5}, TypeError, r"keep_last_windows must be None or an int >= 1; got 1.5"),
        ({"ranks": [0, -1]}, ValueError, r"ranks must be None, an int >= 0 .*; got \[0, -1\]"),
        ({"verbose": "yes"}, TypeError, r"verbose must be True or False; got 'yes'"),
        ({"with_stack": 1}, TypeError, r"with_stack must be True or False; got 1"),
        ({"count_items": 3}, TypeError, r"count_items must be None or a function of one batch"),
        ({"trigger": "fast"}, ValueError, r"trigger must be None or one of \['slowdown'\]; got 'fast'"),
        ({"trigger_max_windows": 0}, ValueError, r"trigger_max_windows must be an int >= 1; got 0"),
        ({"trigger_min_spacing": -1}, ValueError, r"trigger_min_spacing must be an int >= 0; got -1"),
    ],
)
def test_each_shared_argument_is_refused_by_name(bad: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        check_arguments(**{**DEFAULTS, **bad})


def test_the_checked_values() -> None:
    args = check_arguments(**{**DEFAULTS, "profile_batch": "2,4", "ranks": 1, "max_trace_mb": 3, "with_flops": True})
    assert (args.config.first_step, args.config.last_step, args.config.top_k) == (2, 4, 5)
    assert args.ranks == frozenset({1}) and args.max_trace_mb == 3.0 and isinstance(args.max_trace_mb, float)
    assert args.torch_options == {
        "record_shapes": False,
        "profile_memory": False,
        "with_stack": False,
        "with_flops": True,
    }


def test_the_engine_gets_a_new_trigger_with_the_given_limits(tmp_path: Path) -> None:
    assert check_arguments(**DEFAULTS).engine_settings()["trigger"] is None
    args = check_arguments(**{**DEFAULTS, "trigger": "slowdown", "trigger_max_windows": 2, "trigger_min_spacing": 7})
    first, second = args.engine_settings()["trigger"], args.engine_settings()["trigger"]
    assert isinstance(first, SlowdownTrigger) and first is not second  # each engine its own trigger state
    engine = FitEngine(
        args.config,
        new_window=lambda epoch, suffix: None,
        warn=WarnOnce(),
        boundary=LIGHTNING,
        **args.engine_settings(),
    )
    assert engine.trigger is not None
    assert (engine.trigger.max_windows, engine.trigger.min_spacing) == (2, 7)
    assert engine.ranks is None


def _init_parameters(path: Path) -> list[tuple[str, str, str]]:
    """``(name, annotation, default)`` source text of each parameter of ``FitProfiler.__init__`` in ``path``, read
    with ``ast``: no framework is imported."""
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FitProfiler")
    node = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    args, defaults = node.args.args[1:], node.args.defaults
    assert len(args) == len(defaults)  # every argument has a default
    return [
        (a.arg, ast.unparse(a.annotation) if a.annotation else "", ast.unparse(d))
        for a, d in zip(args, defaults, strict=True)
    ]


SRC = Path(__file__).parent.parent / "src" / "fitprof"


@pytest.mark.parametrize("adapter", ["keras", "lightning"])
def test_each_adapter_spells_out_the_one_declaration_of_the_shared_arguments(adapter: str) -> None:
    """Both ``FitProfiler.__init__`` signatures stay explicit for users and IDEs; they have the names, order,
    annotations and defaults of ``ARGUMENTS``, the one declaration (``log_dir``'s default and None are each
    adapter's own)."""
    spelled = _init_parameters(SRC / adapter / "fit_profiler.py")
    assert len(ARGUMENTS) == 18
    assert [name for name, _, _ in spelled] == [a.name for a in ARGUMENTS] == list(SHARED)
    assert spelled[1:] == [(a.name, a.annotation, a.default) for a in ARGUMENTS[1:]]
    assert spelled[0][1].removesuffix(" | None") == ARGUMENTS[0].annotation


def test_check_arguments_takes_exactly_the_shared_arguments() -> None:
    with pytest.raises(TypeError, match=r"missing \['top_k'\], unknown \['topk'\]"):
        check_arguments(**{**{k: v for k, v in DEFAULTS.items() if k != "top_k"}, "topk": 5})

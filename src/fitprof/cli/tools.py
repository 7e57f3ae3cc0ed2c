"""What ``fitprof mcp`` answers, without the MCP SDK: the four tools (``report``, ``analyze``, ``compare``,
``explain``), the folders they may read, and their answers.

``report``, ``analyze`` and ``compare`` run the subcommand itself (its module's ``add_arguments`` and ``run``, as
:func:`fitprof.cli.command.main` does) with ``--format json`` on the path they are given, and return its records as
it prints them (:class:`Answer`), so an agent reads the same figures as ``fitprof <command> --format json``: a
change to a subcommand (its options, its records) reaches the tools without a line here. Bad input is the
command's own error line (:class:`ToolError`).

Safety: the tools read only below the folders the server was started with (:class:`Roots`). A path is resolved
(symbolic links, ``..``) before it is used; a path outside, a URL, or a folder holding a link that leads outside is
refused before the command runs. The command's own bounds on untrusted files apply unchanged (trace size and
events, :mod:`fitprof.traces._limits`; report files that stay inside their log folder,
:mod:`fitprof.report_files`). No tool writes a file: options that write (``--out``, ``--plot``, ``--accept``) or
name a place (a free-text value: a path, a URL, a store) are refused.

``explain`` answers from the registries: a figure's key, unit and definition from :mod:`fitprof.metrics`, a
verdict's rule from :mod:`fitprof.analysis.verdict`'s docstring and its advice from
:func:`fitprof.analysis.verdict.advice_for`.

The command prints to ``sys.stdout`` and ``sys.stderr``; a tool call captures both, so calls are run one at a time
(a lock): the server stays answerable, but a second call waits for the first.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import io
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fitprof import _fs, metrics
from fitprof.analysis import verdict as verdict_rules
from fitprof.cli import analyze as analyze_command
from fitprof.cli import compare as compare_command
from fitprof.cli import report as report_command
from fitprof.cli.output import EXIT_BAD_INPUT, Output

FORMAT_JSON = ("--format", "json")
"""What every tool adds to the command: its JSON records."""

REFUSED_OPTIONS = frozenset({"-h", "--help", "--format", "--out", "--plot", "--accept"})
"""Options a tool never passes on: the format is the tools' own; the others print help or write files."""

SUMMARY_LINES = 20
"""At most this many lines of headlines in an answer's summary; the records hold every one."""

FRAMEWORKS = ("pytorch", "tensorflow", "jax")
"""The frameworks ``explain`` gives a verdict's advice for (:func:`fitprof.analysis.verdict.advice_for`)."""


class ToolError(Exception):
    """A tool call that gives no answer; the message is the command's error lines, or one line of the same shape
    (``fitprof: error: <input>: <what is wrong>``, :func:`refusal`)."""


def refusal(message: str) -> ToolError:
    """A :class:`ToolError` for what the tools refuse themselves, worded as the command's error lines."""
    return ToolError(f"fitprof: error: {' '.join(message.split())}")


@dataclasses.dataclass(frozen=True)
class Answer:
    """One tool's answer.

    Attributes:
        data: what the tool returns as JSON: for ``report``, ``analyze`` and ``compare`` the records exactly as
            ``fitprof <command> --format json`` prints them (a list of objects; NaN as ``null``); for ``explain``
            an object (:func:`explain`).
        text: ``data`` as JSON text (for the three commands: the command's own output, byte for byte).
        summary: a few lines for a reader: each record's headline, the files skipped.
        warnings: the command's ``fitprof: warning:`` lines (files it skipped), empty when none.
        exit_status: the command's exit status (``compare``: 1 for a regression); 0 for ``explain``.
    """

    data: Any
    text: str
    summary: str
    warnings: list[str]
    exit_status: int = 0


class Roots:
    """The folders the tools may read below (``fitprof mcp --root``), resolved once.

    Args:
        roots: folders, absolute or relative to the working folder; the first is where a relative tool argument is
            taken from.

    Raises:
        ValueError: a root that is not an existing folder (the message names it).
    """

    def __init__(self, roots: Iterable[str | os.PathLike[str]]) -> None:
        given = [Path(os.path.abspath(_fs.local_path(os.fspath(r)))) for r in roots]
        if not given:
            raise ValueError("at least one root folder is needed")
        for root in given:
            if not root.is_dir():
                raise ValueError(f"--root {root}: not a folder")
        self.given = given
        self.real = [Path(os.path.realpath(r)) for r in given]

    def __str__(self) -> str:
        return ", ".join(os.fspath(r) for r in self.given)

    def inside(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path``, resolved (links and ``..``), lies in one of the roots."""
        real = os.path.realpath(path)
        return any(os.path.commonpath([real, root]) == os.fspath(root) for root in self.real)

    def path(self, arg: str) -> str:
        """The path a tool hands the command for its argument ``arg``: ``file://`` URLs as paths, relative paths
        taken from the first root, and not resolved (the records name it as given); checked first.

        Raises:
            ToolError: ``arg`` is empty, a URL other than ``file://``, or lies outside the roots once resolved; or
                it is a folder holding a file or folder that leads outside them through a link.
        """
        if not isinstance(arg, str) or not arg.strip() or "\0" in arg:
            raise refusal(f"{arg!r}: not a path (give a file or folder below {self})")
        if _fs.is_remote(arg):
            raise refusal(f"{arg}: not read: this server reads only local files below {self}")
        local = os.path.expanduser(_fs.local_path(arg))
        path = local if os.path.isabs(local) else os.path.join(self.given[0], local)
        if not self.inside(path):
            via = f" (a link to {os.path.realpath(path)})" if os.path.islink(path) else ""
            raise refusal(
                f"{arg}{via}: outside the folders this server may read ({self}); start it with --root for another"
            )
        if os.path.isdir(path):
            self._links_stay_inside(path, arg)
        return path

    def _links_stay_inside(self, folder: str, arg: str) -> None:
        """Raise :class:`ToolError` for the first entry below ``folder`` (any depth; linked folders followed once)
        that resolves outside the roots: the commands follow links as TensorBoard's log-dir walk does."""
        seen: set[str] = set()
        for here, dirs, names in os.walk(folder, followlinks=True):
            real = os.path.realpath(here)
            if real in seen:  # a link loop, or a folder reached twice
                dirs[:] = []
                continue
            seen.add(real)
            for name in [*dirs, *names]:
                entry = os.path.join(here, name)
                if os.path.islink(entry) and not self.inside(entry):
                    raise refusal(
                        f"{arg}: {entry} is a link to {os.path.realpath(entry)}, outside the folders this server "
                        f"may read ({self}); not read"
                    )


COMMANDS = {"report": report_command, "analyze": analyze_command, "compare": compare_command}
"""The subcommands the tools run, by name (each a :class:`fitprof.cli.command.Command`)."""

_LOCK = threading.Lock()


def command_parser(command: str) -> argparse.ArgumentParser:
    """The parser of ``fitprof COMMAND``, made as :func:`fitprof.cli.command.build_parser` makes it."""
    module = COMMANDS[command]
    parser = argparse.ArgumentParser(prog=f"fitprof {command}", description=module.DESCRIPTION)
    module.add_arguments(parser)
    return parser


def run_command(argv: list[str]) -> tuple[int, str, list[str]]:
    """``fitprof ARGV`` in this process: ``ARGV[0]``'s parser and ``run``, as :func:`fitprof.cli.command.main`
    runs them for local paths; the exit status, what it printed on stdout, and its stderr lines. One call at a time:
    the command prints through ``sys.stdout`` / ``sys.stderr``, which are captured for the call."""
    out, err = io.StringIO(), io.StringIO()
    with _LOCK, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args = command_parser(argv[0]).parse_args(argv[1:])
            status = COMMANDS[argv[0]].run(args, Output())
        except SystemExit as exc:  # argparse exits on a bad argument, its message printed
            status = exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    return status, out.getvalue(), [line for line in err.getvalue().splitlines() if line.strip()]


def command_answer(argv: list[str]) -> Answer:
    """Run ``fitprof ARGV --format json`` and return its records.

    Whatever printed records is an answer, with its exit status (``compare`` exits 1 on a regression; the records
    say so); a command that printed nothing gives no answer.

    Raises:
        ToolError: the command printed no record: its error lines (argparse's usage lines left out).
    """
    status, out, lines = run_command([*argv, *FORMAT_JSON])
    if not out.strip():
        errors = [line for line in lines if not line.startswith(("usage:", " "))] or lines
        raise ToolError("\n".join(errors) or f"fitprof {argv[0]}: exit status {status}, no output")
    records = json.loads(out)
    warnings = [line for line in lines if line.startswith("fitprof: warning:")]
    return Answer(records, out, summarize(records, warnings), warnings, status)


def summarize(records: list[dict[str, Any]], warnings: list[str]) -> str:
    """The summary of a command's records: one line per record with a headline (``<run>, epoch E, rank R:
    <headline>``) or epoch verdicts, at most :data:`SUMMARY_LINES`, then the skipped files."""
    lines = []
    for rec in records:
        parts = [
            str(rec["run"]) if rec.get("run") is not None else "",
            f"epoch {rec['epoch']}" if rec.get("epoch") is not None else "",
            f"rank {rec['rank']}" if rec.get("rank") is not None else "",
        ]
        where = ", ".join(p for p in parts if p)
        if rec.get("headline"):
            lines.append(f"{where}: {rec['headline']}" if where else str(rec["headline"]))
        elif rec.get("verdicts"):
            lines.append(f"{where}: {'; '.join(map(str, rec['verdicts']))}")
    if len(lines) > SUMMARY_LINES:
        lines[SUMMARY_LINES:] = [f"... and {len(lines) - SUMMARY_LINES} more (see the records)"]
    if not lines:
        lines.append(f"{len(records)} records")
    return "\n".join([*lines, *(line.removeprefix("fitprof: ") for line in warnings)])


def report(roots: Roots, run: str) -> Answer:
    """``fitprof report RUN --format json``: the records of every fitprof run below ``run`` (a log folder or one
    run's folder; see :mod:`fitprof.cli.report`).

    Raises:
        ToolError: ``run`` outside the roots (:meth:`Roots.path`), or the command's error line.
    """
    return command_answer(["report", roots.path(run)])


def analyze(roots: Roots, trace: str) -> Answer:
    """``fitprof analyze TRACE --format json``: one record per trace file (a file, a ``plugins/profile/<session>``
    folder, or a trace handler's folder), and the spread across ranks (see :mod:`fitprof.cli.analyze`).

    Raises:
        ToolError: ``trace`` outside the roots (:meth:`Roots.path`), or the command's error line (a corrupt,
            foreign or oversized trace).
    """
    return command_answer(["analyze", roots.path(trace)])


def compare(
    roots: Roots, baseline: str, candidate: str, options: Mapping[str, Any] | Sequence[str] | None = None
) -> Answer:
    """``fitprof compare BASELINE CANDIDATE [OPTIONS] --format json``: the comparison's records (see
    :mod:`fitprof.cli.compare`); a regression (exit status 1) is an answer, not an error.

    Args:
        options: the command's options by name, with or without the leading ``--`` (``{"fail-over": 5}``,
            ``{"strict": true}``), or as command-line arguments (``["--fail-over", "5"]``): see
            :func:`option_args`.

    Raises:
        ToolError: a side outside the roots, an option refused (:func:`option_args`), or the command's error
            lines (a missing side, sides that are not comparable, a bad option value).
    """
    args = option_args("compare", options or {})
    return command_answer(["compare", roots.path(baseline), roots.path(candidate), *args])


def passable_options(command: str) -> dict[str, argparse.Action]:
    """The options of ``fitprof COMMAND`` a tool passes on, by flag (``--fail-over``): flags, and options whose
    value the parser checks (a type other than text, or a fixed set of choices); not :data:`REFUSED_OPTIONS`.
    An option whose value is free text (a path, a URL, a name in a store) is left out: it could lead outside the
    roots."""
    out = {}
    for action in command_parser(command)._actions:
        if not action.option_strings or action.option_strings[0] in REFUSED_OPTIONS:
            continue
        if action.nargs == 0 or action.choices is not None or action.type not in (None, str):
            out[max(action.option_strings, key=len)] = action
    return out


def option_args(command: str, options: Mapping[str, Any] | Sequence[str]) -> list[str]:
    """``options`` as the command's arguments, checked against :func:`passable_options`.

    ``options`` is an object of option name to value, ``{"fail-over": 5, "strict": True}`` -> ``["--fail-over",
    "5", "--strict"]``: a name with or without ``--``, with ``_`` or ``-``; a flag takes ``true`` (given) or
    ``false`` (left out); another option a number or a string (a list of them: the option once per item), which
    the command's parser checks. Or a list of command-line arguments, ``["--fail-over", "5", "--strict"]`` (also
    ``--fail-over=5``), read the same way.

    Raises:
        ToolError: ``options`` is neither, names an option the command does not take or the tools do not pass on
            (the message lists those they do), or gives a flag a value, or an option none.
    """
    allowed = passable_options(command)
    args: list[str] = []
    for name, value in _option_pairs(options, command, allowed):
        flag = "--" + str(name).lstrip("-").replace("_", "-")
        action = allowed.get(flag)
        if action is None:
            raise _not_passed(name, command, allowed)
        if action.nargs == 0:
            if not isinstance(value, bool):
                raise refusal(f"options: {name!r} is a flag: give true or false, not {value!r}")
            args += [flag] if value else []
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, bool) or not isinstance(item, (int, float, str)):
                raise refusal(f"options: {name!r} takes a number or a string, not {item!r}")
            args += [flag, str(item)]
    return args


def _not_passed(name: object, command: str, allowed: Mapping[str, argparse.Action]) -> ToolError:
    return refusal(
        f"options: {name!r} is not an option this server passes to fitprof {command} "
        f"(allowed: {', '.join(f.removeprefix('--') for f in allowed) or 'none'})"
    )


def _option_pairs(options: Any, command: str, allowed: Mapping[str, argparse.Action]) -> list[tuple[str, Any]]:
    """``(name, value)`` for each option of ``options`` (:func:`option_args`): an object's items, or a list of
    command-line arguments read as the parser reads them (a flag's value ``True``)."""
    if isinstance(options, Mapping):
        return list(options.items())
    if not isinstance(options, Sequence) or isinstance(options, str) or not all(isinstance(a, str) for a in options):
        raise refusal(f"options: expected an object of option name to value or a list of arguments, got {options!r}")
    pairs: list[tuple[str, Any]] = []
    tokens = list(options)
    while tokens:
        token = tokens.pop(0)
        if not token.startswith("--"):
            raise refusal(f"options: {token!r} is not an option (an option starts with --)")
        name, eq, value = token.partition("=")
        action = allowed.get(name.replace("_", "-"))
        if action is None:
            raise _not_passed(name, command, allowed)
        if eq:
            pairs.append((name, value))
        elif action.nargs == 0:
            pairs.append((name, True))
        elif not tokens:
            raise refusal(f"options: {name} needs a value")
        else:
            pairs.append((name, tokens.pop(0)))
    return pairs


# ------------------------------------------------------------------------------------------------ explain

_BULLET = re.compile(r"^(?P<indent>\s*)[*-] (?:``(?P<name>[a-z-]+)``(?P<when> \([^)]*\))?: )?(?P<text>.*)$")
_ROLE = re.compile(r":\w+:`~?([^`]+)`")


def verdict_rules_text() -> dict[str, str]:
    """Each verdict's rule, as :mod:`fitprof.analysis.verdict`'s docstring states it (its bullet list: one bullet
    per verdict, continuation lines joined, a nested bullet after the condition of the bullet it is under), in
    plain text (single backticks), by verdict name."""
    out: dict[str, str] = {}
    parent = ""  # the text of the current top-level bullet without a verdict: the condition of the nested ones
    current: str | None = None
    for line in (verdict_rules.__doc__ or "").splitlines():
        m = _BULLET.match(line)
        if m:
            nested = bool(m.group("indent"))
            if m.group("name"):
                current = m.group("name")
                when = (m.group("when") or "").strip()
                when = "" if ":data:" in when else when  # a name for the code, not a condition
                rule = f"{when} {m.group('text')}".strip()
                out[current] = f"{parent.rstrip(':')}: {rule}" if nested and parent else rule
            else:
                current, parent = None, m.group("text")
        elif line.startswith("  ") and line.strip():
            if current is not None:
                out[current] += " " + line.strip()
            elif parent:
                parent += " " + line.strip()
        elif line.strip():  # a paragraph after the list
            current, parent = None, ""
        else:
            current = None
    return {name: _ROLE.sub(r"`\1`", rule).replace("``", "`") for name, rule in out.items()}


def _figures_named(name: str) -> list[metrics.Metric]:
    """The registry's figures a name stands for: its key with or without ``fitprof/``, or a record's column (a
    window's key, or an epoch record's without ``fitprof/epoch/``); ``top_op_<i>_ms`` and ``top_ops/<op>`` by
    their pattern."""
    exact = [m for m in metrics.ALL if m.key == name.strip()]
    if exact:
        return exact
    bare = name.strip().removeprefix(metrics.PREFIX)
    found = [
        m for m in metrics.ALL if bare in (m.key.removeprefix(metrics.PREFIX), m.key.removeprefix(metrics.EPOCH_PREFIX))
    ]
    if not found and re.fullmatch(r"top_op_\d+_ms", bare):
        found = [metrics.TOP_OP_RANKED]
    if not found and bare.startswith(metrics.TOP_OPS_PREFIX.removeprefix(metrics.PREFIX)):
        found = [metrics.TOP_OP]
    return found


def explain(name: str) -> Answer:
    """What a figure or a verdict means.

    A figure (``step_time_ms``, ``fitprof/input_percent``, ``epoch/wall_s``, a record's column such as
    ``loader_busy_percent``) gives ``{"kind": "figure", "figures": [{"key", "unit", "definition", "group"}]}``
    from :mod:`fitprof.metrics`; a name that stands for a window figure and an epoch one gives both. A verdict
    (``input-bound``, ...) gives ``{"kind": "verdict", "verdict", "rule", "advice": {framework: [lines]}}``: the
    rule from :mod:`fitprof.analysis.verdict`'s docstring, the advice of
    :func:`~fitprof.analysis.verdict.advice_for` for each framework (a report's own advice also depends on its
    trace: pinned memory, the top operator, the ``tf.data`` stages).

    Raises:
        ToolError: a name that is neither; the message gives the closest names.
    """
    key = name.strip() if isinstance(name, str) else ""
    rules = verdict_rules_text()
    if key in rules:
        advice = {
            fw: verdict_rules.advice_for(key, fw, pageable_share=0.0, top=None)
            for fw in FRAMEWORKS
            if key != verdict_rules.CPU_CONTENDED
        }
        data: dict[str, Any] = {"kind": "verdict", "verdict": key, "rule": rules[key], "advice": advice}
        summary = f"{key}: {rules[key]}"
    else:
        figures = _figures_named(key)
        if not figures:
            known = [*rules, *(m.key.removeprefix(metrics.PREFIX) for m in metrics.ALL)]
            close = difflib.get_close_matches(key.removeprefix(metrics.PREFIX), known, n=5, cutoff=0.5)
            hint = f"; closest: {', '.join(close)}" if close else ""
            raise refusal(
                f"{name!r}: neither a figure nor a verdict (verdicts: {', '.join(rules)}; figures: the keys of "
                f"docs/metrics.md, with or without 'fitprof/'){hint}"
            )
        data = {
            "kind": "figure",
            "figures": [{k: getattr(m, k) for k in ("key", "unit", "definition", "group")} for m in figures],
        }
        summary = "\n".join(f"{m.key} ({m.unit}): {m.definition}" for m in figures)
    return Answer(data, json.dumps(data, indent=2), summary, [])

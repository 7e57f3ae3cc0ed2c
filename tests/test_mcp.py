"""``fitprof mcp``: the MCP server spoken to as an agent speaks to it, through the SDK's own stdio client, in one
child process for the whole conversation (initialize, list the tools, call each one, bad inputs between good ones).

Its answers are checked against ``fitprof <command> --format json`` run here on the same paths (the shipped traces
of ``tests/data``, run folders built from them), its refusals against the command's own error lines, and the
command without the SDK in a child process where ``import mcp`` fails.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fitprof
from fitprof import metrics
from fitprof.analysis import verdict
from fitprof.cli import main
from fitprof.cli import tools as mcp_tools
from fitprof.report_files import write_report_file
from shared_fixtures import DDP_RANKS, KERAS_XSPACE, LIGHTNING_CPU

SRC = Path(__file__).resolve().parents[1] / "src"
TOOLS = {"report", "analyze", "compare", "explain"}
TIMEOUT_S = 120  # each request; the whole conversation takes a few seconds on a quiet machine


def cli(*argv: str | os.PathLike[str]) -> tuple[int, str, list[str]]:
    """``fitprof ARGV --format json`` in this process through the command's own ``main``: exit status, stdout,
    stderr lines."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*map(os.fspath, argv), "--format", "json"])
    return rc, out.getvalue(), err.getvalue().splitlines()


def build_run(run: Path, windows: dict[tuple[int, int], Path]) -> Path:
    """A fitprof run folder as the callbacks lay it out: each ``(epoch, rank)`` window's trace copied into
    ``plugins/profile/<session>/`` and its report file written from the analysis of that copy."""
    for (epoch, rank), trace in windows.items():
        session = run / "plugins" / "profile" / f"2026_01_01_00_00_0{epoch}_rank{rank}"
        session.mkdir(parents=True)
        copy = Path(shutil.copy(trace, session / trace.name))
        report = dataclasses.replace(fitprof.analyze(copy), rank=rank)
        write_report_file(run, session=session.name, epoch=epoch, report=report, trace=copy, rank=rank)
    return run


@dataclasses.dataclass
class Place:
    """The folders the conversation reads: ``root`` (the server's only ``--root``) and ``outside`` (beside it)."""

    root: Path
    outside: Path

    def at(self, rel: str) -> Path:
        return self.root / rel


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Place:
    """Below the root: the shipped traces, the two gloo ranks in one folder, a corrupt trace, two runs of the
    Lightning trace (``logs/a``, ``logs/b``) and a run of the gloo ranks (``logs/ddp``); links that lead outside.
    Outside: a good trace."""
    base = tmp_path_factory.mktemp("mcp")
    root, outside = base / "root", base / "outside"
    traces = root / "traces"
    traces.mkdir(parents=True)
    for trace in (LIGHTNING_CPU, KERAS_XSPACE):
        shutil.copy(trace, traces / trace.name)
    (root / "ddp").mkdir()
    for trace in DDP_RANKS:
        shutil.copy(trace, root / "ddp" / trace.name)
    gz = LIGHTNING_CPU.read_bytes()
    (traces / "corrupt.pt.trace.json.gz").write_bytes(gz[: len(gz) // 2])
    build_run(root / "logs" / "a", {(0, 0): LIGHTNING_CPU, (1, 0): LIGHTNING_CPU})
    build_run(root / "logs" / "b", {(0, 0): LIGHTNING_CPU})
    build_run(root / "logs" / "ddp", {(0, 0): DDP_RANKS[0], (0, 1): DDP_RANKS[1]})
    outside.mkdir()
    secret = Path(shutil.copy(DDP_RANKS[0], outside / "secret.pt.trace.json.gz"))
    (traces / "link.pt.trace.json.gz").symlink_to(secret)
    (root / "linked").mkdir()
    (root / "linked" / "escape.pt.trace.json.gz").symlink_to(secret)
    return Place(root, outside)


GOOD = {
    "analyze lightning": ("analyze", {"trace": "traces/lightning_cpu.pt.trace.json.gz"}),
    "analyze keras": ("analyze", {"trace": "traces/keras_tf_cpu.xplane.pb"}),
    "analyze ranks": ("analyze", {"trace": "ddp"}),
    "report": ("report", {"run": "logs"}),
    "compare": ("compare", {"baseline": "logs/a", "candidate": "logs/b"}),
    "compare options": (
        "compare",
        {"baseline": "logs/a", "candidate": "logs/b", "options": {"fail-over": 50, "min_ms": 2, "--strict": True}},
    ),
    "compare argument list": (
        "compare",
        {"baseline": "logs/a", "candidate": "logs/b", "options": ["--fail-over", "50", "--min-ms=2", "--strict"]},
    ),
}
"""Calls with an answer, by name: the tool and its arguments (paths relative to the root)."""

BAD = {
    "outside": ("analyze", {"trace": "{outside}/secret.pt.trace.json.gz"}),
    "dot-dot": ("analyze", {"trace": "traces/../../outside/secret.pt.trace.json.gz"}),
    "file url": ("analyze", {"trace": "file://{outside}/secret.pt.trace.json.gz"}),
    "link": ("analyze", {"trace": "traces/link.pt.trace.json.gz"}),
    "folder with a link": ("analyze", {"trace": "linked"}),
    "report outside": ("report", {"run": "{outside}"}),
    "compare outside": ("compare", {"baseline": "logs/a", "candidate": "{outside}/secret.pt.trace.json.gz"}),
    "url": ("analyze", {"trace": "s3://bucket/secret.pt.trace.json.gz"}),
    "corrupt": ("analyze", {"trace": "traces/corrupt.pt.trace.json.gz"}),
    "missing": ("analyze", {"trace": "traces/missing.pt.trace.json.gz"}),
    "not comparable": (
        "compare",
        {"baseline": "traces/lightning_cpu.pt.trace.json.gz", "candidate": "traces/keras_tf_cpu.xplane.pb"},
    ),
    "option that writes": ("compare", {"baseline": "logs/a", "candidate": "logs/b", "options": {"out": "x.json"}}),
    "unknown option": ("compare", {"baseline": "logs/a", "candidate": "logs/b", "options": {"nope": 1}}),
    "argument that writes": ("compare", {"baseline": "logs/a", "candidate": "logs/b", "options": ["--out", "x"]}),
    "bad option value": ("compare", {"baseline": "logs/a", "candidate": "logs/b", "options": {"fail-over": -1}}),
    "unknown name": ("explain", {"figure_or_verdict": "step_tme_ms"}),
}
"""Calls that must give a tool error, by name (``{outside}`` stands for the folder beside the root)."""

EXPLAIN = (
    "step_time_ms",
    "fitprof/epoch/wall_s",
    "input_percent",
    "fitprof/input_percent",
    "top_op_2_ms",
    *verdict.OPERATOR_VERDICTS,
)
AFTER_BAD = ("explain", {"figure_or_verdict": "step_time_ms"})
"""The call made after each bad one: the server must still answer."""


@dataclasses.dataclass
class Conversation:
    server_name: str
    server_version: str | None
    tools: dict[str, Any]
    good: dict[str, Any]
    bad: dict[str, tuple[Any, Any]]  # name: (the bad call's result, the next call's result)
    explained: dict[str, Any]


@pytest.fixture(scope="module")
def conversation(place: Place) -> Conversation:
    """One ``fitprof mcp --root ROOT`` child, spoken to through the SDK's stdio client: the initialize handshake,
    the tool list, every call of :data:`GOOD`, each of :data:`BAD` followed by :data:`AFTER_BAD`, and
    ``explain`` on :data:`EXPLAIN`."""
    pytest.importorskip("mcp", reason="needs the MCP SDK (pip install 'fitprof[mcp]')")
    import anyio
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "fitprof.cli", "mcp", "--root", os.fspath(place.root)],
        env={"PYTHONPATH": os.pathsep.join(p for p in (os.fspath(SRC), os.environ.get("PYTHONPATH")) if p)},
        cwd=place.outside,  # relative tool paths come from the root, not from the server's working folder
    )

    def fill(args: dict[str, Any]) -> dict[str, Any]:
        return {k: v.format(outside=place.outside) if isinstance(v, str) else v for k, v in args.items()}

    async def talk() -> Conversation:
        async with Client(params, mode="legacy", read_timeout_seconds=TIMEOUT_S) as client:
            info = client.server_info
            listed = {t.name: t for t in (await client.list_tools()).tools}
            good = {name: await client.call_tool(tool, fill(args)) for name, (tool, args) in GOOD.items()}
            bad = {}
            for name, (tool, args) in BAD.items():
                bad[name] = (await client.call_tool(tool, fill(args)), await client.call_tool(*AFTER_BAD))
            explained = {n: await client.call_tool("explain", {"figure_or_verdict": n}) for n in EXPLAIN}
        assert info is not None
        return Conversation(info.name, info.version, listed, good, bad, explained)

    return anyio.run(talk)


def test_initialize_and_list_the_tools(conversation: Conversation) -> None:
    assert conversation.server_name == "fitprof"
    assert conversation.server_version == fitprof.__version__
    assert set(conversation.tools) == TOOLS
    for tool in conversation.tools.values():
        assert tool.description and tool.annotations.read_only_hint is True
    schemas = {name: tool.input_schema for name, tool in conversation.tools.items()}
    assert schemas["report"]["required"] == ["run"]
    assert schemas["analyze"]["required"] == ["trace"]
    assert schemas["compare"]["required"] == ["baseline", "candidate"] and "options" in schemas["compare"]["properties"]
    assert schemas["explain"]["required"] == ["figure_or_verdict"]


def _cli_argv(place: Place, tool: str, args: dict[str, Any]) -> list[str]:
    """The command line a :data:`GOOD` call stands for: paths taken from the root, options as flags."""
    if tool == "compare":
        options = args.get("options") or {}
        flags = list(options) if isinstance(options, list) else []  # already command-line arguments
        for name, value in options.items() if isinstance(options, dict) else ():
            flag = "--" + name.lstrip("-").replace("_", "-")
            flags += [flag] if value is True else [flag, str(value)]
        return ["compare", os.fspath(place.at(args["baseline"])), os.fspath(place.at(args["candidate"])), *flags]
    return [tool, os.fspath(place.at(args["run" if tool == "report" else "trace"]))]


@pytest.mark.parametrize("name", list(GOOD))
def test_answers_equal_the_commands_json(name: str, conversation: Conversation, place: Place) -> None:
    """The tool's JSON is the command's ``--format json`` output byte for byte, its structured records the same
    records, and its summary holds each record's headline."""
    tool, args = GOOD[name]
    result = conversation.good[name]
    rc, out, err = cli(*_cli_argv(place, tool, args))
    assert rc in (0, 1) and out, err
    assert not result.is_error, result.content
    summary, text = (block.text for block in result.content)
    assert text == out
    records = json.loads(out)
    assert result.structured_content["records"] == records
    assert result.structured_content["exit_status"] == rc
    assert result.structured_content["warnings"] == [line for line in err if line.startswith("fitprof: warning:")]
    headlines = [r["headline"] for r in records if r.get("headline")]
    assert headlines and all(h in summary for h in headlines[: mcp_tools.SUMMARY_LINES])


def test_the_answers_cover_each_kind_of_record(conversation: Conversation) -> None:
    """The calls reach what each command gives: a trace per file and the spread of the two ranks, the windows of
    every run (and the spread of the gloo run), the comparison's head, figure and operator records."""
    kinds = {
        name: [r["record"] for r in result.structured_content["records"]] for name, result in conversation.good.items()
    }
    assert kinds["analyze lightning"] == ["trace"] and kinds["analyze keras"] == ["trace"]
    assert kinds["analyze ranks"] == ["trace", "trace", "spread"]
    assert kinds["report"].count("window") == 5 and kinds["report"].count("spread") == 1
    for name in ("compare", "compare options", "compare argument list"):
        assert kinds[name][0] == "compare" and {"figure", "operator"} <= set(kinds[name])
    for name in ("compare options", "compare argument list"):
        head = conversation.good[name].structured_content["records"][0]
        assert (head["fail_over_percent"], head["min_ms"]) == (50, 2)  # the options reached the command


def _error_text(result: Any) -> str:
    assert result.is_error, result.content
    (block,) = result.content
    return str(block.text)


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_a_tool_error_and_the_server_goes_on(name: str, conversation: Conversation, place: Place) -> None:
    result, after = conversation.bad[name]
    text = _error_text(result)
    assert "Traceback" not in text
    # the command's shape: `fitprof: error: ...` (argparse's own: `fitprof compare: error: ...`)
    assert all(line.startswith(("fitprof: error: ", "fitprof compare: error: ")) for line in text.splitlines()), text
    if name not in ("not comparable",):  # the command's own error lines for two sides: one per reason
        assert "\n" not in text, text
    outside = os.fspath(place.outside)
    if name in ("outside", "dot-dot", "file url", "report outside", "compare outside"):
        assert "outside the folders this server may read" in text and os.fspath(place.root) in text
    elif name in ("link", "folder with a link"):
        assert f"link to {outside}" in text and "outside the folders this server may read" in text
    elif name == "url":
        assert text.startswith("fitprof: error: s3://bucket/") and "reads only local files" in text
    elif name in ("corrupt", "missing", "not comparable", "bad option value"):
        tool, args = BAD[name]
        rc, out, err = cli(*_cli_argv(place, tool, args))
        assert rc == 2 and out == ""
        assert text == "\n".join(line for line in err if not line.startswith(("usage:", " ")))  # the CLI's words
    elif name in ("option that writes", "unknown option", "argument that writes"):
        assert "is not an option this server passes to fitprof compare" in text and "fail-over" in text
    elif name == "unknown name":
        assert "neither a figure nor a verdict" in text and "step_time_ms" in text  # the closest name
    assert not after.is_error and after.structured_content["figures"][0]["key"] == metrics.STEP_TIME_MS.key


def test_nothing_outside_the_root_was_read_into_an_answer(conversation: Conversation, place: Place) -> None:
    """No result names the outside folder but the refusals, which name it to say why."""
    for result in conversation.good.values():
        assert os.fspath(place.outside) not in json.dumps(result.structured_content)


def test_explain_figures_from_the_registry(conversation: Conversation) -> None:
    def figures(name: str) -> list[dict[str, Any]]:
        result = conversation.explained[name]
        assert not result.is_error, result.content
        assert result.structured_content["kind"] == "figure"
        return list(result.structured_content["figures"])

    def row(m: metrics.Metric) -> dict[str, Any]:
        return {"key": m.key, "unit": m.unit, "definition": m.definition, "group": m.group}

    assert figures("step_time_ms") == [row(metrics.STEP_TIME_MS)]
    assert figures("fitprof/epoch/wall_s") == [row(metrics.EPOCH_WALL_S)]
    # a record's column that is a window figure and an epoch figure: both
    assert figures("input_percent") == [row(metrics.INPUT_PERCENT), row(metrics.EPOCH_INPUT_PERCENT)]
    assert figures("fitprof/input_percent") == [row(metrics.INPUT_PERCENT)]  # a whole key: that figure only
    assert figures("top_op_2_ms") == [row(metrics.TOP_OP_RANKED)]
    summary = conversation.explained["step_time_ms"].content[0].text
    assert metrics.STEP_TIME_MS.definition in summary


def test_explain_verdicts_from_their_rules(conversation: Conversation) -> None:
    for name in verdict.OPERATOR_VERDICTS:
        result = conversation.explained[name]
        assert not result.is_error, result.content
        data = result.structured_content
        assert (data["kind"], data["verdict"]) == ("verdict", name)
        assert data["rule"] and data["rule"] in result.content[0].text
        assert data["advice"] == {
            fw: verdict.advice_for(name, fw, pageable_share=0.0, top=None) for fw in ("pytorch", "tensorflow", "jax")
        }
    assert "50" in conversation.explained["compute-bound"].structured_content["rule"]  # COMPUTE_COVERS_PERCENT


def _verdict_labels() -> set[str]:
    """Every label ``verdict_for`` returns, read from its source, and the CPU-contended one."""
    tree = ast.parse(Path(verdict.__file__).read_text(encoding="utf-8"))
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "verdict_for")
    labels = {n.value.value for n in ast.walk(fn) if isinstance(n, ast.Return) and isinstance(n.value, ast.Constant)}
    labels |= {
        c.value
        for n in ast.walk(fn)
        if isinstance(n, ast.IfExp)
        for c in (n.body, n.orelse)
        if isinstance(c, ast.Constant)
    }
    return {*labels, verdict.CPU_CONTENDED}


def test_every_verdict_has_a_rule() -> None:
    """``explain`` knows every verdict the analysis gives, each with the rule its module states, thresholds
    included (a verdict added without its line in the docstring fails here)."""
    rules = mcp_tools.verdict_rules_text()
    assert set(rules) == _verdict_labels()
    assert str(int(verdict.INPUT_BOUND_PERCENT)) in rules["input-bound"]
    assert str(int(verdict.HTOD_BOUND_PERCENT)) in rules["host-to-device-bound"]
    assert str(int(verdict.COMMUNICATION_BOUND_PERCENT)) in rules["communication-bound"]
    for name in ("compute-bound", "host-bound", "overhead-bound"):  # nested under the condition they share
        assert str(int(verdict.COMPUTE_BOUND_MAX_PERCENT)) in rules[name]


def test_options_passed_are_the_ones_the_parser_checks() -> None:
    """``compare``'s options reach the tool from its parser: flags and checked values, never ``--format``,
    ``--out`` or help, nor a free-text value."""
    passed = mcp_tools.passable_options("compare")
    assert {"--fail-over", "--min-ms", "--strict"} <= set(passed)
    assert not set(passed) & mcp_tools.REFUSED_OPTIONS
    assert all(a.nargs == 0 or a.choices is not None or a.type not in (None, str) for a in passed.values())
    with pytest.raises(mcp_tools.ToolError, match="is a flag"):
        mcp_tools.option_args("compare", {"strict": "yes"})
    assert mcp_tools.option_args("compare", {"strict": False, "fail_over": 2.5}) == ["--fail-over", "2.5"]
    assert mcp_tools.option_args("compare", ["--strict", "--min_ms", "1", "--fail-over=3"]) == [
        "--strict", "--min-ms", "1", "--fail-over", "3",
    ]  # fmt: skip
    with pytest.raises(mcp_tools.ToolError, match="needs a value"):
        mcp_tools.option_args("compare", ["--min-ms"])
    with pytest.raises(mcp_tools.ToolError, match="not an option"):
        mcp_tools.option_args("compare", ["5"])


BLOCK_MCP = """
import importlib.abc, sys

class NoMcp(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("mcp", "mcp_types"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoMcp())
from fitprof.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_without_the_extra_one_line_and_exit_2(tmp_path: Path) -> None:
    """With ``import mcp`` failing (as without ``pip install 'fitprof[mcp]'``), ``fitprof mcp`` says in one line
    how to install it and exits 2; the other commands still run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.fspath(SRC), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_MCP, "mcp", "--root", os.fspath(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "fitprof: error: fitprof mcp needs `mcp`, which is not installed: pip install 'fitprof[mcp]'"
    ]
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_MCP, "analyze", os.fspath(DDP_RANKS[0]), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)[0]["rank"] == 0, proc.stderr


def test_a_root_that_is_not_a_folder(tmp_path: Path) -> None:
    pytest.importorskip("mcp", reason="needs the MCP SDK (pip install 'fitprof[mcp]')")
    rc, out, err = cli_plain("mcp", "--root", tmp_path / "missing")
    assert rc == 2 and out == ""
    assert err == [f"fitprof: error: --root {tmp_path / 'missing'}: not a folder"]


def cli_plain(*argv: str | os.PathLike[str]) -> tuple[int, str, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*map(os.fspath, argv)])
    return rc, out.getvalue(), err.getvalue().splitlines()

"""The MCP server of ``fitprof mcp``: :mod:`fitprof.cli.tools` registered as the tools of an SDK ``MCPServer``
(``mcp`` >= 2.3) served on stdin/stdout. The only module that imports the SDK.

Each tool's result carries two text blocks, the summary and the JSON (for ``report``, ``analyze`` and ``compare``
the command's ``--format json`` output, byte for byte), and the same as structured content: ``{"records": [...],
"summary": "...", "warnings": [...], "exit_status": n}`` (``explain``: its object, :func:`fitprof.cli.tools.explain`). A refused or
bad input is a result with ``isError`` set and the one-line message; the server goes on answering.

While it serves, the SDK points file descriptor 1 at stderr, so nothing a tool prints can reach the protocol's
stream; the tools capture what the commands print (:func:`fitprof.cli.tools.run_command`).
"""

from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from fitprof import __version__
from fitprof.cli import tools

INSTRUCTIONS = (
    "fitprof explains where a training step's time goes (input wait, host-to-device copies, collectives, "
    "operators). analyze reads a trace file (*.pt.trace.json[.gz], *.xplane.pb, a plugins/profile/<session> "
    "folder); report reads the fitprof runs below a log folder; compare gates a candidate run against a baseline; "
    "explain says what a figure or a verdict means. Paths are files or folders below the server's roots; a relative "
    "path is taken from the first root."
)

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)


def _result(call: Callable[[], tools.Answer], structured: Callable[[tools.Answer], Any]) -> CallToolResult:
    """The tool result of ``call()``: its summary and JSON, or an error result with its one-line message."""
    try:
        answer = call()
    except tools.ToolError as err:
        return CallToolResult(content=[TextContent(type="text", text=str(err))], is_error=True)
    except Exception as err:  # a bug on odd input: one line for the agent, and the server goes on
        message = f"fitprof: error: could not answer ({type(err).__name__}: {' '.join(str(err).split())})"
        return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)
    return CallToolResult(
        content=[TextContent(type="text", text=answer.summary), TextContent(type="text", text=answer.text)],
        structured_content=structured(answer),
    )


def _records(answer: tools.Answer) -> dict[str, Any]:
    return {
        "records": answer.data,
        "summary": answer.summary,
        "warnings": answer.warnings,
        "exit_status": answer.exit_status,
    }


def build_server(roots: tools.Roots) -> MCPServer:
    """The server with its four tools, reading below ``roots``."""
    server: MCPServer = MCPServer(name="fitprof", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    passed = ", ".join(f.removeprefix("--") for f in tools.passable_options("compare"))

    def report(
        run: Annotated[str, Field(description="a log folder, or one run's folder, holding fitprof runs")],
    ) -> CallToolResult:
        return _result(lambda: tools.report(roots, run), _records)

    def analyze(
        trace: Annotated[
            str,
            Field(
                description="a trace file (.pt.trace.json[.gz], .xplane.pb), a plugins/profile/<session> folder, "
                "or a torch.profiler trace handler's folder"
            ),
        ],
    ) -> CallToolResult:
        return _result(lambda: tools.analyze(roots, trace), _records)

    def compare(
        baseline: Annotated[str, Field(description="a run directory, a report file or a trace file")],
        candidate: Annotated[str, Field(description="a run directory, a report file or a trace file")],
        options: Annotated[
            dict[str, Any] | list[str] | None,
            Field(
                description='fitprof compare\'s options: by name, e.g. {"fail-over": 5, "strict": true}, or as '
                f'command-line arguments, e.g. ["--fail-over", "5"] (passed on: {passed})'
            ),
        ] = None,
    ) -> CallToolResult:
        return _result(lambda: tools.compare(roots, baseline, candidate, options), _records)

    def explain(
        figure_or_verdict: Annotated[
            str, Field(description="a figure (step_time_ms, fitprof/epoch/wall_s, ...) or a verdict (input-bound, ...)")
        ],
    ) -> CallToolResult:
        return _result(lambda: tools.explain(figure_or_verdict), lambda answer: answer.data)

    described: dict[Callable[..., CallToolResult], str] = {
        report: "fitprof report RUN --format json: the figures the fitprof callbacks logged for every run, epoch, "
        "window and rank below RUN, the spread across ranks, and where each epoch's wall time went.",
        analyze: "fitprof analyze TRACE --format json: where the step time of a profiler trace goes (step time, "
        "input wait, host-to-device copies, collectives, top operators), its verdict and advice; with several "
        "ranks' traces, the spread across them.",
        compare: "fitprof compare BASELINE CANDIDATE --format json: each figure and operator on both sides with "
        "its spread, the change and whether it is a regression (the first record's status and headline).",
        explain: "What a fitprof figure means (its key, unit and definition) or a verdict (its rule and what to "
        "try, by framework).",
    }
    for fn, description in described.items():
        server.add_tool(fn, name=fn.__name__, description=description, annotations=READ_ONLY)
    return server


def serve(roots: tools.Roots) -> None:
    """Serve the tools on stdin/stdout until the client closes stdin."""
    try:
        build_server(roots).run("stdio")
    except KeyboardInterrupt:  # Ctrl-C in a terminal: a normal way to stop a server
        pass

"""``fitprof mcp``: fitprof's analyses as tools of a Model Context Protocol server on stdin/stdout, for a coding
agent (docs/mcp.md).

The tools (:mod:`fitprof.cli.tools`) run ``report``, ``analyze`` and ``compare`` as the command does and give
their JSON records, and ``explain`` gives a figure's or a verdict's meaning; they read only below the ``--root``
folders. The server (:mod:`fitprof.cli._mcp_server`) needs the MCP SDK, an optional extra
(``pip install 'fitprof[mcp]'``), imported only when the server starts: without it the command says so in one
line and exits with status 2.
"""

from __future__ import annotations

import argparse

from fitprof._imports import require
from fitprof.cli.output import EXIT_BAD_INPUT, Output

HELP = "serve report, analyze, compare and explain as MCP tools on stdin/stdout, for a coding agent"
"""The line ``fitprof --help`` gives ``mcp``."""

DESCRIPTION = (
    "Serve fitprof's analyses to a coding agent: a Model Context Protocol server on stdin/stdout whose tools "
    "report, analyze and compare give the same JSON as the commands' --format json, and explain gives what a "
    "figure or a verdict means. The tools read only below the --root folders. Needs pip install 'fitprof[mcp]'."
)
"""What ``fitprof mcp --help`` says it does."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``mcp`` arguments: the folders the tools may read."""
    p.add_argument(
        "--root",
        action="append",
        metavar="FOLDER",
        help="a folder the tools may read below (repeatable; a relative tool argument is taken from the first "
        "one; default: the current folder)",
    )


def run(args: argparse.Namespace, out: Output) -> int:
    """Serve until the client closes stdin; the exit status (2: the SDK is missing, or a root is not a folder)."""
    try:
        require("mcp", "fitprof mcp")
    except ModuleNotFoundError as err:
        out.error(str(err))
        return EXIT_BAD_INPUT
    from fitprof.cli import _mcp_server
    from fitprof.cli.tools import Roots

    try:
        roots = Roots(args.root or ["."])
    except ValueError as err:
        out.error(str(err))
        return EXIT_BAD_INPUT
    _mcp_server.serve(roots)
    return 0

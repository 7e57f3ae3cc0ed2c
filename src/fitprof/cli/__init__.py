"""The ``fitprof`` command: bottleneck tables from fitprof runs (``report``) or from any trace file (``analyze``),
and a regression gate between two runs (``compare``).

``fitprof report LOGDIR``
    Finds every fitprof run below ``LOGDIR`` (a folder holding ``plugins/fitprof/<session>.rank<r>.json``,
    written by the Keras and the Lightning callbacks for each profiled window) and prints one row per run,
    epoch and rank: exactly the figures the callback logged (:mod:`fitprof.cli.report`).

``fitprof analyze TRACE...``
    Analyses trace files directly (``*.xplane.pb``, ``*.pt.trace.json``, ``*.json.gz``, or a
    ``plugins/profile/<session>`` folder, whose ``*.xplane.pb`` files are read), recorded by fitprof or not:
    one row per file, with the same figures as :func:`fitprof.analyze`. With several ranks' traces it adds a
    spread record: max - min of ``step_time_ms`` and ``input_percent`` across the ranks, and the slowest rank.
    ``--scheduler ADDRESS`` analyses each file as one task on a Dask distributed cluster (:mod:`fitprof.cli._dask`):
    the workers read the files (absolute paths, or URLs through fsspec) and only the reports come back
    (:mod:`fitprof.cli.analyze`).

``fitprof compare BASELINE CANDIDATE``
    Compares two runs (run directories, report files or trace files), aware of their noise; exit status 1 on a
    regression (:mod:`fitprof.cli.compare`, :mod:`fitprof.compare`).

``fitprof mcp [--root FOLDER]...``
    Serves ``report``, ``analyze`` and ``compare`` (their ``--format json`` records) and ``explain`` as the tools
    of a Model Context Protocol server on stdin/stdout, for a coding agent; the tools read only below the roots
    (:mod:`fitprof.cli.mcp`, :mod:`fitprof.cli.tools`). Needs ``pip install 'fitprof[mcp]'``.

Output formats (``--format``): ``table`` (default, aligned text, then each row's verdict line and the advice),
``markdown`` (the same as a Markdown table), ``json`` (a list of records; numbers in the units their names
say, NaN as ``null``) and ``csv`` (one flat row per record, the top operator only).

Bad input (a missing path, a truncated, corrupt or foreign file, a trace past ``--max-trace-mb`` /
``--max-events``, a report file that leads outside ``LOGDIR``) gives one ``fitprof: error: <path>: <what>``
line on stderr per file and exit status 2; the other files are still reported. Nothing is printed or
written when no file could be reported. This package imports no framework.

``LOGDIR`` and ``TRACE`` may be URLs (``s3://``, ``gs://``, ``hdfs://``, ``memory://``...; ``file://`` is a
local path): the files the command needs (the report files, the named traces) are copied through fsspec into a
temporary folder and read there; every path printed names the URL. A scheme whose package (e.g. ``s3fs``) is
missing is one error line naming the package.

The modules: :mod:`~fitprof.cli.command` (``main``, the parser, the list of subcommands),
:mod:`~fitprof.cli.arguments` (shared options), one module per subcommand (:mod:`~fitprof.cli.report`,
:mod:`~fitprof.cli.analyze`, :mod:`~fitprof.cli.compare`, :mod:`~fitprof.cli.mcp`), :mod:`~fitprof.cli.records` (the records they print), :mod:`~fitprof.cli.output`
(error lines, writing, URLs), :mod:`~fitprof.cli.render` and :mod:`~fitprof.cli.plot`.
"""

from __future__ import annotations

from fitprof.cli.command import main
from fitprof.cli.output import EXIT_BAD_INPUT, EXIT_OK
from fitprof.cli.plot import SEGMENTS
from fitprof.cli.render import FORMATS, render

__all__ = ["EXIT_BAD_INPUT", "EXIT_OK", "FORMATS", "SEGMENTS", "main", "render"]

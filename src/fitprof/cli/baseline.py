"""``fitprof baseline save NAME RUN``: keep a run as a named baseline for ``fitprof compare --against NAME``.

The run's report files, per-epoch files and TensorBoard event files are copied into ``<store>/<NAME>/`` (the store
a folder or a URL, :mod:`fitprof.baselines`), replacing what NAME held. Exit status: 0 saved, 2 bad input (a bad
name, a run with no report file, a store that cannot be written). Framework-free.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from fitprof import _fs, baselines
from fitprof.cli.output import EXIT_BAD_INPUT, EXIT_OK, Output, describe

HELP = "save a run as a named baseline for 'fitprof compare --against NAME'"
"""The line ``fitprof --help`` gives ``baseline``."""

DESCRIPTION = (
    "Save RUN (a run directory or a folder of runs, a local path or a URL) as the baseline NAME in the baseline "
    f"store (--store, else ${baselines.STORE_ENV}, else {baselines.DEFAULT_STORE}): its report files, per-epoch "
    "files and event files are copied there, replacing what NAME held."
)
"""What ``fitprof baseline --help`` says it does."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``save NAME RUN`` and ``--store``."""
    p.add_argument("action", choices=("save",), help="save: keep RUN as the baseline NAME")
    p.add_argument("name", metavar="NAME", help="the baseline's name (letters, digits, '.', '_', '-')")
    p.add_argument("run_dir", metavar="RUN", help="the run directory (or folder of runs) to keep")
    p.add_argument(
        "--store",
        metavar="STORE",
        help=f"the baseline store, a folder or URL (default: ${baselines.STORE_ENV} or {baselines.DEFAULT_STORE})",
    )


def run(args: argparse.Namespace, out: Output) -> int:
    """Save the baseline; one line saying where; the exit status."""
    with tempfile.TemporaryDirectory(prefix="fitprof-baseline-") as tmp:
        try:
            if _fs.is_remote(args.run_dir):
                local = Path(tmp)
                _fs.fetch(args.run_dir, local, baselines.wanted)
            else:
                local = Path(_fs.local_path(args.run_dir))
                if not local.is_dir():
                    out.error(f"{args.run_dir}: no such folder (a baseline is a run directory)")
                    return EXIT_BAD_INPUT
            where, count = baselines.save(args.name, local, args.store, source=args.run_dir)
        except baselines.BaselineError as err:
            out.error(str(err))
            return EXIT_BAD_INPUT
        except (OSError, ValueError) as err:
            out.error(
                describe(args.run_dir if _fs.is_remote(args.run_dir) else baselines.store_location(args.store), err)
            )
            return EXIT_BAD_INPUT
    print(f"fitprof: saved {args.run_dir} as the baseline {args.name!r} in {os.fspath(where)} ({count} files)")
    return EXIT_OK

"""Run one function over many files in parallel processes, results in the input order.

``fitprof analyze`` and ``fitprof report`` use it for ``--jobs N``: each file is read and analysed in a worker
process (numpy, pandas and the JSON decoder hold the GIL for most of a trace's analysis, so threads would not
help), and only the small result travels back. The results are the same objects, in the same order, as a loop
in this process gives, so the output is identical to ``--jobs 1``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def default_jobs() -> int:
    """The CPU cores this process may run on (``os.sched_getaffinity`` where it exists), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


PARALLEL_MIN_BYTES = 32 * 2**20
"""Without ``--jobs``, files are read in parallel only when they hold at least this many bytes in all: a worker
process takes about a second to start (it imports numpy, pandas and fitprof), more than a few small files take
to read."""


def auto_jobs(paths: Sequence[str | os.PathLike[str]]) -> int:
    """The ``--jobs`` default: :func:`default_jobs` when ``paths`` hold at least :data:`PARALLEL_MIN_BYTES`
    together (missing files count 0), else 1."""
    total = 0
    for path in paths:
        try:
            total += os.stat(path).st_size
        except OSError:
            continue
    return default_jobs() if total >= PARALLEL_MIN_BYTES else 1


def ordered_map(fn: Callable[[T], R], items: Sequence[T], jobs: int) -> list[R]:
    """``[fn(x) for x in items]``, computed by up to ``jobs`` worker processes when ``jobs`` > 1.

    ``fn`` must be a module-level function and must not raise (return the error instead): an exception in a
    worker is re-raised here, like the loop would, but after the other items finished.

    Raises:
        ValueError: if ``jobs`` < 1.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if jobs == 1 or len(items) < 2:
        return [fn(x) for x in items]
    # spawn, never fork: the caller may be a process that runs TensorFlow or torch threads (a notebook, a test
    # session), and a forked child of such a process can deadlock on a lock one of those threads held.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=context) as pool:
        return list(pool.map(fn, items))

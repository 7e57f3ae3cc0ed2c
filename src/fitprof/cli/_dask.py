"""Run one function over many files on a Dask distributed cluster, results in the input order (``--scheduler``).

``fitprof analyze --scheduler ADDRESS`` sends one small task per trace file (its path or URL and the reading
bounds) to the cluster's workers through ``distributed.Client(ADDRESS)``. The workers read the files
themselves, so the files must be where every worker can read them: a shared filesystem path, or a URL
(``s3://``, ``gs://``, ...) whose fsspec package the workers have. Only each file's small result (a
:class:`fitprof.BottleneckReport`, a few KB) travels back; the cross-rank figures are then computed here, as
for local files. The workers need fitprof installed (the same version: the function is sent by reference).

``dask`` and ``distributed`` are optional (``pip install 'fitprof[dask]'``) and imported only when a scheduler
is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TypeVar

from fitprof._imports import require

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_CONNECT_TIMEOUT_S = 10.0
"""How long to try to reach the scheduler before giving up (seconds)."""


class SchedulerError(OSError):
    """The Dask scheduler could not be reached, or the cluster failed while running the files; the message names
    the scheduler's address."""


def scheduler_map(
    fn: Callable[[T], R],
    items: Sequence[T],
    address: str,
    *,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> list[R]:
    """``[fn(x) for x in items]``, each call run as one task on the Dask cluster whose scheduler is ``address``.

    Args:
        fn: a module-level function (workers import it by name) that must not raise: return the error instead.
        items: one argument per task; each is pickled and sent to a worker, and each result sent back.
        address: the scheduler, as ``distributed.Client`` takes it (``tcp://host:8786``, ``host:8786``).
        connect_timeout_s: how long to try to reach the scheduler.

    Returns:
        The results in the order of ``items`` (an empty list, without connecting, for no items).

    Raises:
        ModuleNotFoundError: ``dask`` or ``distributed`` is not installed; the message names
            ``pip install 'fitprof[dask]'``.
        SchedulerError: no scheduler answered at ``address`` within ``connect_timeout_s``, the address is
            malformed, or the cluster failed while running the tasks (a worker died, the scheduler went away).
    """
    if not items:
        return []
    require("dask", "--scheduler (a Dask cluster)")
    distributed = require("distributed", "--scheduler (a Dask cluster)")
    failure = _probe(distributed, address, connect_timeout_s)
    if failure is None:
        try:
            client = distributed.Client(address, timeout=connect_timeout_s, set_as_default=False)
        except Exception as err:  # the probe answered but the scheduler did not take the client
            failure = _what(err)
    if failure is not None:
        raise SchedulerError(
            f"cannot reach the Dask scheduler at {address} ({failure}; connect timeout {connect_timeout_s:g} s)"
        )
    try:
        futures = client.map(fn, list(items), pure=False)
        return list(client.gather(futures))
    except Exception as err:  # a worker killed, the scheduler gone: the cluster's failure, not the files'
        raise SchedulerError(f"the Dask cluster at {address} failed while analysing ({_what(err)})") from err
    finally:
        client.close()


def _probe(distributed: ModuleType, address: str, timeout_s: float) -> str | None:
    """Open and close one connection to ``address`` (with the client's security settings from Dask's config);
    the reason it failed, or None.

    A ``Client`` that fails to connect is left half built, and closing it later (at garbage collection) waits
    and prints a traceback; a bare connection leaves nothing behind.
    """
    from distributed.comm import connect

    async def probe() -> None:
        comm = await connect(address, timeout=timeout_s, **distributed.Security().get_connection_args("client"))
        await comm.close()

    try:
        asyncio.run(probe())
    except Exception as err:  # OSError (refused, timed out), ValueError (a malformed address or unknown scheme)
        return _what(err)
    return None


def _what(err: BaseException) -> str:
    """The error's message on one line, or its type when it has none."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__

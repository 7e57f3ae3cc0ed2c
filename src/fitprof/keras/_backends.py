"""What differs between Keras's backends, chosen once: the table :data:`BACKENDS`.

As Keras's ``TensorBoard`` callback picks its backend's profiler functions once and then calls them, the Keras
``FitProfiler`` looks its backend up here in ``__init__`` and never compares backend names again. A new Keras
backend is one row: its window (a :class:`~fitprof.profilers.base.ProfileWindow`), its device, its FLOP count,
and the few facts of its fit loop listed in :class:`Backend`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fitprof._warn import WarnOnce
from fitprof.keras import _throughput
from fitprof.profilers.base import ProfileWindow


@dataclass(frozen=True)
class Backend:
    """One Keras backend's functions and facts.

    Attributes:
        name: the backend's name, as ``keras.backend.backend()`` gives it; ``label`` as written in messages.
        window: ``window(run_dir, *, epoch, rank, world, suffix, warn, options)``, a new unstarted window.
        device_and_dtype: ``(device name, compute dtype)`` of a model, for the MFU.
        count_flops: runs one counted ``train_function`` call (:class:`~fitprof.keras._throughput.KerasWork`);
            None: FLOPs are not counted on this backend.
        fetch_timer: makes the always-on timer of each batch fetch (None: the fetch is not visible to Python).
        store: the remote store of a URL ``log_dir`` (None: fsspec).
        threads: the intra-op threads the backend computes with, for the loader's free cores (None: not known).
        python_fetch: Keras fetches each batch in Python, outside ``train_function`` (an error there is guarded
            through the epoch iterator).
        torch_options: ``record_shapes`` and the other ``torch.profiler`` flags apply.
        count_items: a callback sees a batch (the FLOP-count call's), so ``count_items`` can run.
        extra_last_call: with data of unknown length Keras calls ``on_train_batch_begin`` once more, for the call
            that finds the data exhausted.
        non_chief_abort: the profiler can abort a non-chief worker when a window stops (TensorFlow 2.21).
        retraces_collectives: counting FLOPs retraces the step, which allocates collective keys under a
            multi-worker strategy.
        prefetches_plain_batches: a ``PyDataset`` without workers is pulled ahead in the background
            (``tf.data``'s ``prefetch``), so the step's wait for it is not the loading's time.
        kineto_trace: a window writes a Kineto trace (``torch.profiler``), which fitprof's trace reader analyses.
    """

    name: str
    label: str
    window: Callable[..., ProfileWindow]
    device_and_dtype: Callable[[Any], tuple[str, str]]
    count_flops: Callable[..., Any] | None = None
    fetch_timer: Callable[[], Any] | None = None
    store: Callable[[str], Any] | None = None
    threads: Callable[[], int] | None = None
    python_fetch: bool = False
    torch_options: bool = False
    count_items: bool = False
    extra_last_call: bool = False
    non_chief_abort: bool = False
    retraces_collectives: bool = False
    prefetches_plain_batches: bool = False
    kineto_trace: bool = False


def _tf_window(run_dir: str, *, epoch: int, rank: int, world: int, suffix: str, **_: Any) -> ProfileWindow:
    from fitprof.profilers.tensorflow import TFProfileWindow

    return TFProfileWindow(run_dir, epoch=epoch, rank=rank, world=world, suffix=suffix, warn=_.get("warn"))


def _jax_window(run_dir: str, *, epoch: int, rank: int, world: int, suffix: str, **_: Any) -> ProfileWindow:
    from fitprof.profilers.jax import JaxProfileWindow

    return JaxProfileWindow(run_dir, epoch=epoch, rank=rank, world=world, suffix=suffix, warn=_.get("warn"))


def _torch_window(
    run_dir: str, *, epoch: int, rank: int, world: int, suffix: str, warn: WarnOnce, options: dict[str, bool]
) -> ProfileWindow:
    from fitprof.keras._torch_backend import torch_window

    return torch_window(run_dir, epoch=epoch, rank=rank, world=world, suffix=suffix, warn=warn, options=options)


def _fetch_timer() -> Any:
    from fitprof.keras._torch_backend import FetchTimer

    return FetchTimer()


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _gfile_store(url: str) -> Any:
    from fitprof.profilers.tensorflow import GFileStore

    return GFileStore(url)


_TENSORFLOW = Backend("tensorflow", "TensorFlow", _tf_window, _throughput.tf_device_and_dtype, _throughput.count_tf)
_TORCH = Backend(
    "torch", "torch", _torch_window, _throughput.torch_device_and_dtype, _throughput.count_torch, threads=_torch_threads
)

BACKENDS: dict[str, Backend] = {
    "tensorflow": dataclasses.replace(
        _TENSORFLOW,
        store=_gfile_store,
        extra_last_call=True,
        non_chief_abort=True,
        retraces_collectives=True,
        prefetches_plain_batches=True,
    ),
    "torch": dataclasses.replace(
        _TORCH, fetch_timer=_fetch_timer, python_fetch=True, torch_options=True, count_items=True, kineto_trace=True
    ),
    "jax": Backend("jax", "JAX", _jax_window, _throughput.jax_device_and_dtype),
}
"""The supported Keras backends, by ``keras.backend.backend()`` name."""

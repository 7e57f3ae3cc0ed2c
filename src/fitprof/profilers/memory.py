"""Memory readers: one small pair of functions (reset the peak, read) per device kind, behind one interface.

:data:`BACKENDS` maps a device kind to its :class:`MemoryBackend`; :class:`MemoryReader` is what the probe
(:class:`fitprof.fit.memory.MemoryProbe`) calls. Each framework is imported inside its own functions only, so
importing this module imports no framework. Every figure is in bytes; where a figure is unknown it is NaN.

==============  ==================================================================================================
kind            where each figure comes from
==============  ==================================================================================================
``cuda``        ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` since ``reset_peak_memory_stats``;
                in use ``memory_allocated``; capacity ``get_device_properties(device).total_memory``
``tensorflow``  ``tf.config.experimental.get_memory_info("GPU:<i>")`` (``peak``, ``current``) since
                ``reset_memory_stats``; TensorFlow gives no capacity (NaN)
``jax``         ``jax.local_devices()[i].memory_stats()``: ``peak_bytes_in_use``, ``bytes_in_use``,
                ``peak_bytes_reserved``, ``bytes_limit``; JAX cannot reset its peak, so it is the process's
``host``        Linux: ``VmHWM`` (peak resident set, reset by writing ``5`` to ``/proc/self/clear_refs``) and
                ``VmRSS`` from ``/proc/self/status``, capacity ``VmRSS + MemAvailable`` from ``/proc/meminfo``
                (the most this process could hold now, other processes' memory left out). Elsewhere
                ``resource.getrusage`` ``ru_maxrss`` (the process's peak, no reset) and the physical RAM
==============  ==================================================================================================
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

NAN = math.nan


@dataclass(frozen=True)
class MemoryReading:
    """One read of a device's memory, in bytes (NaN where the backend does not say).

    Attributes:
        peak_bytes: the most the framework (the process, on the host) held since the last reset of the peak.
        in_use_bytes: what it holds now.
        reserved_peak_bytes: the allocator's reserved peak since the last reset (CUDA's caching allocator, JAX).
        capacity_bytes: what the device can hold (the host: what this process could hold now).
    """

    peak_bytes: float
    in_use_bytes: float
    reserved_peak_bytes: float = NAN
    capacity_bytes: float = NAN


@dataclass(frozen=True)
class MemoryBackend:
    """The two functions of one device kind.

    Attributes:
        reset: ``reset(device)``: start a new peak (a no-op where the backend cannot; see ``resets``).
        read: ``read(device) -> MemoryReading``.
        resets: whether ``reset`` starts a new peak; False: every peak is the process's peak so far.
    """

    reset: Callable[[int], None]
    read: Callable[[int], MemoryReading]
    resets: bool = True


# ------------------------------------------------------------------------------------------------------ CUDA
def _cuda_reset(device: int) -> None:
    import torch

    torch.cuda.reset_peak_memory_stats(device)


def _cuda_read(device: int) -> MemoryReading:
    import torch

    return MemoryReading(
        peak_bytes=float(torch.cuda.max_memory_allocated(device)),
        in_use_bytes=float(torch.cuda.memory_allocated(device)),
        reserved_peak_bytes=float(torch.cuda.max_memory_reserved(device)),
        capacity_bytes=float(torch.cuda.get_device_properties(device).total_memory),
    )


# ------------------------------------------------------------------------------------------------ TensorFlow
def _tf_reset(device: int) -> None:
    import tensorflow as tf

    tf.config.experimental.reset_memory_stats(f"GPU:{device}")


def _tf_read(device: int) -> MemoryReading:
    import tensorflow as tf

    info = tf.config.experimental.get_memory_info(f"GPU:{device}")
    return MemoryReading(peak_bytes=float(info["peak"]), in_use_bytes=float(info["current"]))


# ------------------------------------------------------------------------------------------------------- JAX
def _jax_reset(device: int) -> None:
    """JAX has no call that resets its peak."""


def _jax_read(device: int) -> MemoryReading:
    import jax

    stats = jax.local_devices()[device].memory_stats()
    if not stats:  # the CPU backend keeps no statistics
        raise RuntimeError(f"jax device {device} keeps no memory statistics")
    return MemoryReading(
        peak_bytes=float(stats.get("peak_bytes_in_use", NAN)),
        in_use_bytes=float(stats.get("bytes_in_use", NAN)),
        reserved_peak_bytes=float(stats.get("peak_bytes_reserved", NAN)),
        capacity_bytes=float(stats.get("bytes_limit", NAN)),
    )


# ------------------------------------------------------------------------------------------------------ host
_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
_MEMINFO = "/proc/meminfo"


def _kib_fields(path: str, names: tuple[str, ...]) -> dict[str, float]:
    """``{name: bytes}`` of the ``Name:  1234 kB`` lines of a /proc file."""
    out: dict[str, float] = {}
    with open(path, encoding="ascii") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in names:
                out[name] = float(rest.split()[0]) * 1024.0
    return out


def _linux_reset(device: int) -> None:
    # ``5`` resets the peak resident set size (VmHWM) to the current one (Documentation/filesystems/proc.rst).
    with open(_CLEAR_REFS, "w", encoding="ascii") as f:
        f.write("5")


def _linux_read(device: int) -> MemoryReading:
    status = _kib_fields(_STATUS, ("VmHWM", "VmRSS"))
    available = _kib_fields(_MEMINFO, ("MemAvailable",)).get("MemAvailable", NAN)
    rss = status.get("VmRSS", NAN)
    return MemoryReading(peak_bytes=status.get("VmHWM", NAN), in_use_bytes=rss, capacity_bytes=rss + available)


def _rusage_reset(device: int) -> None:
    """``ru_maxrss`` cannot be reset."""


def _rusage_read(device: int) -> MemoryReading:
    import resource  # not on Windows: the read fails and the probe warns once

    # ru_maxrss is in KiB on Linux and the BSDs, in bytes on macOS.
    scale = 1.0 if sys.platform == "darwin" else 1024.0
    peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale
    try:
        ram = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        ram = NAN
    return MemoryReading(peak_bytes=peak, in_use_bytes=NAN, capacity_bytes=ram)


_HOST = (
    MemoryBackend(_linux_reset, _linux_read)
    if os.path.exists(_STATUS) and os.path.exists(_CLEAR_REFS)
    else MemoryBackend(_rusage_reset, _rusage_read, resets=False)
)

BACKENDS: dict[str, MemoryBackend] = {
    "cuda": MemoryBackend(_cuda_reset, _cuda_read),
    "tensorflow": MemoryBackend(_tf_reset, _tf_read),
    "jax": MemoryBackend(_jax_reset, _jax_read, resets=False),
    "host": _HOST,
}
"""Device kind -> its functions. ``host`` is the process's resident memory (a CPU-only run trains there)."""

KINDS = tuple(BACKENDS)


class MemoryReader:
    """Reset and read the memory of one device of one kind.

    Args:
        kind: one of :data:`KINDS`: ``"cuda"`` (torch on a CUDA or ROCm device), ``"tensorflow"`` (a TensorFlow
            GPU), ``"jax"`` (a JAX accelerator) or ``"host"`` (the process's resident memory).
        device: the device index (CUDA device, ``GPU:<i>``, ``jax.local_devices()[i]``); ignored for ``host``.

    Raises:
        ValueError: for a kind not in :data:`KINDS` or a negative device index.

    The calls raise what their framework raises; the probe that calls them catches it (profiling never stops
    training).
    """

    def __init__(self, kind: str, device: int = 0) -> None:
        if kind not in BACKENDS:
            raise ValueError(f"memory kind must be one of {KINDS}, got {kind!r}")
        if not isinstance(device, int) or device < 0:
            raise ValueError(f"device must be an integer >= 0, got {device!r}")
        self.kind = kind
        self.device = device
        self._backend = BACKENDS[kind]

    @property
    def resets(self) -> bool:
        """Whether :meth:`reset_peak` starts a new peak (False: every peak is the process's peak so far)."""
        return self._backend.resets

    def reset_peak(self) -> None:
        """Start a new peak: the next :meth:`read`'s ``peak_bytes`` counts from now (where :attr:`resets`)."""
        self._backend.reset(self.device)

    def read(self) -> MemoryReading:
        """The device's memory now, in bytes (see :class:`MemoryReading`)."""
        return self._backend.read(self.device)


# ------------------------------------------------------------------------------------ which kind a run trains on
def _torch_device() -> tuple[str, int]:
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.cuda.current_device()
    return "host", 0


def _tf_device() -> tuple[str, int]:
    import tensorflow as tf

    return ("tensorflow", 0) if tf.config.list_logical_devices("GPU") else ("host", 0)


def _jax_device() -> tuple[str, int]:
    import jax

    return ("host", 0) if jax.default_backend() == "cpu" else ("jax", 0)


KERAS_BACKEND_DEVICE: dict[str, Callable[[], tuple[str, int]]] = {
    "torch": _torch_device,
    "tensorflow": _tf_device,
    "jax": _jax_device,
}
"""Keras backend -> the memory kind and device index it trains on (the first accelerator, else the host)."""


def keras_device(backend: str) -> tuple[str, int]:
    """``(kind, device)`` for a Keras backend: its first accelerator where it has one, else ``("host", 0)``.

    Raises:
        ValueError: for a backend not in :data:`KERAS_BACKEND_DEVICE`.
    """
    if backend not in KERAS_BACKEND_DEVICE:
        raise ValueError(f"Keras backend must be one of {tuple(KERAS_BACKEND_DEVICE)}, got {backend!r}")
    return KERAS_BACKEND_DEVICE[backend]()


def torch_device(device: object) -> tuple[str, int]:
    """``(kind, device)`` for a ``torch.device`` (Lightning's ``trainer.strategy.root_device``): ``("cuda", i)`` on a
    CUDA (or ROCm) device, else ``("host", 0)``."""
    if getattr(device, "type", None) == "cuda":
        index = getattr(device, "index", None)
        return "cuda", 0 if index is None else int(index)
    return "host", 0

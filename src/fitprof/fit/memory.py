"""The memory probe: peak, headroom and growth per profiled window and per epoch, for both callbacks.

Framework-free: it calls a :class:`MemoryReaderLike` (:class:`fitprof.profilers.memory.MemoryReader` in a real
run, a fake in tests) a few times an epoch, never per step: the peak is reset at the epoch's start, read and reset
at a window's start and end, and read at the epoch's end. One resettable peak counter serves both the window and
the epoch: the epoch's peak is the largest of the peaks read in between.

Figures (1 MB = 1e6 bytes; see :mod:`fitprof.metrics` for the definitions):

- per window (:meth:`MemoryProbe.window_figures`): ``fitprof/memory_peak_mb``, ``fitprof/memory_reserved_peak_mb``,
  ``fitprof/memory_headroom_percent``;
- per epoch (:meth:`MemoryProbe.epoch_figures`): ``fitprof/epoch/memory_peak_mb``,
  ``fitprof/epoch/memory_in_use_mb``, ``fitprof/epoch/memory_growth_mb``, ``fitprof/epoch/memory_headroom_percent``.

Warnings, each once per fit: memory in use grew by at least :data:`LEAK_MIN_MB` in each of the last
:data:`LEAK_EPOCHS` epochs (a leak), and the headroom at a peak fell under :data:`LOW_HEADROOM_PERCENT`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Protocol

from fitprof import metrics
from fitprof._warn import WarnOnce

MB = 1e6
"""Bytes in one MB of the logged figures."""
LEAK_MIN_MB = 10.0
"""Growth per epoch (MB) that counts towards a leak. Measured on small CPU runs of both callbacks (Keras on
TensorFlow, Lightning; the process's resident memory, a window every epoch): -0.4 to 7.2 MB an epoch without a leak
(the most in epoch 1, after the first window), 29.4-30.6 MB with a planted 30 MB one."""
LEAK_EPOCHS = 3
"""Consecutive epochs, each growing by at least :data:`LEAK_MIN_MB`, that make the leak warning."""
LOW_HEADROOM_PERCENT = 10.0
"""Headroom (% of capacity) under which the near-out-of-memory warning is issued."""


class MemoryReadingLike(Protocol):
    """What :meth:`MemoryReaderLike.read` returns, in bytes (NaN where unknown)."""

    @property
    def peak_bytes(self) -> float: ...
    @property
    def in_use_bytes(self) -> float: ...
    @property
    def reserved_peak_bytes(self) -> float: ...
    @property
    def capacity_bytes(self) -> float: ...


class MemoryReaderLike(Protocol):
    """The reader the probe calls (:class:`fitprof.profilers.memory.MemoryReader`)."""

    kind: str

    def reset_peak(self) -> None: ...
    def read(self) -> MemoryReadingLike: ...


def memory_probe(kind: str, device: int = 0, *, warn: Callable[[str, str], None] | None = None) -> MemoryProbe:
    """The probe for a device kind (``"cuda"``, ``"tensorflow"``, ``"jax"``, ``"host"``; see
    :data:`fitprof.profilers.memory.BACKENDS`) and device index.

    Raises:
        ValueError: for an unknown kind or a negative index.
    """
    from fitprof.profilers.memory import MemoryReader  # imports no framework until a read

    return MemoryProbe(MemoryReader(kind, device), warn=warn)


def _max(a: float, b: float) -> float:
    """The larger of two figures, NaN only when both are."""
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return max(a, b)


def headroom_percent(peak_bytes: float, reserved_peak_bytes: float, capacity_bytes: float) -> float:
    """``100 * (capacity - held) / capacity``, ``held`` the larger of the peak and the reserved peak (what the device
    held at its fullest: a caching allocator holds its reserve); NaN without a capacity."""
    held = _max(peak_bytes, reserved_peak_bytes)
    if not capacity_bytes > 0 or math.isnan(held):
        return math.nan
    return 100.0 * (capacity_bytes - held) / capacity_bytes


class MemoryProbe:
    """Memory figures per profiled window and per epoch (a probe of :class:`fitprof.fit.probes.Probe`'s shape).

    Args:
        reader: resets and reads the training device's memory (see :class:`MemoryReaderLike`); None: the host's
            (the process's resident memory) until :meth:`use` names the training device.
        warn: ``warn(key, message)``, the adapter's warn-once; default a new :class:`~fitprof._warn.WarnOnce`.

    A read that raises is warned about once and leaves that figure NaN; training goes on.
    """

    def __init__(
        self, reader: MemoryReaderLike | None = None, *, warn: Callable[[str, str], None] | None = None
    ) -> None:
        if reader is None:
            from fitprof.profilers.memory import MemoryReader  # imports no framework until a read

            reader = MemoryReader("host")
        self.reader = reader
        self._warn = warn or WarnOnce()
        self._reset_fit()

    def use(self, kind: str, device: int = 0) -> None:
        """Read the memory of this device from now on (the adapter names it when a fit starts).

        Args:
            kind: ``"cuda"``, ``"tensorflow"``, ``"jax"`` or ``"host"`` (:data:`fitprof.profilers.memory.KINDS`).
            device: its index.

        Raises:
            ValueError: for an unknown kind or a negative index.
        """
        from fitprof.profilers.memory import MemoryReader

        self.reader = MemoryReader(kind, device)

    def _reset_fit(self) -> None:
        self._prev_in_use = math.nan
        self._growth: list[tuple[int, float]] = []  # (epoch, growth in bytes) of the epochs with a figure
        self._leak_warned = False
        self._reset_epoch()

    def _reset_epoch(self) -> None:
        self._epoch_peak = math.nan
        self._epoch_reserved = math.nan
        self._capacity = math.nan
        self._window: dict[str, float] = {}
        self._epoch: dict[str, float] = {}

    # ----------------------------------------------------------------------------------------------- reads
    def _reset(self) -> None:
        try:
            self.reader.reset_peak()
        except Exception as err:
            self._warn(
                "memory-reset",
                f"fitprof: could not reset the {self.reader.kind} memory peak ({err!r}); each memory peak is the "
                "largest since the last reset that worked.",
            )

    def _read(self) -> MemoryReadingLike | None:
        """Read, fold the peak into the epoch's, reset the peak; None after a failed read (warned once)."""
        try:
            r = self.reader.read()
        except Exception as err:
            self._warn(
                "memory-read",
                f"fitprof: could not read the {self.reader.kind} memory ({err!r}); memory figures are NaN.",
            )
            return None
        self._epoch_peak = _max(self._epoch_peak, float(r.peak_bytes))
        self._epoch_reserved = _max(self._epoch_reserved, float(r.reserved_peak_bytes))
        if not math.isnan(float(r.capacity_bytes)):
            self._capacity = float(r.capacity_bytes)
        return r

    # ---------------------------------------------------------------------------------------------- events
    def fit_start(self, *, now_ns: int = 0) -> None:
        self._reset_fit()
        self._reset()

    def epoch_start(self, epoch: int, *, now_ns: int = 0) -> None:
        self._reset_epoch()
        self._reset()

    def window_start(self, *, now_ns: int = 0) -> None:
        # The steps before the window count for the epoch's peak; the window's peak starts here.
        self._read()
        self._reset()

    def window_end(self, *, now_ns: int = 0) -> None:
        r = self._read()
        self._reset()
        if r is None:
            self._window = {}
            return
        peak, reserved, capacity = float(r.peak_bytes), float(r.reserved_peak_bytes), float(r.capacity_bytes)
        headroom = headroom_percent(peak, reserved, capacity)
        self._window = {
            metrics.MEMORY_PEAK_MB.key: peak / MB,
            metrics.MEMORY_RESERVED_PEAK_MB.key: reserved / MB,
            metrics.MEMORY_HEADROOM_PERCENT.key: headroom,
        }
        self._check_headroom(headroom, _max(peak, reserved), capacity, "the profiled window")

    def epoch_end(self, epoch: int, *, now_ns: int = 0) -> None:
        r = self._read()
        self._reset()
        in_use = math.nan if r is None else float(r.in_use_bytes)
        growth = in_use - self._prev_in_use  # NaN for the first epoch and after a failed read
        if not math.isnan(in_use):
            self._prev_in_use = in_use
        if not math.isnan(growth):
            self._growth.append((epoch, growth))
        held = _max(self._epoch_peak, self._epoch_reserved)
        headroom = headroom_percent(self._epoch_peak, self._epoch_reserved, self._capacity)
        self._epoch = {
            metrics.EPOCH_MEMORY_PEAK_MB.key: self._epoch_peak / MB,
            metrics.EPOCH_MEMORY_IN_USE_MB.key: in_use / MB,
            metrics.EPOCH_MEMORY_GROWTH_MB.key: growth / MB,
            metrics.EPOCH_MEMORY_HEADROOM_PERCENT.key: headroom,
        }
        self._check_headroom(headroom, held, self._capacity, f"epoch {epoch}")
        self._check_leak(epoch, in_use)

    # --------------------------------------------------------------------------------------------- figures
    def window_figures(self) -> dict[str, float]:
        """The figures of the window that closed in this epoch (NaN where none closed or the read failed)."""
        return {key: self._window.get(key, math.nan) for key in WINDOW_KEYS}

    def epoch_figures(self) -> dict[str, float]:
        """This epoch's figures (NaN before its end, for the growth of the first epoch, and where unknown)."""
        return {key: self._epoch.get(key, math.nan) for key in EPOCH_KEYS}

    # -------------------------------------------------------------------------------------------- warnings
    def _check_headroom(self, headroom: float, held: float, capacity: float, where: str) -> None:
        if headroom < LOW_HEADROOM_PERCENT:
            self._warn(
                "memory-headroom",
                f"fitprof: memory headroom is {headroom:.1f}% at the peak of {where} ({held / MB:.0f} of "
                f"{capacity / MB:.0f} MB on {self.reader.kind}): close to out of memory. A smaller batch, mixed "
                'precision (Lightning `Trainer(precision="bf16-mixed")`, Keras '
                '`keras.mixed_precision.set_global_policy("mixed_bfloat16")`) or activation checkpointing '
                "(`torch.utils.checkpoint`, `jax.checkpoint`) lowers the peak.",
            )

    def _check_leak(self, epoch: int, in_use: float) -> None:
        recent = self._growth[-LEAK_EPOCHS:]
        if self._leak_warned or len(recent) < LEAK_EPOCHS:
            return
        if not all(g >= LEAK_MIN_MB * MB for _, g in recent):
            return
        run = 0  # the first epoch of the run of growing epochs that ends here
        for i in range(len(self._growth) - 1, -1, -1):
            if self._growth[i][1] < LEAK_MIN_MB * MB:
                break
            run = i
        first = self._growth[run][0]
        per_epoch = statistics.median(g for _, g in self._growth[run:]) / MB
        self._leak_warned = True
        self._warn(
            "memory-leak",
            f"fitprof: memory grows about {per_epoch:.0f} MB per epoch since epoch {first} ({in_use / MB:.0f} MB in "
            f"use at the end of epoch {epoch}, {self.reader.kind}): something keeps tensors alive (a list of losses "
            "with their graphs?). Keep `loss.item()` or `loss.detach()`, not the loss, in anything that outlives a "
            "step.",
        )


WINDOW_KEYS: tuple[str, ...] = (
    metrics.MEMORY_PEAK_MB.key,
    metrics.MEMORY_RESERVED_PEAK_MB.key,
    metrics.MEMORY_HEADROOM_PERCENT.key,
)
"""The keys of :meth:`MemoryProbe.window_figures`, every window."""
EPOCH_KEYS: tuple[str, ...] = (
    metrics.EPOCH_MEMORY_PEAK_MB.key,
    metrics.EPOCH_MEMORY_IN_USE_MB.key,
    metrics.EPOCH_MEMORY_GROWTH_MB.key,
    metrics.EPOCH_MEMORY_HEADROOM_PERCENT.key,
)
"""The keys of :meth:`MemoryProbe.epoch_figures`, every epoch."""

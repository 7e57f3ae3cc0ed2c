"""The memory probe (``fitprof.fit.memory``) over a simulated device, and the real readers
(``fitprof.profilers.memory``): the host's on any Linux machine, CUDA's on a GPU."""

from __future__ import annotations

import math
import mmap
import sys
import warnings
from dataclasses import dataclass, field

import numpy as np
import pytest

from fitprof import metrics
from fitprof.fit.memory import EPOCH_KEYS, MB, WINDOW_KEYS, MemoryProbe, memory_probe
from fitprof.profilers.memory import BACKENDS, KINDS, MemoryReader, MemoryReading


@dataclass
class Device:
    """A device with one resettable peak counter, as CUDA's allocator and Linux's VmHWM keep it."""

    kind: str = "fake"
    capacity: float = 1000 * MB
    reserve: float = math.nan
    in_use: float = 100 * MB
    peak: float = 100 * MB
    reads: int = 0
    resets: int = 0
    fail: set[str] = field(default_factory=set)

    def use(self, nbytes: float) -> None:
        self.in_use += nbytes
        self.peak = max(self.peak, self.in_use)

    def temporary(self, nbytes: float) -> None:
        self.use(nbytes)
        self.use(-nbytes)

    def reset_peak(self) -> None:
        if "reset" in self.fail:
            raise RuntimeError("reset refused")
        self.resets += 1
        self.peak = self.in_use

    def read(self) -> MemoryReading:
        if "read" in self.fail:
            raise RuntimeError("no statistics")
        self.reads += 1
        return MemoryReading(self.peak, self.in_use, self.reserve, self.capacity)


class Warnings:
    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def __call__(self, key: str, message: str) -> None:
        self.seen.setdefault(key, message)


def run_epoch(
    probe: MemoryProbe,
    dev: Device,
    epoch: int,
    steps: int,
    *,
    window: range = range(0),
    temp: float = 0,
    leak: float = 0,
    temp_outside: float = 0,
) -> None:
    probe.epoch_start(epoch, now_ns=0)
    for step in range(1, steps + 1):
        if step == window.start:
            probe.window_start(now_ns=0)
        dev.temporary(temp if step in window else temp_outside)
        dev.use(leak / steps)
        if window and step == window.stop - 1:
            probe.window_end(now_ns=0)
    probe.epoch_end(epoch, now_ns=0)


def test_the_window_peak_is_the_windows_and_the_epoch_peak_the_largest_read() -> None:
    dev, said = Device(), Warnings()
    probe = MemoryProbe(dev, warn=said)
    probe.fit_start(now_ns=0)
    # 300 MB temporaries outside the window, 200 MB inside: the window reads 200, the epoch 300.
    run_epoch(probe, dev, 0, 10, window=range(4, 7), temp=200 * MB, temp_outside=300 * MB)
    w, e = probe.window_figures(), probe.epoch_figures()
    assert w[metrics.MEMORY_PEAK_MB.key] == pytest.approx(300.0)  # 100 in use + 200
    assert e[metrics.EPOCH_MEMORY_PEAK_MB.key] == pytest.approx(400.0)
    assert w[metrics.MEMORY_HEADROOM_PERCENT.key] == pytest.approx(70.0)
    assert e[metrics.EPOCH_MEMORY_HEADROOM_PERCENT.key] == pytest.approx(60.0)
    assert math.isnan(w[metrics.MEMORY_RESERVED_PEAK_MB.key])
    assert math.isnan(e[metrics.EPOCH_MEMORY_GROWTH_MB.key])  # no previous epoch
    assert e[metrics.EPOCH_MEMORY_IN_USE_MB.key] == pytest.approx(100.0)
    assert set(w) == set(WINDOW_KEYS) and set(e) == set(EPOCH_KEYS)
    # Never per step: one reset at fit start, at epoch start; a read and a reset at window start, window end;
    # a read and a reset at epoch end.
    assert (dev.reads, dev.resets) == (3, 5)
    assert said.seen == {}


def test_the_steps_before_a_window_count_for_the_epochs_peak() -> None:
    dev = Device()
    probe = MemoryProbe(dev, warn=Warnings())
    probe.fit_start(now_ns=0)
    probe.epoch_start(0, now_ns=0)
    dev.temporary(600 * MB)  # before the window only
    probe.window_start(now_ns=0)
    dev.temporary(50 * MB)
    probe.window_end(now_ns=0)
    probe.epoch_end(0, now_ns=0)
    assert probe.window_figures()[metrics.MEMORY_PEAK_MB.key] == pytest.approx(150.0)
    assert probe.epoch_figures()[metrics.EPOCH_MEMORY_PEAK_MB.key] == pytest.approx(700.0)


def test_a_window_opened_in_another_epoch_leaves_nan_and_the_epoch_peak_counts_from_its_start() -> None:
    dev = Device()
    probe = MemoryProbe(dev, warn=Warnings())
    probe.fit_start(now_ns=0)
    dev.temporary(500 * MB)  # before the epoch: not the epoch's
    run_epoch(probe, dev, 0, 5, temp_outside=50 * MB)
    assert all(math.isnan(v) for v in probe.window_figures().values())
    assert probe.epoch_figures()[metrics.EPOCH_MEMORY_PEAK_MB.key] == pytest.approx(150.0)


def test_the_reserved_peak_sets_the_headroom_when_it_is_larger() -> None:
    dev = Device(reserve=950 * MB)
    said = Warnings()
    probe = MemoryProbe(dev, warn=said)
    probe.fit_start(now_ns=0)
    run_epoch(probe, dev, 0, 5, window=range(2, 4), temp=100 * MB)
    w = probe.window_figures()
    assert w[metrics.MEMORY_RESERVED_PEAK_MB.key] == pytest.approx(950.0)
    assert w[metrics.MEMORY_HEADROOM_PERCENT.key] == pytest.approx(5.0)
    assert list(said.seen) == ["memory-headroom"]
    assert "5.0%" in said.seen["memory-headroom"] and "950 of 1000 MB" in said.seen["memory-headroom"]


def test_a_steady_leak_reads_its_growth_and_warns_once() -> None:
    dev, said = Device(), Warnings()
    probe = MemoryProbe(dev, warn=said)
    probe.fit_start(now_ns=0)
    growth = []
    for epoch in range(6):
        run_epoch(probe, dev, epoch, 8, leak=30 * MB)
        growth.append(probe.epoch_figures()[metrics.EPOCH_MEMORY_GROWTH_MB.key])
        if epoch < 3:
            assert "memory-leak" not in said.seen  # 3 growths needed: epochs 1, 2, 3
    assert math.isnan(growth[0]) and growth[1:] == pytest.approx([30.0] * 5)
    assert list(said.seen) == ["memory-leak"]
    assert said.seen["memory-leak"].startswith("fitprof: memory grows about 30 MB per epoch since epoch 1")


def test_growth_that_stops_or_stays_small_never_warns() -> None:
    rng = np.random.default_rng(0)
    dev, said = Device(), Warnings()
    probe = MemoryProbe(dev, warn=said)
    probe.fit_start(now_ns=0)
    # Two epochs of 30 MB then flat; noise of up to 9 MB each epoch never makes a leak.
    for epoch, leak in enumerate([30, 30, 0, 30, 30, 0, *rng.uniform(-9, 9, 6)]):
        run_epoch(probe, dev, epoch, 4, leak=float(leak) * MB)
    assert said.seen == {}


def test_a_reader_that_fails_leaves_nan_and_warns_once() -> None:
    dev, said = Device(fail={"read", "reset"}), Warnings()
    probe = MemoryProbe(dev, warn=said)
    probe.fit_start(now_ns=0)
    for epoch in range(2):
        run_epoch(probe, dev, epoch, 4, window=range(2, 3), temp=10 * MB)
    assert all(math.isnan(v) for v in {**probe.epoch_figures(), **probe.window_figures()}.values())
    assert sorted(said.seen) == ["memory-read", "memory-reset"]


def test_a_new_fit_starts_the_growth_afresh() -> None:
    dev = Device()
    probe = MemoryProbe(dev, warn=Warnings())
    probe.fit_start(now_ns=0)
    run_epoch(probe, dev, 0, 2)
    dev.use(500 * MB)
    probe.fit_start(now_ns=0)
    run_epoch(probe, dev, 0, 2)
    assert math.isnan(probe.epoch_figures()[metrics.EPOCH_MEMORY_GROWTH_MB.key])


def test_bad_kinds_and_devices_are_refused() -> None:
    with pytest.raises(ValueError, match=r"memory kind must be one of .*'host'.*got 'gpu'"):
        MemoryReader("gpu")
    with pytest.raises(ValueError, match="device must be an integer >= 0, got -1"):
        memory_probe("cuda", -1)
    assert set(KINDS) == {"cuda", "tensorflow", "jax", "host"} == set(BACKENDS)


def test_the_readers_import_no_framework_until_they_read() -> None:
    code = (
        "import sys; from fitprof.fit.memory import memory_probe; memory_probe('cuda'); memory_probe('tensorflow');"
        "memory_probe('jax'); print(sorted(m for m in ('torch','tensorflow','jax') if m in sys.modules))"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
def test_the_host_reader_sees_a_200_mb_temporary_and_its_reset() -> None:
    reader = MemoryReader("host")
    assert reader.resets
    reader.reset_peak()
    before = reader.read()
    a = np.ones(200_000_000, dtype=np.uint8)  # written, so every page is resident
    del a
    after = reader.read()
    assert after.peak_bytes - before.in_use_bytes == pytest.approx(200e6, rel=0.05)
    assert abs(after.in_use_bytes - before.in_use_bytes) < 20e6  # freed: numpy's large buffers are unmapped
    assert after.capacity_bytes > after.in_use_bytes
    reader.reset_peak()
    assert reader.read().peak_bytes < before.in_use_bytes + 20e6


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
def _resident(nbytes: int) -> mmap.mmap:
    """``nbytes`` of fresh pages, written so that they are resident, mapped outside malloc: in a process whose
    malloc keeps freed blocks in its heap (seen in a whole fast run, once torch and TensorFlow were loaded), a
    kept array could reuse the resident pages of the last step's temporary and the epoch read no growth."""
    block = mmap.mmap(-1, nbytes)
    np.frombuffer(block, dtype=np.uint8)[:] = 1
    return block


def test_the_probe_on_the_host_measures_planted_temporaries_and_a_leak() -> None:
    said = Warnings()
    probe = memory_probe("host", warn=said)
    kept = []
    probe.fit_start(now_ns=0)
    figures = []
    for epoch in range(4):
        probe.epoch_start(epoch, now_ns=0)
        kept.append(_resident(30_000_000))  # before the window: held at the window and at the end
        for step in range(1, 6):
            if step == 2:
                probe.window_start(now_ns=0)
            _resident(200_000_000 if step in (2, 3) else 4096).close()
            if step == 3:
                probe.window_end(now_ns=0)
        probe.epoch_end(epoch, now_ns=0)
        figures.append({**probe.epoch_figures(), **probe.window_figures()})
    for f in figures:
        assert f[metrics.MEMORY_PEAK_MB.key] - f[metrics.EPOCH_MEMORY_IN_USE_MB.key] == pytest.approx(200, rel=0.05)
        assert 0 <= f[metrics.MEMORY_HEADROOM_PERCENT.key] <= 100
    growth = [f[metrics.EPOCH_MEMORY_GROWTH_MB.key] for f in figures[1:]]
    assert all(20 <= g <= 40 for g in growth), growth
    assert list(said.seen) == ["memory-leak"]


@pytest.mark.gpu
def test_cuda_reader_exact_figures() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    reader = MemoryReader("cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    reader.reset_peak()
    tmp = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    del tmp
    kept = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    r = reader.read()
    # The caching allocator rounds a request up to 2 MiB blocks: these sizes are already whole blocks.
    assert r.peak_bytes == base + 256 * 2**20
    assert r.in_use_bytes == base + 64 * 2**20
    assert r.reserved_peak_bytes >= r.peak_bytes
    assert r.capacity_bytes == torch.cuda.get_device_properties(0).total_memory
    reader.reset_peak()
    assert reader.read().peak_bytes == base + 64 * 2**20
    del kept


@pytest.mark.gpu
def test_cuda_probe_window_and_epoch() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probe = memory_probe("cuda")
        probe.fit_start(now_ns=0)
        kept = []
        for epoch in range(2):
            probe.epoch_start(epoch, now_ns=0)
            probe.window_start(now_ns=0)
            base = torch.cuda.memory_allocated()
            tmp = torch.empty(200 * 10**6, dtype=torch.uint8, device="cuda")
            del tmp
            probe.window_end(now_ns=0)
            kept.append(torch.empty(30 * 2**20, dtype=torch.uint8, device="cuda"))
            probe.epoch_end(epoch, now_ns=0)
        w, e = probe.window_figures(), probe.epoch_figures()
    assert w[metrics.MEMORY_PEAK_MB.key] * MB == pytest.approx(base + 200 * 10**6, abs=2 * 2**20)
    assert e[metrics.EPOCH_MEMORY_GROWTH_MB.key] * MB == 30 * 2**20

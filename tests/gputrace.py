"""GPU-shaped traces whose every figure is known by construction: a Kineto Chrome trace and an XSpace.

Built with the standard library and numpy only, sharing nothing with fitprof (neither its readers nor its
XSpace writer and schema: the XSpace bytes are written here, field by field, in protobuf's wire format, with the
field numbers of tsl's ``xplane.proto``), so that a bug in fitprof cannot cancel out in a test.

Both generators plant the same schedule of ``steps`` training steps, with durations drawn from a seeded
generator (whole microseconds, so sums stay exact in floating point):

* each step opens with a DataLoader / ``IteratorGetNext`` wait, then an HtoD copy from pinned memory and one
  from pageable memory, forward and backward kernels launched by known operators, two NCCL all-reduce kernels
  (the second starting halfway through the first, on another stream: their union, not their sum, is the
  collective time), a DtoH copy, and a kernel launched outside any operator;
* Kineto only: device work runs after its launch, the last kernel of a step after the step's end (it still
  belongs to the step that launched it); ``aten::item`` and ``aten::_local_scalar_dense`` share start and
  duration (the callee, later in the file, launches the copy); one step holds a ``fitprof/validation`` span
  with its own fetch and kernel, none of which count;
* outside the steps: a warm-up fetch, copy and kernel before the first step and a copy after the last (none
  count); Kineto also writes the profiler's own span, metadata, flow events, a device-side mirror of every
  ``ProfilerStep#N`` and runtime calls that launch nothing; XSpace a derived device line (``TensorFlow Ops``)
  repeating the stream events, which must not count twice.

Each generator returns the trace and a :class:`Truth` with the figures, summed while planting.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PINNED = "Memcpy HtoD (Pinned -> Device)"
PAGEABLE = "Memcpy HtoD (Pageable -> Device)"
DTOH = "Memcpy DtoH (Device -> Pageable)"
NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"
DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
LOOSE_KERNEL = "void multi_tensor_apply_kernel<FusedAdamW>(float*)"  # launched outside any operator


@dataclass
class Truth:
    """The figures of a generated trace (per step: summed over the analysed steps, divided by their number)."""

    steps: int
    step_nums: list[int]
    step_time_ms: float
    input_ms_per_step: float
    htod_pinned_ms_per_step: float
    htod_pageable_ms_per_step: float
    htod_bytes_per_step: float
    dtoh_ms_per_step: float
    collective_ms_per_step: float
    device_ms_per_step: dict[str, float] = field(default_factory=dict)
    """Device time per step by the operator that launched it (Kineto: the innermost ``cpu_op``; XSpace: the
    ``tf_op`` stat's op name), or the kernel's own name when no operator launched it."""
    rank: int | None = None
    world_size: int | None = None

    @property
    def htod_ms_per_step(self) -> float:
        return self.htod_pinned_ms_per_step + self.htod_pageable_ms_per_step

    def percent(self, ms_per_step: float) -> float:
        return 100.0 * ms_per_step / self.step_time_ms


class _Sums:
    """Running totals while planting (microseconds, bytes)."""

    def __init__(self) -> None:
        self.window = self.input = self.pinned = self.pageable = self.nbytes = self.dtoh = self.coll = 0.0
        self.ops: dict[str, float] = defaultdict(float)

    def truth(self, step_nums: list[int], rank: int | None, world_size: int | None) -> Truth:
        n = len(step_nums)
        return Truth(
            steps=n,
            step_nums=step_nums,
            step_time_ms=self.window / n / 1e3,
            input_ms_per_step=self.input / n / 1e3,
            htod_pinned_ms_per_step=self.pinned / n / 1e3,
            htod_pageable_ms_per_step=self.pageable / n / 1e3,
            htod_bytes_per_step=self.nbytes / n,
            dtoh_ms_per_step=self.dtoh / n / 1e3,
            collective_ms_per_step=self.coll / n / 1e3,
            device_ms_per_step={k: v / n / 1e3 for k, v in self.ops.items()},
            rank=rank,
            world_size=world_size,
        )


def _us(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(rng.integers(lo, hi + 1))


# ------------------------------------------------------------------------------------------------- Kineto


def kineto_trace(
    *,
    steps: int = 4,
    first_step: int = 11,
    seed: int = 0,
    rank: int | None = 0,
    world_size: int | None = 8,
    pageable_us: tuple[int, int] = (300, 900),
    nccl_us: tuple[int, int] = (800, 2_000),
    validation_step: int | None = 1,
    slack_us: tuple[int, int] = (2_500, 4_000),
) -> tuple[dict[str, Any], Truth]:
    """A Kineto trace (``{"traceEvents": [...], ...}``) of ``steps`` steps numbered from ``first_step``.

    Args:
        steps: how many ``ProfilerStep#N`` spans.
        first_step: the first step's number.
        seed: the random generator's seed (durations).
        rank, world_size: ``distributedInfo`` (None for neither).
        pageable_us: range of each pageable HtoD copy's duration (us); make it large for an HtoD-bound trace.
        nccl_us: range of each NCCL kernel's duration (us).
        validation_step: index (0-based) of the step holding a ``fitprof/validation`` span, or None.
        slack_us: range of the host's idle time at each step's end, after its planted work (us). The truth's step
            time is the host span: with long copies, give the step room for them, or the device outlasts the host
            span and fitprof rightly counts the step longer (docs/metrics.md, "Step time on a GPU").
    """
    rng = np.random.default_rng(seed)
    host_pid, host_tid, dev = 4242, 4242, 0
    compute, copy_stream, nccl_stream, nccl_stream2 = 7, 13, 20, 21
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": host_pid, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_name", "pid": dev, "tid": 0, "args": {"name": "CUDA GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": dev, "tid": compute, "args": {"name": "stream 7"}},
    ]
    corr = [1000]
    sums = _Sums()

    def x(cat: str, name: str, ts: float, dur: float, pid: int = host_pid, tid: int = host_tid, **args: Any) -> None:
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args})

    def launch(
        at: float, what: str, dur: float, *, start: float, stream: int = compute, cat: str = "kernel", **args: Any
    ) -> int:
        """A runtime call at ``at`` launching ``what`` on the device at ``start``; returns the correlation id."""
        corr[0] += 1
        c = corr[0]
        runtime = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
        x("cuda_runtime", runtime, at, 4, correlation=c)
        x(cat, what, start, dur, pid=dev, tid=stream, correlation=c, **args)
        ev.append({"ph": "f", "id": c, "pid": dev, "tid": stream, "ts": start, "cat": "ac2g", "name": "ac2g"})
        return c

    def op(name: str, ts: float, dur: float) -> None:
        x("cpu_op", name, ts, dur)

    # Warm-up before the first step: a fetch, a copy and a kernel that must not count.
    t = 1_000_000.0
    x("user_annotation", DATALOADER, t, 700)
    op("aten::copy_", t + 800, 100)
    launch(t + 820, PINNED, 50, start=t + 830, stream=copy_stream, cat="gpu_memcpy", bytes=1 << 20)
    op("aten::addmm", t + 1_000, 60)
    launch(t + 1_010, "ampere_sgemm_128x64_tn", 500, start=t + 1_020)
    t += 5_000

    step_nums = list(range(first_step, first_step + steps))
    for k, num in enumerate(step_nums):
        wait, pinned, pageable = _us(rng, 300, 2_500), _us(rng, 40, 200), _us(rng, *pageable_us)
        gemm, relu, mm1, mm2 = _us(rng, 600, 1_500), _us(rng, 20, 90), _us(rng, 300, 800), _us(rng, 300, 800)
        n1, n2, dtoh, loose = _us(rng, *nccl_us), _us(rng, *nccl_us), _us(rng, 3, 20), _us(rng, 100, 400)
        busy = 10 + wait + 500 + 300 + 700 + 400 + max(n1, n1 // 2 + n2) + 100  # the host's planted work
        length = busy + _us(rng, *slack_us)  # room for the validation span and the optimizer launch
        x("user_annotation", f"ProfilerStep#{num}", t, length)
        x("gpu_user_annotation", f"ProfilerStep#{num}", t + 200, length - 100, pid=dev, tid=compute)
        sums.window += length
        # input wait
        x("user_annotation", DATALOADER, t + 5, wait)
        sums.input += wait
        c = t + 10 + wait
        # pinned and pageable HtoD copies, launched by aten::copy_ inside aten::to
        op("aten::to", c, 400)
        op("aten::copy_", c + 10, 380)
        nbytes = int(rng.integers(1, 64)) << 16
        launch(c + 20, PINNED, pinned, start=c + 30, stream=copy_stream, cat="gpu_memcpy", bytes=nbytes)
        pbytes = int(rng.integers(1, 16)) << 12
        launch(c + 200, PAGEABLE, pageable, start=c + 260, stream=copy_stream, cat="gpu_memcpy", bytes=pbytes)
        sums.pinned += pinned
        sums.pageable += pageable
        sums.nbytes += nbytes + pbytes
        sums.ops["aten::copy_"] += pinned + pageable
        c += 500
        # forward: aten::linear > aten::addmm launches the GEMM; aten::relu its kernel
        op("aten::linear", c, 120)
        op("aten::addmm", c + 10, 100)
        launch(c + 30, "ampere_sgemm_128x64_tn", gemm, start=c + 40)
        sums.ops["aten::addmm"] += gemm
        op("aten::relu", c + 150, 40)
        launch(c + 160, "void at::native::vectorized_elementwise_kernel<4, at::native::relu>()", relu, start=c + 170)
        sums.ops["aten::relu"] += relu
        # a runtime call that launches nothing on the device
        x("cuda_runtime", "cudaStreamIsCapturing", c + 200, 2, correlation=0)
        c += 300
        # backward: autograd node > aten::mm, two kernels
        op("autograd::engine::evaluate_function: MmBackward0", c, 600)
        op("aten::mm", c + 20, 250)
        launch(c + 40, "ampere_sgemm_64x32_nn", mm1, start=c + 100)
        op("aten::mm", c + 300, 250)
        launch(c + 320, "ampere_sgemm_64x32_nt", mm2, start=c + 100 + mm1)
        sums.ops["aten::mm"] += mm1 + mm2
        c += 700
        # the gradient all-reduce: c10d::allreduce_ > record_param_comms launches two NCCL kernels; the second
        # starts halfway through the first, on another stream
        op("c10d::allreduce_", c, 300)
        op("record_param_comms", c + 10, 280)
        x("user_annotation", "nccl:all_reduce", c + 15, 270)
        s1 = c + 400
        launch(c + 20, NCCL_KERNEL, n1, start=s1, stream=nccl_stream)
        s2 = s1 + n1 // 2
        launch(c + 40, NCCL_KERNEL, n2, start=s2, stream=nccl_stream2)
        sums.coll += max(s1 + n1, s2 + n2) - s1
        sums.ops["record_param_comms"] += n1 + n2
        c += 400 + max(n1, n1 // 2 + n2)
        # the loss read back: aten::item > aten::_local_scalar_dense, same start and duration, the callee later
        # in the file launches the DtoH copy
        op("aten::item", c, 80)
        op("aten::_local_scalar_dense", c, 80)
        launch(c + 10, DTOH, dtoh, start=c + 30, stream=copy_stream, cat="gpu_memcpy", bytes=4)
        sums.dtoh += dtoh
        sums.ops["aten::_local_scalar_dense"] += dtoh
        c += 100
        end = t + length
        assert c <= end - 2_000, "the planted work overlaps the validation span"
        # validation inside this step: its fetch and its kernel do not count, nor does its time
        if k == validation_step:
            val = 1_500
            x("user_annotation", "fitprof/validation", end - 2_000, val)
            x("user_annotation", DATALOADER, end - 1_990, 300)
            op("aten::addmm", end - 1_600, 50)
            launch(end - 1_590, "ampere_sgemm_128x64_tn", 400, start=end - 1_580)
            sums.window -= val
        # the optimizer kernel, launched outside any operator at the end of the step, runs after the step
        launch(end - 50, LOOSE_KERNEL, loose, start=end + 60)
        sums.ops[LOOSE_KERNEL] += loose
        t = end

    # After the last step: a copy launched outside every step.
    op("aten::copy_", t + 500, 100)
    launch(t + 510, PINNED, 70, start=t + 520, stream=copy_stream, cat="gpu_memcpy", bytes=1 << 20)
    ev.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
               "ts": 999_000, "dur": t + 2_000 - 999_000})  # fmt: skip
    ev.append({"ph": "i", "s": "t", "name": "Record Window End", "pid": "", "tid": "", "ts": t + 1_000})
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
        "traceEvents": ev,
    }
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
    return doc, sums.truth(step_nums, rank, world_size)


def write_kineto(path: Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` as JSON, gzipped when the name ends in ``.gz``."""
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


# ------------------------------------------------------------------------------------- XSpace, by hand


def varint(n: int) -> bytes:
    """``n`` as a protobuf varint: its low 64 bits (a negative int64 in two's complement, ten bytes), 7 at a time."""
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int(num: int, value: int) -> bytes:
    return varint(num << 3) + varint(value)


def field_bytes(num: int, payload: bytes) -> bytes:
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def _str(num: int, text: str) -> bytes:
    return field_bytes(num, text.encode())


# tsl/profiler/protobuf/xplane.proto field numbers
XSPACE_PLANES, XSPACE_HOSTNAMES = 1, 4
PLANE_ID, PLANE_NAME, PLANE_LINES, PLANE_EVENT_METADATA, PLANE_STAT_METADATA, PLANE_STATS = 1, 2, 3, 4, 5, 6
LINE_ID, LINE_NAME, LINE_TIMESTAMP_NS, LINE_EVENTS, LINE_DURATION_PS = 1, 2, 3, 4, 9
EVENT_METADATA_ID, EVENT_OFFSET_PS, EVENT_DURATION_PS, EVENT_STATS = 1, 2, 3, 4
STAT_METADATA_ID, STAT_DOUBLE, STAT_UINT64, STAT_INT64, STAT_STR, STAT_REF = 1, 2, 3, 4, 5, 7
EMETA_ID, EMETA_NAME, EMETA_STATS = 1, 2, 5
SMETA_ID, SMETA_NAME = 1, 2


class PlaneBuilder:
    """One XPlane being built: metadata interned by name, lines of events in picoseconds."""

    def __init__(self, plane_id: int, name: str) -> None:
        self.id, self.name = plane_id, name
        self.events: dict[str, int] = {}
        self.stats: dict[str, int] = {}
        self.lines: list[tuple[int, str, int, list[bytes]]] = []
        self.plane_stats: list[bytes] = []

    def stat_id(self, name: str) -> int:
        return self.stats.setdefault(name, len(self.stats) + 1)

    def event_id(self, name: str) -> int:
        return self.events.setdefault(name, len(self.events) + 1)

    def stat(self, name: str, value: int | str) -> bytes:
        sid = _int(STAT_METADATA_ID, self.stat_id(name))
        if isinstance(value, str):
            return sid + _str(STAT_STR, value)
        return sid + _int(STAT_INT64, value)

    def line(self, line_id: int, name: str, timestamp_ns: int) -> list[bytes]:
        events: list[bytes] = []
        self.lines.append((line_id, name, timestamp_ns, events))
        return events

    def event(self, line: list[bytes], name: str, offset_ps: int, duration_ps: int, **stats: int | str) -> None:
        body = _int(EVENT_METADATA_ID, self.event_id(name)) + _int(EVENT_OFFSET_PS, offset_ps)
        body += _int(EVENT_DURATION_PS, duration_ps)
        for key, value in stats.items():
            body += field_bytes(EVENT_STATS, self.stat(key, value))
        line.append(body)

    def encode(self) -> bytes:
        out = _int(PLANE_ID, self.id) + _str(PLANE_NAME, self.name)
        for line_id, name, ts_ns, events in self.lines:
            body = _int(LINE_ID, line_id) + _str(LINE_NAME, name) + _int(LINE_TIMESTAMP_NS, ts_ns)
            body += b"".join(field_bytes(LINE_EVENTS, e) for e in events)
            out += field_bytes(PLANE_LINES, body)
        for name, eid in self.events.items():
            meta = _int(EMETA_ID, eid) + _str(EMETA_NAME, name)
            out += field_bytes(PLANE_EVENT_METADATA, _int(1, eid) + field_bytes(2, meta))  # map entry: key 1, value 2
        for name, sid in self.stats.items():
            meta = _int(SMETA_ID, sid) + _str(SMETA_NAME, name)
            out += field_bytes(PLANE_STAT_METADATA, _int(1, sid) + field_bytes(2, meta))
        out += b"".join(field_bytes(PLANE_STATS, s) for s in self.plane_stats)
        return out


def memcpy_details(src: str, dst: str, size: int) -> str:
    """The ``memcpy_details`` stat as XLA's CUPTI collector writes it."""
    return f"kind_src:{src} kind_dst:{dst} size:{size} dest:0 async:1"


def xspace_trace(*, steps: int = 4, first_step: int = 3, seed: int = 0, host: str = "gpuhost") -> tuple[bytes, Truth]:
    """An XSpace (serialized bytes) of a TensorFlow GPU window: a ``/host:CPU`` plane with the step markers
    (``train``, stats ``step_num`` and ``_r=1``), ``IteratorGetNextOp::DoCompute`` spans and ``tf_Compute`` ops; a
    ``/device:GPU:0`` plane whose ``Stream`` lines hold ``MemcpyH2D`` / ``MemcpyD2H`` copies (``memcpy_details``)
    and kernels (``tf_op`` = ``op name:op type``), NCCL ones among them; a derived ``TensorFlow Ops`` line that
    repeats the stream events; and a ``Task Environment`` plane."""
    rng = np.random.default_rng(seed)
    sums = _Sums()
    cpu, gpu, env = PlaneBuilder(1, "/host:CPU"), PlaneBuilder(2, "/device:GPU:0"), PlaneBuilder(3, "Task Environment")
    base_ns = 1_000_000  # every line starts here; offsets in picoseconds
    python = cpu.line(1, "python3", base_ns)
    get_next = cpu.line(2, "tf_data_iterator_get_next", base_ns)
    tf_compute = cpu.line(3, "tf_Compute", base_ns)
    tf_data = cpu.line(4, "tf_data_private_threadpool", base_ns)
    h2d_stream = gpu.line(13, "Stream #13(MemcpyH2D)", base_ns)
    compute = gpu.line(7, "Stream #7(Compute)", base_ns)
    nccl1 = gpu.line(20, "Stream #20(Nccl)", base_ns)
    nccl2 = gpu.line(21, "Stream #21(Nccl)", base_ns)
    derived = gpu.line(1000, "TensorFlow Ops", base_ns)

    def ps(us: float) -> int:
        return round(us * 1_000_000)

    def dev(line: list[bytes], name: str, start: float, dur: float, **stats: int | str) -> None:
        gpu.event(line, name, ps(start), ps(dur), **stats)
        gpu.event(derived, name, ps(start), ps(dur), **stats)  # the derived line repeats it

    # Warm-up before the first step: must not count.
    dev(h2d_stream, "MemcpyH2D", 100, 80, memcpy_details=memcpy_details("pinned", "device", 1 << 20),
        tf_op="IteratorGetNext:IteratorGetNext")  # fmt: skip
    dev(compute, "volta_sgemm_128x64_nn", 300, 500, tf_op="sequential/dense/MatMul:MatMul")
    cpu.event(get_next, "IteratorGetNextOp::DoCompute", ps(50), ps(600))

    t = 2_000.0
    step_nums = list(range(first_step, first_step + steps))
    for num in step_nums:
        wait, pinned, pageable = _us(rng, 200, 3_000), _us(rng, 40, 200), _us(rng, 100, 600)
        gemm, relu, grad = _us(rng, 500, 1_500), _us(rng, 20, 90), _us(rng, 400, 1_200)
        n1, n2, dtoh = _us(rng, 500, 1_500), _us(rng, 500, 1_500), _us(rng, 3, 20)
        busy = 20 + wait + 40 + pinned + pageable + gemm + relu + 10 + grad + 10 + max(n1, n1 // 2 + n2) + 10 + dtoh
        length = busy + _us(rng, 200, 1_000)
        cpu.event(python, "train", ps(t), ps(length), step_num=num, _r=1)
        sums.window += length
        cpu.event(get_next, "IteratorGetNextOp::DoCompute", ps(t + 10), ps(wait))
        cpu.event(tf_data, "Iterator::Map", ps(t + 20), ps(wait - 20))  # tf.data's own work: not an op
        sums.input += wait
        c = t + 20 + wait
        # host ops (host self time is not used: the trace has device events)
        cpu.event(tf_compute, "sequential/dense/MatMul:MatMul", ps(c), ps(200))
        cpu.event(tf_compute, "sequential/dense/Relu:Relu", ps(c + 210), ps(50))
        # HtoD copies, attributed to IteratorGetNext
        nbytes = int(rng.integers(1, 64)) << 16
        dev(h2d_stream, "MemcpyH2D", c + 10, pinned, memcpy_details=memcpy_details("pinned", "device", nbytes),
            tf_op="IteratorGetNext:IteratorGetNext")  # fmt: skip
        pbytes = int(rng.integers(1, 16)) << 12
        dev(h2d_stream, "MemcpyH2D", c + 20 + pinned, pageable,
            memcpy_details=memcpy_details("pageable", "device", pbytes), tf_op="IteratorGetNext:IteratorGetNext")  # fmt: skip
        sums.pinned += pinned
        sums.pageable += pageable
        sums.nbytes += nbytes + pbytes
        sums.ops["IteratorGetNext"] += pinned + pageable
        c += 40 + pinned + pageable
        dev(compute, "volta_sgemm_128x64_nn", c, gemm, tf_op="sequential/dense/MatMul:MatMul")
        dev(compute, "void Eigen::internal::EigenMetaKernel<relu>()", c + gemm, relu,
            tf_op="sequential/dense/Relu:Relu")  # fmt: skip
        sums.ops["sequential/dense/MatMul"] += gemm
        sums.ops["sequential/dense/Relu"] += relu
        c += gemm + relu + 10
        dev(compute, "volta_sgemm_64x32_nt", c, grad, tf_op="gradient_tape/sequential/dense/MatMul:MatMul")
        sums.ops["gradient_tape/sequential/dense/MatMul"] += grad
        c += grad + 10
        # two NCCL all-reduce kernels, the second from halfway through the first, on another stream
        reduce_op = "CollectiveReduceV2:CollectiveReduceV2"
        dev(nccl1, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", c, n1, tf_op=reduce_op)
        dev(nccl2, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", c + n1 // 2, n2, tf_op=reduce_op)
        sums.coll += max(c + n1, c + n1 // 2 + n2) - c
        sums.ops["CollectiveReduceV2"] += n1 + n2
        c += max(n1, n1 // 2 + n2) + 10
        dev(compute, "MemcpyD2H", c, dtoh, memcpy_details=memcpy_details("device", "pageable", 4),
            tf_op="Identity:Identity")  # fmt: skip
        sums.dtoh += dtoh
        sums.ops["Identity"] += dtoh
        t += length

    # After the last step: a copy that must not count.
    dev(h2d_stream, "MemcpyH2D", t + 100, 90, memcpy_details=memcpy_details("pinned", "device", 1 << 20),
        tf_op="IteratorGetNext:IteratorGetNext")  # fmt: skip
    start_ns, stop_ns = 1_700_000_000_000_000_000, 1_700_000_000_000_000_000 + int((t + 1_000) * 1e3)
    env.plane_stats += [_int(STAT_METADATA_ID, env.stat_id("profile_start_time")) + _int(STAT_UINT64, start_ns)]
    env.plane_stats += [_int(STAT_METADATA_ID, env.stat_id("profile_stop_time")) + _int(STAT_UINT64, stop_ns)]
    space = b"".join(field_bytes(XSPACE_PLANES, p.encode()) for p in (cpu, gpu, env)) + _str(XSPACE_HOSTNAMES, host)
    return space, sums.truth(step_nums, None, None)

"""A seeded mutator for trace files and report files, shared by the fuzz test and ``benchmarks/fuzz_traces.py``.

Every mutant is ``(label, file name, bytes)``. The seeds are small traces built here (a synthetic Kineto Chrome
trace that has every kind of event the reader classifies, and the XSpace fitprof's converter writes from it),
plus any trace given by the caller (the shared fixtures, ``tests/data``). Mutations:

* bytes: flipped, cut, inserted, a slice repeated, on the plain and the gzipped file;
* JSON: one value anywhere (an event field, ``args``, ``distributedInfo``, the top level) replaced by ``null``,
  ``-1``, ``1e308``, ``2**70``, ``-2**70``, a string, a list, an object, ``true``, a 100,000-deep nesting;
  keys dropped; events repeated;
* XSpace: bytes as above, and field values (times, ids, stat values, names) replaced with extremes;
* bombs: gzip files that inflate far past the size bound (whitespace, empty events, deep nesting).

Nothing here is random without a seed: the same seed gives the same inputs.
"""

from __future__ import annotations

import copy
import gzip
import inspect
import json
import random
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Mutant = tuple[str, str, bytes]

KINETO_NAME = "fuzz.pt.trace.json"
XSPACE_NAME = "fuzz.xplane.pb"

REPLACEMENTS: tuple[Any, ...] = (
    None,
    -1,
    0,
    1e308,
    -1e308,
    2**70,
    -(2**70),
    "x",
    "",
    "ProfilerStep#",
    "ProfilerStep#99999999999999999999999",
    "Memcpy HtoD (Pinned -> Device)",
    [],
    [1, 2],
    {},
    {"a": None},
    True,
)
DEEP = 100_000
"""Nesting depth of the deep-nesting mutation (far past any recursion limit)."""


def _x(cat: str, name: str, ts: float, dur: float, pid: Any = 7, tid: Any = 7, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def kineto_seed(steps: int = 3) -> dict[str, Any]:
    """A small Kineto trace with steps, DataLoader waits, ops, launches, kernels, copies and collectives."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x", "ts": 0, "dur": 9e3},
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python"}},
    ]
    for s in range(steps):
        t = 100.0 + 200.0 * s
        corr = 10 * s
        events += [
            _x("user_annotation", f"ProfilerStep#{s + 3}", t, 190.0),
            _x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + 1, 40.5),
            _x("cpu_op", "aten::linear", t + 50, 60),
            _x("cpu_op", "aten::addmm", t + 51, 20),
            _x("cuda_runtime", "cudaLaunchKernel", t + 52, 3, correlation=corr + 1),
            _x("cuda_runtime", "cudaMemcpyAsync", t + 45, 3, correlation=corr + 2),
            _x("cpu_op", "c10d::allreduce_", t + 120, 6),
            _x("cuda_driver", "cuLaunchKernel", t + 121, 1, correlation=corr + 3),
            _x("kernel", "void gemm()", t + 60, 40, pid=0, tid=7, correlation=corr + 1),
            _x(
                "gpu_memcpy",
                "Memcpy HtoD (Pinned -> Device)",
                t + 48,
                4,
                pid=0,
                tid=7,
                correlation=corr + 2,
                bytes=4096,
            ),
            _x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", t + 125, 8, pid=0, tid=8, correlation=corr + 3),
            _x("gpu_memcpy", "Memcpy", t + 140, 1, pid=0, tid=7, kind="DtoH", bytes=8),
            _x("python_function", "train.py(12): step", t, 180),
        ]
    return {"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": events}


def xspace_seed(doc: dict[str, Any]) -> bytes:
    """The XSpace fitprof's converter writes from the Kineto trace ``doc``."""
    from fitprof.traces.xspace_write import kineto_to_xspace

    return bytes(kineto_to_xspace(doc, host="fuzz").SerializeToString())


# ------------------------------------------------------------------------------------------------- bytes


def byte_mutation(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One random byte-level damage of ``data``."""
    if not data:
        return "empty", b""
    op = rng.choice(("flip", "flip", "cut", "insert", "repeat", "zero"))
    i = rng.randrange(len(data))
    if op == "flip":
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            j = rng.randrange(len(out))
            out[j] ^= 1 << rng.randrange(8)
        return "flip", bytes(out)
    if op == "cut":
        return "cut", data[:i]
    if op == "insert":
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        return "insert", data[:i] + junk + data[i:]
    if op == "zero":
        j = min(len(data), i + rng.randint(1, 64))
        return "zero", data[:i] + bytes(j - i) + data[j:]
    j = min(len(data), i + rng.randint(1, 256))
    return "repeat", data[:j] + data[i:j] * rng.randint(2, 50) + data[j:]


# -------------------------------------------------------------------------------------------------- JSON


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


_DEEP_MARK = "__fitprof_fuzz_deep__"


def json_mutation(doc: Any, rng: random.Random) -> tuple[str, bytes]:
    """One random value-level change of the parsed trace ``doc``, serialised (``NaN``/``Infinity`` allowed)."""
    doc = copy.deepcopy(doc)
    paths = list(_paths(doc))
    path = rng.choice(paths)
    op = rng.choice(("replace", "replace", "replace", "drop", "deep", "repeat"))
    if op == "drop" and path and isinstance(doc, dict):
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict):
            del parent[path[-1]]
        else:
            del parent[path[-1]]
        label = f"drop {path[-1]!r}"
    elif op == "deep":
        doc = _set(doc, path, _DEEP_MARK)
        label = "deep"
    elif op == "repeat" and isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list) and doc["traceEvents"]:
        events = doc["traceEvents"]
        events.extend(copy.deepcopy(rng.choice(events)) for _ in range(rng.randint(1, 200)))
        label = "repeat event"
    else:
        value = rng.choice((*REPLACEMENTS, float("nan"), float("inf")))
        doc = _set(doc, path, value)
        label = f"{'/'.join(map(str, path[-2:]))}={value!r}"[:60]
    text = json.dumps(doc)
    if _DEEP_MARK in text:
        text = text.replace(f'"{_DEEP_MARK}"', "[" * DEEP + "]" * DEEP, 1)
    return label, text.encode()


# ------------------------------------------------------------------------------------------------ XSpace


def xspace_mutation(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One random field-level change of the XSpace ``data`` (times, ids, names, stat values)."""
    from fitprof.traces.xspace_write import xplane_classes

    space = xplane_classes()["XSpace"].FromString(data)
    planes = list(space.planes)
    plane = rng.choice(planes)
    events = [ev for line in plane.lines for ev in line.events]
    op = rng.choice(("time", "dur", "meta", "name", "stat", "line", "plane_name"))
    if op == "time" and plane.lines:
        line = rng.choice(list(plane.lines))
        line.timestamp_ns = rng.choice((0, -1, 2**63 - 1, -(2**63)))
    elif op == "dur" and events:
        ev = rng.choice(events)
        ev.duration_ps = rng.choice((0, 2**63 - 1, -(2**63)))
        ev.offset_ps = rng.choice((0, 2**63 - 1, -(2**63), ev.offset_ps))
    elif op == "meta" and events:
        rng.choice(events).metadata_id = rng.choice((0, -1, 2**62, 12345))
    elif op == "name" and plane.event_metadata:
        md = plane.event_metadata[rng.choice(list(plane.event_metadata))]
        md.name = rng.choice(
            (
                "",
                "x" * 100_000,
                "a:b",
                "IteratorGetNextOp::DoCompute",
                "\udcff".encode(errors="surrogatepass").decode("latin1"),
            )
        )
    elif op == "stat" and events:
        ev = rng.choice(events)
        stat = ev.stats.add(metadata_id=rng.choice([0, *plane.stat_metadata.keys()]))
        which = rng.choice(("double_value", "int64_value", "uint64_value", "str_value", "ref_value", "bytes_value"))
        value = {
            "double_value": rng.choice((float("nan"), float("inf"), 1e308, -0.0)),
            "int64_value": rng.choice((-(2**63), 2**63 - 1)),
            "uint64_value": rng.choice((0, 2**64 - 1)),
            "str_value": rng.choice(("", "abc", "1e999", "step")),
            "ref_value": rng.choice((0, 2**64 - 1, 7)),
            "bytes_value": b"\x00\xff",
        }[which]
        setattr(stat, which, value)
    elif op == "line" and plane.lines:
        rng.choice(list(plane.lines)).name = rng.choice(("", "tf_Compute", "Stream #1", "python", "x" * 1000))
    else:
        plane.name = rng.choice(("", "/host:CPU", "/device:GPU:0", "Task Environment", "/device:"))
    return f"xspace {op}", bytes(space.SerializeToString())


# ------------------------------------------------------------------------------------------------- bombs


def gzip_stream(parts: Iterator[bytes]) -> bytes:
    """Gzip of the concatenated ``parts`` (streamed: the plain text is never held whole)."""
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [co.compress(p) for p in parts]
    out.append(co.flush())
    return b"".join(out)


def bomb(kind: str, plain_mb: int) -> bytes:
    """A ``.json.gz`` that inflates to about ``plain_mb`` MB: ``whitespace`` inside ``traceEvents``, ``events``
    (``{"ph":"i"},``: instant events, repeated), ``objects`` (``{},``: objects that are no events), ``numbers``
    (``0.5,`` repeated) or ``deep`` (``[`` repeated inside an event's field)."""
    unit = {"whitespace": b" ", "events": b'{"ph":"i"},', "objects": b"{},", "numbers": b"0.5,", "deep": b"["}[kind]
    block = unit * ((1 << 20) // len(unit))

    def parts() -> Iterator[bytes]:
        yield b'{"traceEvents": [{"x": ' if kind == "deep" else b'{"traceEvents": ['
        for _ in range(plain_mb):
            yield block
        yield b"{}]}" if kind in ("events", "objects", "numbers") else b"]}"

    return gzip_stream(parts())


# ---------------------------------------------------------------------------------------------- mutants


def mutants(
    rng: random.Random,
    n: int,
    *,
    kineto: list[tuple[str, Any]] | None = None,
    xspace: list[tuple[str, bytes]] | None = None,
) -> Iterator[Mutant]:
    """``n`` mutated trace files from the seeds (by default the synthetic Kineto trace and its XSpace).

    ``kineto``: ``(name, parsed trace)`` seeds; ``xspace``: ``(name, file bytes)`` seeds.
    """
    if kineto is None:
        kineto = [("synthetic", kineto_seed())]
    if xspace is None:
        xspace = [("synthetic", xspace_seed(kineto_seed()))]
    for k in range(n):
        pick = k % 5
        if pick in (0, 1):
            name, doc = kineto[rng.randrange(len(kineto))]
            label, data = json_mutation(doc, rng)
        elif pick == 2:
            name, doc = kineto[rng.randrange(len(kineto))]
            label, data = byte_mutation(json.dumps(doc).encode(), rng)
        elif pick == 3:
            name, xdata = xspace[rng.randrange(len(xspace))]
            label, data = xspace_mutation(xdata, rng) if rng.random() < 0.5 else byte_mutation(xdata, rng)
            yield f"{name}: {label}", XSPACE_NAME, data
            continue
        else:
            name, doc = kineto[rng.randrange(len(kineto))]
            if rng.random() < 0.5:
                label, plain = json_mutation(doc, rng)
                label, data = f"{label}, gzipped", gzip.compress(plain, 1)
            else:
                label, data = byte_mutation(gzip.compress(json.dumps(doc).encode(), 1), rng)
                label = f"gzip {label}"
        yield f"{name}: {label}", KINETO_NAME + (".gz" if data[:2] == b"\x1f\x8b" else ""), data


# ------------------------------------------------------------------------------------------------- seeds


def seeds(root: Path, shared_kineto: Path) -> tuple[list[tuple[str, Any]], list[tuple[str, bytes]]]:
    """Kineto seeds (parsed) and XSpace seeds (bytes): the synthetic ones, the small shared fixtures
    (:data:`SMALL_FIXTURES` in ``shared_kineto``) and the files under ``<root>/tests/data`` below 1 MB."""
    doc = kineto_seed()
    kineto: list[tuple[str, Any]] = [("synthetic", doc)]
    xspace: list[tuple[str, bytes]] = [("synthetic", xspace_seed(doc))]
    for name in SMALL_FIXTURES:
        if (shared_kineto / name).is_file():
            kineto.append((name, json.loads(gzip.decompress((shared_kineto / name).read_bytes()))))
    data = root / "tests" / "data"
    for path in sorted(data.rglob("*")) if data.is_dir() else []:
        if not path.is_file() or path.stat().st_size >= 2**20:
            continue
        if path.name.endswith(".xplane.pb"):
            xspace.append((path.name, path.read_bytes()))
        elif path.name.endswith((".json", ".json.gz")):
            raw = path.read_bytes()
            try:
                kineto.append((path.name, json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)))
            except (ValueError, OSError, EOFError):
                continue  # a deliberately broken fixture: the mutator needs parsed seeds
    return kineto, xspace


SMALL_FIXTURES = ("cpu_only_rank34.pt.trace.json.gz", "mi250_rocm_minitoy_train.json.gz")


# --------------------------------------------------------------------------------------------------- run


def peak_rss_kb() -> int:
    """This process's peak resident set in kB: Linux's ``VmHWM``, which starts afresh at ``exec``. (``getrusage``'s
    ``ru_maxrss`` does not: a child started by fork + exec reports at least its parent's peak, hiding its own.)
    ``ru_maxrss`` where there is no ``/proc``."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


PEAK_RSS_SOURCE = inspect.getsource(peak_rss_kb)
"""The source of :func:`peak_rss_kb`, for a ``python -c`` child to define it too."""


def run(n: int, seed: int, workdir: Path, root: Path, shared_kineto: Path, **bounds: Any) -> dict[str, Any]:
    """Analyse ``n`` mutants with :func:`fitprof.analyze` under ``bounds``; what happened, as a JSON-able dict.

    ``outcomes``: how many gave a report / a TraceError; ``failures``: anything else, with the mutation;
    ``baseline_kb`` / ``peak_kb``: this process's peak RSS before the first mutant (after one read of the seed)
    and after the last; ``slowest_s`` and its mutant.
    """
    import time
    from collections import Counter

    import fitprof
    from fitprof.traces import TraceError

    kineto, xspace = seeds(root, shared_kineto)
    warm = workdir / "warm.pt.trace.json"
    warm.write_text(json.dumps(kineto_seed()))
    fitprof.analyze(warm)
    (workdir / XSPACE_NAME).write_bytes(xspace[0][1])
    fitprof.analyze(workdir / XSPACE_NAME)
    baseline = peak_rss_kb()
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    slowest = (0.0, "")
    for label, name, data in mutants(random.Random(seed), n, kineto=kineto, xspace=xspace):
        path = workdir / name
        path.write_bytes(data)
        start = time.perf_counter()
        try:
            report = fitprof.analyze(path, **bounds)
            outcomes["report"] += 1
            if report.steps_analyzed < 0 or not report.verdict:
                failures.append(f"{label}: a report without a verdict")
        except TraceError as err:
            outcomes["TraceError"] += 1
            if str(path) not in str(err):
                failures.append(f"{label}: the error does not name the file: {err}"[:300])
        except Exception as err:
            failures.append(f"{label}: {type(err).__name__}: {err}"[:300])
        took = time.perf_counter() - start
        slowest = max(slowest, (took, label))
    return {
        "inputs": n,
        "outcomes": dict(outcomes),
        "failures": failures,
        "baseline_kb": baseline,
        "peak_kb": peak_rss_kb(),
        "slowest_s": slowest[0],
        "slowest": slowest[1],
    }

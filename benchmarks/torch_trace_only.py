"""What torch's experimental ``trace_only`` saves at a window's end: ``prof.stop()`` and ``export_chrome_trace``, with
and without ``torch._C._profiler._ExperimentalConfig(trace_only=True)``, fresh processes, interleaved.

Each child process (``--child MODE``) runs an 8-layer MLP (1 torch thread, CPU), warms up, profiles ``--steps``
steps marked ``ProfilerStep#N`` (as fitprof marks them) plus ``--extra-ops`` small operators a step (0: the tiny
window, about 3k events; 800: about 10^5), then times, on the training thread (``time.thread_time``, CPU) and the
wall clock, ``prof.stop()`` and ``prof.export_chrome_trace(<plain .json>)`` (torch's C++ writer, as fitprof uses
it). The modes run in turn, in fresh processes, ``--repeats`` times (the order alternating by repeat).

Then, on the traces of the last repeat, whether the exported trace is the same with ``trace_only``: the event
count and the multiset of ``(name, cat, ph, argument names)`` of the two traces, and :func:`fitprof.analyze`'s figures on each
(timings differ between two runs; the names, counts and steps must not).

    PYTHONPATH=src python benchmarks/torch_trace_only.py [--repeats 5] [--extra-ops 0] [--steps 5] [--device cuda]

``--device cuda``: the model and each step's batch copy on the GPU, CUDA activities recorded too (kernels, copies),
the device synchronised before the stop.

torch 2.13 builds its Python events lazily (on ``events()`` / ``key_averages()``, which fitprof never calls), so
what ``trace_only`` can still save is what the C++ side does at the stop.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("plain", "trace_only")


def child(mode: str, steps: int, extra_ops: int, out: Path, device: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(8):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    host = torch.randn(32, 64)
    small = torch.ones(4, device=device)

    def step() -> None:
        x = host.to(device) if device == "cuda" else host  # the batch's copy (HtoD)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        for _ in range(extra_ops):
            small.add(1.0)

    for _ in range(5):
        step()
    kwargs = {}
    if mode == "trace_only":
        kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(trace_only=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    prof = profile(activities=activities, **kwargs)
    prof.start()
    step()  # the warm-up step, unmarked, as fitprof's window has one
    for n in range(1, steps + 1):
        with record_function(f"ProfilerStep#{n}"):
            step()
    if device == "cuda":
        torch.cuda.synchronize()
    w0, c0 = time.perf_counter(), time.thread_time()
    prof.stop()
    w1, c1 = time.perf_counter(), time.thread_time()
    trace = out / f"{mode}.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    w2, c2 = time.perf_counter(), time.thread_time()
    print(json.dumps({"stop": [(w1 - w0) * 1e3, (c1 - c0) * 1e3], "export": [(w2 - w1) * 1e3, (c2 - c1) * 1e3]}))


def _events(path: Path) -> list[dict]:
    with open(path) as fh:
        return [e for e in json.load(fh)["traceEvents"] if e.get("ph") != "M"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--extra-ops", type=int, default=0)
    parser.add_argument("--child", choices=MODES)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.extra_ops, args.out, args.device)
        return
    import torch

    try:
        torch._C._profiler._ExperimentalConfig(trace_only=True)
    except Exception as err:
        print(f"torch {torch.__version__} has no trace_only ({err!r}): nothing to compare")
        return
    out = Path(tempfile.mkdtemp(prefix="fitprof-traceonly-"))
    got: dict[str, list[dict]] = {m: [] for m in MODES}
    loads = [os.getloadavg()[0]]
    for r in range(args.repeats):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            cmd = [sys.executable, __file__, "--child", mode, "--out", str(out)]
            cmd += ["--steps", str(args.steps), "--extra-ops", str(args.extra_ops), "--device", args.device]
            run = subprocess.run(cmd, capture_output=True, text=True, check=True)
            got[mode].append(json.loads(run.stdout.strip().splitlines()[-1]))
        loads.append(os.getloadavg()[0])
    plain_events = _events(out / "plain.pt.trace.json")
    print(
        f"{len(plain_events)}-event window ({args.steps} steps, {args.extra_ops} extra ops a step, {args.device}), "
        f"{args.repeats} repeats, fresh processes interleaved; load {min(loads):.2f}-{max(loads):.2f}"
    )
    for mode in MODES:
        parts = {}
        for part in ("stop", "export"):
            cpu = [g[part][1] for g in got[mode]]
            parts[part] = statistics.median(cpu)
            print(f"  {mode:10s} {part:6s}: CPU median {parts[part]:7.2f} ms [{min(cpu):.2f}, {max(cpu):.2f}], "
                  f"wall median {statistics.median(g[part][0] for g in got[mode]):7.2f} ms")  # fmt: skip
        both = [g["stop"][1] + g["export"][1] for g in got[mode]]
        print(f"  {mode:10s} stop + export: CPU median {statistics.median(both):7.2f} ms")
    paired = [
        (p["stop"][1] + p["export"][1]) / (t["stop"][1] + t["export"][1])
        for p, t in zip(got["plain"], got["trace_only"], strict=True)
    ]
    print(f"  plain / trace_only, stop + export CPU, paired by repeat: {sorted(round(x, 3) for x in paired)}")

    only_events = _events(out / "trace_only.pt.trace.json")

    def shape(events: list[dict]) -> collections.Counter:
        return collections.Counter(
            (e.get("name"), e.get("cat"), e.get("ph"), tuple(sorted(e.get("args", {})))) for e in events
        )

    a, b = shape(plain_events), shape(only_events)
    print(f"last repeat's traces: {len(plain_events)} / {len(only_events)} events; (name, cat, ph, argument names) multisets "
          f"{'equal' if a == b else 'differ: ' + repr(list(((a - b) + (b - a)).items())[:8])}")  # fmt: skip
    try:
        import fitprof
    except ImportError:
        return
    reports = {m: fitprof.analyze(out / f"{m}.pt.trace.json") for m in MODES}
    for field in ("steps_analyzed", "step_time_ms", "input_percent", "self_ms_per_step"):
        print(f"  analyze {field}: " + ", ".join(f"{m} {getattr(reports[m], field)!r}" for m in MODES))
    names = {m: [op.name for op in reports[m].top_ops] for m in MODES}
    print(f"  analyze top ops: plain {names['plain'][:3]}, trace_only {names['trace_only'][:3]}")


if __name__ == "__main__":
    main()

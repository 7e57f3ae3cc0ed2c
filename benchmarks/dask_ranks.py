"""Many rank traces: ``fitprof analyze`` with ``--jobs 1``, ``--jobs 2`` and ``--scheduler`` on a Dask cluster.

    python benchmarks/dask_ranks.py [--ranks 256] [--mb 1] [--workers 2] [--big-mb 200]

* ``--ranks`` generated Kineto rank traces of about ``--mb`` MB of plain JSON each (the events of
  ``analysis_speed.generate_kineto_stream``: 1,000-op GPU steps; each rank a few ops more per step than the one
  before, and its ``distributedInfo``), written to a temporary folder and deleted at the end (never committed);
* each configuration runs the ``fitprof analyze ... --format json`` command in a fresh process, timed from the
  outside (wall seconds, including the interpreter's start and the imports); the outputs must be identical;
* peak memory per process: ``VmHWM`` (the kernel's own peak RSS of a process) of the command and of every
  process under it (``--jobs`` workers), or of each Dask worker (``distributed.LocalCluster(processes=True,
  n_workers=--workers, threads_per_worker=1)``, started here; its scheduler runs in this process), read every
  0.1 s while the command runs; the workers' figure before the run (idle, fitprof not yet imported) is shown too;
* CPU seconds (user + system): the command and its ``--jobs`` workers (``getrusage(RUSAGE_CHILDREN)`` after they
  ended), or the Dask workers (``/proc/<pid>/stat`` before and after the run; the command itself beside it);
  on a shared machine this is the figure that does not grow with other work's load;
* per-file cost on the cluster: the workers' own wall seconds inside the tasks (the scheduler's
  ``task_prefixes[...].all_durations["compute"]``), summed, over the megabytes read;
* ``--big-mb``: one generated trace of that size analysed alone in a fresh process (seconds, peak RSS / size):
  the reader's ratio at the size the 1,000-rank estimate needs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from analysis_speed import analyze_in_child, generate_kineto_stream

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def write_ranks(folder: Path, ranks: int, mb: float) -> list[Path]:
    """``ranks`` Kineto traces of about ``mb`` MB each, with ``distributedInfo`` (rank, world size)."""
    paths = []
    for rank in range(ranks):
        path = folder / f"host{rank // 8}_rank{rank}.pt.trace.json"
        generate_kineto_stream(path, mb, ops_per_step=1000 + rank)
        with open(path, "r+b") as fh:  # the document ends in "]}": add the rank before the last brace
            fh.seek(-1, os.SEEK_END)
            fh.write(f', "distributedInfo": {{"rank": {rank}, "world_size": {ranks}}}}}'.encode())
        paths.append(path)
    return paths


def vm_hwm_kb(pid: int) -> int | None:
    """The peak RSS of process ``pid`` so far (kB), None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    """Every process under ``pid`` (any depth), from ``/proc/<pid>/task/*/children``."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """CPU seconds of this process's finished (waited-for) children and their own waited-for children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_watched(argv: list[str], watch: Callable[[int], list[int]]) -> tuple[float, dict[int, int], str]:
    """Run ``argv``; wall seconds, the peak RSS (kB) of each process ``watch(pid)`` names, sampled every 0.1 s
    while it runs, and its stdout."""
    peaks: dict[int, int] = {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, text=True)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for pid in watch(proc.pid):
                kb = vm_hwm_kb(pid)
                if kb is not None:
                    peaks[pid] = max(peaks.get(pid, 0), kb)
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]}... exited {proc.returncode}: {err[-2000:]}")
    return wall, peaks, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--mb", type=float, default=1.0, help="plain JSON MB per rank trace (default: 1)")
    parser.add_argument("--workers", type=int, default=2, help="Dask worker processes (default: 2)")
    parser.add_argument("--big-mb", type=float, default=0.0, help="also analyse one trace of this size alone")
    args = parser.parse_args(argv)

    import distributed

    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}; "
        f"Python {sys.version.split()[0]}, dask/distributed {distributed.__version__}"
    )
    with tempfile.TemporaryDirectory(prefix="fitprof-ranks-") as d:
        folder = Path(d)
        t0 = time.perf_counter()
        files = write_ranks(folder, args.ranks, args.mb)
        total_mb = sum(p.stat().st_size for p in files) / 1e6
        print(f"generated {len(files)} rank traces, {total_mb:,.1f} MB in all, in {time.perf_counter() - t0:.1f} s")
        cmd = [sys.executable, "-m", "fitprof.cli", "analyze", *map(str, files), "--format", "json"]
        rows: list[dict[str, Any]] = []
        outputs = {}
        for jobs in (1, 2):
            cpu0 = children_cpu_seconds()
            wall, peaks, out = run_watched([*cmd, "--jobs", str(jobs)], lambda pid: [pid, *children(pid)])
            cpu = children_cpu_seconds() - cpu0  # the command and its --jobs workers
            outputs[f"--jobs {jobs}"] = out
            rows.append(
                {"how": f"`--jobs {jobs}`", "wall": wall, "cpu": cpu, "peaks": peaks, "idle": None, "compute": None}
            )
        with (
            distributed.LocalCluster(
                processes=True, n_workers=args.workers, threads_per_worker=1, dashboard_address=None
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            workers = list(client.run(os.getpid).values())
            idle = {pid: vm_hwm_kb(pid) or 0 for pid in workers}
            cpu0, workers_cpu0 = children_cpu_seconds(), sum(map(cpu_seconds, workers))
            wall, peaks, out = run_watched([*cmd, "--scheduler", cluster.scheduler_address], lambda pid: workers)
            client_cpu = children_cpu_seconds() - cpu0
            workers_cpu = sum(map(cpu_seconds, workers)) - workers_cpu0
            compute = sum(p.all_durations.get("compute", 0.0) for p in cluster.scheduler.task_prefixes.values())
            outputs["--scheduler"] = out
            rows.append(
                {
                    "how": f"`--scheduler` (LocalCluster, {args.workers} worker processes)",
                    "wall": wall,
                    "cpu": workers_cpu,
                    "client_cpu": client_cpu,
                    "peaks": peaks,
                    "idle": idle,
                    "compute": compute,
                }
            )
        same = len(set(outputs.values())) == 1
        records = json.loads(outputs["--jobs 1"])
        spread = next(r for r in records if r["record"] == "spread")
        print(
            f"outputs identical: {same}; {sum(r['record'] == 'trace' for r in records)} trace records, straggler "
            f"rank {spread['straggler_rank']}, step-time spread {spread['step_time_ms_spread']:.2f} ms"
        )
        print(
            "\n| run | wall s | MB/s | CPU s (s/MB) | peak RSS per process, MB (idle before) | workers' task s (s/MB) |"
        )
        print("|---|---:|---:|---:|---|---:|")
        for r in rows:
            peaks = sorted(r["peaks"].items())
            cells = ", ".join(
                f"{kb / 1024:,.0f}" + (f" ({r['idle'][pid] / 1024:,.0f})" if r["idle"] else "") for pid, kb in peaks
            )
            compute = f"{r['compute']:.1f} ({r['compute'] / total_mb:.3f} s/MB)" if r["compute"] is not None else "–"
            client = f"; the command itself {r['client_cpu']:.1f}" if "client_cpu" in r else ""
            print(
                f"| {r['how']} | {r['wall']:.1f} | {total_mb / r['wall']:.1f} | {r['cpu']:.1f} "
                f"({r['cpu'] / total_mb:.3f}{client}) | {cells} | {compute} |",
                flush=True,
            )
        if args.big_mb:
            big = folder / f"generated_{args.big_mb:g}mb.pt.trace.json"
            generate_kineto_stream(big, args.big_mb)
            size = big.stat().st_size
            cpu0 = children_cpu_seconds()
            r = analyze_in_child(big)
            cpu = children_cpu_seconds() - cpu0  # the whole child: its start and imports too
            print(
                f"\none {size / 1e6:,.0f} MB trace alone, fresh process: {r['s']:.1f} s ({r['s'] / (size / 1e6):.3f} "
                f"s/MB), CPU {cpu:.1f} s for the whole process ({cpu / (size / 1e6):.3f} s/MB), peak RSS "
                f"{r['peak_kb'] / 1024:,.0f} MB = {r['peak_kb'] * 1024 / size:.2f} x its size"
            )
    print(f"\nreproduce: python benchmarks/dask_ranks.py {' '.join(sys.argv[1:] if argv is None else argv)}")


if __name__ == "__main__":
    main()

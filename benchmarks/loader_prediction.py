"""How well the loader probe's worker count holds: predict the step time with N workers from a run with fewer, then
re-measure with N workers, side by side, for sleep-modelled and CPU-bound loading.

A plain torch loop (``tests/loader_loop.py``): the step sleeps ``--step-ms`` (a host waiting for its GPU); each
sample's ``__getitem__`` sleeps ``--item-ms`` (``sleep``: loading that waits, on storage or a network) or burns that
much CPU time (``cpu``: decoding, augmenting); batches of ``--batch-size``. For each repeat and mode, one run with
``--base`` workers gives the probe's prediction for every N in ``--workers``; then each N is run and its step time
re-measured by the loop's own clock (the mean period between step ends over the steady steps). Each prediction is
made by a base run right before its re-measurement (base, 2, base, 3, base, 4, then the next repeat), so that the
machine's load, which drifts within minutes on a shared machine, changes little between the two. Also printed: the busy
share against the truth the dataset and collate time themselves, and the exposed-time upper bound of the same run
(the step without its input wait, what `fitprof/step_time_if_no_input_ms` predicts).

    python benchmarks/loader_prediction.py --repeats 3

``--source pydataset-threads`` / ``pydataset-processes``: the same check for a Keras fit (``--keras-backend``, torch
unless given, in a child process per repeat: ``tests/pydataset_loop.py``) on a ``PyDataset(workers=N,
use_multiprocessing=...)``, the step a layer sleeping ``--keras-step-ms`` (TensorFlow and JAX: a sleep at each batch's
end, as their traced step cannot sleep), each batch's ``__getitem__`` sleeping ``--batch-ms`` (``cpu``: burning that much CPU
time in Python, ``--cpu-batch-ms``); re-measured by the epoch's ``samples_per_s`` (TensorFlow and JAX, where a
``PyDataset``'s batch size is unknown to Keras: the mean time between batch starts over the epoch's second half), one
epoch after a model built on
arrays (a model built from the dataset leaves Keras's enqueuer holding batches for epoch 0). Threads with ``--base 1``:
Keras loads in the main thread, timed as the input wait.

    python benchmarks/loader_prediction.py --source pydataset-processes --repeats 3 --modes sleep
    python benchmarks/loader_prediction.py --source pydataset-threads --keras-backend jax --base 2 --modes sleep

``--agreement``: does the advised count depend on the count a run started from? For each repeat and mode, runs
with each of ``--bases`` workers (1 and 3 by default) interleaved, each giving its advised count
(``loader_workers_needed``) and that count's predicted step time; then each advised count is run and its step
re-measured. An epoch the probe finds contended (its workers waited for a core while other processes held cores)
advises no count: it is counted as such, not re-measured. The issue's loader: 6 ms a sample, batches of 8.

    python benchmarks/loader_prediction.py --agreement --item-ms 6 --batch-size 8 --repeats 3 --modes sleep
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from loader_loop import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["sleep", "cpu"], choices=["sleep", "cpu"])
    parser.add_argument("--base", type=int, default=1, help="workers of the run that predicts")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--item-ms", type=float, default=20.0, help="sleep mode: ms a sample")
    parser.add_argument("--cpu-item-ms", type=float, default=10.0, help="cpu mode: CPU ms a sample")
    parser.add_argument("--step-ms", type=float, default=6.0)
    parser.add_argument("--ctx", default="fork", choices=["fork", "spawn", "forkserver"])
    parser.add_argument("--json", type=Path, help="write every run here")
    parser.add_argument("--agreement", action="store_true", help="the advised count from each of --bases workers")
    parser.add_argument("--bases", type=int, nargs="+", default=[1, 3], help="--agreement: the starting counts")
    parser.add_argument(
        "--source", default="dataloader", choices=["dataloader", "pydataset-threads", "pydataset-processes"]
    )
    parser.add_argument("--batch-ms", type=float, default=120.0, help="PyDataset, sleep mode: ms a batch")
    parser.add_argument("--cpu-batch-ms", type=float, default=40.0, help="PyDataset, cpu mode: CPU ms a batch")
    parser.add_argument("--keras-step-ms", type=float, default=20.0, help="PyDataset: the step's sleep")
    parser.add_argument("--keras-steps", type=int, default=40, help="PyDataset: steps of the epoch")
    parser.add_argument(
        "--keras-backend", default="torch", choices=["torch", "tensorflow", "jax"], help="PyDataset: Keras's backend"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    print(
        f"load average {os.getloadavg()[0]:.1f}, cores {len(os.sched_getaffinity(0))}, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    rows: list[dict[str, object]] = []
    if args.agreement:
        agreement(args)
        return
    if args.source != "dataloader":
        rows = pydataset_rows(args)
        table(rows, args)
        return
    for mode in args.modes:
        item = args.cpu_item_ms if mode == "cpu" else args.item_ms
        for r in range(args.repeats):
            kw = dict(
                steps=args.steps,
                batch_size=args.batch_size,
                item_ms=item,
                step_ms=args.step_ms,
                ctx=args.ctx,
                cpu=mode == "cpu",
            )
            for n in args.workers:
                (base,) = run(args.base, **kw)  # type: ignore[arg-type]
                e = base.probe
                assert e is not None, "no steady steps: raise --steps"
                (again,) = run(n, **kw)  # type: ignore[arg-type]
                predicted = e.predict(n) * 1e-6
                rows.append(
                    {
                        "mode": mode,
                        "repeat": r,
                        "base": args.base,
                        "n": n,
                        "base_step_ms": base.step_ms,
                        "batch_ms": e.batch_ns * 1e-6,
                        "batch_cpu_ms": e.batch_cpu_ns * 1e-6,
                        "batch_runq_ms": e.batch_runq_ns * 1e-6,
                        "free_cores": e.free_cores,
                        "own_w_ms": again.probe.batch_ns * 1e-6 if again.probe else float("nan"),
                        "own_model_ms": max(again.probe.step_ns, again.probe.batch_ns / n) * 1e-6
                        if again.probe
                        else float("nan"),
                        "rest_ms": e.step_ns * 1e-6,
                        "predicted_ms": predicted,
                        "exposed_bound_ms": e.step_ns * 1e-6,
                        "measured_ms": again.step_ms,
                        "error_percent": 100.0 * (predicted - again.step_ms) / again.step_ms,
                        "busy_percent": again.probe.busy_percent if again.probe else float("nan"),
                        "truth_busy_percent": again.truth_busy_percent,
                        "needed": e.needed,
                        "needed_predicted_ms": e.predicted_ns * 1e-6,
                        "advice": e.advice(),
                        "batches_equal": again.batches_equal,
                    }
                )
                x = rows[-1]
                print(
                    f"{mode:5s} r{r} N={n}: predicted {predicted:6.1f} ms, re-measured {again.step_ms:6.1f} ms "
                    f"({x['error_percent']:+5.1f}%), exposed-time bound {x['exposed_bound_ms']:5.1f} ms; "
                    f"busy {x['busy_percent']:5.1f}% vs truth {again.truth_busy_percent:5.1f}%  "
                    f"[base N={args.base}: {base.step_ms:.1f} ms, W {x['batch_ms']:.1f} ms (CPU {x['batch_cpu_ms']:.1f}, "
                    f"waiting for a core {x['batch_runq_ms']:.1f}), S {x['rest_ms']:.1f} ms, free cores {e.free_cores or 0:.2f}; "
                    f"this run's own W "
                    f"{x['own_w_ms']:.1f} ms, max(S, W/N) {x['own_model_ms']:.1f} ms]",
                    flush=True,
                )
                print(f"  advice (N={args.base}): {e.advice()}; needed {e.needed}", flush=True)
    table(rows, args)


def agreement(args: argparse.Namespace) -> None:
    """The advised count from each of ``--bases`` workers, and each advised count re-measured (``--agreement``)."""
    summary: list[tuple[str, dict[int, int | None], list[float]]] = []
    for mode in args.modes:
        item = args.cpu_item_ms if mode == "cpu" else args.item_ms
        kw = dict(
            steps=args.steps,
            batch_size=args.batch_size,
            item_ms=item,
            step_ms=args.step_ms,
            ctx=args.ctx,
            cpu=mode == "cpu",
        )
        for r in range(args.repeats):
            counts: dict[int, int | None] = {}
            errors: list[float] = []
            for base in args.bases if r % 2 == 0 else args.bases[::-1]:
                (b,) = run(base, **kw)  # type: ignore[arg-type]
                e = b.probe
                assert e is not None, "no steady steps: raise --steps"
                if e.contended:
                    counts[base] = None
                    print(f"{mode:5s} r{r} from {base}: contended, no count ({e.advice()})", flush=True)
                    continue
                counts[base] = e.needed
                (again,) = run(e.needed, **kw)  # type: ignore[arg-type]
                err = 100.0 * (e.predicted_ns * 1e-6 - again.step_ms) / again.step_ms
                errors.append(err)
                print(
                    f"{mode:5s} r{r} from {base} ({b.step_ms:.1f} ms a step, W {e.batch_ns * 1e-6:.1f} ms, waiting for a "
                    f"core {e.batch_runq_ns * 1e-6:.1f}): advised {e.needed}, predicted {e.predicted_ns * 1e-6:.1f} ms, "
                    f"re-measured {again.step_ms:.1f} ms ({err:+.1f}%)",
                    flush=True,
                )
            summary.append((mode, counts, errors))
    print("\n| mode | repeat | advised count from each base | within ±1 | prediction error of each | within 20% |")
    print("|---|---|---|---|---|---|")
    for r, (mode, counts, errors) in enumerate(summary):
        given = [c for c in counts.values() if c is not None]
        agree = "–" if len(given) < 2 else ("yes" if max(given) - min(given) <= 1 else "no")
        said = ", ".join(f"{b}: {'none (contended)' if c is None else c}" for b, c in sorted(counts.items()))
        errs = ", ".join(f"{v:+.1f}%" for v in errors)
        print(
            f"| {mode} | {r % args.repeats} | {said} | {agree} | {errs} | {sum(abs(v) <= 20 for v in errors)}/{len(errors)} |"
        )
    print(f"load average {os.getloadavg()[0]:.1f} ({Path('/proc/loadavg').read_text().strip()})")


def table(rows: list[dict[str, object]], args: argparse.Namespace) -> None:
    print()
    print(
        "| mode | N | predicted ms (median) | re-measured ms (median) | error range | within 20% | busy − truth (pp) |"
    )
    print("|---|---|---|---|---|---|---|")
    for mode in args.modes:
        for n in args.workers:
            sel = [x for x in rows if x["mode"] == mode and x["n"] == n]
            errs = [float(x["error_percent"]) for x in sel]  # type: ignore[arg-type]
            gaps = [float(x["busy_percent"]) - float(x["truth_busy_percent"]) for x in sel]  # type: ignore[arg-type]
            print(
                f"| {mode} | {n} | {statistics.median(float(x['predicted_ms']) for x in sel):.1f} | "  # type: ignore[arg-type]
                f"{statistics.median(float(x['measured_ms']) for x in sel):.1f} | "  # type: ignore[arg-type]
                f"{min(errs):+.1f} … {max(errs):+.1f}% | {sum(abs(v) <= 20 for v in errs)}/{len(errs)} | "
                f"{min(gaps):+.1f} … {max(gaps):+.1f} |"
            )
    print(f"load average {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def pydataset_rows(args: argparse.Namespace) -> list[dict[str, object]]:
    """Each repeat and mode: one child running the fits base, 2, base, 3, base, 4 (``--workers``) in that order."""
    processes = args.source == "pydataset-processes"
    loop = Path(__file__).resolve().parents[1] / "tests" / "pydataset_loop.py"
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, KERAS_BACKEND=args.keras_backend, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    rows: list[dict[str, object]] = []
    for mode in args.modes:
        batch = args.cpu_batch_ms if mode == "cpu" else args.batch_ms
        for r in range(args.repeats):
            order = [k for n in args.workers for k in (args.base, n)]
            cmd = [sys.executable, str(loop), "--workers", *map(str, order), "--logdir", "/tmp/fitprof-bench-pyds"]
            cmd += ["--steps", str(args.keras_steps), "--batch-ms", str(batch), "--step-ms", str(args.keras_step_ms)]
            cmd += ["--processes"] * processes + ["--cpu"] * (mode == "cpu")
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-3000:])
            fits: list[dict[str, Any]] = json.loads(
                next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))[len("RESULT") :]
            )
            for base, again in zip(fits[0::2], fits[1::2], strict=True):
                n = again["workers"]
                predicted = base["predict"][str(n)]
                h, ha = base["history"], again["history"]
                rows.append(
                    {
                        "mode": mode,
                        "repeat": r,
                        "base": args.base,
                        "n": n,
                        "source": args.source,
                        "backend": args.keras_backend,
                        "base_step_ms": base["step_ms"],
                        "batch_ms": h["fitprof/epoch/loader_batch_ms"],
                        "batch_cpu_ms": base["batch_cpu_ms"],
                        "worker_cpu_cores": base["worker_cpu_cores"],
                        "rest_ms": base["rest_ms"],
                        "predicted_ms": predicted,
                        "published_ms": h["fitprof/epoch/step_time_if_enough_workers_ms"],
                        "measured_ms": again["step_ms"],
                        "error_percent": 100.0 * (predicted - again["step_ms"]) / again["step_ms"],
                        "busy_percent": ha["fitprof/epoch/loader_busy_percent"],
                        "truth_busy_percent": again["truth_busy"],
                        "again_rest_ms": again["rest_ms"],
                        "again_worker_cpu_cores": again["worker_cpu_cores"],
                        "needed": base["needed"],
                        "advice": base["advice"],
                        "again_advice": again["advice"],
                        "load": again["load"],
                    }
                )
                x = rows[-1]
                print(
                    f"{args.source} ({args.keras_backend}) {mode:5s} r{r} N={n}: predicted {predicted:6.1f} ms, re-measured "
                    f"{again['step_ms']:6.1f} ms ({x['error_percent']:+5.1f}%); busy {x['busy_percent']:5.1f}% vs "
                    f"truth {again['truth_busy']:5.1f}%  [base N={args.base}: {base['step_ms']:.1f} ms, W "
                    f"{x['batch_ms']:.1f} ms (CPU {base['batch_cpu_ms']:.1f}), S {base['rest_ms']:.1f} ms; N={n}: S "
                    f"{again['rest_ms']:.1f} ms, worker CPU {again['worker_cpu_cores'] or 0:.2f} cores; load "
                    f"{again['load']:.1f}]",
                    flush=True,
                )
                print(f"  advice (N={args.base}): {base['advice']}", flush=True)
                print(f"  advice (N={n}): {again['advice']}", flush=True)
    return rows


if __name__ == "__main__":
    main()

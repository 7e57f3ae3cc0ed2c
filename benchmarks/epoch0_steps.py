"""Epoch 0 against later epochs, step by step (issue 19): Keras ``sleep_input`` of the zoo, every epoch profiled.

    python benchmarks/epoch0_steps.py [--runs N] [--epochs N]

For each run and epoch it prints the zoo's error (fitprof's input share less the truth, the share of the window
covered by batch production spans), fitprof's own time per step, the warm-up step's length (from the start of the
capture to the first step marker) against the analysed steps' mean, and per analysed step: the marker's length
against the zoo's clock, and fitprof's input wait (input spans clipped to the marker) against the production
span inside the clock's step (ms). A first-window effect shows as epoch 0's steps differing from the others'.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo

import fitprof


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as d:
            prof, clock, spans, _ = zoo.keras_run(
                "sleep_input", Path(d), model_kind="small", batch=64, sleep_s=0.020, epochs=args.epochs
            )
            for e in range(args.epochs):
                report = prof.reports[e]
                truth = zoo.clipped_share(spans, *clock.window(e))
                table = fitprof.read_trace(prof.trace_paths[e])
                steps = table[table["kind"] == "step"].sort_values("step_num")
                inputs = table[table["kind"] == "input"]
                warm_up_ms = (steps["ts_us"].min() - table["ts_us"].min()) / 1e3
                cells = []
                for k, (_, s) in enumerate(steps.iterrows()):
                    lo, hi = s["ts_us"], s["ts_us"] + s["dur_us"]
                    ends = inputs["ts_us"] + inputs["dur_us"]
                    wait_ms = ((ends.clip(upper=hi) - inputs["ts_us"].clip(lower=lo)).clip(lower=0)).sum() / 1e3
                    j = e * zoo.STEPS + zoo.FIRST - 1 + k
                    c_lo, c_hi = clock.post[j], clock.pre[j + 1]
                    made_ms = zoo.clipped_share(spans, c_lo, c_hi) / 100 * (c_hi - c_lo) * 1e3
                    cells.append(
                        f"{int(s['step_num'])}: {s['dur_us'] / 1e3:.1f}/{(c_hi - c_lo) * 1e3:.1f} "
                        f"wait {wait_ms:.1f}/{made_ms:.1f}"
                    )
                print(
                    f"run {run} epoch {e}: truth {truth:.1f}% fitprof {report.input_percent:.1f}% "
                    f"error {report.input_percent - truth:+.1f} pp, self {report.self_ms_per_step:.3f} ms/step, "
                    f"warm-up step {warm_up_ms:.1f} ms vs {report.step_time_ms:.1f} ms | " + "; ".join(cells),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

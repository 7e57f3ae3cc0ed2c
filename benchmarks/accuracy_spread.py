"""Measure the spread of fitprof's input-share error on the real-run cases of ``tests/test_accuracy.py``.

    python benchmarks/accuracy_spread.py [--repeats 30] [--out spread.jsonl]

Runs each case of ``zoo.py`` that the tests use (Lightning ``sleep_input``, ``compute_bound``,
``workers_hidden``; Keras ``sleep_input`` at 80 ms a batch and ``compute_bound``) ``--repeats`` times,
interleaved, and prints per case the error (fitprof - truth, percentage points) range, mean and standard
deviation, the range widened by three standard deviations (what ``tests/test_accuracy.py`` allows), and the
largest step-time gap against the clock callbacks. Run it on the machine the tests run on, under its usual load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

CASES = [
    ("lightning", "sleep_input", {}),
    ("lightning", "compute_bound", {}),
    ("keras", "sleep_input", {"sleep": 0.080}),
    ("keras", "compute_bound", {}),
    ("lightning", "workers_hidden", {}),
]


def main(argv: list[str] | None = None) -> None:
    import zoo

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default="accuracy_spread.jsonl")
    args = parser.parse_args(argv)
    rows: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    with open(args.out, "a") as out:
        for _ in range(args.repeats):
            for framework, scenario, kwargs in CASES:
                run = zoo.keras_scenario if framework == "keras" else zoo.lightning_scenario
                t0 = time.perf_counter()
                with tempfile.TemporaryDirectory() as tmp:
                    result = run(scenario, Path(tmp), side_tools=False, **kwargs)  # type: ignore[operator]
                row = {
                    "framework": framework,
                    "scenario": scenario,
                    "truth": result.truth_pct,
                    "fitprof": result.fitprof_pct,
                    "error_pp": result.error_pp,
                    "step_gap": result.step_ms / result.truth_step_ms - 1,
                    "verdict": result.verdict,
                    "load1": os.getloadavg()[0],
                    "seconds": time.perf_counter() - t0,
                }
                print(json.dumps(row), file=out, flush=True)
                rows[framework, scenario].append(row)
    gaps = [abs(r["step_gap"]) for rs in rows.values() for r in rs]
    for (framework, scenario), rs in rows.items():
        errors = [r["error_pp"] for r in rs]
        sd = statistics.stdev(errors) if len(errors) > 1 else float("nan")
        print(
            f"{framework}/{scenario}: {len(errors)} runs, error {min(errors):+.2f}..{max(errors):+.2f} pp, "
            f"mean {statistics.mean(errors):+.2f}, sd {sd:.2f} -> allow {min(errors) - 3 * sd:+.1f}.."
            f"{max(errors) + 3 * sd:+.1f}; verdicts {sorted({r['verdict'] for r in rs})}"
        )
    if len(gaps) > 1:
        print(f"step time vs clocks: at most {max(gaps):.2%} apart, sd {statistics.stdev(gaps):.2%}")


if __name__ == "__main__":
    main()

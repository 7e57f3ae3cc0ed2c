"""Mutation check: does a fast in-process test fail when a verdict threshold, an exposed-time figure or a logged key
is broken? Not collected by pytest (no ``test_`` prefix); run it by hand after changing the analysis or the logs:

    python tests/mutations.py                 # every mutation, the kill table at the end
    python tests/mutations.py --only htod     # the mutations whose name holds "htod"
    python tests/mutations.py --list          # where each pattern matches in this checkout, nothing run

Each mutation is a regular expression and its replacement, looked for in every ``src/fitprof/**/*.py`` (so a
threshold or a function that moves to another module is still found, by its name). It must match exactly once;
otherwise the row says ``pattern matched N times`` and the pattern needs updating. The mutated copy of ``src`` lives
in a temporary folder; ``pytest -m "not slow"`` runs against it (``PYTHONPATH`` names the copy first): first the
test files most likely to catch the mutation (every failing test listed), and only when none fails there the whole
fast suite, up to its first failure. A mutation is *killed* when a test fails.

The exit status is 0 when every mutation is killed, 1 when one survives, 2 when a pattern did not match once or
the unmutated copy fails its tests.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST = ["-m", "not slow", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
CORE_TESTS = ["tests/test_verdict_boundaries.py", "tests/test_core.py", "tests/test_speedup.py"]
KERAS_TESTS = ["tests/test_keras_logged_keys.py"]


@dataclass(frozen=True)
class Mutation:
    name: str
    pattern: str
    replacement: str
    first: tuple[str, ...] = tuple(CORE_TESTS)
    """Test files to run before the rest of ``tests/`` (where a kill is expected; it saves time, nothing more)."""


def _threshold(const: str, old: str, new: str) -> tuple[str, str]:
    """Pattern and replacement that change the value assigned to a module constant (``NAME = 15.0``)."""
    return rf"(\b{const}\s*(?::\s*[\w\[\], ]+)?=\s*){re.escape(old)}\b(?:\.0\b)?", rf"\g<1>{new}"


def _strict(const: str) -> tuple[str, str]:
    """``x >= CONST`` made ``x > CONST`` (a row at exactly the threshold changes side)."""
    return rf"(\w+\s*)>=(\s*{const}\b)(?!`)", r"\g<1>>\g<2>"


def _loose(const: str) -> tuple[str, str]:
    """``x < CONST`` made ``x <= CONST``."""
    return rf"(\w+\s*)<(\s*{const}\b)(?!`)", r"\g<1><=\g<2>"


_FN = r"(?:\w+\.)?_?"
"""An interval helper's optional module prefix and underscore: ``_length(`` or ``intervals.length(``."""

MUTATIONS = [
    Mutation("input threshold 20 -> 25", *_threshold("INPUT_BOUND_PERCENT", "20", "25.0")),
    Mutation("input >= -> >", *_strict("INPUT_BOUND_PERCENT")),
    Mutation("htod threshold 15 -> 20", *_threshold("HTOD_BOUND_PERCENT", "15", "20.0")),
    Mutation("htod >= -> >", *_strict("HTOD_BOUND_PERCENT")),
    Mutation("collectives threshold 20 -> 25", *_threshold("COMMUNICATION_BOUND_PERCENT", "20", "25.0")),
    Mutation("collectives >= -> >", *_strict("COMMUNICATION_BOUND_PERCENT")),
    Mutation("compute covers 50 -> 55", *_threshold("COMPUTE_COVERS_PERCENT", "50", "55.0")),
    Mutation("compute covers < -> <=", *_loose("COMPUTE_COVERS_PERCENT")),
    Mutation("10% floor 10 -> 12", *_threshold("COMPUTE_BOUND_MAX_PERCENT", "10", "12.0")),
    Mutation("10% floor (input) < -> <=", r"(input_percent\s*)<(\s*COMPUTE_BOUND_MAX_PERCENT\b)(?!`)", r"\g<1><=\g<2>"),
    Mutation("10% floor (htod) < -> <=", r"(htod_percent\s*)<(\s*COMPUTE_BOUND_MAX_PERCENT\b)(?!`)", r"\g<1><=\g<2>"),
    # Exposed time: each figure's "less the time something else ran" dropped, so the whole span counts. The
    # interval helpers are matched with or without a module prefix (``_length`` or ``intervals.length``).
    Mutation(
        "htod exposed never reduced by overlap",
        rf"(htod_us\s*=\s*{_FN}length\(copies\))\s*-\s*{_FN}overlap\(copies,[^\n]*\)\)",
        r"\g<1>",
    ),
    Mutation(
        "device collective exposed never reduced by overlap",
        rf"(coll_us\s*=\s*{_FN}length\(c\))\s*-\s*{_FN}overlap\(c,[^\n]*\)\)",
        r"\g<1>",
    ),
    Mutation(
        "host collective/input exposed never reduced by overlap",
        rf"return ({_FN}length\(spans\)) - {_FN}overlap\(spans, cover\)",
        r"return \g<1>",
    ),
    Mutation(
        "overlapping input spans summed instead of merged",
        rf"(input_union\s*=\s*|clipped_us\(){_FN}union\(([\w.]*ts\[inp\]),\s*([\w.]*end\[inp\])\)",
        r"\g<1>(np.sort(\g<2>), \g<3>[np.argsort(\g<2>, kind='stable')])",
    ),
    # The keys Keras logs: the same every epoch (History, CSVLogger).
    Mutation(
        "logged keys lose the last top_op_<k>_ms",
        r"(top_op_rank_key\(i\) for i in range\(1, )top_k \+ 1\)",
        r"\g<1>top_k)",
        first=tuple(KERAS_TESTS),
    ),
    Mutation(
        "fitprof/epoch/* keys left out of Keras logs",
        r"\n(\s*)logs\.update\((?:timing|\w+\.epoch)\)",
        r"\n\g<1>pass",
        first=tuple(KERAS_TESTS),
    ),
    Mutation(
        "first step's fetch counted as input",
        r"if not self\._first_step and ns > 0:",
        "if ns > 0:",
        ("tests/test_epoch_parts.py",),
    ),
    Mutation(
        "epoch closes at fitprof's own epoch-end hook (a later save goes to the next epoch)",
        r"\n(\s*)self\.results\[result\.epoch\] = self\._last = result\n",
        r"\n\g<1>self.results[result.epoch] = self._last = result\n\g<1>self.close(now)\n",
        ("tests/test_epoch_saves.py", "tests/test_epoch_parts.py"),
    ),
    Mutation(
        "Keras closes each epoch at fitprof's own on_epoch_end",
        r"self\._closes_later = later\b",
        "self._closes_later = False",
        ("tests/test_epoch_saves_keras.py",),
    ),
    Mutation(
        "an epoch's final parts never reach its result",
        r"result\.epoch\.update\(final\.scalars\(\)\)",
        "pass",
        ("tests/test_epoch_saves.py",),
    ),
    Mutation(
        "trigger's 25% floor removed",
        r"max\(self\.mad_k \* _MAD_TO_SIGMA \* mad, self\.rel \* median\)",
        "self.mad_k * _MAD_TO_SIGMA * mad",
        ("tests/test_steps.py",),
    ),
]


def _sources(src: Path) -> list[Path]:
    return sorted((src / "fitprof").rglob("*.py"))


def _matches(src: Path, m: Mutation) -> list[tuple[Path, int]]:
    found = []
    for path in _sources(src):
        text = path.read_text()
        found += [(path, text.count("\n", 0, hit.start()) + 1) for hit in re.finditer(m.pattern, text)]
    return found


def _apply(src: Path, m: Mutation) -> None:
    ((path, _),) = _matches(src, m)
    path.write_text(re.sub(m.pattern, m.replacement, path.read_text(), count=1))


def _existing(files: list[str] | tuple[str, ...]) -> list[str]:
    return [f for f in files if (ROOT / f).is_file()]


def _pytest(src: Path, files: list[str], extra: list[str]) -> tuple[int, str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH")) if p))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *FAST, *extra, *files],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start


def _failed(output: str) -> str:
    """``N failed: <test functions, parameters left out>`` from pytest's short summary."""
    ids = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    if not ids:
        return "(no FAILED line; see the output with -v)"
    tests = dict.fromkeys(i.removeprefix("tests/").split("[")[0] for i in ids)
    return f"{len(ids)} failed: " + ", ".join(tests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="run only the mutations whose name holds this text")
    parser.add_argument("--list", action="store_true", help="show where each pattern matches, run nothing")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the unmutated copy")
    parser.add_argument("--tests", nargs="*", help="test files to run instead of all of tests/")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the pytest output of each run")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.only in m.name]
    src = ROOT / "src"
    bad = 0
    for m in chosen:
        where = _matches(src, m)
        if len(where) != 1 or args.list:
            places = ", ".join(f"{p.relative_to(ROOT)}:{line}" for p, line in where) or "nowhere"
            print(f"{m.name}: pattern matched {len(where)} times ({places})")
            bad += len(where) != 1
    if args.list or bad:
        return 2 if bad else 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="fitprof-mutants-") as tmp:
        scratch = Path(tmp) / "src"

        def fresh() -> None:
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.copytree(src, scratch, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))

        if not args.no_baseline:
            fresh()
            rc, out, secs = _pytest(scratch, args.tests or _existing([*CORE_TESTS, *KERAS_TESTS]), ["-x"])
            if rc != 0:
                print(out[-4000:])
                print(f"the unmutated copy fails its tests (exit {rc}): fix that first")
                return 2
            print(f"baseline: unmutated copy passes ({secs:.0f} s)", flush=True)
        for m in chosen:
            fresh()
            _apply(scratch, m)
            # Stage 1: the files where a kill is expected, every failure listed (they import no framework, or
            # only Keras: seconds). Stage 2, for a survivor of stage 1: the whole fast suite, up to its first failure.
            stages = [(args.tests, [])] if args.tests else [(_existing(m.first), []), (["tests"], ["-x"])]
            secs = 0.0
            for files, extra in stages:
                rc, out, took = _pytest(scratch, files, extra)
                secs += took
                if args.verbose:
                    print(out)
                if rc != 0:
                    break
            killed = rc == 1
            what = _failed(out) if killed else f"pytest exit {rc}" if rc not in (0, 5) else "-"
            rows.append((m.name, "killed" if killed else "SURVIVED", what, secs))
            print(f"{rows[-1][1]:8} {m.name} ({secs:.0f} s): {what}", flush=True)
    print("\n| mutation | result | failing tests | seconds |\n|---|---|---|---|")
    for name, result, what, secs in rows:
        print(f"| {name} | {result} | {what} | {secs:.0f} |")
    survived = [r for r in rows if r[1] != "killed"]
    print(f"\n{len(rows) - len(survived)} of {len(rows)} mutations killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())

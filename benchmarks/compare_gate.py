"""``fitprof compare`` as a CI gate, measured: false alarms of the same code (quiet, and under a planted load of busy
processes), detection of slower code, the input wait, a faster candidate and a new dominant operator.

    python benchmarks/compare_gate.py [--runs 8] [--slower 6] [--load 2] [--steps 24] [--epochs 3]
                                      [--per-side 1 3] [--pairs 56] [--plant 10] [--out DIR] [--json FILE]

Every run is a Lightning fit of a tiny MLP (``torch.set_num_threads(1)``, one process for all fits: the imports
once) with ``FitProfiler(profile_batch=(6, 15))``: ``--epochs`` epochs of ``--steps`` steps, one 10-step window
each, the always-on timing of every step in the per-epoch file. Each step calls ``fitprof_gate::work``, which sleeps
the step's modelled time (``time.sleep``: the step's length is set, not the machine's speed), then the MLP's
forward and backward. After each fit the script waits for its ``.xplane.pb`` (:func:`fitprof.wait_for_profiles`),
so no conversion runs into the next fit's steps (in CI each run is a process of its own). One fit is discarded
first (a process's first fits are slower), the first two same-code runs size the planted changes, and the rest of
the groups take turns, one run of each in each round, so a drift of the machine over the minutes falls on every
group alike. The cases:

* same code, quiet: ``--runs`` runs of a 10 ms sleep a step; a false alarm is exit 1 (or 2);
* +10% step, quiet: runs whose step spins (a busy loop of a set length; a longer sleep overshoots by more) for
  ``--plant`` % of the same-code runs' *measured* step (the median of their every clean step, which holds fitprof's,
  Lightning's and the MLP's own time beside the 10 ms sleep); caught is exit 1; the change measured is printed;
* +20 ms in ``collate_fn`` on a ~50 ms step, quiet: caught is exit 1 with the headline naming the input wait;
* 40% faster: the sleep shortened by 40% of the measured step; must never exit 1;
* a new dominant operator: a 384x384 QR decomposition (``torch.linalg.qr``) added to each step; exit 1 naming
  ``linalg_qr``;
* under load: ``--load`` busy processes (a Python spin loop each) run while ``--runs`` same-code runs and runs whose
  step spins 25% of the loaded same-code step longer are trained and compared; same code must not exit 1; +25%
  must exit 1 or 3 (inconclusive), never 0.

Each set of cases is compared once per ``--per-side`` value n: with n 1, every ordered pair of distinct runs (same
code) or every (same, changed) pair; with n > 1, each side a folder of n runs (as a CI job keeps a baseline of
several runs), ordered pairs of disjoint n-run sets of the same code or an n-run set of each group, at most
``--pairs`` drawn by a seeded generator. Exit 3 (inconclusive: a side CPU-contended) is counted apart.
``/proc/loadavg`` is recorded before and after the training of each load. At the end, per n, one line per "Done
when" line of the gate's issue says whether it is met, with its counts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

WINDOW = (6, 15)
BASE_MS = 10.0


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _spin() -> None:
    while True:
        pass


_WORK: Any = None


def _work_op() -> Any:
    global _WORK
    if _WORK is None:
        import torch

        @torch.library.custom_op(
            "fitprof_gate::work", mutates_args=(), schema="(Tensor x, float ms, float spin_ms) -> Tensor"
        )
        def work(x: torch.Tensor, ms: float, spin_ms: float) -> torch.Tensor:
            if ms > 0:
                time.sleep(ms / 1000)
            if spin_ms > 0:  # a planted change of a set length: a sleep's overshoot grows with its length
                end = time.perf_counter() + spin_ms / 1000
                while time.perf_counter() < end:
                    pass
            return x.clone()

        work.register_fake(lambda x, ms, spin_ms: torch.empty_like(x))
        work.register_autograd(lambda ctx, grad: (grad, None, None))
        _WORK = work
    return _WORK


def fit(
    run_dir: Path,
    *,
    step_ms: float,
    spin_ms: float = 0.0,
    collate_ms: float = 0.0,
    qr: bool = False,
    steps: int,
    epochs: int,
) -> None:
    """One training run into ``run_dir``."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data import default_collate as collate

    from fitprof.lightning import FitProfiler

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    work = _work_op()

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            if qr:
                torch.linalg.qr(torch.randn(384, 384))
            return torch.nn.functional.cross_entropy(self.net(work(x, step_ms, spin_ms)), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def slow_collate(batch: Any) -> Any:
        time.sleep(collate_ms / 1000)
        return collate(batch)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(steps * 32, 64, generator=g), torch.randint(0, 10, (steps * 32,), generator=g))
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[FitProfiler(log_dir=run_dir, profile_batch=WINDOW, verbose=False)],
    )
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(Model(), DataLoader(data, batch_size=32, collate_fn=slow_collate if collate_ms else collate))


def compare(a: Path, b: Path) -> tuple[int, str, bool, str]:
    """``fitprof compare a b``'s exit status (0, 1, 2 or 3) and headline, and what the figures alone said (whether
    anything regressed, and the headline without the contention), through the API the command runs."""
    from fitprof.compare import NotComparableError, load_side
    from fitprof.compare import compare as run_compare

    try:
        result = run_compare(load_side(a), load_side(b))
    except NotComparableError as err:
        return 2, str(err), False, str(err)
    rc = 3 if result.inconclusive else (1 if result.regressed else 0)
    bare = dataclasses.replace(result, contention=[])
    return rc, result.headline(), result.regressed, bare.headline()


def measured_step_ms(runs: list[Path]) -> float:
    """The median over ``runs`` of each run's median clean step time (ms), read back from its per-epoch file: the
    step as the gate sees it (the sleep, the MLP, Lightning's loop and fitprof's hooks)."""
    import statistics

    from fitprof.compare import load_side

    medians = [statistics.median(v for steps in load_side(r).steps for v in steps) for r in runs]
    return float(statistics.median(medians))


def train_one(run: Path, **kwargs: Any) -> Path:
    """One run into ``run`` (reused when already there: ``--out`` kept from an earlier call), then a wait for its
    ``.xplane.pb`` files, so that no conversion of this fit runs into the next one's steps (in CI each run is a
    process of its own)."""
    import fitprof

    if not list(run.glob("plugins/fitprof/epochs.rank*.jsonl")):
        fit(run, **kwargs)
        fitprof.wait_for_profiles(run)
    return run


def train(root: Path, name: str, n: int, **kwargs: Any) -> list[Path]:
    """``n`` runs ``<root>/<name><i>``, one after the other."""
    return [train_one(root / f"{name}{i}", **kwargs) for i in range(n)]


def train_interleaved(
    root: Path, groups: dict[str, tuple[int, dict[str, Any]]], first: dict[str, int] | None = None
) -> dict[str, list[Path]]:
    """The runs of several groups (name: (runs, :func:`fit`'s arguments)) taking turns, one run of each group in
    each round, so that a drift of the machine or of the process over the minutes of the benchmark falls on every
    group alike instead of on whichever group was trained first. A group's runs are numbered from its ``first``
    (default 0)."""
    runs: dict[str, list[Path]] = {name: [] for name in groups}
    for i in range(max(n for n, _ in groups.values())):
        for name, (n, kwargs) in groups.items():
            if i < n:
                runs[name].append(train_one(root / f"{name}{(first or {}).get(name, 0) + i}", **kwargs))
    return runs


def pairs(
    base: list[Path], cand: list[Path] | None, per_side: int = 1, most: int = 56, folders: Path | None = None
) -> list[tuple[Path, Path]]:
    """The compared pairs. One run a side (``per_side`` 1): every ordered pair of distinct runs of one group
    (``cand`` None) or every (base, cand) run pair. ``per_side`` n > 1: each side a folder of n runs (a baseline
    folder of several runs, as ``fitprof compare`` pools them), made in ``folders`` of hard links to the runs'
    files; same code: ordered pairs of disjoint n-run sets of ``base``; otherwise an n-run set of ``base`` against
    one of ``cand``; at most ``most`` pairs, drawn by a seeded generator when there are more."""
    import random
    import shutil

    if per_side == 1:
        todo = list(itertools.permutations(base, 2)) if cand is None else [(b, c) for b in base for c in cand]
        return todo
    assert folders is not None
    sets_b = list(itertools.combinations(base, per_side))
    if cand is None:
        combos = [(a, b) for a in sets_b for b in sets_b if not set(a) & set(b)]
    else:
        combos = [(a, b) for a in sets_b for b in itertools.combinations(cand, per_side)]
    if len(combos) > most:
        combos = random.Random(20261204).sample(combos, most)

    def folder(runs: tuple[Path, ...]) -> Path:
        out = folders / "+".join(r.name for r in runs)
        if not out.exists():
            for r in runs:
                shutil.copytree(r, out / r.name, copy_function=os.link)
        return out

    return [(folder(a), folder(b)) for a, b in combos]


def case(
    name: str,
    load: str,
    todo: list[tuple[Path, Path]],
    good: Callable[[int, str], bool],
    what: str,
    load_span: tuple[str, str],
    figures_good: Callable[[bool, str], bool],
) -> dict[str, Any]:
    """Compare every pair; count the exit statuses, the pairs that meet ``good`` (exit status, headline), and the
    pairs whose figures alone (contention aside) meet ``figures_good`` (regressed, bare headline)."""
    counts = {0: 0, 1: 0, 2: 0, 3: 0}
    goods, figure_goods = 0, 0
    bad_headlines: list[str] = []
    for a, b in todo:
        rc, headline, regressed, bare = compare(a, b)
        counts[rc] = counts.get(rc, 0) + 1
        goods += good(rc, headline)
        figure_goods += figures_good(regressed, bare)
        if not good(rc, headline) and len(bad_headlines) < 2:
            bad_headlines.append(f"exit {rc}: {headline}")
    result = {
        "case": name,
        "load": load,
        "pairs": len(todo),
        "exit0": counts[0],
        "exit1": counts[1],
        "exit2": counts[2],
        "inconclusive": counts[3],
        "good": goods,
        "what_is_good": what,
        "figures_alone_good": figure_goods,
        "loadavg_before": load_span[0],
        "loadavg_after": load_span[1],
        "examples_of_bad": bad_headlines,
    }
    print(json.dumps(result), flush=True)
    return result


def not_failed(rc: int, headline: str) -> bool:
    return rc not in (1, 2)


def caught(rc: int, headline: str) -> bool:
    return rc == 1


def caught_or_3(rc: int, headline: str) -> bool:
    return rc in (1, 3)


def qr_named(rc: int | bool, headline: str) -> bool:
    """Exit 1 (or, for the figures alone, regressed) with the headline naming ``linalg_qr`` first."""
    return rc == 1 and "linalg_qr" in headline.split(";")[0]  # True == 1: a regressed flag counts


def input_named(rc: int | bool, headline: str) -> bool:
    """Exit 1 (or regressed) with the headline naming the input wait first."""
    return rc == 1 and headline.split(";")[0].startswith("regression: input wait")


def not_regressed(flag: bool, headline: str) -> bool:
    return not flag


def regressed(flag: bool, headline: str) -> bool:
    return flag


def done_when(results: list[dict[str, Any]]) -> list[str]:
    """One line per "Done when" line of the gate's issue: ``MET`` or ``NOT MET``, its counts and the load. A quiet
    line measured on a loaded machine says so: its pairs come out inconclusive (exit 3), which no quiet target
    counts as met."""
    by = {(r["case"], r["load"] == "none"): r for r in results}

    def line(ok: bool, what: str, r: dict[str, Any], counts: str) -> str:
        load = f"load {r['loadavg_before']} -> {r['loadavg_after']}"
        effect = r.get("measured_change_percent")
        measured = f", measured change {effect:+.1f}%" if effect is not None else ""
        return f"# done-when {'MET' if ok else 'NOT MET'}: {what}: {counts}{measured} ({load})"

    out = []
    r = by[("same code", True)]
    alarms = r["exit1"] + r["exit2"]
    out.append(
        line(
            r["pairs"] >= 40 and alarms <= 1,
            "same code, quiet, >= 40 pairs, at most 1 false alarm",
            r,
            f"{alarms} false alarm(s) in {r['pairs']} pairs, {r['inconclusive']} inconclusive",
        )
    )
    r = by[("same code", False)]
    alarms = r["exit1"] + r["exit2"]
    out.append(
        line(
            r["pairs"] >= 40 and alarms <= 0.05 * r["pairs"],
            "same code, planted load, >= 40 pairs, at most 5% false alarms (inconclusive apart)",
            r,
            f"{alarms} false alarm(s) in {r['pairs']} pairs, {r['inconclusive']} inconclusive",
        )
    )
    r = by[("+10% step", True)]
    out.append(
        line(
            r["exit1"] >= 0.95 * r["pairs"],
            "+10% step caught in >= 95% of pairs, quiet",
            r,
            f"{r['exit1']} of {r['pairs']} caught, {r['inconclusive']} inconclusive, {r['exit0']} ok",
        )
    )
    r = by[("+25% step", False)]
    out.append(
        line(
            r["exit0"] == 0,
            "+25% under the planted load caught or inconclusive, never ok",
            r,
            f"{r['exit1']} caught, {r['inconclusive']} inconclusive, {r['exit0']} ok of {r['pairs']}",
        )
    )
    r = by[("+20 ms collate_fn", True)]
    out.append(
        line(
            r["good"] == r["pairs"],
            "+20 ms collate_fn caught, quiet, headline names the input wait",
            r,
            f"{r['good']} of {r['pairs']} (exit 1: {r['exit1']}, inconclusive: {r['inconclusive']})",
        )
    )
    r = by[("40% faster", True)]
    out.append(line(r["exit1"] == 0, "40% faster never exits 1", r, f"{r['exit1']} exit 1 of {r['pairs']}"))
    r = by[("QR added", True)]
    out.append(
        line(
            r["good"] == r["pairs"],
            "QR exits 1 naming linalg_qr",
            r,
            f"{r['good']} of {r['pairs']} (inconclusive: {r['inconclusive']})",
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8, help="same-code runs a group (default 8: 56 ordered pairs)")
    parser.add_argument("--slower", type=int, default=6, help="runs of each changed code (default 6)")
    parser.add_argument("--load", type=int, default=2, help="busy processes of the planted load (default 2)")
    parser.add_argument("--steps", type=int, default=24, help="steps an epoch (default 24)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs a run (default 3)")
    parser.add_argument(
        "--per-side",
        type=int,
        nargs="+",
        default=[1, 3],
        help="runs a side of each compared pair, one set of cases each (default: 1 and 3)",
    )
    parser.add_argument(
        "--plant",
        type=float,
        default=10.0,
        help="the slower runs' added sleep, %% of the sized step (default 10; the measured change is printed)",
    )
    parser.add_argument("--pairs", type=int, default=56, help="the most pairs a case compares (default 56)")
    parser.add_argument(
        "--out", type=Path, help="keep the runs here, and reuse the runs already there (default: a temporary folder)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here, one JSON object a line")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fitprof-gate-") as tmp:
        root = args.out or Path(tmp)
        shape = {"steps": args.steps, "epochs": args.epochs}
        all_results: list[dict[str, Any]] = []
        t0 = time.perf_counter()

        before = loadavg()
        # the first fits of a process are slower (imports, allocators, the profiler's first start): one fit is
        # discarded, and a second, of the same code, sizes the planted changes
        train_one(root / "warmup0", step_ms=BASE_MS, **shape)
        # the planted changes are shares of the step the gate measures, not of the sleep alone: the sleep is
        # only part of it (the MLP, Lightning's loop and fitprof's hooks take the rest); the first two same-code
        # runs size them
        first_same = train(root, "same", 2, step_ms=BASE_MS, **shape)
        sizing = measured_step_ms(first_same)
        print(f"# same-code step measured {sizing:.3f} ms (sleep {BASE_MS:g} ms)", flush=True)
        few = max(4, args.slower // 2)
        quiet = train_interleaved(
            root,
            {
                "same": (args.runs - 2, {"step_ms": BASE_MS, **shape}),
                "slower10_": (args.slower, {"step_ms": BASE_MS, "spin_ms": args.plant / 100 * sizing, **shape}),
                "faster40_": (args.slower, {"step_ms": max(BASE_MS - 0.40 * sizing, 0.0), **shape}),
                "qr": (few, {"step_ms": BASE_MS, "qr": True, **shape}),
                "step50_": (few, {"step_ms": 48.0, **shape}),
                "collate20_": (few, {"step_ms": 48.0, "collate_ms": 20.0, **shape}),
            },
            first={"same": 2},
        )
        quiet_load = (before, loadavg())

        busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
        for p in busy:
            p.start()
        try:
            time.sleep(1.0)
            before = loadavg()
            loaded_sizing = measured_step_ms([train_one(root / "loaded_warmup", step_ms=BASE_MS, **shape)])
            loaded_runs = train_interleaved(
                root,
                {
                    "loaded": (args.runs, {"step_ms": BASE_MS, **shape}),
                    "loaded25_": (args.slower, {"step_ms": BASE_MS, "spin_ms": 0.25 * loaded_sizing, **shape}),
                },
            )
            busy_load = (before, loadavg())
        finally:
            for p in busy:
                p.terminate()
                p.join()
        same, slower, faster, qr = first_same + quiet["same"], quiet["slower10_"], quiet["faster40_"], quiet["qr"]
        step50, collate = quiet["step50_"], quiet["collate20_"]
        loaded, loaded25 = loaded_runs["loaded"], loaded_runs["loaded25_"]
        measured, loaded_ms = measured_step_ms(same), measured_step_ms(loaded)
        label = f"{args.load} busy processes"
        folders = root / "sides"
        verdicts = []
        for n in args.per_side:

            def todo(b: list[Path], c: list[Path] | None, n: int = n) -> list[tuple[Path, Path]]:
                return pairs(b, c, n, args.pairs, folders)

            results = []
            q, ld = quiet_load, busy_load
            results.append(case("same code", "none", todo(same, None), not_failed, "not exit 1/2", q, not_regressed))
            results.append(case("+10% step", "none", todo(same, slower), caught, "exit 1", q, regressed))
            results[-1]["measured_change_percent"] = 100 * (measured_step_ms(slower) / measured - 1)
            results.append(case("40% faster", "none", todo(same, faster), not_failed, "not exit 1", q, not_regressed))
            results[-1]["measured_change_percent"] = 100 * (measured_step_ms(faster) / measured - 1)
            results.append(case("QR added", "none", todo(same, qr), qr_named, "exit 1 naming linalg_qr", q, qr_named))
            results.append(
                case(
                    "+20 ms collate_fn",
                    "none",
                    todo(step50, collate),
                    input_named,
                    "exit 1, headline input wait",
                    q,
                    input_named,
                )
            )
            results.append(case("same code", label, todo(loaded, None), not_failed, "not exit 1/2", ld, not_regressed))
            results.append(case("+25% step", label, todo(loaded, loaded25), caught_or_3, "exit 1 or 3", ld, regressed))
            results[-1]["measured_change_percent"] = 100 * (measured_step_ms(loaded25) / loaded_ms - 1)
            for r in results:
                r["runs_a_side"] = n
            all_results.extend(results)
            verdicts.append((n, done_when(results)))
        print(f"# {time.perf_counter() - t0:.0f} s in all; cpus {os.cpu_count()}", flush=True)
        for n, lines in verdicts:
            print(f"# {n} run(s) a side:", flush=True)
            for line in lines:
                print(line, flush=True)
        if args.json:
            args.json.write_text("".join(json.dumps(r) + "\n" for r in all_results))


if __name__ == "__main__":
    main()

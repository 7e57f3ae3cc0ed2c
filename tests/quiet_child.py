"""Child process of ``test_quiet_profiler.py``: two small fits with fitprof, one with the profilers' log lines
quieted (the default) and one with ``FITPROF_QUIET_PROFILER=0``; a marker line on fd 2 before each, so the parent
can split this process's stderr by run.

``python quiet_child.py lightning OUT``: a Lightning fit of :class:`lightning_tiny.Tiny` (Kineto's lines).
``python quiet_child.py keras OUT``: a Keras fit on whatever ``KERAS_BACKEND`` says (TensorFlow's lines when it is
``tensorflow`` and ``TF_CPP_MIN_LOG_LEVEL`` is unset).
Each run prints ``RESULT {"run": ..., "windows": N}`` on stdout: the windows the fit profiled, read from the report
files it wrote.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from fitprof.report_files import find_report_files

RUNS = (("quiet", "1"), ("loud", "0"))
"""Each run's name and its ``FITPROF_QUIET_PROFILER``."""


def marker(name: str) -> bytes:
    """The line written to fd 2 before run ``name``."""
    return f"=== run {name}\n".encode()


def lightning_fit(out: Path) -> None:
    from fitprof.lightning import FitProfiler
    from lightning_tiny import Tiny, loader, trainer

    trainer(out, [FitProfiler(log_dir=str(out), profile_batch=(2, 3), verbose=False)], max_epochs=2).fit(
        Tiny(), loader(8)
    )


def keras_fit(out: Path) -> None:
    import keras
    import numpy as np

    from fitprof.keras import FitProfiler

    rng = np.random.default_rng(0)
    x, y = rng.random((64, 8), dtype="float32"), rng.integers(0, 2, 64)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    profiler = FitProfiler(log_dir=str(out), profile_batch=(2, 3), verbose=False)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[profiler])


def main() -> None:
    kind, root = sys.argv[1], Path(sys.argv[2])
    fit = {"lightning": lightning_fit, "keras": keras_fit}[kind]
    for name, value in RUNS:
        os.environ["FITPROF_QUIET_PROFILER"] = value
        sys.stderr.flush()
        os.write(2, marker(name))
        fit(root / name)
        windows = len(find_report_files(root / name))
        print("RESULT " + json.dumps({"run": name, "windows": windows}), flush=True)


if __name__ == "__main__":
    main()

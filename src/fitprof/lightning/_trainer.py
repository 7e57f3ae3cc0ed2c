"""What the Lightning adapter reads of the ``Trainer`` beyond its hooks, and writes to it: the argument that cuts the
epochs short, the logger step of an epoch's end, the figures handed to ``callback_metrics`` and the loggers, the
intra-op threads and loader workers, the cross-rank all-gather."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping
from typing import Any

import lightning.pytorch as pl


def epoch_limit(trainer: pl.Trainer, first_step: int) -> str | None:
    """The Trainer argument that cuts the training epochs short, as the user wrote it (None: none does)."""
    fast_dev_run = getattr(trainer, "fast_dev_run", False)
    if fast_dev_run:
        return f"Trainer(fast_dev_run={fast_dev_run!r}) runs {int(fast_dev_run)} training step(s)"
    limit = getattr(trainer, "limit_train_batches", None)
    if limit is not None and limit != 1.0:
        return f"Trainer(limit_train_batches={limit!r})"
    max_steps = getattr(trainer, "max_steps", -1)
    if max_steps is not None and 0 <= max_steps < first_step:
        return f"Trainer(max_steps={max_steps})"
    return None


def epoch_end_step(trainer: pl.Trainer) -> int:
    """The logger step of the epoch's last batch, where fitprof writes to the loggers: the figures, the operators by
    name and the Markdown summaries (the step Lightning gives the epoch-end ``self.log`` values of
    ``on_train_epoch_end``; after an exception, that of the last batch's ``on_step`` values).

    Lightning counts the batches that stepped (``fit_loop.epoch_loop._batches_that_stepped``, per batch whatever
    the optimizers did, so not ``global_step`` under manual optimization) and logs a batch's values at the count
    before it: ``FitLoop`` logs epoch-end metrics with the count one back, so that they sit at the last batch's
    step. During a validation run inside fit the last batch's count is not advanced yet, so it is the count itself.
    Where a Lightning version lacks the count, ``trainer.global_step`` stands for it. Never below 0.
    """
    stepped = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "_batches_that_stepped", None)
    count = stepped if isinstance(stepped, int) else trainer.global_step
    return max(int(count) - (0 if trainer.validating else 1), 0)


def log_figures(
    trainer: pl.Trainer,
    figures: Mapping[str, float],
    *,
    epoch: int,
    step: int | None = None,
    progress_bar: Collection[str] = (),
    loggers: bool = True,
    failed: Callable[[Any, Exception], None] | None = None,
) -> None:
    """Hand ``figures`` to Lightning as its own epoch-end ``self.log(..., on_epoch=True)`` values end up, without
    Lightning's per-call result objects: in one pass, from any hook.

    - ``trainer.callback_metrics`` and ``trainer.logged_metrics``: each figure as a 0-d float64 tensor on the CPU
      (what ``EarlyStopping``, ``ModelCheckpoint(monitor=...)`` and ``ReduceLROnPlateau`` read; the exact figure, no
      device copy); the keys in ``progress_bar`` also in ``trainer.progress_bar_metrics`` as floats.
    - every logger in ``trainer.loggers``: one ``log_metrics`` call with the figures as floats plus ``"epoch"``
      (``epoch``, as Lightning adds it to each epoch-end row), at :func:`epoch_end_step` (the step Lightning gives
      its epoch-end values), then ``save()``, as Lightning's own logger connector does after each call. Called on
      every rank as Lightning calls them; Lightning's loggers write on rank 0 only (``rank_zero_only``).
      ``log_every_n_steps`` does not apply, as it does not to Lightning's epoch-end values.

    Why not ``self.log``: Lightning builds, moves to the module's device and updates a result object at every
    call, 0.3-0.7 ms of CPU a key (``benchmarks/lightning_log_cost.py``), and walks them all again at the fit's
    teardown.

    Args:
        trainer: the fitting trainer.
        figures: name -> value (floats; NaN is written as it is: filter first what a logger must not get).
        epoch: the 0-based epoch the figures belong to.
        step: the loggers' step; None: :func:`epoch_end_step` now (an epoch closed later passes the step its end
            had).
        progress_bar: the keys also shown in the progress bar.
        loggers: False: ``callback_metrics`` and the progress bar only (as ``self.log(..., logger=False)``: not in
            ``logged_metrics``, no logger row).
        failed: called with the logger and the error when a logger raises (the other loggers still get the row);
            None re-raises.
    """
    import torch

    values = {k: float(v) for k, v in figures.items()}
    tensors = {k: torch.tensor(v, dtype=torch.float64) for k, v in values.items()}
    trainer.callback_metrics.update(tensors)
    bar = [k for k in progress_bar if k in values]
    if bar:
        trainer.progress_bar_metrics.update({k: values[k] for k in bar})
    if not values or not loggers:
        return
    trainer.logged_metrics.update(tensors)
    row: dict[str, float] = {**values, "epoch": epoch}
    step = epoch_end_step(trainer) if step is None else step
    for logger in trainer.loggers:
        try:
            logger.log_metrics(row, step=step)
            logger.save()
        except Exception as err:
            if failed is None:
                raise
            failed(logger, err)


def threads_and_workers(trainer: pl.Trainer) -> tuple[int | None, int | None]:
    """The intra-op threads and the training loader's workers, for the epoch-parts probe (the CPU-contention
    verdict weighs them against the cores); None where Lightning does not say."""
    threads = workers = None
    with contextlib.suppress(Exception):
        import torch

        threads = int(torch.get_num_threads())
    with contextlib.suppress(Exception):
        loaders = trainer.train_dataloader
        loaders = loaders.values() if isinstance(loaders, dict) else loaders
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        workers = sum(int(getattr(dl, "num_workers", 0) or 0) for dl in loaders if dl is not None)
    return threads, workers


def all_gather(trainer: pl.Trainer, vector: list[float]) -> list[list[float]]:
    """All-gather one vector per rank (index = global rank): a float64 tensor, on the CPU for gloo / MPI, on the
    rank's device otherwise. Raises on failure."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend())
    device = torch.device("cpu") if ("gloo" in backend or "mpi" in backend) else trainer.strategy.root_device
    local = torch.tensor(vector, dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return [[float(x) for x in t.cpu().tolist()] for t in gathered]


def distributed() -> bool:
    """Whether ``torch.distributed`` is initialised with more than one rank."""
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
    except Exception:  # a broken process group: behave as a single process
        return False

"""What the Lightning adapter reads of the ``Trainer`` beyond its hooks: the argument that cuts the epochs short,
the logger step of an epoch's end, the intra-op threads and loader workers, the cross-rank all-gather; and
Lightning's ``sync_dist`` advice kept off fitprof's keys."""

from __future__ import annotations

import contextlib
import warnings

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
    """The logger step of the epoch's last batch, for what fitprof writes to a logger itself: the operators by name
    and the Markdown summaries (at the step ``pl_module.log`` gives the epoch-end scalars in ``on_train_epoch_end``),
    and after an exception the scalars too (at the step of the last batch's ``on_step`` values).

    Lightning counts the batches that stepped (``fit_loop.epoch_loop._batches_that_stepped``, per batch whatever
    the optimizers did, so not ``global_step`` under manual optimization) and logs a batch's values at the count
    before it: ``FitLoop`` logs epoch-end metrics with the count one back, so that they sit at the last batch's
    step. During a validation run inside fit the last batch's count is not advanced yet, so it is the count itself.
    Where a Lightning version lacks the count, ``trainer.global_step`` stands for it. Never below 0.
    """
    stepped = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "_batches_that_stepped", None)
    count = stepped if isinstance(stepped, int) else trainer.global_step
    return max(int(count) - (0 if trainer.validating else 1), 0)


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


def no_sync_dist_advice() -> None:
    """Keep Lightning from asking, once per key, to ``self.log(<fitprof key>, ..., sync_dist=True)`` in a
    distributed run (37 warnings under ``strategy="ddp_spawn"``): fitprof logs its keys with ``sync_dist=False``
    on purpose, the window's figures gathered across ranks already and the ``fitprof/epoch/*`` figures each rank's
    own, and a collective per key would hang when ranks log different keys. Lightning's warning for any other key
    is left as it is (the filter matches fitprof's keys only, in this process: each spawned rank sets its own)."""
    warnings.filterwarnings(
        "ignore", message=r"It is recommended to use `self\.log\('fitprof/[^']*', \.\.\., sync_dist=True\)`"
    )

"""Rank, world size and the cross-rank gather for Keras runs (``tf.distribute``; ``torch.distributed``)."""

from __future__ import annotations

import logging
from typing import Any

from fitprof.cross_rank import VECTOR_LENGTH

log = logging.getLogger(__name__)


def rank_and_world(model: Any, backend: str) -> tuple[int, int]:
    """``(global rank, world size)`` of this process: its worker index under ``MultiWorkerMirroredStrategy``
    (one rank per worker process; ``MirroredStrategy`` over local devices is one rank), or the
    ``torch.distributed`` rank on the torch backend. ``(0, 1)`` when not distributed, and always on JAX."""
    if backend == "tensorflow":
        try:
            strategy = model.distribute_strategy
            resolver = getattr(strategy, "cluster_resolver", None)
            if resolver is not None and resolver.cluster_spec().as_dict():
                spec = resolver.cluster_spec().as_dict()
                workers = len(spec.get("worker", [])) + len(spec.get("chief", []))
                task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
                rank = task_id + (1 if task_type == "worker" and "chief" in spec else 0)
                return rank, max(workers, 1)
        except Exception as err:
            log.debug("fitprof: could not read the tf.distribute cluster: %s", err)
        return 0, 1
    if backend == "jax":
        return 0, 1  # multi-process JAX (jax.distributed) is not gathered: every process is a rank-0 run
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        pass
    return 0, 1


def all_gather_vectors(model: Any, backend: str, vector: list[float], world: int) -> list[list[float]]:
    """All-gather one fixed-length vector per rank (index = rank). Every rank must call it at the same point.

    TensorFlow: ``strategy.gather`` of a per-replica value across ``MultiWorkerMirroredStrategy``'s workers (one
    CPU replica each; with several local replicas each rank's first replica is kept). torch:
    ``torch.distributed.all_gather``.
    """
    if backend == "tensorflow":
        import tensorflow as tf

        strategy = model.distribute_strategy
        value = tf.constant([vector], dtype=tf.float64)
        per_replica = strategy.run(lambda: tf.identity(value))
        gathered = strategy.gather(per_replica, axis=0).numpy().tolist()
        per_rank = max(len(gathered) // max(world, 1), 1)
        return [row for i, row in enumerate(gathered) if i % per_rank == 0][:world]
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(vector, dtype=torch.float64)
    out = [torch.zeros(VECTOR_LENGTH, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(out, tensor)
    return [t.tolist() for t in out]

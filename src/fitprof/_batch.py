"""How many samples one training batch holds, read from the batch itself (framework-free)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["batch_size"]

_MAX_DEPTH = 8


def _leading_dim(x: Any) -> int | None:
    shape = getattr(x, "shape", None)
    if shape is None:
        return None
    if isinstance(shape, tuple):  # numpy's shape, torch.Size: read as it is (this runs every training step)
        dims = shape
    else:
        try:
            dims = tuple(shape)
        except TypeError:  # a shape that is not a sequence (an unknown-rank TensorShape)
            return None
    if not dims:
        return None  # a scalar has no batch axis
    first = dims[0]
    if first is None:  # an unknown (symbolic) batch dimension
        return None
    try:
        n = int(first)
    except (TypeError, ValueError):
        return None
    return n if n >= 0 else None


def batch_size(batch: Any, _depth: int = 0) -> int | None:
    """The number of samples in ``batch``: the leading dimension of its first array-like leaf.

    Works on anything with a ``.shape`` (torch tensors, numpy arrays, TensorFlow tensors, JAX arrays) and on
    tuples, lists and mappings of them, searched depth first in order (so ``(x, y)`` gives ``len(x)``, and a
    dict gives its first array's length). No framework is imported.

    Returns:
        The leading dimension (samples) as an ``int``, or ``None`` where the batch holds no array with a
        known leading dimension (a scalar, a string, an unknown symbolic batch size, nesting deeper than 8).
        Never raises.
    """
    cls = type(batch)
    if cls is tuple or cls is list:  # the usual (inputs, targets): a plain sequence has no shape of its own
        if _depth >= _MAX_DEPTH:
            return None
        if batch:  # its first item, most often the inputs' array: read here, with no call when its shape is a tuple
            shape = getattr(batch[0], "shape", None)
            if isinstance(shape, tuple) and shape and type(shape[0]) is int and shape[0] >= 0:  # numpy, torch.Size
                return shape[0]
            n = _leading_dim(batch[0])
            if n is not None:
                return n
        items: Any = batch
    else:
        n = _leading_dim(batch)
        if n is not None:
            return n
        if _depth >= _MAX_DEPTH or isinstance(batch, (str, bytes)):
            return None
        if isinstance(batch, Mapping):
            items = batch.values()
        elif isinstance(batch, (tuple, list)):
            items = batch
        else:
            return None
    for item in items:
        n = batch_size(item, _depth + 1)
        if n is not None:
            return n
    return None

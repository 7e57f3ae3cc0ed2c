"""How many samples one training batch holds, read from the batch itself (framework-free)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["batch_samples", "batch_size"]

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


def _is_dataclass_instance(x: Any) -> bool:
    return hasattr(type(x), "__dataclass_fields__") and not isinstance(x, type)


def _walk(batch: Any, depth: int, dims: list[int], lists: list[tuple[int, int | None]]) -> None:
    """Appends the leading dimension of each array-like leaf of ``batch`` to ``dims``, depth first in order, and for
    each list or tuple of two or more array-likes of one rank ``(its length, their common leading dimension or
    None)`` to ``lists``."""
    n = _leading_dim(batch)
    if n is not None:
        dims.append(n)
        return
    if depth >= _MAX_DEPTH or isinstance(batch, (str, bytes)):
        return
    if isinstance(batch, (tuple, list)):
        items: Any = batch
        if len(batch) >= 2:
            shapes = [getattr(x, "shape", None) for x in batch]
            if all(isinstance(sh, tuple) and sh for sh in shapes) and len({len(sh) for sh in shapes}) == 1:  # type: ignore[arg-type]
                firsts = {sh[0] for sh in shapes}  # type: ignore[index]
                lists.append((len(batch), firsts.pop() if len(firsts) == 1 else None))
    elif isinstance(batch, Mapping):
        items = batch.values()
    elif _is_dataclass_instance(batch):  # as Lightning's extract_batch_size: each field in order
        items = [getattr(batch, name) for name in type(batch).__dataclass_fields__]
    else:
        return
    for item in items:
        _walk(item, depth + 1, dims, lists)


def batch_samples(batch: Any) -> tuple[int | None, str]:
    """The number of samples in ``batch``, and what made it uncertain.

    Lightning's rule (``lightning.pytorch.utilities.data.extract_batch_size``): every array-like leaf of the batch
    (anything with a ``.shape``: torch, numpy, TensorFlow, JAX) is read, depth first in order, through tuples,
    lists, mappings and dataclass instances; when their leading dimensions agree, that is the count. When they do
    not (Lightning warns of an "ambiguous collection"):

    * a list or tuple of two or more arrays of one rank whose length is another leaf's leading dimension holds one
      array per sample (a list of variable-size images beside their targets, as a collate that cannot stack them
      gives it): its length is the count;
    * else the first leaf's leading dimension is the count, as Lightning takes it, and the note says so.

    No framework is imported; a scalar (no leading dimension) and a negative or unknown (symbolic) dimension are not
    read, nor is nesting deeper than 8.

    Returns:
        ``(samples, note)``: the count as an ``int`` (None where no leaf has a known leading dimension), and ""
        or one sentence saying why the count is unknown or may be wrong (for the one warning of a fit).
        Never raises.
    """
    dims: list[int] = []
    lists: list[tuple[int, int | None]] = []
    _walk(batch, 0, dims, lists)
    if not dims:
        return None, (
            f"fitprof could not read a batch size from the batch (a {type(batch).__name__}): it holds no array with "
            "a leading dimension in its tuples, lists, mappings or dataclass fields"
        )
    first = dims[0]
    if all(n == first for n in dims):
        return first, ""
    for length, common in lists:
        if length != common and dims.count(length) > (1 if common is None else 0):
            return length, ""
    found = sorted(set(dims))
    return first, (
        f"the batch's arrays disagree on its size (leading dimensions {', '.join(map(str, found))}, an ambiguous "
        f"collection as Lightning calls it); fitprof counted {first} samples a step, the first array's"
    )


def batch_size(batch: Any) -> int | None:
    """The number of samples in ``batch`` (:func:`batch_samples`, without its note).

    Returns:
        The count as an ``int``, or ``None`` where the batch holds no array with a known leading dimension (a
        scalar, a string, an unknown symbolic batch size, nesting deeper than 8). Never raises.
    """
    cls = type(batch)
    if cls is tuple or cls is list:  # the usual (x, y) of numpy arrays or torch tensors: read here, every step
        first: Any = None
        for item in batch:
            shape = getattr(item, "shape", None)
            if not (isinstance(shape, tuple) and shape and type(shape[0]) is int and shape[0] >= 0):
                break
            if first is None:
                first = shape[0]
            elif shape[0] != first:
                break
        else:
            if first is not None and len(batch) <= 2:  # more arrays of one leading dimension may be samples
                return int(first)
    return batch_samples(batch)[0]

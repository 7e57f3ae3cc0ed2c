"""Interval maths on disjoint, sorted sets of spans (microseconds): union, intersection, difference, lengths.

A set is a pair of arrays ``(starts, ends)``, as :func:`union` makes it. Every function is vectorised with numpy
and gives the same floats, bit for bit, as the two-pointer merge loop that walks the sets in order
(``tests/test_vectorised_equivalence.py`` holds that loop as the reference): the figures of a report do not depend
on which of the two computed them.
"""

from __future__ import annotations

import numpy as np

Spans = tuple[np.ndarray, np.ndarray]
"""A disjoint, sorted set of intervals: ``(starts, ends)``, equal lengths."""


def union(starts: np.ndarray, ends: np.ndarray) -> Spans:
    """Merge intervals into sorted, disjoint ones."""
    if len(starts) == 0:
        return starts.astype(float), ends.astype(float)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length of the union of the intervals."""
    s, e = union(starts, ends)
    return float(np.sum(e - s))


def length(a: Spans) -> float:
    """Total length of a disjoint set."""
    return float(np.sum(a[1] - a[0]))


def overlap(a: Spans, b: Spans) -> float:
    """Total length of the intersection of two disjoint, sorted interval sets.

    The pieces' lengths are added left to right (``np.cumsum`` is sequential, unlike ``np.sum``'s pairwise
    summation), in the order a two-pointer merge meets them: the same float, bit for bit, as that merge's loop.
    """
    lo, hi = intersect(a, b)
    return float(np.cumsum(hi - lo)[-1]) if len(lo) else 0.0


def inside(times: np.ndarray, spans: Spans) -> np.ndarray:
    """Boolean mask: which times fall inside one of the disjoint, sorted spans."""
    s, e = spans
    if len(s) == 0:
        return np.zeros(len(times), dtype=bool)
    k = np.searchsorted(s, times, side="right") - 1
    ok = k >= 0
    out = np.zeros(len(times), dtype=bool)
    out[ok] = times[ok] < e[k[ok]]
    return out


def subtract(a: Spans, b: Spans) -> Spans:
    """The parts of the disjoint, sorted intervals ``a`` outside the disjoint, sorted intervals ``b``."""
    if len(b[0]) == 0 or len(a[0]) == 0:
        return a[0].astype(float), a[1].astype(float)
    gaps_s = np.concatenate([[-np.inf], b[1]])
    gaps_e = np.concatenate([b[0], [np.inf]])
    keep = gaps_e > gaps_s
    return intersect(a, (gaps_s[keep], gaps_e[keep]))


def intersect(a: Spans, b: Spans) -> Spans:
    """Intersection of two disjoint, sorted interval sets, as a disjoint, sorted set.

    Vectorised form of the two-pointer merge (advance ``a`` when its interval ends first, else ``b``; keep each
    piece of positive length), which meets every pair of overlapping intervals once, in order of ``a``'s index
    then ``b``'s. For sets as :func:`union` makes them (each interval's start at most its end, each end before
    the next start or at it) the pairs of positive overlap are, for interval ``i`` of ``a``, the ``j`` of ``b`` with
    ``be[j] > as[i]`` and ``bs[j] < ae[i]``: a run of consecutive ``j`` that two ``searchsorted`` calls on ``b``'s
    (non-decreasing) ends and starts find, listed ``i`` by ``i``: the merge's order (its position only moves
    forward in both sets, and it reaches every such pair: while behind ``i`` it advances ``a``, whose intervals
    end by ``as[i] < be[j]``; while behind ``j`` it advances ``b``, whose intervals end by ``bs[j] < ae[i]``).
    Each piece is the merge's ``max(as, bs)``, ``min(ae, be)`` (written as ``where`` to return the same operand
    on a tie, as Python's ``max`` and ``min`` do). Sets that do not meet those conditions (an interval with its
    end before its start, from a negative duration; NaN) go through the merge loop itself.
    """
    (as_, ae), (bs, be) = a, b
    if len(as_) == 0 or len(bs) == 0:
        return np.array([], dtype=float), np.array([], dtype=float)
    if not (_ordered_disjoint(as_, ae) and _ordered_disjoint(bs, be)):
        return _intersect_merge(a, b)
    first = np.searchsorted(be, as_, side="right")  # the first j with be[j] > as[i]
    stop = np.searchsorted(bs, ae, side="left")  # the first j with bs[j] >= ae[i]
    count = np.maximum(stop - first, 0)
    total = int(count.sum())
    i = np.repeat(np.arange(len(as_)), count)
    j = np.arange(total) + np.repeat(first - (np.cumsum(count) - count), count)
    a_s, a_e, b_s, b_e = as_[i], ae[i], bs[j], be[j]
    lo = np.where(b_s > a_s, b_s, a_s).astype(float, copy=False)
    hi = np.where(b_e < a_e, b_e, a_e).astype(float, copy=False)
    keep = hi > lo
    return (lo, hi) if keep.all() else (lo[keep], hi[keep])


def _ordered_disjoint(starts: np.ndarray, ends: np.ndarray) -> bool:
    """Every interval's start at most its end and each end at or before the next start (no NaN): the shape of
    :func:`union`'s output for intervals of non-negative length, and of :func:`subtract`'s gaps."""
    return bool(np.all(starts <= ends) and np.all(ends[:-1] <= starts[1:]))


def _intersect_merge(a: Spans, b: Spans) -> Spans:
    """:func:`intersect` as the two-pointer merge loop, for sets :func:`_ordered_disjoint` rejects."""
    as_, ae = a[0].tolist(), a[1].tolist()
    bs, be = b[0].tolist(), b[1].tolist()
    out_s: list[float] = []
    out_e: list[float] = []
    i = j = 0
    while i < len(as_) and j < len(bs):
        lo, hi = max(as_[i], bs[j]), min(ae[i], be[j])
        if hi > lo:
            out_s.append(lo)
            out_e.append(hi)
        if ae[i] < be[j]:
            i += 1
        else:
            j += 1
    return np.array(out_s, dtype=float), np.array(out_e, dtype=float)

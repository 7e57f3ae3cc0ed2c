"""Masks over one column of the event table, each distinct value tested once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd


class Distinct:
    """One column's values (at some rows), each distinct value tested once: ``pd.factorize`` codes the rows, a test
    runs on the distinct values, and each row's small integer code looks its answer up (one gather per mask).
    :meth:`mask` and :meth:`equal` give the masks that testing every row gives (``values == v``, ``np.isin``,
    ``str.startswith``, ``in``), without a Python or string comparison per row for each mask asked."""

    def __init__(self, values: np.ndarray, rows: np.ndarray | None = None) -> None:
        """``rows``: a boolean mask of the rows to code (None: all); the masks are False at every other row."""
        self._n = len(values)
        self._rows = None if rows is None else np.flatnonzero(rows)
        codes, self._uniques = pd.factorize(values if self._rows is None else values[self._rows])
        # The codes live as long as the analysis: 1 byte a row for the few kinds, not factorize's 8.
        self._codes = codes.astype(np.int8) if len(self._uniques) < 127 else codes

    def mask(self, test: Callable[[Any], bool]) -> np.ndarray:
        """Boolean mask of the rows whose value passes ``test``."""
        # Code -1, a missing value (None, NaN), is never a hit: it compares unequal to every string and its ``str``
        # ("None", "nan") starts with no prefix the analysis asks for.
        passed = np.zeros(len(self._uniques) + 1, dtype=bool)  # the last slot: code -1, never a hit
        passed[:-1] = [bool(test(u)) for u in self._uniques]
        hit = passed[self._codes]
        if self._rows is None:
            return hit
        out = np.zeros(self._n, dtype=bool)
        out[self._rows] = hit
        return out

    def equal(self, *values: object) -> np.ndarray:
        """Boolean mask of the rows whose value equals one of ``values``."""
        return self.mask(lambda u: any(bool(u == v) for v in values))


GROUP_SUMS_IN_PYTHON = 4096
"""Up to this many values :func:`group_sums` adds them in a Python loop; above, pandas' groupby (whose fixed cost,
about 1 ms, is then small against the loop's)."""


def group_sums(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pd.Series(values).groupby(keys).sum()`` as two arrays, bit for bit: the distinct keys, sorted (missing keys
    left out), and each one's sum of its non-NaN values (0.0 for none).

    pandas adds each group's values in their order with Kahan's compensated summation (``group_sum`` in
    ``pandas/_libs/groupby.pyx``, starting from 0.0, a compensation that turns NaN, from an infinite value, reset
    to 0). Small inputs (:data:`GROUP_SUMS_IN_PYTHON`) are summed here with the same float operations in the same
    order, without building the Series, the grouper and the result's index; larger ones by pandas itself.
    ``tests/test_report_golden.py`` checks the two agree bit for bit.
    """
    values = np.asarray(values, dtype=float)
    if len(values) > GROUP_SUMS_IN_PYTHON:
        totals = pd.Series(values).groupby(keys).sum()
        return totals.index.to_numpy(), totals.to_numpy(dtype=float)
    return _kahan_group_sums(keys, values)


def _kahan_group_sums(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`group_sums` in the Python loop, whatever the size."""
    codes, uniques = pd.factorize(keys, sort=True)
    sums = _kahan_sums(codes.tolist(), np.asarray(values, dtype=float).tolist(), len(uniques))
    return np.asarray(uniques), np.array(sums, dtype=float)


def _kahan_sums(codes: list[int], values: list[float], n: int) -> list[float]:
    """Each code's Kahan sum of its non-NaN values, in order, as pandas' ``group_sum`` computes it."""
    sums = [0.0] * n
    comp = [0.0] * n
    for code, val in zip(codes, values, strict=True):
        if code < 0 or val != val:  # a missing key, a NaN value: skipped
            continue
        s = sums[code]
        y = val - comp[code]
        t = s + y
        c = t - s - y
        comp[code] = 0.0 if c != c else c
        sums[code] = t
    return sums

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

"""Warn once per problem: the one helper every part of fitprof warns through (stdlib only)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class WarnOnce:
    """Warn each distinct problem once per instance: ``warn(key, message)``.

    Args:
        emit: how to warn (the adapter's way: ``warnings.warn`` with its category, Lightning's
            ``rank_zero_warn``, ``logging``). A failing ``emit`` (e.g. warnings turned into errors) falls back
            to ``logging``: a warning never breaks training.
    """

    def __init__(self, emit: Callable[[str], Any]) -> None:
        self._emit = emit
        self.keys: set[str] = set()

    def __call__(self, key: str, message: str) -> None:
        if key in self.keys:
            return
        self.keys.add(key)
        try:
            self._emit(message)
        except Exception:
            log.warning(message)

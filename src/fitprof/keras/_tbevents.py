"""Write fitprof's scalars and text summary to a TensorBoard event file with tensorboard's own writer.

Framework-free (no TensorFlow, no torch): ``tensorboard.summary.writer.event_file_writer.EventFileWriter``
with the scalar and text plugins' ``*_pb`` summaries, so the Scalars and Text dashboards show them.
The writer is created on first use, so a run that never logs leaves no empty event file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any


class TBEventFile:
    """One TensorBoard event file of fitprof's, created lazily in one run directory (not torch's or TensorFlow's
    ``SummaryWriter``: tensorboard's own ``EventFileWriter`` with the scalar and text ``*_pb`` summaries).

    Args:
        log_dir: the run directory (created on first write).
        filename_suffix: appended to the event file's name, to tell fitprof's file from others in the run.
    """

    def __init__(self, log_dir: str | os.PathLike[str], filename_suffix: str = ".fitprof") -> None:
        self.log_dir = os.fspath(log_dir)
        self._suffix = filename_suffix
        self._writer: Any = None

    def _get(self) -> Any:
        if self._writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            os.makedirs(self.log_dir, exist_ok=True)
            self._writer = EventFileWriter(self.log_dir, filename_suffix=self._suffix)
        return self._writer

    def _add(self, summary: Any, step: int) -> None:
        from tensorboard.compat.proto import event_pb2

        self._get().add_event(event_pb2.Event(summary=summary, step=int(step), wall_time=time.time()))

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """Write each ``tag -> value`` as a scalar at ``step``."""
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb

        for tag, value in values.items():
            self._add(scalar_pb(tag, float(value)), step)

    def text(self, tag: str, markdown: str, step: int) -> None:
        """Write a Markdown text summary (TensorBoard's Text tab) at ``step``."""
        from tensorboard.plugins.text.summary_v2 import text_pb

        self._add(text_pb(tag, markdown), step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

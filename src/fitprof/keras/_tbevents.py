"""Write fitprof's scalars and text summary to a TensorBoard event file with tensorboard's own record format.

Framework-free (no TensorFlow, no torch): tensorboard's ``RecordWriter`` (the TFRecord framing its
``EventFileWriter`` uses) over a plain local file, with the scalar and text plugins' ``*_pb`` summaries, so the
Scalars and Text dashboards show them. Not ``EventFileWriter`` itself: it opens its file through
``tensorboard.compat.tf``, which imports TensorFlow whenever TensorFlow is installed (5.8 s of the training thread at
the first profiled epoch's end of a Keras fit on torch, measured), and writes from a thread of its own that competes
with the training loop for the GIL; the events here are few and written at once. The file is created on first use,
so a run that never logs leaves no empty event file.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

_UID = itertools.count()
"""Tells apart two files opened in the same second by one process (``EventFileWriter`` names its files alike)."""


class TBEventFile:
    """One TensorBoard event file of fitprof's, created lazily in one run directory (not torch's or TensorFlow's
    ``SummaryWriter``: tensorboard's event format with the scalar and text ``*_pb`` summaries, written at once).

    Args:
        log_dir: the run directory (created on first write).
        filename_suffix: appended to the event file's name, to tell fitprof's file from others in the run.
    """

    def __init__(self, log_dir: str | os.PathLike[str], filename_suffix: str = ".fitprof") -> None:
        self.log_dir = os.fspath(log_dir)
        self._suffix = filename_suffix
        self._file: Any = None
        self._records: Any = None
        self._path: str | None = None

    def warm_up(self) -> None:
        """Import the summary code now rather than at the first write, which the training loop waits for (the
        first write of a few scalars took 31-41 ms with it, measured); nothing happens without tensorboard."""
        with contextlib.suppress(ImportError):
            import tensorboard.compat.proto.event_pb2
            import tensorboard.plugins.scalar.summary_v2
            import tensorboard.plugins.text.summary_v2
            import tensorboard.summary.writer.record_writer  # noqa: F401

    def _write(self, event: Any) -> None:
        """Append one ``Event`` as a TFRecord (tensorboard's ``RecordWriter``: length, CRCs, the bytes)."""
        if self._file is None:
            from tensorboard.summary.writer.record_writer import RecordWriter

            if self._path is not None:  # the file of this fit, closed after its last write: append to it
                self._file = open(self._path, "ab")  # noqa: SIM115 - closed in flush() / close()
                self._records = RecordWriter(self._file)
            else:
                from tensorboard.compat.proto import event_pb2

                os.makedirs(self.log_dir, exist_ok=True)
                # EventFileWriter's file name: time, host, process, a counter
                name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
                self._path = os.path.join(self.log_dir, f"{name}.{next(_UID)}{self._suffix}")
                self._file = open(self._path, "wb")  # noqa: SIM115 - closed in flush() / close()
                self._records = RecordWriter(self._file)
                self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self._records.write(event.SerializeToString())

    def _add(self, summary: Any, step: int) -> None:
        from tensorboard.compat.proto import event_pb2

        self._write(event_pb2.Event(summary=summary, step=int(step), wall_time=time.time()))

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
        """Write what was added to the file and close it: the next write appends to the same file. No file is held
        open between epoch ends, so a fit that an exception ends where no hook of fitprof's runs again leaves none
        open either."""
        if self._file is not None:
            self._file.close()
            self._file = self._records = None

    def close(self) -> None:
        """Close the file; the next write starts a new one (a new fit's)."""
        self.flush()
        self._path = None

"""The Keras torch-backend window: :class:`~fitprof.profilers.torch.TorchProfileWindow` behind the interface of
:class:`~fitprof.profilers.tensorflow.TFProfileWindow` (``start`` / ``begin_step`` / ``end_step`` / ``stop`` /
``cleanup`` / ``abort``, ``session_dir``).

On the torch backend Keras fetches each batch in Python before ``on_train_batch_begin``, so a step span
``[begin(n), begin(n+1))`` holds step ``n``'s compute and step ``n+1``'s fetch: every span still holds one
fetch and one step, so step time and input share keep their meaning. The ``.xplane.pb`` is written at the
epoch's end by :class:`fitprof.window.WindowPipeline`, as for Lightning.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fitprof._session import new_session_dir
from fitprof._warn import WarnOnce
from fitprof.profilers.torch import TorchProfileWindow, profiler_running


class TorchKerasWindow:
    """One profiled window of a Keras model on the torch backend."""

    def __init__(self, log_dir: str, *, epoch: int, rank: int = 0, warn: WarnOnce) -> None:
        self._log_dir = log_dir
        self._epoch = epoch
        self._rank = rank
        self._window = TorchProfileWindow(warn=warn)
        self.session_dir: Path | None = None
        self._trace: Path | None = None

    def start(self) -> None:
        """Raises:
        RuntimeError: if another torch profiler runs or the profiler did not start."""
        if profiler_running():
            raise RuntimeError("another torch profiler is already running; fitprof does not start a second one")
        session = new_session_dir(self._log_dir, self._epoch)
        if not self._window.start(self._log_dir, session.name, rank=self._rank):
            session.rmdir()
            raise RuntimeError("the torch profiler did not start")
        self.session_dir = session

    def begin_step(self, step: int) -> None:
        self._window.begin_step(step)

    def end_step(self) -> None:
        self._window.end_step()

    def stop(self, *, drop_open_step: bool = False) -> Path:
        """Stop and export the Kineto trace; return it (a temporary copy, with ``session_dir`` None, when
        ``log_dir`` cannot be written).

        Raises:
            RuntimeError: if the profiler could not stop or export.
        """
        path = self._window.stop(drop_open_step=drop_open_step)
        if path is None:
            raise RuntimeError("the torch profiler exported no trace")
        if self._window.temporary:
            self.session_dir, self._trace = None, path
        return path

    def cleanup(self) -> None:
        """Delete the temporary copy kept when the trace could not be written to ``log_dir``."""
        if self._trace is not None:
            shutil.rmtree(self._trace.parent, ignore_errors=True)
            self._trace = None

    def abort(self) -> None:
        self._window.stop(export=False)

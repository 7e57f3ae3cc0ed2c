"""The torch-backend window for Keras: fitprof's torch.profiler window, plus an ``.xplane.pb`` for xprof.

On the torch backend Keras fetches each batch in Python before ``on_train_batch_begin``, so a step span
``[begin(n), begin(n+1))`` holds step ``n``'s compute and step ``n+1``'s fetch: every span still holds one
fetch and one step, so step time and input share keep their meaning.
"""

from __future__ import annotations

from pathlib import Path

from fitprof._session import new_session_dir
from fitprof._torch import TorchProfileWindow, profiler_running


class TorchKerasWindow:
    """One profiled window of a Keras model on the torch backend (same interface as ``TFWindow``)."""

    framework = "pytorch"

    def __init__(self, log_dir: str, *, rank: int = 0) -> None:
        self._log_dir = log_dir
        self._rank = rank
        self._window = TorchProfileWindow(warn=self._raise)
        self.session_dir: Path | None = None
        self.save_error: OSError | None = None

    @staticmethod
    def _raise(message: str) -> None:
        raise RuntimeError(message)

    def start(self) -> None:
        if profiler_running():
            raise RuntimeError("another torch profiler is already running; fitprof does not start a second one")
        session = new_session_dir(self._log_dir)
        self._session = self.session_dir = session
        if not self._window.start(self._log_dir, session.name, rank=self._rank):
            session.rmdir()
            raise RuntimeError("the torch profiler did not start")

    def begin_step(self, step: int) -> None:
        self._window.begin_step(step)

    def end_step(self) -> None:
        self._window.end_step()

    def stop(self, *, drop_open_step: bool = False) -> Path:
        """Stop, export the Kineto trace and convert it to ``<session>/<host>.xplane.pb``; return the trace.

        Raises:
            RuntimeError: if the profiler could not stop or export.
        """
        from fitprof.traces.xspace_write import write_xspace

        path = self._window.stop(drop_open_step=drop_open_step)
        if path is None:
            raise RuntimeError("the torch profiler exported no trace")
        write_xspace(path, self._log_dir, self._session.name)
        return path

    def cleanup(self) -> None:
        """Nothing to clean: the torch window writes straight into ``log_dir``."""

    def abort(self) -> None:
        self._window.stop(export=False)

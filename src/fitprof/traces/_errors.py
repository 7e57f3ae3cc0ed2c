"""The one error type of the trace readers, in its own module so that every reader can import it without going
through :mod:`fitprof.traces` (which imports the readers)."""

from __future__ import annotations


class TraceError(ValueError):
    """A file that is not a readable trace (missing, truncated, corrupt, or of another format)."""

"""Start a real TensorBoard on loopback for the tests that read the Profile tab and the scalars over HTTP."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(base: str, path: str, **params: str) -> Any:
    """GET ``base + path`` with query ``params``; JSON-decode (gunzipping when needed)."""
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read()
        if resp.headers.get("Content-Encoding") == "gzip" or body[:2] == b"\x1f\x8b":
            body = gzip.decompress(body)
    return json.loads(body) if body else None


BIND_TRIES = 5
"""A free port can be taken by another process (another test run's TensorBoard) between our check and
TensorBoard's bind; such a start is retried on a new port, this many times in all."""


def _start(logdir: str | os.PathLike[str], timeout_s: float) -> tuple[subprocess.Popen[bytes], str, Any]:
    """Start TensorBoard on a free loopback port; return the process, its base URL and its open log file, once it
    answers. Raises RuntimeError when it exits (after :data:`BIND_TRIES` tries when the port was taken)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    exe = Path(sys.executable).with_name("tensorboard")
    for attempt in range(1, BIND_TRIES + 1):
        port = _free_port()
        cmd = [str(exe), "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "1"]
        log = open(Path(logdir) / ".tensorboard-test.log", "w")  # noqa: SIM115 - closed by the caller
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                log.close()
                text = Path(log.name).read_text()
                if "could not bind" in text and attempt < BIND_TRIES:
                    break  # the port was taken meanwhile: try another one
                raise RuntimeError(f"tensorboard exited with {proc.returncode}: {text}")
            try:
                get(base, "/data/plugins_listing")
                return proc, base, log
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    proc.kill()
                    log.close()
                    raise TimeoutError(f"tensorboard did not answer on {base}") from None
                time.sleep(0.5)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def tensorboard(logdir: str | os.PathLike[str], timeout_s: float = 180.0) -> Iterator[str]:
    """Run ``tensorboard --logdir LOGDIR`` on 127.0.0.1 and yield its base URL; stop it on exit.

    ``timeout_s`` is a hang detector, not a timing: TensorBoard took over 90 s to answer on the 2-core test
    machine at a load average of 14."""
    proc, base, log = _start(logdir, timeout_s)
    try:
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def wait_for(fn: Any, timeout_s: float = 60.0, interval_s: float = 1.0, until: Callable[[Any], bool] = bool) -> Any:
    """Call ``fn`` until ``until`` holds for its answer (default: the answer is truthy) or ``timeout_s`` passes;
    returns the last answer. TensorBoard loads runs in the background, one by one: a test that expects several
    passes an ``until`` for the whole set, so it never judges a partial listing."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if until(value) or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)

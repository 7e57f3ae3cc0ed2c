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
from collections.abc import Iterator
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


@contextlib.contextmanager
def tensorboard(logdir: str | os.PathLike[str], timeout_s: float = 90.0) -> Iterator[str]:
    """Run ``tensorboard --logdir LOGDIR`` on 127.0.0.1 and yield its base URL; stop it on exit."""
    port = _free_port()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    exe = Path(sys.executable).with_name("tensorboard")
    cmd = [
        str(exe),
        "--logdir",
        str(logdir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--reload_interval",
        "1",
    ]
    log = open(Path(logdir) / ".tensorboard-test.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tensorboard exited with {proc.returncode}: {Path(log.name).read_text()}")
            try:
                get(base, "/data/plugins_listing")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tensorboard did not answer on {base}") from None
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def wait_for(fn: Any, timeout_s: float = 60.0, interval_s: float = 1.0) -> Any:
    """Call ``fn`` until it returns something truthy (TensorBoard loads runs in the background)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)

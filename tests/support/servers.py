"""Helpers to run real servers on loopback in tests: free ports, waiting for HTTP readiness."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIDECAR = [sys.executable, "-m", "numbakv.service"]
"""The sidecar's command, as ``numbakv-sidecar`` runs it (run it in ``ROOT``)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url`` until it answers 200; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


@contextlib.contextmanager
def running(
    args: list[str], ready_url: str, timeout_s: float = 30, **popen
) -> Iterator[subprocess.Popen]:
    """Start a server process, wait until ``ready_url`` answers, stop it on exit."""
    proc = subprocess.Popen(args, **popen)
    try:
        wait_http(ready_url, timeout_s, proc)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sidecar(
    metrics_dir: str, port: int, *flags: str, **popen
) -> contextlib.AbstractContextManager[subprocess.Popen]:
    """The sidecar under uvicorn, as ``numbakv-sidecar`` runs it, on 127.0.0.1."""
    args = [
        *SIDECAR,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics-dir",
        metrics_dir,
        *flags,
    ]
    return running(args, f"http://127.0.0.1:{port}/healthz", cwd=ROOT, **popen)

"""The disk tier's index lock is never held across file I/O: a `touch` from the engine returns
while another thread is stuck in a file system call (an existence check, an unlink)."""

from __future__ import annotations

import os
import threading

import pytest

from numbakv.tiers import disk as disk_module
from numbakv.tiers.chunk_format import encode_header
from numbakv.tiers.disk import ALIGNMENT, DiskBackend, DiskSettings
from tests.support.tiers import namespace

CHUNK_BYTES = 4096
KEYS = [b"k%d" % i for i in range(4)]


def stuck(monkeypatch, name: str, real) -> tuple[threading.Event, threading.Event]:
    """Make `os.<name>` (as the disk tier calls it) wait until released; (entered, release)."""
    entered, release = threading.Event(), threading.Event()

    def waiting(*args):
        entered.set()
        release.wait(10)
        return real(*args)

    target = disk_module.os.path if name == "exists" else disk_module.os
    monkeypatch.setattr(target, name, waiting)
    return entered, release


@pytest.mark.parametrize(
    "blocked, call",
    [
        ("exists", lambda backend: backend.exists(KEYS)),
        (
            "exists",
            lambda backend: backend.read_into(KEYS[:1], [memoryview(bytearray(CHUNK_BYTES))], 48),
        ),
        ("unlink", lambda backend: backend.delete(KEYS[:1])),
    ],
)
def test_a_touch_never_waits_behind_file_io(tmp_path, monkeypatch, blocked, call):
    backend = DiskBackend(
        DiskSettings(tmp_path, 8 * (ALIGNMENT + CHUNK_BYTES)), namespace(), CHUNK_BYTES
    )
    payload = memoryview(bytes(CHUNK_BYTES))
    header = encode_header(namespace().digest, b"w" * 8, payload)
    assert backend.write(KEYS, [header] * 4, [payload] * 4) == [True] * 4
    real = os.path.exists if blocked == "exists" else os.unlink
    entered, release = stuck(monkeypatch, blocked, real)
    worker = threading.Thread(target=call, args=(backend,))
    worker.start()
    try:
        assert entered.wait(10), "the call never reached the file system"
        touched = threading.Thread(target=backend.touch, args=(KEYS[::-1],))
        touched.start()
        touched.join(5)
        assert not touched.is_alive(), "touch waited behind file I/O"
        assert worker.is_alive()  # still in its file system call
    finally:
        release.set()
        worker.join(10)

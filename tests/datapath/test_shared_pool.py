"""A host pool that the processes of a node share: one copy, the same pages for every opener,
reached by each opener's kernels, and a name that does not outlive its users."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from numbakv.datapath import HostPool, TransferEngine
from numbakv.datapath import host_pool as host_pool_module
from numbakv.datapath import shared_memory as shared_memory_module
from numbakv.datapath._device import CudaAPIError
from tests.support.datapath_cases import GPU_POISON, finish, make_cache

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def memory_dir(tmp_path):
    """A fresh folder on Linux's memory file system, where shared pools live: a GPU pins a
    mapping of a file there (of a file on disk, it refuses). tmp_path where there is none."""
    if not shared_memory_module.SHARED_DIR.is_dir():
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="numbakv-test-", dir=shared_memory_module.SHARED_DIR))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_pools_opened_at_one_path_are_one_copy_that_each_engine_reaches(memory_dir):
    path = memory_dir / "pool.kv"
    cache = make_cache("mla", np.random.default_rng(3), num_blocks=6)
    writer = HostPool(5, cache.layout.block_bytes, shared=path)
    reader = HostPool(5, cache.layout.block_bytes, shared=path)
    assert path.stat().st_size == writer.nbytes == reader.nbytes  # one copy, not two

    original = cache.host_copies()
    store = TransferEngine(cache.layout, writer)
    store.submit(1, "store", [4, 0, 2], [1, 3, 0])
    assert finish(store, 1) == [(1, True)]
    cache.poison()
    load = TransferEngine(cache.layout, reader)  # never stored anything
    load.submit(2, "load", [5, 1, 3], [1, 3, 0])
    assert finish(load, 2) == [(2, True)]
    copies = cache.host_copies()
    for source, target in [(4, 5), (0, 1), (2, 3)]:
        assert cache.block_bytes(copies, target) == cache.block_bytes(original, source)
    assert set(cache.block_bytes(copies, 0)) == {GPU_POISON}


def test_another_process_writes_the_same_pages_and_its_name_goes_with_its_pool(memory_dir):
    path = memory_dir / "pool.kv"
    pool = HostPool(8, 96, shared=path)
    child = (
        "import sys, numpy as np; from numbakv.datapath import HostPool; "
        "pool = HostPool(8, 96, shared=sys.argv[1]); "
        "pool.blocks[:] = np.random.default_rng(7).integers(0, 256, (8, 96), dtype=np.uint8)"
    )
    subprocess.run([sys.executable, "-c", child, str(path)], cwd=ROOT, check=True)
    expected = np.random.default_rng(7).integers(0, 256, (8, 96), dtype=np.uint8)
    assert np.array_equal(pool.blocks, expected)
    assert not path.exists()  # the child's pool went: no new process can join, ours still maps


def test_a_barrier_removes_the_name_once_every_process_has_mapped_it(memory_dir):
    path = memory_dir / "pool.kv"
    arrived = []
    pool = HostPool(2, 64, shared=path, barrier=lambda: arrived.append(path.exists()))
    assert arrived == [True] and not path.exists()
    pool.blocks[:] = 9  # the pages stay
    assert (pool.blocks == 9).all()


def test_a_name_holding_other_sizes_is_refused_naming_it_after_the_barrier(memory_dir):
    path = memory_dir / "pool.kv"
    kept = HostPool(4, 64, shared=path)
    arrived = []
    with pytest.raises(ValueError, match=f"{path} holds 256 bytes, expected 128"):
        HostPool(4, 32, shared=path, barrier=lambda: arrived.append(True))
    assert arrived == [True]  # the other processes do not wait for this one
    assert kept.blocks.shape == (4, 64)


def test_too_little_shared_memory_is_refused_before_sizing(tmp_path, monkeypatch):
    path = tmp_path / "pool.kv"
    real = os.statvfs(tmp_path)
    full = os.statvfs_result((*real[:4], 0, *real[5:]))  # no block available
    monkeypatch.setattr(shared_memory_module.os, "statvfs", lambda directory: full)
    with pytest.raises(OSError, match="shared host copy needs .* --shm-size"):
        HostPool(4, 64, shared=path)
    assert not path.exists()


def test_a_pool_that_fails_to_pin_leaves_no_file_behind_and_says_where_pools_live(
    tmp_path, monkeypatch
):
    def refused(_array):  # what the driver answers for a file on disk
        raise CudaAPIError(1, "Call to cuMemHostRegister results in CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(host_pool_module, "map_host", refused)
    path = tmp_path / "pool.kv"
    with pytest.raises(OSError, match=f"shared='{path}': the GPU cannot pin .* such as /dev/shm"):
        HostPool(4, 4096, shared=path)
    assert list(tmp_path.iterdir()) == []

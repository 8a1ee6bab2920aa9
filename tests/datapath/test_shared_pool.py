"""A host pool that the processes of a node share: one copy, the same pages for every opener,
reached by each opener's kernels, and a name that does not outlive its users."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from numbakv.datapath import HostPool, TransferEngine
from numbakv.datapath import host_pool as host_pool_module
from numbakv.datapath import shared_memory as shared_memory_module
from tests.support.datapath_cases import GPU_POISON, finish, make_cache

ROOT = Path(__file__).resolve().parents[2]


def test_pools_opened_at_one_path_are_one_copy_that_each_engine_reaches(tmp_path):
    path = tmp_path / "pool.kv"
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


def test_another_process_writes_the_same_pages_and_its_name_goes_with_its_pool(tmp_path):
    path = tmp_path / "pool.kv"
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


def test_a_barrier_removes_the_name_once_every_process_has_mapped_it(tmp_path):
    path = tmp_path / "pool.kv"
    arrived = []
    pool = HostPool(2, 64, shared=path, barrier=lambda: arrived.append(path.exists()))
    assert arrived == [True] and not path.exists()
    pool.blocks[:] = 9  # the pages stay
    assert (pool.blocks == 9).all()


def test_a_name_holding_other_sizes_is_refused_naming_it_after_the_barrier(tmp_path):
    path = tmp_path / "pool.kv"
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


def test_a_pool_that_fails_to_pin_leaves_no_file_behind(tmp_path, monkeypatch):
    def refused(_array):
        raise RuntimeError("injected: the driver refused to pin")

    monkeypatch.setattr(host_pool_module, "map_host", refused)
    with pytest.raises(RuntimeError, match="injected"):
        HostPool(4, 4096, shared=tmp_path / "pool.kv")
    assert list(tmp_path.iterdir()) == []

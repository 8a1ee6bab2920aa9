"""numbakv's OffloadingWorker under vLLM 0.32's contract, built from CanonicalKVCaches of CPU
tensors (the CUDA simulator): two KV cache groups on the same tensors, with pages of different
sizes, as a hybrid model's attention and state layers share vLLM's tensors."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.support.vllm_support import require_vllm

require_vllm()

import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    TransferResult,
)

from numbakv.integrations.vllm.config import Settings
from numbakv.integrations.vllm.host_spec import HostChunksSpec
from numbakv.integrations.vllm.worker import NumbaKVOffloadingWorker

NUM_BLOCKS, NUM_CHUNKS, ROW = 12, 8, 96
PAGES = (96, 64)  # bytes of each row that group 0 and group 1 use


@pytest.fixture
def worker_and_tensors(caplog):
    caplog.set_level(logging.INFO, logger="vllm.numbakv")
    generator = torch.Generator().manual_seed(0)
    backing = torch.randint(-128, 127, (2, NUM_BLOCKS, ROW), dtype=torch.int8, generator=generator)
    tensors = [backing[0], backing[1]]
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(tensor, ROW) for tensor in tensors],
        group_data_refs=[[CanonicalKVCacheRef(t, page) for t in (0, 1)] for page in PAGES],
    )
    budget = NUM_CHUNKS * 2 * ROW  # vLLM's share: every tensor's row for every chunk
    worker = NumbaKVOffloadingWorker.create(
        caches, 1, NUM_CHUNKS, Settings(cpu_bytes_to_use=budget), True, budget
    )
    return worker, tensors


def test_two_groups_store_and_load_back_through_vllms_specs(worker_and_tensors, caplog):
    worker, tensors = worker_and_tensors
    started = " ".join(record.getMessage() for record in caplog.get_records("setup"))
    assert "2 KV cache group(s)" in started
    assert "blocks come in 2 sizes" in started  # a pool of 192-byte and one of 128-byte blocks
    original = [tensor.clone() for tensor in tensors]
    store = GPULoadStoreSpec([1, 2, 3], group_sizes=[2, 1], block_indices=[0, 0])
    assert worker.submit_store(5, store, HostChunksSpec(np.array([0, 1, 2])))
    worker.wait({5})
    assert worker.get_finished() == [TransferResult(5, True, 2 * 192 + 128, 0.0)]

    for tensor in tensors:
        tensor.fill_(7)
    load = GPULoadStoreSpec([9, 10, 11], group_sizes=[2, 1], block_indices=[0, 0])
    assert worker.submit_load(6, HostChunksSpec(np.array([0, 1, 2])), load)
    worker.shutdown()  # waits for the load
    assert [result.job_id for result in worker.get_finished()] == [6]
    for tensor, earlier in zip(tensors, original):
        assert torch.equal(tensor[9:11], earlier[1:3])  # group 0: whole rows
        assert torch.equal(tensor[11, :64], earlier[3, :64])  # group 1: its 64 bytes only
        assert (tensor[11, 64:] == 7).all() and (tensor[:9] == 7).all()


@pytest.mark.parametrize(
    ("gpu", "host", "logged"),
    [
        (GPULoadStoreSpec([1, 2], group_sizes=[2], block_indices=[0]), [0, 1], "2 KV cache group"),
        (GPULoadStoreSpec([1, 2], group_sizes=[1, 1], block_indices=[0, 0]), [0], "fill 2 host"),
        (GPULoadStoreSpec([1], group_sizes=[1, 0], block_indices=[0, 0]), None, "HostChunksSpec"),
    ],
)
def test_a_job_that_does_not_fit_is_refused_and_logged(
    worker_and_tensors, caplog, gpu, host, logged
):
    worker, tensors = worker_and_tensors
    before = [tensor.clone() for tensor in tensors]
    host_spec = HostChunksSpec(np.array(host)) if host is not None else gpu
    assert worker.submit_store(1, gpu, host_spec) is False
    assert worker.submit_load(2, host_spec, gpu) is False
    assert "refused, nothing moved" in caplog.text and logged in caplog.text
    assert worker.get_finished() == []
    assert all(torch.equal(tensor, earlier) for tensor, earlier in zip(tensors, before))

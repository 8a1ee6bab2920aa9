"""The vLLM worker's transfer core on a real GPU, over torch CUDA tensors laid out as vLLM's
canonical KV caches (vLLM itself need not be installed: this is the code its worker runs).

Byte-exact against torch's own indexing, ordered after the compute stream, and overlapping
compute that runs on another stream.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from numbakv.datapath import ChunkTransfers
from numbakv.integrations.vllm.tensors import torch_block_arrays

NUM_BLOCKS = 64
NUM_CHUNKS = 48
PAGE = 16 * 8 * 128 * 2 * 2  # a block of one layer: 16 tokens, 8 KV heads of 128, fp16, K and V
PADDED = PAGE + 256
GROUPS = [[(0, PAGE), (1, PAGE), (2, PAGE)], [(3, PAGE), (4, PAGE)]]  # two groups, two pools
SLEEP_CYCLES = 2_000_000_000  # about a second of a GPU clock


def _canonical_tensors(seed: int) -> list:
    """Five layers' [num_blocks, padded page] byte tensors inside one allocation, as vLLM's."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    backing = torch.randint(
        1, 255, (5, NUM_BLOCKS, PADDED), dtype=torch.uint8, device="cuda", generator=generator
    )
    return [backing[layer].view(torch.int8) for layer in range(5)]


def _transfers(tensors, blocks_per_chunk: int) -> ChunkTransfers:
    arrays, compute_stream = torch_block_arrays(tensors, [PADDED] * len(tensors), False)
    return ChunkTransfers(
        arrays, GROUPS, blocks_per_chunk, NUM_CHUNKS, compute_stream=compute_stream
    )


def _group_rows(tensors, refs, block_ids) -> np.ndarray:
    """torch's indexing: each block's pages of the group's layers, concatenated, as bytes."""
    index = torch.as_tensor(block_ids, device="cuda", dtype=torch.long)
    rows = torch.cat([tensors[t][index, :page] for t, page in refs], dim=1)
    return rows.cpu().numpy().view(np.uint8)


@pytest.mark.gpu
@pytest.mark.parametrize("blocks_per_chunk", [1, 4])
def test_store_and_load_are_byte_exact_against_torch_indexing(blocks_per_chunk):
    tensors = _canonical_tensors(seed=blocks_per_chunk)
    original = [tensor.clone() for tensor in tensors]
    transfers = _transfers(tensors, blocks_per_chunk)
    rng = np.random.default_rng(blocks_per_chunk)
    sizes, firsts = [9, 6], [blocks_per_chunk - 1, 0]  # group 0 enters its first chunk late
    chunks_needed = [
        -(-(first % blocks_per_chunk + size) // blocks_per_chunk)
        for size, first in zip(sizes, firsts)
    ]
    chunk_ids = rng.permutation(NUM_CHUNKS)[: sum(chunks_needed)]
    store_ids = rng.permutation(NUM_BLOCKS)[: sum(sizes)]

    transfers.submit(1, "store", store_ids.astype(np.int32), sizes, firsts, chunk_ids)
    transfers.wait([1])
    assert [(job.job_id, job.success) for job in transfers.get_finished()] == [(1, True)]
    pool = transfers.pools[3 * PAGE]  # group 0's
    skip = firsts[0] % blocks_per_chunk
    group0_hosts = (
        chunk_ids[: chunks_needed[0], None] * blocks_per_chunk + np.arange(blocks_per_chunk)
    ).ravel()[skip : skip + sizes[0]]
    np.testing.assert_array_equal(
        pool.blocks[group0_hosts], _group_rows(original, GROUPS[0], store_ids[:9])
    )

    for tensor in tensors:
        tensor.fill_(0x5A)
    load_ids = rng.permutation(NUM_BLOCKS)[: sum(sizes)]
    transfers.submit(2, "load", load_ids.astype(np.int32), sizes, firsts, chunk_ids)
    transfers.wait([2])
    transfers.get_finished()
    for refs, at in zip(GROUPS, (slice(0, 9), slice(9, 15))):
        np.testing.assert_array_equal(
            _group_rows(tensors, refs, load_ids[at]), _group_rows(original, refs, store_ids[at])
        )
    untouched = torch.ones(NUM_BLOCKS, dtype=torch.bool, device="cuda")
    untouched[torch.as_tensor(load_ids, device="cuda")] = False
    for tensor in tensors:
        assert (tensor[untouched] == 0x5A).all()
        assert (tensor[:, PAGE:] == 0x5A).all()  # padding is never written


@pytest.mark.gpu
def test_a_store_waits_for_the_compute_stream_it_was_submitted_on():
    tensors = _canonical_tensors(seed=7)
    transfers = _transfers(tensors, 1)
    compute = torch.cuda.Stream()
    with torch.cuda.stream(compute):
        torch.cuda._sleep(SLEEP_CYCLES)  # the model still running...
        for tensor in tensors:
            tensor[:4].fill_(0x33)  # ...then writing the blocks the store reads
        transfers.submit(1, "store", np.arange(4, dtype=np.int32), [4, 0], [0, 0], np.arange(4))
    transfers.wait([1])
    assert (transfers.pools[3 * PAGE].blocks[:4] == 0x33).all()


@pytest.mark.gpu
def test_a_store_overlaps_compute_running_on_another_stream():
    tensors = _canonical_tensors(seed=8)
    transfers = _transfers(tensors, 1)
    torch.cuda.synchronize()  # the blocks are written: the store depends on nothing queued
    busy, idle = torch.cuda.Stream(), torch.cuda.Stream()
    done = torch.cuda.Event()
    with torch.cuda.stream(busy):
        torch.cuda._sleep(SLEEP_CYCLES)
        done.record(busy)
    with torch.cuda.stream(idle):  # the blocks were written on `idle`, which has finished
        transfers.submit(1, "store", np.arange(8, dtype=np.int32), [8, 0], [0, 0], np.arange(8))
    transfers.wait([1])
    assert not done.query(), "the store waited for compute it does not depend on"
    torch.cuda.synchronize()
    np.testing.assert_array_equal(
        transfers.pools[3 * PAGE].blocks[:8], _group_rows(tensors, GROUPS[0], range(8))
    )


def test_cpu_tensors_are_refused_off_the_simulator():
    with pytest.raises(ValueError, match="need the KV caches on a CUDA GPU"):
        torch_block_arrays([torch.zeros(4, PAGE, dtype=torch.int8)], [PAGE], False)

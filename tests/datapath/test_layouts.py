"""KVLayout: every layout reduces to segments of an arena; bad engine arrays fail at construction."""

from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from numbakv.datapath import KVLayout, LayoutKind, layouts
from numbakv.datapath._device import array_interface
from tests.support.datapath_cases import make_cache, random_array


@pytest.mark.parametrize(
    ("kind", "segments_per_layer", "chunk_bytes"),
    [
        (LayoutKind.FLASH_ATTN, 2, 2 * 2 * 4 * 2),  # K and V are separate runs
        (LayoutKind.FLASHINFER, 1, 2 * 2 * 2 * 4 * 2),  # K and V adjacent: one run
        (LayoutKind.MLA, 1, 2 * 4 * 2),
    ],
)
def test_per_layer_geometry(kind, segments_per_layer, chunk_bytes):
    cache = make_cache(kind, np.random.default_rng(0), num_layers=3)
    layout = cache.layout
    assert (layout.num_layers, layout.num_blocks, layout.dtype) == (3, 8, np.dtype(np.float16))
    assert layout.num_segments == 3 * segments_per_layer
    assert layout.chunk_bytes == chunk_bytes
    assert layout.block_bytes == layout.num_segments * chunk_bytes


def test_cross_layer_is_one_run_per_block():
    cache = make_cache(LayoutKind.CROSS_LAYER, np.random.default_rng(0), num_layers=4)
    layout = cache.layout
    assert (layout.num_layers, layout.num_blocks, layout.num_segments) == (4, 8, 1)
    assert layout.chunk_bytes == layout.block_stride == 4 * 2 * 2 * 2 * 4 * 2


def test_cross_layer_accepts_a_one_element_list():
    array = cuda.to_device(random_array(np.random.default_rng(0), (4, 2, 8), np.int8))
    assert KVLayout.from_arrays("cross_layer", [array]).num_layers == 2


def _layers(*shapes, dtype=np.float16):
    rng = np.random.default_rng(1)
    return [cuda.to_device(random_array(rng, shape, dtype)) for shape in shapes]


BAD_LAYOUTS = [
    pytest.param(
        "flash_attn",
        _layers((2, 4, 2, 2, 4)) + _layers((2, 4, 2, 2, 4), dtype=np.float32),
        "layer 1 has dtype float32, layer 0 has float16",
        id="dtype-mismatch",
    ),
    pytest.param(
        "flash_attn",
        _layers((2, 4, 2, 2, 4), (2, 5, 2, 2, 4)),
        r"layer 1 has shape \(2, 5, 2, 2, 4\)",
        id="shape-mismatch",
    ),
    pytest.param(
        "flash_attn",
        _layers((2, 4, 2, 2, 4))
        + [
            cuda.to_device(random_array(np.random.default_rng(2), (2, 4, 2, 2, 8), np.float16))[
                :, :, :, :, :4
            ]
        ],
        "layer 1 has strides",
        id="strides-mismatch",
    ),
    pytest.param(
        "flash_attn",
        _layers((2, 4, 2, 4)),
        r"expected a 5-D array \[2, num_blocks",
        id="flash-ndim",
    ),
    pytest.param("flash_attn", _layers((3, 4, 2, 2, 4)), "axis 0 must be 2", id="flash-kv-axis"),
    pytest.param(
        "flashinfer", _layers((4, 3, 2, 2, 4)), "axis 1 must be 2", id="flashinfer-kv-axis"
    ),
    pytest.param("mla", _layers((4, 2, 2, 4)), "expected a 3-D array", id="mla-ndim"),
    pytest.param("cross_layer", _layers((4,)), "at least 2-D", id="cross-ndim"),
    pytest.param(
        "cross_layer", _layers((4, 2), (4, 2)), "expected one array, got 2", id="cross-two-arrays"
    ),
    pytest.param("mla", [], "at least one layer", id="no-layers"),
    pytest.param("mla", _layers((0, 2, 4)), "empty KV cache", id="empty"),
    pytest.param(
        "nonsense", _layers((4, 2, 4)), "'nonsense' is not a valid LayoutKind", id="bad-kind"
    ),
]


@pytest.mark.parametrize(("kind", "arrays", "message"), BAD_LAYOUTS)
def test_bad_layouts_fail_at_construction(kind, arrays, message):
    with pytest.raises(ValueError, match=message):
        KVLayout.from_arrays(kind, arrays)


def test_a_single_array_is_not_a_list_of_layers():
    with pytest.raises(TypeError, match="expected a list of per-layer arrays"):
        KVLayout.from_arrays("mla", _layers((4, 2, 4))[0])


def test_objects_without_an_array_interface_are_rejected():
    with pytest.raises(TypeError, match="__cuda_array_interface__"):
        KVLayout.from_arrays("mla", [object()])


def test_negative_strides_are_rejected():
    array = cuda.to_device(random_array(np.random.default_rng(0), (4, 2, 4), np.float16))[::-1]
    with pytest.raises(ValueError, match="negative strides"):
        KVLayout.from_arrays("mla", [array])


def _base(array) -> int:
    return int(array_interface(array)["data"][0])


# Issue 23, item 8: with several GPUs visible, memory of another device than the current context's
# is an illegal address for the kernels. The driver's answer to "which device owns this address"
# is replaced here, as the simulator has one device.


def test_layers_on_different_devices_are_refused(monkeypatch):
    layers = _layers((4, 2, 4), (4, 2, 4), (4, 2, 4))
    device_of = {_base(layers[2]): 1}
    monkeypatch.setattr(layouts, "pointer_device", lambda address: device_of.get(address, 0))
    with pytest.raises(ValueError, match="layer 2 is on CUDA device 1, layer 0 on device 0"):
        KVLayout.from_arrays("mla", layers)


def test_a_cache_on_another_device_than_the_current_one_is_refused(monkeypatch):
    monkeypatch.setattr(layouts, "pointer_device", lambda address: 1)
    with pytest.raises(ValueError, match="on CUDA device 1 but the current device is 0"):
        KVLayout.from_arrays("mla", _layers((4, 2, 4), (4, 2, 4)))


def test_memory_that_is_not_cuda_memory_is_refused(monkeypatch):
    def not_cuda(address):
        raise ValueError(f"address {address:#x} is not CUDA memory")

    monkeypatch.setattr(layouts, "pointer_device", not_cuda)
    with pytest.raises(ValueError, match="layer 0: address 0x[0-9a-f]+ is not CUDA memory"):
        KVLayout.from_arrays("mla", _layers((4, 2, 4)))


def test_the_layout_records_its_device():
    assert KVLayout.from_arrays("mla", _layers((4, 2, 4))).device == 0


def test_a_layout_prints_its_sizes_not_its_arrays():
    """Issue 37: its repr printed every array whole."""
    layout = make_cache("flash_attn", np.random.default_rng(3), num_blocks=64).layout
    text = repr(layout)
    assert "num_blocks=64" in text and "chunk_bytes=" in text and len(text) < 300


# A load writes every segment of its blocks: were two blocks to share a byte, loading one would
# overwrite the other. Segments of one block may share bytes (layers sharing one KV cache).


def _random(shape, seed=3) -> np.ndarray:
    return random_array(np.random.default_rng(seed), shape, np.float16)


def test_layers_that_overlap_across_blocks_are_refused_naming_both():
    memory = _random((5, 2, 4))  # layer 1's block 0 is layer 0's block 1
    with pytest.raises(ValueError, match=r"kv_caches\[0\] and kv_caches\[1\] overlap: block 1"):
        KVLayout.from_arrays("mla", [memory[:4], memory[1:]])


def test_layers_that_overlap_by_part_of_a_block_are_refused():
    memory = _random((128,))  # blocks 32 bytes apart, each two runs of 8 bytes, 16 apart
    first, second = (
        np.lib.stride_tricks.as_strided(memory[start:], (4, 2, 4), (32, 16, 2)) for start in (0, 19)
    )  # the second's block 0 starts 38 bytes in: 6 bytes into the first's block 1
    with pytest.raises(ValueError, match=r"kv_caches\[0\] and kv_caches\[1\] overlap: block 1"):
        KVLayout.from_arrays("mla", [first, second])


@pytest.mark.parametrize("stride", [0, 8])
def test_a_block_axis_stride_shorter_than_a_block_is_refused(stride):
    memory = _random((64,))
    overlapping = np.lib.stride_tricks.as_strided(memory, (4, 2, 4), (stride, 8, 2))  # 16 B blocks
    with pytest.raises(ValueError, match=f"blocks overlap: the block axis' stride is {stride} "):
        KVLayout.from_arrays("mla", [overlapping])


@pytest.mark.parametrize(
    ("kind", "arrays"),
    [
        pytest.param("mla", lambda: [_random((4, 2, 4))] * 3, id="one-cache-for-three-layers"),
        pytest.param(
            "flashinfer",
            lambda: [_random((4, 3, 2, 2, 2, 4))[:, layer] for layer in range(3)],
            id="flashinfer-layers-interleaved-in-one-array",
        ),
        pytest.param(
            "mla",
            lambda: [
                np.lib.stride_tricks.as_strided(memory[start:], (4, 2, 4), (32, 16, 2))
                for memory in [_random((128,))]
                for start in (0, 3)
            ],
            id="layers-overlapping-within-each-block",  # 6 bytes apart, blocks 32
        ),
    ],
)
def test_layers_that_share_bytes_within_a_block_or_none_are_accepted(kind, arrays):
    layout = KVLayout.from_arrays(kind, arrays())
    assert layout.num_blocks == 4


@settings(max_examples=300, deadline=None)
@given(
    num_blocks=st.integers(1, 5),
    chunk_bytes=st.integers(1, 8),
    stride_over_chunk=st.integers(0, 12),
    offsets=st.lists(st.integers(0, 60), min_size=1, max_size=5),
)
def test_blocks_are_found_apart_exactly_when_no_byte_is_in_two_blocks(
    num_blocks, chunk_bytes, stride_over_chunk, offsets
):
    block_stride = chunk_bytes + stride_over_chunk
    owners: dict[int, set[int]] = {}  # byte -> the blocks that hold it, by brute force
    for offset in offsets:
        for block in range(num_blocks):
            start = offset + block * block_stride
            for byte in range(start, start + chunk_bytes):
                owners.setdefault(byte, set()).add(block)
    shared = any(len(blocks) > 1 for blocks in owners.values())
    check = partial(
        layouts._check_blocks_apart,
        LayoutKind.MLA,
        num_blocks,
        chunk_bytes,
        block_stride,
        np.array(offsets, dtype=np.int64),
        1,
    )
    if shared:
        with pytest.raises(ValueError, match="overlap"):
            check()
    else:
        check()

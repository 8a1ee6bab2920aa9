"""Describe the engine's GPU KV cache as byte ranges the transfer kernels can address.

A `KVLayout` is built from the engine's own arrays, zero-copy, and reduces every supported layout
to one shape: each (layer, chunk) pair is a *segment*; block `b` of segment `s` is `chunk_bytes`
contiguous bytes at `arena + segment_offsets[s] + b * block_stride`. The arena is a single word
view spanning the address range of all layers, so a kernel reaches every layer through one array
argument plus a small offset table (see docs/DATAPATH.md for why).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from numbakv.datapath._device import (
    array_interface,
    current_device_id,
    interface_strides,
    pointer_device,
    word_view,
)

WORD_DTYPES = (np.dtype(np.uint64), np.dtype(np.uint32), np.dtype(np.uint16), np.dtype(np.uint8))
"""Kernel access widths, widest first; a layout uses the widest that every address and size allows."""


class LayoutKind(str, Enum):
    """The engine's KV-cache layouts, named by where the block axis sits."""

    FLASH_ATTN = "flash_attn"  # per layer [2, num_blocks, block_size, num_kv_heads, head_size]
    FLASHINFER = "flashinfer"  # per layer [num_blocks, 2, block_size, num_kv_heads, head_size]
    MLA = "mla"  # per layer [num_blocks, block_size, head_size]
    CROSS_LAYER = "cross_layer"  # one array [num_blocks, num_layers, ...]


_BLOCK_AXIS = {
    LayoutKind.FLASH_ATTN: 1,
    LayoutKind.FLASHINFER: 0,
    LayoutKind.MLA: 0,
    LayoutKind.CROSS_LAYER: 0,
}
_SHAPE_HINT = {
    LayoutKind.FLASH_ATTN: "[2, num_blocks, block_size, num_kv_heads, head_size]",
    LayoutKind.FLASHINFER: "[num_blocks, 2, block_size, num_kv_heads, head_size]",
    LayoutKind.MLA: "[num_blocks, block_size, head_size]",
    LayoutKind.CROSS_LAYER: "[num_blocks, num_layers, ...]",
}


@dataclass(frozen=True, eq=False)
class KVLayout:
    """The engine's KV cache as segments of an arena; a host block holds one block of every segment."""

    kind: LayoutKind
    num_layers: int
    num_blocks: int
    dtype: np.dtype
    chunk_bytes: int
    block_stride: int
    segment_offsets: np.ndarray = field(repr=False)  # the arrays print as their sizes do
    word: np.dtype
    arena: Any = field(repr=False)
    arrays: tuple = field(repr=False)
    device: int

    @property
    def num_segments(self) -> int:
        return len(self.segment_offsets)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers: the size of one host block."""
        return self.num_segments * self.chunk_bytes

    def layer_segments(self, layers: range | None) -> tuple[int, int]:
        """(first segment, number of segments) of the layers `layers` names (None: every layer).
        One line naming `layers` when it is not a non-empty `range` of this cache's layers with
        step 1, or when a block keeps its layers in one run (a contiguous cross-layer cache)."""
        if layers is None or layers == range(self.num_layers):
            return 0, self.num_segments
        if not isinstance(layers, range):
            raise TypeError(f"layers must be a range of layer indices, got {type(layers).__name__}")
        if layers.step != 1 or not 0 <= layers.start < layers.stop <= self.num_layers:
            raise ValueError(
                f"layers must be a non-empty range within [0, {self.num_layers}) with step 1, "
                f"got {layers!r}"
            )
        per_layer, rest = divmod(self.num_segments, self.num_layers)
        if rest or not per_layer:
            raise ValueError(
                f"layers: this {self.kind.value} cache holds all {self.num_layers} layers of a "
                "block in one contiguous run, which moves whole; pass layers=None"
            )
        return layers.start * per_layer, len(layers) * per_layer

    @classmethod
    def from_arrays(cls, kind: LayoutKind | str, kv_caches: Any | Sequence[Any]) -> KVLayout:
        """Describe `kv_caches` (a list of per-layer arrays, or one array for CROSS_LAYER)."""
        kind = LayoutKind(kind)
        arrays = _as_layer_list(kind, kv_caches)
        interfaces = [array_interface(array) for array in arrays]
        shape = tuple(int(extent) for extent in interfaces[0]["shape"])
        strides = interface_strides(interfaces[0])
        dtype = np.dtype(interfaces[0]["typestr"])
        _check_shape(kind, shape, strides)
        for layer, interface in enumerate(interfaces[1:], start=1):
            _check_same_as_first(layer, interface, shape, strides, dtype)
        device = _check_devices(interfaces)

        block_axis = _BLOCK_AXIS[kind]
        block_stride = strides[block_axis]
        inner_shape = shape[:block_axis] + shape[block_axis + 1 :]
        inner_strides = strides[:block_axis] + strides[block_axis + 1 :]
        chunk_bytes, chunk_offsets = _contiguous_chunks(inner_shape, inner_strides, dtype.itemsize)

        bases = np.array([interface["data"][0] for interface in interfaces], dtype=np.int64)
        arena_base = int(bases.min())
        extent = sum((n - 1) * s for n, s in zip(shape, strides)) + dtype.itemsize
        arena_bytes = int(bases.max()) + extent - arena_base
        segment_offsets = ((bases - arena_base)[:, None] + chunk_offsets[None, :]).reshape(-1)
        _check_blocks_apart(
            kind, shape[block_axis], chunk_bytes, block_stride, segment_offsets, len(chunk_offsets)
        )
        word = _widest_word(arena_base, chunk_bytes, block_stride, segment_offsets)
        return cls(
            kind=kind,
            num_layers=shape[1] if kind is LayoutKind.CROSS_LAYER else len(arrays),
            num_blocks=shape[block_axis],
            dtype=dtype,
            chunk_bytes=chunk_bytes,
            block_stride=block_stride,
            segment_offsets=segment_offsets,
            word=word,
            arena=word_view(arena_base, arena_bytes, word, owner=tuple(arrays)),
            arrays=tuple(arrays),
            device=device,
        )


def _as_layer_list(kind: LayoutKind, kv_caches: Any) -> list:
    if kind is LayoutKind.CROSS_LAYER:
        arrays = list(kv_caches) if isinstance(kv_caches, (list, tuple)) else [kv_caches]
        if len(arrays) != 1:
            raise ValueError(f"cross_layer: expected one array, got {len(arrays)}")
        return arrays
    if not isinstance(kv_caches, (list, tuple)):
        raise TypeError(
            f"{kind.value}: expected a list of per-layer arrays, got {type(kv_caches).__name__}"
        )
    if not kv_caches:
        raise ValueError(f"{kind.value}: expected at least one layer, got an empty list")
    return list(kv_caches)


def _check_shape(kind: LayoutKind, shape: tuple, strides: tuple) -> None:
    hint = _SHAPE_HINT[kind]
    expected_ndim = {LayoutKind.FLASH_ATTN: 5, LayoutKind.FLASHINFER: 5, LayoutKind.MLA: 3}.get(
        kind
    )
    if expected_ndim is not None and len(shape) != expected_ndim:
        raise ValueError(
            f"{kind.value}: expected a {expected_ndim}-D array {hint}, got shape {shape}"
        )
    if kind is LayoutKind.CROSS_LAYER and len(shape) < 2:
        raise ValueError(f"cross_layer: expected at least 2-D {hint}, got shape {shape}")
    kv_axis = {LayoutKind.FLASH_ATTN: 0, LayoutKind.FLASHINFER: 1}.get(kind)
    if kv_axis is not None and shape[kv_axis] != 2:
        raise ValueError(
            f"{kind.value}: axis {kv_axis} must be 2 (K and V) in {hint}, got shape {shape}"
        )
    if 0 in shape:
        raise ValueError(f"{kind.value}: empty KV cache, shape {shape}")
    if any(stride < 0 for stride in strides):
        raise ValueError(f"{kind.value}: negative strides are not supported, got strides {strides}")


def _check_same_as_first(
    layer: int, interface: dict, shape: tuple, strides: tuple, dtype: np.dtype
) -> None:
    other_dtype = np.dtype(interface["typestr"])
    if other_dtype != dtype:
        raise ValueError(
            f"layer {layer} has dtype {other_dtype}, layer 0 has {dtype}: layers must agree"
        )
    other_shape = tuple(int(extent) for extent in interface["shape"])
    if other_shape != shape:
        raise ValueError(
            f"layer {layer} has shape {other_shape}, layer 0 has {shape}: layers must agree"
        )
    other_strides = interface_strides(interface)
    if other_strides != strides:
        raise ValueError(
            f"layer {layer} has strides {other_strides}, layer 0 has {strides}: layers must agree"
        )


def _check_devices(interfaces: list[dict]) -> int:
    """The one CUDA device every layer lives on, which must be the current one: the arena and the
    kernels belong to the current context, and another device's memory is an illegal address there.
    """
    current = current_device_id()  # first: a context must be current to ask about pointers
    devices = []
    for layer, interface in enumerate(interfaces):
        try:
            devices.append(pointer_device(interface["data"][0]))
        except ValueError as error:
            raise ValueError(f"layer {layer}: {error}") from None
        if devices[layer] != devices[0]:
            raise ValueError(
                f"layer {layer} is on CUDA device {devices[layer]}, layer 0 on device "
                f"{devices[0]}: every layer must be on one device"
            )
    if devices[0] != current:
        raise ValueError(
            f"the KV cache is on CUDA device {devices[0]} but the current device is {current}: "
            f"make device {devices[0]} current first (torch.cuda.set_device or "
            "numba.cuda.select_device)"
        )
    return devices[0]


def _check_blocks_apart(
    kind: LayoutKind,
    num_blocks: int,
    chunk_bytes: int,
    block_stride: int,
    segment_offsets: np.ndarray,
    segments_per_array: int,
) -> None:
    """Refuse a cache in which two blocks share a byte: loading one would overwrite the other.

    Segments of one block may share bytes: layers that share one KV cache (vLLM's KV sharing) are
    stored twice and written back identical. Segment s's chunk of block b starts at
    `segment_offsets[s] + b * block_stride`, so chunks of two different blocks meet where two
    offsets lie apart by less than `chunk_bytes` from a multiple m of the stride, 0 < m <
    num_blocks: only pairs more than a stride less a chunk apart, and less than the whole cache's
    reach, can (none, in the layouts engines use).
    """
    if num_blocks == 1:
        return
    if block_stride < chunk_bytes:
        raise ValueError(
            f"{kind.value}: blocks overlap: the block axis' stride is {block_stride} bytes and each "
            f"block holds runs of {chunk_bytes}"
        )
    order = np.argsort(segment_offsets, kind="stable")
    offsets = segment_offsets[order]
    reach = (num_blocks - 1) * block_stride + chunk_bytes
    first = np.searchsorted(offsets, offsets + block_stride - chunk_bytes, side="right")
    past = np.searchsorted(offsets, offsets + reach, side="left")
    for step in range(int((past - first).max(initial=0))):
        near = np.flatnonzero(first + step < past)
        apart = offsets[first[near] + step] - offsets[near]
        multiple = np.maximum(1, (apart - chunk_bytes) // block_stride + 1)
        meet = np.flatnonzero(multiple * block_stride < apart + chunk_bytes)
        if meet.size:
            pair = near[meet[0]]
            one, other = order[pair], order[first[pair] + step]
            raise ValueError(
                f"{kind.value}: kv_caches[{one // segments_per_array}] and "
                f"kv_caches[{other // segments_per_array}] overlap: block "
                f"{multiple[meet[0]]} of the first shares bytes with block 0 of the second, and "
                "each block needs bytes of its own"
            )


def _contiguous_chunks(shape: tuple, strides: tuple, itemsize: int) -> tuple[int, np.ndarray]:
    """Split one block's sub-array into equal contiguous runs: (run bytes, run offsets in C order)."""
    run_bytes, axis = itemsize, len(shape)
    while axis > 0 and (shape[axis - 1] == 1 or strides[axis - 1] == run_bytes):
        run_bytes *= shape[axis - 1]
        axis -= 1
    offsets = np.zeros(1, dtype=np.int64)
    for extent, stride in zip(shape[:axis], strides[:axis]):
        offsets = (offsets[:, None] + np.arange(extent, dtype=np.int64) * stride).reshape(-1)
    return run_bytes, offsets


def _widest_word(
    arena_base: int, chunk_bytes: int, block_stride: int, segment_offsets: np.ndarray
) -> np.dtype:
    alignment = np.gcd.reduce(np.append(segment_offsets, [arena_base, chunk_bytes, block_stride]))
    return next(word for word in WORD_DTYPES if alignment % word.itemsize == 0)

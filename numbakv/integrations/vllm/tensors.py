"""vLLM's canonical KV tensors as the byte arrays the data path takes, zero-copy.

Needs torch, not vLLM: the GPU tests drive the worker's transfer core through it without vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def torch_block_arrays(
    tensors: Sequence[Any], page_sizes: Sequence[int], on_simulator: bool
) -> tuple[list[Any], Callable[[], Any] | None]:
    """vLLM's canonical KV tensors as `[num_blocks, page_bytes]` byte arrays, and the compute
    stream to order jobs after, zero-copy.

    CUDA tensors are taken as they are (the kernels reach them through __cuda_array_interface__),
    ordered after torch's current stream; on the CUDA simulator CPU tensors become NumPy views.
    """
    import torch

    arrays = [tensor.view(torch.int8).view(-1, page) for tensor, page in zip(tensors, page_sizes)]
    devices = {array.device.type for array in arrays}
    if on_simulator:
        if devices != {"cpu"}:
            raise ValueError(
                f"the CUDA simulator reaches CPU tensors only; the KV caches are on {sorted(devices)}"
            )
        return [array.numpy() for array in arrays], None
    if devices != {"cuda"}:
        raise ValueError(
            f"numbakv's kernels need the KV caches on a CUDA GPU, got {sorted(devices)} "
            "(CPU tensors run on the CUDA simulator: NUMBA_ENABLE_CUDASIM=1)"
        )
    return arrays, torch.cuda.current_stream

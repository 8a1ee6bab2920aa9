"""Bridge between engine arrays, raw addresses and kernel arguments, on a GPU and on the simulator.

Everything that differs between a real GPU and Numba's CUDA simulator lives here, so the rest of
the data path is written once. On a GPU an array is described by its `__cuda_array_interface__`
and a raw address becomes a `DeviceNDArray` without copying; on the simulator "device" memory is
NumPy memory, so the same address becomes a NumPy view wrapped as a simulated device array.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
from numba import cuda
from numba.cuda.core import config

ON_SIMULATOR: bool = bool(config.ENABLE_CUDASIM)

if ON_SIMULATOR:
    CUDA_ERRORS: tuple[type[Exception], ...] = ()  # the simulator raises no driver errors
else:
    from numba.cuda.cudadrv.driver import CudaAPIError

    CUDA_ERRORS = (CudaAPIError,)


def array_interface(array: Any) -> dict:
    """The CUDA array interface of `array` (on the simulator: of the NumPy memory behind it)."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is not None:
        return interface
    if ON_SIMULATOR:
        backing = getattr(array, "_ary", array)  # simulated device/mapped arrays wrap a NumPy array
        if isinstance(backing, np.ndarray):
            return backing.__array_interface__
    raise TypeError(
        f"expected a GPU array exposing __cuda_array_interface__ (torch, CuPy, Numba), got {type(array).__name__}"
    )


def interface_strides(interface: dict) -> tuple[int, ...]:
    """Byte strides from an array interface (which leaves them out for C-contiguous arrays)."""
    strides = interface.get("strides")
    if strides is not None:
        return tuple(int(s) for s in strides)
    itemsize = np.dtype(interface["typestr"]).itemsize
    shape = interface["shape"]
    result, step = [], itemsize
    for extent in reversed(shape):
        result.append(step)
        step *= int(extent)
    return tuple(reversed(result))


def word_view(address: int, nbytes: int, word: np.dtype, owner: Any) -> Any:
    """A 1-D kernel argument of `word`s over `nbytes` at `address`, zero-copy; keeps `owner` alive."""
    length = nbytes // word.itemsize
    if ON_SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        raw = (ctypes.c_uint8 * nbytes).from_address(address)
        simulated = FakeCUDAArray(np.frombuffer(raw, dtype=word, count=length))
        simulated.owner = owner
        return simulated
    interface = {
        "shape": (length,),
        "strides": None,
        "typestr": word.str,
        "data": (address, False),
        "version": 3,
    }
    return cuda.from_cuda_array_interface(interface, owner=owner, sync=False)


def upload_prefix(device: Any, host: np.ndarray, count: int, stream: Any) -> None:
    """Copy `host[:count]` (pinned) into `device[:count]`, asynchronously on `stream`."""
    if ON_SIMULATOR:
        device._ary[:count] = host[:count]
        return
    from numba.cuda.cudadrv import driver

    driver.host_to_device(device, host, count * host.itemsize, stream=stream)


def event_done(event: Any) -> bool:
    """Whether all work before `event`'s last record has finished, without blocking."""
    query = getattr(event, "query", None)  # the simulator runs synchronously and has no query()
    return True if query is None else bool(query())


def foreign_stream(stream: Any) -> Any:
    """A Numba stream over a foreign stream's `cuda_stream` handle (torch's streams have one)."""
    return cuda.external_stream(int(stream.cuda_stream))

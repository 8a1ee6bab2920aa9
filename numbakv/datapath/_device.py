"""Bridge between engine arrays, raw handles and kernel launches, on a GPU and on the simulator.

Everything that differs between a real GPU and Numba's CUDA simulator lives here, so the rest of
the data path is written once. On a GPU an array is described by its `__cuda_array_interface__`,
a raw address becomes a `DeviceNDArray` without copying, and the per-job work of `submit` (event
records, the id upload, the launch, a staged round's batched copy) goes straight to the driver with
arguments prepared once. On
the simulator "device" memory is NumPy memory and execution is synchronous: the same address
becomes a NumPy view wrapped as a simulated device array, ordering calls have nothing to do, and
a batch of block copies is a loop of memmoves over the same addresses.
"""

from __future__ import annotations

import ctypes
import time
import warnings
from typing import Any

import numpy as np
from numba import cuda
from numba.cuda.core import config
from numba.cuda.cudadrv.driver import CudaAPIError  # on the simulator: a class nothing raises

ON_SIMULATOR: bool = bool(config.ENABLE_CUDASIM)

if not ON_SIMULATOR:
    from numba.cuda.cudadrv.driver import (
        Event,
        Stream,
        _event_finalizer,
        _stream_finalizer,
        binding,
        driver,
    )


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


def map_host(array: np.ndarray) -> tuple[int, Any]:
    """Existing host memory (C-contiguous `array`) made reachable by the current device's kernels,
    pinned and mapped: its device address, and the registration, which holds while referenced.

    On the simulator kernels reach host memory as it is.
    """
    if ON_SIMULATOR:
        return array.ctypes.data, None
    registration = cuda.current_context().mempin(
        array, array.ctypes.data, array.nbytes, mapped=True
    )
    return int(registration.device_pointer_value), registration


# --- devices --------------------------------------------------------------------------------


def current_device_id() -> int:
    """The device of Numba's current CUDA context (made current by torch or Numba, whichever
    touched CUDA first in this thread)."""
    if ON_SIMULATOR:
        return 0
    return int(cuda.current_context().device.id)


def pointer_device(address: int) -> int:
    """The device that owns the device memory at `address`; ValueError if it is not CUDA memory."""
    if ON_SIMULATOR:
        return 0
    attribute = binding.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    try:
        return int(driver.cuPointerGetAttribute(attribute, binding.CUdeviceptr(address)))
    except CudaAPIError as error:
        raise ValueError(f"address {address:#x} is not CUDA memory ({error})") from None


# --- streams, events, uploads ---------------------------------------------------------------


def new_stream() -> Any:
    """A stream that does not synchronise with the legacy default stream (torch's default).

    Numba's `cuda.stream()` creates blocking streams: a store would wait for all compute queued
    on the default stream, and the next compute for the store. Ours are ordered only by the
    events the caller passes.
    """
    if ON_SIMULATOR:
        return cuda.stream()
    deallocations = cuda.current_context().deallocations  # also makes a context current
    handle = driver.cuStreamCreate(binding.CUstream_flags.CU_STREAM_NON_BLOCKING.value)
    return Stream(handle, finalizer=_stream_finalizer(deallocations, handle))


def new_event(*, timing: bool = True, blocking: bool = False) -> Any:
    """A Numba event; `blocking` makes `synchronize()` sleep instead of spinning a CPU core."""
    if ON_SIMULATOR:
        return cuda.event()
    flags = 0 if timing else int(binding.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    if blocking:
        flags |= int(binding.CUevent_flags.CU_EVENT_BLOCKING_SYNC)
    deallocations = cuda.current_context().deallocations  # also makes a context current
    handle = driver.cuEventCreate(flags)
    return Event(handle, finalizer=_event_finalizer(deallocations, handle))


def handle_of(stream_or_event: Any) -> int:
    """The raw driver handle of a Numba stream or event (0 on the simulator)."""
    return 0 if ON_SIMULATOR else int(stream_or_event.handle)


def record(event: int, stream: int) -> None:
    """cuEventRecord on raw handles."""
    if not ON_SIMULATOR:
        driver.cuEventRecord(event, stream)


def stream_wait(stream: int, event: int) -> None:
    """Make `stream` wait for `event`'s last record (raw handles)."""
    if not ON_SIMULATOR:
        driver.cuStreamWaitEvent(stream, event, 0)


def event_done(event: Any) -> bool:
    """Whether all work before `event`'s last record has finished, without blocking."""
    return True if ON_SIMULATOR else bool(event.query())


def synchronize(event: Any, spin_seconds: float) -> None:
    """Wait until all work before `event`'s last record has finished: poll it for up to
    `spin_seconds` (a short job is seen done as soon as a polling engine would see it), then sleep
    in the driver (a blocking-sync event wakes the thread when the GPU gets there)."""
    if ON_SIMULATOR:
        return
    deadline = time.perf_counter() + spin_seconds
    while time.perf_counter() < deadline:
        if event.query():
            return
    event.synchronize()


def device_address(array: Any) -> int:
    """The address of a Numba device or pinned array's first byte (0 on the simulator)."""
    if ON_SIMULATOR:
        return 0
    interface = getattr(array, "__cuda_array_interface__", None) or array.__array_interface__
    return int(interface["data"][0])


def upload(
    device: Any, device_at: int, host: np.ndarray, host_at: int, count: int, stream: int
) -> None:
    """Copy `host[:count]` (pinned, at `host_at`) into `device[:count]` (at `device_at`),
    asynchronously on `stream`."""
    if ON_SIMULATOR:
        device._ary[:count] = host[:count]
        return
    driver.cuMemcpyHtoDAsync(device_at, host_at, count * host.itemsize, stream)


# --- kernel launches ------------------------------------------------------------------------


class Launcher:
    """One kernel with fixed arguments except a few scalars set per launch, on one stream.

    Numba's launch path rebuilds about 30 kernel parameters from Python objects on every call.
    Here Numba prepares them once (its own `_prepare_args`, so they match its lowering exactly),
    they are packed into a parameter block, and a launch rewrites only the scalars at
    `variable_positions` (in that order) before one `cuLaunchKernel`. That leans on numba-cuda
    internals: where they differ from what this was written against (0.30), it warns once and
    launches through Numba's own path, slower but right. The simulator always takes Numba's path.
    """

    def __init__(
        self,
        kernel: Any,
        args: tuple,
        variable_positions: tuple[int, ...],
        threads_per_block: int,
        stream: Any,
    ) -> None:
        self._kernel = kernel
        self._stream = stream
        self._threads = threads_per_block
        self._args = list(args)  # also keeps every argument's memory alive
        self._variable_positions = variable_positions
        self._function = None  # set when the driver launch is prepared
        if ON_SIMULATOR:
            return
        try:
            self._prepare_driver_launch(kernel, args, variable_positions)
        except (AttributeError, TypeError, ValueError, NotImplementedError, StopIteration) as error:
            warnings.warn(
                "numbakv: this numba-cuda's kernel internals differ from what the fast launch "
                f"expects ({type(error).__name__}: {error}); launching through Numba's own path, "
                "which adds tens of microseconds to each submit",
                RuntimeWarning,
                stacklevel=2,
            )

    def _prepare_driver_launch(
        self, kernel: Any, args: tuple, variable_positions: tuple[int, ...]
    ) -> None:
        compiled = next(iter(kernel.overloads.values()))
        values: list = []
        indices = {}
        for position, (numba_type, value) in enumerate(zip(compiled.argument_types, args)):
            if position in variable_positions:
                indices[position] = len(values)
            compiled._prepare_args(numba_type, value, 0, [], values)
        self._variable_indices = tuple(indices[position] for position in variable_positions)
        self._params = (ctypes.c_uint64 * len(values))(*map(_parameter_word, values))
        base = ctypes.addressof(self._params)
        self._pointers = (ctypes.c_void_p * len(values))(
            *(base + 8 * i for i in range(len(values)))
        )
        self._pointers_at = ctypes.addressof(self._pointers)
        self._stream_handle = int(self._stream.handle)
        handle = compiled._codelibrary.get_cufunc().handle
        if isinstance(handle, binding.CUkernel):  # library-loaded: this context's function
            handle = driver.cuKernelGetFunction(handle)
        self._function = handle

    @property
    def uses_driver_launch(self) -> bool:
        """Whether launches skip Numba's per-call argument handling."""
        return self._function is not None

    def __call__(self, grid: int, *values: int) -> None:
        if self._function is None:
            for position, value in zip(self._variable_positions, values):
                self._args[position] = value
            self._kernel[grid, self._threads, self._stream](*self._args)
            return
        for index, value in zip(self._variable_indices, values):
            self._params[index] = value
        driver.cuLaunchKernel(
            self._function,
            grid,
            1,
            1,
            self._threads,
            1,
            1,
            0,
            self._stream_handle,
            self._pointers_at,
            0,
        )


def _parameter_word(value: Any) -> int:
    """A kernel parameter as the 8-byte word the driver copies (every parameter here is 8 bytes:
    array fields, pointers and int64 scalars)."""
    if isinstance(value, ctypes._SimpleCData):
        if ctypes.sizeof(value) != 8:
            raise TypeError(f"unexpected {ctypes.sizeof(value)}-byte kernel parameter {value!r}")
        value = value.value
    return int(value) % 2**64


# --- batched block copies (the staged path) -----------------------------------------------

_BATCH_COPY_VERSION = 12080  # CUDA 12.8 introduced cuMemcpyBatchAsync


def batch_copy_unsupported() -> str | None:
    """Why one driver call cannot copy a batch of blocks here (None: it can)."""
    if ON_SIMULATOR:
        return None
    version = int(driver.cuDriverGetVersion())
    if version < _BATCH_COPY_VERSION:
        return (
            f"the CUDA driver supports CUDA {version // 1000}.{version % 1000 // 10}; batched "
            "copies (cuMemcpyBatchAsync) need 12.8"
        )
    return None


class BatchCopy:
    """Copies of `count` byte ranges (`dsts[i]` <- `srcs[i]`, `sizes[i]` bytes) in one driver call,
    queued on one stream: cuMemcpyBatchAsync, so the copy engines move them while the SMs are
    free, and no Python runs per range. The address arrays are int64 arrays the caller keeps and
    refills; the driver reads them during the call. On the simulator: a memmove per range.
    """

    def __init__(self, stream: Any, dsts: np.ndarray, srcs: np.ndarray, sizes: np.ndarray) -> None:
        for array in (dsts, srcs, sizes):
            if array.dtype != np.int64 or not array.flags.c_contiguous:
                raise TypeError("batch copy addresses and sizes must be C-contiguous int64 arrays")
        self._arrays = (dsts, srcs, sizes)
        if ON_SIMULATOR:
            return
        self._stream_handle = int(stream.handle)
        self._pointers = tuple(array.ctypes.data for array in self._arrays)
        version = int(driver.cuDriverGetVersion())
        abi = 13000 if version >= 13000 else _BATCH_COPY_VERSION  # 13.0 dropped `failIdx`
        function, _status = driver.cuGetProcAddress(
            b"cuMemcpyBatchAsync",
            abi,
            int(binding.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT),
        )
        if not int(function):
            raise RuntimeError(f"the CUDA driver ({version}) has no cuMemcpyBatchAsync")
        pointer, size = ctypes.c_void_p, ctypes.c_size_t
        arguments = [pointer, pointer, pointer, size, pointer, pointer, size]
        arguments += [pointer] if abi < 13000 else []
        self._call = ctypes.CFUNCTYPE(ctypes.c_int, *arguments, pointer)(int(function))
        # One set of attributes for every copy: in stream order, the copy engines preferred.
        self._attributes = binding.CUmemcpyAttributes()
        self._attributes.srcAccessOrder = (
            binding.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        )
        self._attributes.flags = int(
            binding.CUmemcpyFlags.CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
        )
        self._attribute_index = (ctypes.c_size_t * 1)(0)
        self._failed_index = (ctypes.c_size_t * 1)(0)
        self._tail = (
            (self._attributes.getPtr(), ctypes.addressof(self._attribute_index), 1)
            + ((ctypes.addressof(self._failed_index),) if abi < 13000 else ())
            + (self._stream_handle,)
        )

    def __call__(self, count: int) -> None:
        """Queue the first `count` copies of the arrays."""
        if not count:
            return
        if ON_SIMULATOR:
            for dst, src, size in zip(*(array[:count].tolist() for array in self._arrays)):
                ctypes.memmove(dst, src, size)
            return
        result = self._call(*self._pointers, count, *self._tail)
        if result:
            raise CudaAPIError(result, f"Call to cuMemcpyBatchAsync results in CUresult {result}")

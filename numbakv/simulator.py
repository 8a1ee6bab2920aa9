"""Choosing Numba's CUDA simulator on machines without a GPU, before Numba is first imported."""

from __future__ import annotations

import ctypes.util
import os


def has_cuda_driver() -> bool:
    """Whether this machine has an NVIDIA driver (without importing Numba)."""
    return ctypes.util.find_library("cuda") is not None or os.path.exists("/dev/nvidia0")


def simulate_without_gpu() -> bool:
    """Turn on the CUDA simulator unless a driver is present or the choice was made already.

    Numba reads NUMBA_ENABLE_CUDASIM once, when numba.cuda is first imported, so call this first.
    Returns whether the simulator is in use.
    """
    if "NUMBA_ENABLE_CUDASIM" not in os.environ and not has_cuda_driver():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

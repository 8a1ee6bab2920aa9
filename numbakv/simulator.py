"""Choosing Numba's CUDA simulator on machines without a GPU, before Numba CUDA is first imported."""

from __future__ import annotations

import ctypes.util
import logging
import os
import sys

logger = logging.getLogger(__name__)


def has_cuda_driver() -> bool:
    """Whether this machine has an NVIDIA driver (without importing Numba)."""
    return ctypes.util.find_library("cuda") is not None or os.path.exists("/dev/nvidia0")


def simulate_without_gpu() -> bool:
    """Turn on the CUDA simulator unless a driver is present or the choice was made already
    (`NUMBA_ENABLE_CUDASIM` set); say so in one log line. Returns whether the simulator is in use.

    Numba reads NUMBA_ENABLE_CUDASIM once, when Numba CUDA is first imported: the data path calls
    this before it imports Numba, and raises if Numba CUDA came first on a machine without a GPU.
    """
    if "NUMBA_ENABLE_CUDASIM" not in os.environ and not has_cuda_driver():
        if "numba.cuda" in sys.modules:
            raise RuntimeError(
                "numbakv: no NVIDIA driver here, and Numba CUDA was imported before numbakv could "
                "choose its simulator: set NUMBA_ENABLE_CUDASIM=1 before Python starts, or import "
                "numbakv.datapath before numba.cuda"
            )
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        logger.warning(
            "numbakv: no NVIDIA driver here: the data path runs on Numba's CUDA simulator, an "
            "interpreter (small sizes only; transfers are not timed)"
        )
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

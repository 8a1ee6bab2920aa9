"""Test-wide setup: the CUDA simulator stands in for a GPU on machines without one."""

import ctypes.util
import os

import pytest


def _machine_has_cuda_driver() -> bool:
    return ctypes.util.find_library("cuda") is not None or os.path.exists("/dev/nvidia0")


# Numba reads this once, at its first import of numba.cuda: decide before any test imports it.
if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _machine_has_cuda_driver():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

ON_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def pytest_collection_modifyitems(config, items):
    if not ON_SIMULATOR:
        return
    skip_gpu = pytest.mark.skip(reason="needs a real CUDA GPU (running on the CUDA simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)

"""Test-wide setup: the CUDA simulator stands in for a GPU on machines without one."""

import pytest

from numbakv.simulator import simulate_without_gpu

ON_SIMULATOR = simulate_without_gpu()  # before any test imports numba.cuda


def pytest_collection_modifyitems(config, items):
    if not ON_SIMULATOR:
        return
    skip_gpu = pytest.mark.skip(reason="needs a real CUDA GPU (running on the CUDA simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)

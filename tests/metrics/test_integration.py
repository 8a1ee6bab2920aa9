"""Metrics fed by the real manager and the real transfer engine (on the CUDA simulator)."""

import numpy as np
from prometheus_client import CollectorRegistry

from numbakv import CPUOffloadingManager, KVOffloader
from numbakv.datapath import HostPool, TransferEngine
from numbakv.metrics import OffloadMetrics
from tests.support.datapath_cases import make_cache


def test_offloader_activity_reaches_the_exported_metrics(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    cache = make_cache("flashinfer", np.random.default_rng(3), num_layers=2, num_blocks=8)
    manager = CPUOffloadingManager(block_size=2, num_blocks=4, cache_policy="arc")
    registry = CollectorRegistry()
    metrics = OffloadMetrics(manager, instance="gpu0", registry=registry, enabled=True)
    engine = TransferEngine(
        cache.layout,
        HostPool.for_layout(cache.layout, 4),
        threads_per_block=32,
        on_job_done=metrics.on_job_done,
    )
    offloader = KVOffloader(manager, engine)
    offloader.wait(offloader.store([1, 2, 3], [0, 1, 2]))
    assert offloader.lookup([1, 2, 3, 9]) == 3
    offloader.wait(offloader.load([1, 2], [5, 6]))
    offloader.wait(offloader.store([4, 5], [3, 4]))  # evicts one block
    offloader.poll()

    def value(name, **labels):
        return registry.get_sample_value(name, {"instance": "gpu0", **labels})

    manager_labels = {"policy": "arc"}
    assert value("numbakv_stored_blocks_total", **manager_labels) == 5
    assert value("numbakv_loaded_blocks_total", **manager_labels) == 2
    assert value("numbakv_evicted_blocks_total", **manager_labels) == 1
    assert value("numbakv_hit_blocks_total", **manager_labels) == 3
    assert value("numbakv_host_used_blocks", **manager_labels) == 4
    block_bytes = cache.layout.block_bytes
    assert value("numbakv_transfer_bytes_total", direction="store") == 5 * block_bytes
    assert value("numbakv_transfer_bytes_total", direction="load") == 2 * block_bytes
    assert value("numbakv_transfer_jobs_total", direction="store") == 2
    assert value("numbakv_transfer_duration_seconds_count", direction="load") == 1
    assert value("numbakv_arc_p_blocks", **manager_labels) is not None

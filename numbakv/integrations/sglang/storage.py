"""`NumbaKVHiCacheStorage`: numbakv's tiers as an SGLang HiCache storage backend.

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
      '{"backend_name": "numbakv", "module_path": "numbakv.integrations.sglang",
        "class_name": "NumbaKVHiCacheStorage", "interface_v1": 1, "tier": "redis://host:6379/0"}'

SGLang builds it as `cls(storage_config, kwargs)` (settings checked then, nothing opened), then
hands it the host KV pool (`register_mem_pool_host`): the tier opens there, its namespace and rows
taken from the pool. SGLang's cache controller calls it from its prefetch and backup threads; no
call raises into them: a store that is down, paused or refuses is a miss or a failed write, logged
by the tier, and anything unexpected is logged here and answered the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    PoolName,
)
from sglang.srt.observability.metrics_collector import StorageMetrics

from numbakv.integrations.sglang.namespace import head_shards
from numbakv.integrations.sglang.settings import backend_settings
from numbakv.integrations.sglang.transfers import HostPageStore
from numbakv.jobs import Direction
from numbakv.metrics import OffloadMetrics, shared_metrics
from numbakv.tiers.settings import redacted

logger = logging.getLogger("numbakv.integrations.sglang")

Answer = TypeVar("Answer")


class NumbaKVHiCacheStorage(HiCacheStorage):
    """SGLang's HiCache storage over one numbakv tier (`tier` in the extra config).

    Both of SGLang's paths: with `"interface_v1": 1`, `batch_get_v1`/`batch_set_v1` move pages by
    host index (the pool's own memory is the tier's rows where its layout allows); otherwise the
    generic `batch_get`/`batch_set` move flat page tensors. `batch_exists` answers how many pages
    from the first are stored, within the tier's lookup deadline. `get_stats` gives SGLang's
    storage metrics; numbakv's tier metrics go to PROMETHEUS_MULTIPROC_DIR beside SGLang's own.
    """

    def __init__(
        self, storage_config: HiCacheStorageConfig, kwargs: Mapping[str, Any] | None = None
    ) -> None:
        """`kwargs`: the factory's extra arguments, which SGLang 0.5.23 leaves empty."""
        self.settings = backend_settings(storage_config.extra_config)
        if head_shards(storage_config)[0] > 1 and not self.settings.interface_v1:
            raise ValueError(
                "tp_lcm_size: pages split into head groups (heterogeneous TP) need interface_v1: 1"
            )
        if storage_config.dcp_size > 1:
            raise ValueError("numbakv's HiCache backend does not serve decode context parallelism")
        self.storage_config = storage_config
        self.pages: HostPageStore | None = None
        self._metrics: OffloadMetrics | None = None
        self._log = _BatchLog(storage_config.enable_storage_metrics)

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Open the tier over SGLang's host KV pool; a store that cannot be opened raises here,
        which fails SGLang's attach with numbakv's one line."""
        if self.pages is not None:
            raise RuntimeError("the numbakv HiCache backend has its host pool already")
        super().register_mem_pool_host(mem_pool_host)
        self.pages = HostPageStore(self.settings, self.storage_config, mem_pool_host)
        config = self.storage_config
        instance = f"sglang-tp{config.tp_rank}"
        if config.pp_size > 1:
            instance += f"-pp{config.pp_rank}"
        if config.dp_rank:
            instance += f"-dp{config.dp_rank}"
        self._metrics = shared_metrics(instance, tiers=self.pages.tiers)
        logger.info(
            "numbakv HiCache backend: tier %s, %s path, pages of %d bytes %s",
            redacted(self.settings.tier),
            "zero-copy (batch_get_v1)" if self.settings.interface_v1 else "generic (batch_get)",
            self.pages.page_bytes,
            "read and written in place"
            if self.pages.direct
            else f"copied through {self.pages.batch} staging rows a direction",
        )

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """SGLang registers the KV pool here too; another pool (Mamba, SWA, indexer: a hybrid
        model's) is refused, which fails the attach."""
        if host_pool_name != PoolName.KV or host_pool is not getattr(self, "mem_pool_host", None):
            raise ValueError(
                f"numbakv's HiCache backend stores a model's KV pool only; this model also has a "
                f"{host_pool_name} pool (a hybrid model), which it does not serve"
            )
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    # --- SGLang's zero-copy path (interface_v1) ---

    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> list[bool]:
        """Load pages into the host pool at `host_indices`; which were loaded."""
        return self._pages_moved(
            Direction.LOAD, keys, lambda: self._store.load_pages(keys, host_indices)
        )

    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> list[bool]:
        """Store the host pool's pages at `host_indices`; which were stored."""
        return self._pages_moved(
            Direction.STORE, keys, lambda: self._store.store_pages(keys, host_indices)
        )

    # --- SGLang's generic path ---

    def batch_get(
        self,
        keys: list[str],
        target_locations: list[torch.Tensor] | None = None,
        target_sizes: Any = None,
    ) -> list[torch.Tensor | None]:
        targets = target_locations if target_locations is not None else [None] * len(keys)
        loaded = self._pages_moved(
            Direction.LOAD, keys, lambda: self._store.load_flat(keys, targets)
        )
        return [page if ok else None for page, ok in zip(targets, loaded)]

    def batch_set(
        self,
        keys: list[str],
        values: list[torch.Tensor] | None = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        pages = values if values is not None else [None] * len(keys)
        return all(
            self._pages_moved(Direction.STORE, keys, lambda: self._store.store_flat(keys, pages))
        )

    def get(
        self, key: str, target_location: torch.Tensor | None = None, target_sizes: Any = None
    ) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def set(
        self,
        key: str,
        value: torch.Tensor | None = None,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        return self.batch_set([key], [value])

    # --- lookups, statistics, lifetime ---

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many pages from the first are stored (SGLang's prefix count)."""
        return _answered(0, "batch_exists", lambda: self._store.exists(keys))

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get_stats(self) -> StorageMetrics | None:
        """Pages and GB/s of each batch since the last call, where SGLang's storage metrics are
        on (`--enable-cache-report` with metrics)."""
        return self._log.take()

    def clear(self) -> bool:
        """Drop every page stored in this backend's namespace (SGLang's `/clear_hicache_storage`,
        say after new weights under the same model name): every engine sharing the store loses
        them too, as they share the namespace. Whether the store answered."""
        return _answered(False, "clear", lambda: self._store.clear())

    def close(self) -> None:
        """Finish every transfer, then release the tier and the metrics."""
        opened, self.pages, self._metrics = (self.pages, self._metrics), None, None
        for part in opened:
            if part is not None:
                part.close()

    @property
    def _store(self) -> HostPageStore:
        if self.pages is None:
            raise RuntimeError("SGLang has not registered its host pool (register_mem_pool_host)")
        return self.pages

    def _pages_moved(
        self, direction: Direction, keys: list[str], move: Callable[[], np.ndarray]
    ) -> list[bool]:
        """`move()` (which pages of `keys` moved) timed and logged for get_stats; all False when
        it raises."""
        started = time.perf_counter()
        moved = _answered([False] * len(keys), direction.value, lambda: move().tolist())
        pages = sum(moved)
        if pages:
            self._log.record(direction, pages, pages * self._store.page_bytes, started)
        return moved


def _answered(failed: Answer, what: str, call: Callable[[], Answer]) -> Answer:
    """`call()`, or `failed` when it raises (logged): SGLang's controller gets an answer always."""
    try:
        return call()
    except Exception:
        logger.exception("numbakv HiCache backend: %s failed; answered as a miss", what)
        return failed


class _BatchLog:
    """Each batch's pages and GB/s since the last `take`, for SGLang's storage metrics (kept only
    where they are on: nothing else takes them)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._metrics = StorageMetrics()

    def record(self, direction: Direction, pages: int, nbytes: int, started: float) -> None:
        if not self.enabled:
            return
        gigabytes_per_s = nbytes / max(time.perf_counter() - started, 1e-9) / 1e9
        with self._lock:
            if direction is Direction.LOAD:
                self._metrics.prefetch_pgs.append(pages)
                self._metrics.prefetch_bandwidth.append(gigabytes_per_s)
            else:
                self._metrics.backup_pgs.append(pages)
                self._metrics.backup_bandwidth.append(gigabytes_per_s)

    def take(self) -> StorageMetrics | None:
        if not self.enabled:
            return None
        with self._lock:
            taken, self._metrics = self._metrics, StorageMetrics()
        return taken

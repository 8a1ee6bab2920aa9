"""`HostPageStore`: SGLang's host pages in numbakv tiers, one chunk a page (or a page's head group).

A tier moves chunks between its rows and its store on its own threads. Here the rows are either
SGLang's host pool itself, where a page is one range and pages tile the pool (`PageMap.direct_rows`:
nothing is copied), or staging rows that pages are copied through, a batch at a time: rows
`[0, batch)` for loads and `[batch, 2 * batch)` for stores, each half taken by one call at a time.
Every call waits for its jobs, so no row is touched after the call returns.

SGLang's generic path hands flat pages (tensors) instead of host indices; they are copied through
the same staging rows. Both paths store the same bytes (a page's ranges in address order), under
the same namespace.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from numbakv.integrations.sglang.namespace import directory_shares, head_shards, page_namespace
from numbakv.integrations.sglang.pages import PageMap, page_map
from numbakv.integrations.sglang.settings import BackendSettings, tier_share
from numbakv.jobs import Direction, FinishedJob
from numbakv.tiers import ChunkTier, open_tier


class _Jobs:
    """Futures of the jobs in flight, resolved by the tiers' `on_job_done`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._waiting: dict[int, Future[FinishedJob]] = {}

    def expect(self) -> tuple[int, Future[FinishedJob]]:
        future: Future[FinishedJob] = Future()
        with self._lock:
            job_id = next(self._ids)
            self._waiting[job_id] = future
        return job_id, future

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._waiting.pop(job_id, None)

    def finished(self, job: FinishedJob) -> None:
        with self._lock:
            future = self._waiting.pop(job.job_id, None)
        if future is not None:
            future.set_result(job)


@dataclass
class _Shard:
    """One head group's tier, its rows, and where its chunk lies in a page (None: flat pages)."""

    tier: ChunkTier
    rows: np.ndarray
    page_map: PageMap | None


class HostPageStore:
    """The pages of `host_pool` (SGLang's host KV pool) in the tier `settings` name, in the
    namespace `config` (SGLang's `HiCacheStorageConfig`) and the pool give.

    With `settings.interface_v1` pages move by host index (`load_pages`, `store_pages`);
    otherwise as flat page tensors (`load_flat`, `store_flat`). Keys are SGLang's page hashes.
    Bad input raises ValueError before anything moves; a store that fails makes misses.
    """

    def __init__(self, settings: BackendSettings, config: Any, host_pool: Any) -> None:
        split, _ = head_shards(config)
        self.by_index = settings.interface_v1
        self.page_size = host_pool.page_size
        self.host_tokens = host_pool.size
        if self.by_index:
            maps: list[PageMap | None] = list(page_map(host_pool, split))
            chunk_bytes = maps[0].chunk_bytes
            direct = maps[0].direct_rows() if split == 1 else None
        else:
            flat = host_pool.get_dummy_flat_data_page()
            maps, chunk_bytes, direct = [None], flat.numel() * flat.element_size(), None
        self.page_bytes = chunk_bytes * split
        self.direct = direct is not None
        self.batch = max(1, settings.staging_bytes // self.page_bytes)
        self._row_ids = np.arange(2 * self.batch)  # staging rows: loads first, then stores
        self._jobs = _Jobs()
        self._load_lock = threading.Lock()
        self._store_lock = threading.Lock()
        self._shards: list[_Shard] = []
        url, tier_settings = tier_share(settings, directory_shares(config))
        try:
            for shard, shard_map in enumerate(maps):
                rows = (
                    direct
                    if direct is not None
                    else np.empty((2 * self.batch, chunk_bytes), np.uint8)
                )
                namespace = page_namespace(config, host_pool, shard, chunk_bytes)
                tier = open_tier(
                    url, rows, namespace, on_job_done=self._jobs.finished, **tier_settings
                )
                self._shards.append(_Shard(tier, rows, shard_map))
        except BaseException:
            self.close()
            raise

    @property
    def tiers(self) -> dict[str, ChunkTier]:
        """The tiers by name, for numbakv's metrics: "hicache", or "hicache-<rank>" a head group."""
        if len(self._shards) == 1:
            return {"hicache": self._shards[0].tier}
        return {f"hicache-{s.tier.namespace.tensor_parallel_rank}": s.tier for s in self._shards}

    def exists(self, keys: Sequence[str]) -> int:
        """How many pages from the first are in the tier (every head group of each), found within
        the tier's lookup deadline: a late or failed answer counts as a miss."""
        encoded = _encoded(keys)
        lookups = [shard.tier.lookup(encoded) for shard in self._shards]
        found = np.ones(len(encoded), dtype=bool)
        for lookup in lookups:
            found &= np.asarray(lookup.answer(wait=True), dtype=bool)
        return len(found) if found.all() else int(np.argmin(found))

    def load_pages(self, keys: Sequence[str], host_indices: torch.Tensor) -> np.ndarray:
        """Load the pages into the host pool at `host_indices` (`page_size` a page, SGLang's
        `batch_get_v1`); which pages were loaded, each checked before it counts."""
        encoded, first_tokens = _encoded(keys), self._first_tokens(host_indices, len(keys))
        if self.direct:
            rows = self._shards[0].page_map.direct_row_of(first_tokens)
            return self._move(Direction.LOAD, encoded, rows)
        self._require_path(by_index=True)

        def unstage(part: slice, rows: slice, loaded: np.ndarray) -> None:
            for shard in self._shards:
                staged = shard.rows[rows] if loaded.all() else shard.rows[rows][loaded]
                shard.page_map.scatter(staged, first_tokens[part][loaded])

        return self._staged(Direction.LOAD, encoded, unstage)

    def store_pages(self, keys: Sequence[str], host_indices: torch.Tensor) -> np.ndarray:
        """Store the host pool's pages at `host_indices` (SGLang's `batch_set_v1`); which were."""
        encoded, first_tokens = _encoded(keys), self._first_tokens(host_indices, len(keys))
        if self.direct:
            rows = self._shards[0].page_map.direct_row_of(first_tokens)
            return self._move(Direction.STORE, encoded, rows)
        self._require_path(by_index=True)

        def stage(part: slice, rows: slice) -> None:
            for shard in self._shards:
                shard.page_map.gather(first_tokens[part], shard.rows[rows])

        return self._staged(Direction.STORE, encoded, stage)

    def load_flat(self, keys: Sequence[str], targets: Sequence[torch.Tensor]) -> np.ndarray:
        """Load the pages into flat page tensors (SGLang's generic `batch_get`); which were."""
        self._require_path(by_index=False)
        encoded, views = _encoded(keys), self._flat_views(targets, len(keys))
        (shard,) = self._shards

        def unstage(part: slice, rows: slice, loaded: np.ndarray) -> None:
            staged = shard.rows[rows]
            for index in np.flatnonzero(loaded):
                views[part.start + index][:] = staged[index]

        return self._staged(Direction.LOAD, encoded, unstage)

    def store_flat(self, keys: Sequence[str], values: Sequence[torch.Tensor]) -> np.ndarray:
        """Store flat page tensors (SGLang's generic `batch_set`); which were stored."""
        self._require_path(by_index=False)
        encoded, views = _encoded(keys), self._flat_views(values, len(keys))
        (shard,) = self._shards

        def stage(part: slice, rows: slice) -> None:
            for view, row in zip(views[part], shard.rows[rows]):
                row[:] = view

        return self._staged(Direction.STORE, encoded, stage)

    def clear(self) -> bool:
        """Every page of this backend's namespaces removed from the store (every head group's);
        whether the store answered for each."""
        return all(shard.tier.clear() is not None for shard in self._shards)

    def close(self) -> None:
        """Finish every job, then release the tiers (their threads, connections, files)."""
        for shard in self._shards:
            shard.tier.close()
        self._shards = []

    def _staged(self, direction: Direction, keys: np.ndarray, copy) -> np.ndarray:
        """Move `keys` through the staging rows, a batch at a time, one call a direction at a
        time: a store's `copy(part, rows)` fills the rows first, a load's `copy(part, rows,
        loaded)` empties them after (`part` the batch's pages, `rows` a slice: a view, never a
        copy). Which pages moved."""
        load = direction is Direction.LOAD
        first_row = 0 if load else self.batch
        moved = np.zeros(len(keys), dtype=bool)
        with self._load_lock if load else self._store_lock:
            for start in range(0, len(keys), self.batch):
                part = slice(start, min(start + self.batch, len(keys)))
                rows = slice(first_row, first_row + part.stop - start)
                if not load:
                    copy(part, rows)
                moved[part] = self._move(direction, keys[part], rows)
                if load:
                    copy(part, rows, moved[part])
        return moved

    def _move(self, direction: Direction, keys: np.ndarray, rows: np.ndarray | slice) -> np.ndarray:
        """Move `keys` through every head group's tier at `rows` (row ids, or a slice of the
        staging rows); which moved in all of them."""
        rows = self._row_ids[rows] if isinstance(rows, slice) else rows
        submitted = []
        try:
            for shard in self._shards:
                job_id, future = self._jobs.expect()
                submit = (
                    shard.tier.submit_load
                    if direction is Direction.LOAD
                    else shard.tier.submit_store
                )
                try:
                    submit(job_id, keys.tolist(), rows)
                except BaseException:
                    self._jobs.forget(job_id)
                    raise
                submitted.append(future)
        finally:  # rows in use until every submitted job has finished
            jobs = [future.result() for future in submitted]
            for shard in self._shards:
                shard.tier.take_finished()  # reported through the futures already
        failed = {key for job in jobs for key in job.failed_keys}
        return np.fromiter((key not in failed for key in keys), dtype=bool, count=len(keys))

    def _require_path(self, by_index: bool) -> None:
        """Refuse the path the extra config did not choose (SGLang calls that one only): its
        pages have no map, or its rows are the pool's own memory rather than staging rows."""
        if self.by_index != by_index:
            chosen = "batch_get_v1/batch_set_v1" if self.by_index else "batch_get/batch_set"
            raise ValueError(f"interface_v1 is {int(self.by_index)}: SGLang calls {chosen}")

    def _first_tokens(self, host_indices: torch.Tensor, pages: int) -> np.ndarray:
        """The first host index of each page, checked against the pool."""
        indices = torch.as_tensor(host_indices).reshape(-1)
        if indices.numel() != pages * self.page_size:
            raise ValueError(
                f"host_indices must hold page_size ({self.page_size}) indices a key, got "
                f"{indices.numel()} for {pages} keys"
            )
        first = indices[:: self.page_size].cpu().numpy().astype(np.int64)
        if len(first) and (first.min() < 0 or first.max() + self.page_size > self.host_tokens):
            raise ValueError(
                f"host_indices must lie in the host pool [0, {self.host_tokens}), got "
                f"{first.min()}..{first.max() + self.page_size - 1}"
            )
        return first

    def _flat_views(self, tensors: Sequence[torch.Tensor], pages: int) -> np.ndarray:
        """Each flat page tensor's bytes (no copy), checked to be one contiguous chunk each."""
        if len(tensors) != pages:
            raise ValueError(f"one flat page a key: {pages} keys, {len(tensors)} pages")
        views = np.empty(pages, dtype=object)
        chunk = self._shards[0].rows.shape[1]
        for index, tensor in enumerate(tensors):
            if not (
                isinstance(tensor, torch.Tensor)
                and tensor.device.type == "cpu"
                and tensor.is_contiguous()
            ):
                raise ValueError(
                    f"flat pages must be contiguous host tensors, got {type(tensor).__name__}"
                )
            view = tensor.reshape(-1).view(torch.uint8).numpy()
            if view.nbytes != chunk:
                raise ValueError(f"a flat page must be {chunk} bytes, got {view.nbytes}")
            views[index] = view
        return views


def _encoded(keys: Sequence[str]) -> np.ndarray:
    """SGLang's keys (strings) as the tier's keys (bytes), in an array for slicing by batch."""
    encoded = np.empty(len(keys), dtype=object)
    for index, key in enumerate(keys):
        if not isinstance(key, str) or not key:
            raise ValueError(f"keys must be non-empty strings, got {key!r}")
        encoded[index] = key.encode()
    return encoded

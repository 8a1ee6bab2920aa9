"""numbakv's cache policies as vLLM `CachePolicy`s, for vLLM's own CPU tier and its tiering spec.

    "kv_connector_extra_config": {"spec_name": "CPUOffloadingSpec", "cpu_bytes_to_use": ...,
        "eviction_policy": "sarc", "cache_policy_module_path": "numbakv.integrations.vllm.policies"}

vLLM's policy factory loads `getattr(module, eviction_policy)`: `sarc`, `s3fifo` and `sieve` are
the classes below. vLLM's manager keeps the chunks and their ref counts; numbakv's policy keeps
the order. Never imports the data path: it runs in vLLM's scheduler (docs/VLLM.md).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import ClassVar

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys

from numbakv.policies import NOT_READY, S3FIFOPolicy, SIEVEPolicy, SightingARCPolicy
from numbakv.policies import CachePolicy as NumbaKVPolicy


class NumbaKVCachePolicy(CachePolicy):
    """vLLM's CachePolicy contract over the numbakv policy `numbakv_policy`.

    - **Ref counts.** numbakv's policies read `ref_counts[chunk_id]`: -1 not ready, 0 idle, > 0
      read. vLLM's manager changes `ChunkStatus.ref_cnt` in place and calls `mark_evictable` and
      `mark_non_evictable` on every change to or from 0, which is all a policy tells apart, so
      the list is kept from those calls (1 stands for any reader count).
    - **One touch a request, before its new chunks go in.** vLLM applies a request's accesses
      when it finishes. numbakv's policies take a request's touch first and its new chunks after
      (the replay order of docs/MANAGER.md): sarc ranks, classes and watches new chunks against
      that touch, and S3-FIFO and SIEVE would take a touch after insertion for a re-use. So a new
      chunk waits, unranked, until its request finishes; `on_request_finished` then touches the
      request's keys once, head first, and inserts its waiting chunks in prefix order. An
      explicit `touch` (vLLM 0.32's connector makes none) ranks every waiting chunk first.
    - **Eviction.** Victims come from the policy; waiting chunks go, oldest first, only when the
      policy's idle chunks fall short. Whether n idle unprotected chunks exist is counted, not
      searched: idle counts follow the transitions, and only the call's protected keys are read.
    - **`on_store_miss` does nothing.** vLLM's default touches the missed keys: for sarc a second
      observation of the request by its tuner, whose finishing touch names them anyway. numbakv's
      policies read their ghost lists when a chunk is inserted, after that touch here.
    """

    numbakv_policy: ClassVar[type[NumbaKVPolicy]]

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._ref_counts: list[int] = [NOT_READY] * cache_capacity
        self._policy = self.numbakv_policy(cache_capacity, self._ref_counts)
        self._chunks: dict[OffloadKey, ChunkStatus] = {}
        self.get = self._chunks.get  # vLLM's hottest call, at C speed
        self._waiting: dict[OffloadKey, int] = {}  # chunk ids not ranked yet, oldest first
        self._idle = 0  # chunks with ref count 0, waiting or ranked
        self._idle_waiting = 0

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self._chunks.get(key)

    def insert(
        self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext | None = None
    ) -> None:
        """A new chunk waits unranked for its request's end (vLLM 0.33 passes that request's
        context, 0.32 none: the chunk's rank never depends on it)."""
        self._chunks[key] = chunk
        self._waiting[key] = chunk.chunk_id
        ref_cnt = chunk.ref_cnt
        self._ref_counts[chunk.chunk_id] = NOT_READY if ref_cnt < 0 else min(ref_cnt, 1)
        if ref_cnt == 0:
            self._idle += 1
            self._idle_waiting += 1

    def remove(self, key: OffloadKey) -> None:
        chunk = self._chunks.pop(key)
        waiting = self._waiting.pop(key, None) is not None
        if not waiting:
            self._policy.remove(key)
        if self._ref_counts[chunk.chunk_id] == 0:
            self._idle -= 1
            self._idle_waiting -= waiting
        self._ref_counts[chunk.chunk_id] = NOT_READY

    def mark_evictable(self, key: OffloadKey) -> None:
        self._idle += 1
        block_id = self._waiting.get(key)  # a store completing: mostly a waiting chunk
        if block_id is None:
            block_id = self._chunks[key].chunk_id
        else:
            self._idle_waiting += 1
        self._ref_counts[block_id] = 0

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._ref_counts[self._chunks[key].chunk_id] = 1
        self._idle -= 1
        self._idle_waiting -= key in self._waiting

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """Nothing: the request is observed once, when it finishes (class docstring)."""

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        self._rank(list(self._waiting))
        self._policy.touch(keys if isinstance(keys, list) else list(keys))

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        """The request's one touch, head first, then its waiting new chunks in prefix order."""
        keys = order_request_keys(key_groups, req_context)
        if keys:
            new = list(filter(self._waiting.__contains__, keys))
            self._policy.touch(keys)
            self._rank(new)

    def _rank(self, keys: list[OffloadKey]) -> None:
        """Hand waiting chunks to numbakv's policy, in this order, as one store."""
        if keys:
            block_ids = list(map(self._waiting.pop, keys))
            self._idle_waiting -= list(map(self._ref_counts.__getitem__, block_ids)).count(0)
            self._policy.insert(keys, block_ids)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        from_policy = n
        idle_ranked = self._idle - self._idle_waiting
        if idle_ranked < n + len(protected):  # the policy alone may fall short: count exactly
            from_policy = self._available(protected, idle_ranked, n)
            if from_policy is None:
                return None
        victims = self._policy.evict(from_policy, protected) if from_policy else []
        if from_policy < n:
            victims += self._oldest_waiting(n - from_policy, protected)
        self._idle -= n
        ref_counts, chunks = self._ref_counts, self._chunks
        evicted = []
        for key, block_id in victims:
            ref_counts[block_id] = NOT_READY
            evicted.append((key, chunks.pop(key)))
        return evicted

    def _available(self, protected: Collection[OffloadKey], idle_ranked: int, n: int) -> int | None:
        """How many of n victims the policy can give (the rest come from waiting chunks), or
        None when n idle unprotected chunks do not exist."""
        chunks, ref_counts, waiting = self._chunks, self._ref_counts, self._waiting
        idle_protected = [
            key
            for key in protected
            if (chunk := chunks.get(key)) is not None and ref_counts[chunk.chunk_id] == 0
        ]
        waiting_protected = sum(map(waiting.__contains__, idle_protected))
        from_policy = min(n, idle_ranked - len(idle_protected) + waiting_protected)
        if n - from_policy > self._idle_waiting - waiting_protected:
            return None
        return from_policy

    def _oldest_waiting(self, n: int, protected: Collection[OffloadKey]) -> list[tuple]:
        """Take the n oldest idle unprotected waiting chunks (the count says they exist)."""
        ref_counts, waiting = self._ref_counts, self._waiting
        victims = []
        for key, block_id in waiting.items():
            if ref_counts[block_id] == 0 and key not in protected:
                victims.append((key, block_id))
                if len(victims) == n:
                    break
        for key, _ in victims:
            del waiting[key]
        self._idle_waiting -= n
        return victims

    def clear(self) -> None:
        self._policy.clear()
        self._chunks.clear()
        self._waiting.clear()
        self._ref_counts[:] = [NOT_READY] * self.cache_capacity
        self._idle = self._idle_waiting = 0


class SightingARCCachePolicy(NumbaKVCachePolicy):
    """numbakv's Sighting ARC (docs/POLICIES.md) as a vLLM CachePolicy."""

    numbakv_policy = SightingARCPolicy


class S3FIFOCachePolicy(NumbaKVCachePolicy):
    """numbakv's S3-FIFO as a vLLM CachePolicy."""

    numbakv_policy = S3FIFOPolicy


class SIEVECachePolicy(NumbaKVCachePolicy):
    """numbakv's SIEVE as a vLLM CachePolicy."""

    numbakv_policy = SIEVEPolicy


# The names vLLM's factory looks up: getattr(module, eviction_policy).
sarc = SightingARCCachePolicy
s3fifo = S3FIFOCachePolicy
sieve = SIEVECachePolicy

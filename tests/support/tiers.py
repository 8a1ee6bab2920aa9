"""A tier over a dict in this process, for the tests of what `ChunkTier` does around any store:
its namespace, the backend, a pool of random chunks, and the jobs a drained tier finished."""

from __future__ import annotations

import threading

import numpy as np

from numbakv.tiers import BackendUnavailable, ChunkBackend, ChunkTier, Namespace, StoredValue

CHUNK_BYTES = 4096
KEYS = [b"k%d" % i for i in range(4)]


def namespace(**changes) -> Namespace:
    fields = {
        "model": "m",
        "revision": "r",
        "dtype": "float16",
        "tokens_per_block": 16,
        "blocks_per_chunk": 1,
        "num_layers": 2,
        "num_kv_heads": 4,
        "head_size": 64,
        "page_bytes": 2048,
        "layout": "layer_major",
    }
    return Namespace(**{**fields, **changes})


class DictBackend(ChunkBackend):
    """Whole values in a dict; `unavailable` and `gate` make it unreachable or slow."""

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self.unavailable = False
        self.gate = threading.Event()
        self.gate.set()

    def _reach(self) -> None:
        self.gate.wait()
        if self.unavailable:
            raise BackendUnavailable("down")

    def exists(self, keys):
        self._reach()
        return [key in self.values for key in keys]

    def write(self, keys, headers, payloads):
        self._reach()
        for key, header, payload in zip(keys, headers, payloads):
            self.values[key] = header + bytes(payload)
        return [True] * len(keys)

    def read_into(self, keys, payloads, header_bytes):
        self._reach()
        found = []
        for key, payload in zip(keys, payloads):
            value = self.values.get(key)
            if value is None:
                found.append(None)
                continue
            body = value[header_bytes:][: payload.nbytes]
            payload[: len(body)] = body
            found.append(StoredValue(value[:header_bytes], len(value) - header_bytes))
        return found

    def delete(self, keys):
        for key in keys:
            self.values.pop(key, None)

    def clear(self):
        self._reach()
        removed = len(self.values)
        self.values.clear()
        return removed


class SlowLoads(DictBackend):
    """Loads wait for `load_gate` (and say they have begun); stores go through."""

    def __init__(self) -> None:
        super().__init__()
        self.load_gate = threading.Event()
        self.loading = threading.Event()

    def read_into(self, keys, payloads, header_bytes):
        self.loading.set()
        self.load_gate.wait()
        return super().read_into(keys, payloads, header_bytes)


def random_pool(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, CHUNK_BYTES), dtype=np.uint8)


TEST_LOOKUP_DEADLINE_S = 1.0
"""The tests' tiers' lookup deadline, unless a test sets its own: the 5 ms default is the
deadline's subject only where a test sets it, and a busy 2-core machine can miss it (a late
lookup is misses)."""


def tier_over(backend, pool=None, **options) -> ChunkTier:
    pool = random_pool(8, 0) if pool is None else pool
    options.setdefault("lookup_deadline_s", TEST_LOOKUP_DEADLINE_S)
    return ChunkTier(backend, pool, namespace(), **options)


def finished(tier: ChunkTier) -> dict:
    tier.drain()
    return {job.job_id: job for job in tier.take_finished()}

"""Which of SGLang's two storage paths moves pages faster through numbakv's HiCache backend.

    python benchmarks/sglang_paths.py [--tiers dir,redis] [--pages 32] [--repeats 5]
        [--out results/sglang_paths.json]

Each path is driven as SGLang 0.5.23's cache controller drives it, over SGLang's real host pools
(CPU, unpinned: no GPU here) on one backend a path:

- generic: a store reads each page out of the pool (`get_data_page`) and calls `batch_set`; a load
  allocates a flat page per key (`get_dummy_flat_data_page`), calls `batch_get`, and copies each
  page into the pool (`set_from_flat_data_page`);
- zero-copy (`interface_v1: 1`): `batch_set_v1` and `batch_get_v1` with the pages' host indices.

Pools: MHA page_first (a page is a K and a V range: the backend copies them through its staging
rows) and MLA page_first (a page is one range: the tier reads and writes the pool in place), pages
of about 2 MiB. Tiers: a directory under a temporary folder, and a redis-server this script starts
on loopback (Debian package redis-server). Each figure is the median GB/s of `--repeats`
interleaved repeats (the paths alternate first), each a batch of `--pages` fresh keys stored, then
loaded back and checked byte for byte.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's numbakv and tests

from tests.support.redis_servers import redis_server
from tests.support.sglang_pools import (
    backend,
    host_pool,
    page_bytes,
    page_indices,
    storage_config,
)

POOLS = {
    "mha page_first": {"layout": "page_first", "layers": 16, "heads": 8, "head_dim": 128},
    "mla page_first": {"layout": "page_first", "mla": True, "layers": 61, "latent": (512, 64)},
}
"""Host pools of about 2 MiB pages at 32 tokens a page: MHA 16 layers of 8 heads of 128, MLA
DeepSeek-V3's 61 layers of a 512+64 latent; bf16."""
PAGE_SIZE = 32


def drivers(storage, pool, generic: bool):
    """(store, load) of a batch, as SGLang's controller calls the path: whether every page was
    stored, and which were loaded."""
    size = pool.page_size
    if not generic:
        return lambda keys, indices: all(storage.batch_set_v1(keys, indices)), storage.batch_get_v1

    def store(keys, indices):
        return storage.batch_set(keys, [pool.get_data_page(int(i)) for i in indices[::size]])

    def load(keys, indices):
        pages = storage.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
        for index, page in zip(indices[::size], pages):
            if page is not None:
                pool.set_from_flat_data_page(int(index), page)
        return [page is not None for page in pages]

    return store, load


def measure(tier: dict, pool_settings: dict, pages: int, repeats: int) -> dict[str, dict]:
    mla = pool_settings.get("mla", False)
    tokens = pages * PAGE_SIZE  # the pool holds twice that: the pages stored, and loaded
    pools = {
        name: host_pool(**pool_settings, page_size=PAGE_SIZE, tokens=tokens, seed=1)
        for name in ("generic", "zero-copy")
    }
    backends = {
        name: backend(
            storage_config({**tier, "interface_v1": int(name == "zero-copy")}, mla=mla), pools[name]
        )
        for name in pools
    }
    size = backends["generic"].pages.page_bytes
    seconds = {(name, what): [] for name in pools for what in ("store", "load")}
    stored_pages = list(range(pages))
    loaded_pages = list(range(pages, 2 * pages))
    for repeat in range(repeats):
        order = list(pools) if repeat % 2 == 0 else list(pools)[::-1]
        for name in order:
            pool = pools[name]
            store, load = drivers(backends[name], pool, name == "generic")
            keys = [f"{repeat:016x}{name == 'generic':016x}{page:032x}" for page in stored_pages]
            started = time.perf_counter()
            assert store(keys, page_indices(stored_pages, PAGE_SIZE))
            seconds[(name, "store")].append(time.perf_counter() - started)
            started = time.perf_counter()
            assert all(load(keys, page_indices(loaded_pages, PAGE_SIZE)))
            seconds[(name, "load")].append(time.perf_counter() - started)
            for stored, loaded in zip(stored_pages, loaded_pages):
                assert page_bytes(pool, stored) == page_bytes(pool, loaded)
    for storage in backends.values():
        storage.close()
    return {
        f"{name} {what}": {
            "GB/s": round(pages * size / statistics.median(times) / 1e9, 3),
            "median_ms": round(statistics.median(times) * 1e3, 2),
        }
        for (name, what), times in seconds.items()
    } | {"page_bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiers", default="dir,redis")
    parser.add_argument("--pages", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for tier_name in args.tiers.split(","):
            for pool_name, pool_settings in POOLS.items():
                if tier_name == "dir":
                    directory = tempfile.mkdtemp(dir=scratch)
                    tier = {"tier": f"dir:{directory}", "bytes_to_use": 8 << 30}
                    figures = measure(tier, pool_settings, args.pages, args.repeats)
                else:
                    with redis_server(
                        tempfile.mkdtemp(dir=scratch), "--maxmemory", "2gb"
                    ) as server:
                        figures = measure(
                            {"tier": server.url}, pool_settings, args.pages, args.repeats
                        )
                rows.append({"tier": tier_name, "pool": pool_name, **figures})
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

"""LMCache 0.5.6's own stores, timed for numbakv's tier benchmarks: a baseline, never a dependency.

Run by `benchmarks/redis_tier_bandwidth.py` and `benchmarks/tier_bandwidth.py` with
`--lmcache-python PATH`, the Python of a virtual environment of its own that has LMCache:

    python3 -m venv /opt/lmcache && /opt/lmcache/bin/pip install lmcache==0.5.6

It reads one JSON request a line on stdin and answers one JSON line on stdout, so that its runs
take turns with numbakv's in one process tree: `{"store": "resp" | "redis" | "disk", "where": URL
or directory, "chunk_bytes": N, "chunks": M, "op": "write" | "read", "threads": T}` gives
`{"seconds": S}`, the wall time of one batch of M chunks of N random bytes, stored with LMCache's
batched put (each chunk's completion awaited) or loaded with its batched get; every load is
checked byte for byte against what was stored, after the clock. Chunks are LMCache `MemoryObj`s
from its `LocalCPUBackend`, KV of fp16 [2, layers, 16 tokens, 1024] (`chunk_bytes` a multiple of
64 KiB). The remote stores go through `CreateConnector` (`resp://`: LMCache's native client;
`redis://`: redis-py's asyncio client), the disk through `LocalDiskBackend` with O_DIRECT.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __name__ == "__main__":  # the server side, in LMCache's environment
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.connector import CreateConnector
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

TOKENS = 16
WIDTH = 1024  # KV heads x head size
LAYER_BYTES = 2 * TOKENS * WIDTH * 2  # K and V of one layer, fp16


class LMCacheBaseline:
    """This script run by LMCache's Python, asked for one timed batch at a time (the client side,
    imported by numbakv's benchmarks without LMCache)."""

    def __init__(self, python: str) -> None:
        self._process = subprocess.Popen(
            [python, str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def seconds(
        self, store: str, where: str, chunk_bytes: int, chunks: int, op: str, threads: int = 8
    ) -> float:
        """One batch's wall time: `op` ("write" or "read") of `chunks` chunks in `store`."""
        return self.timing(store, where, chunk_bytes, chunks, op, threads)[0]

    def timing(
        self, store: str, where: str, chunk_bytes: int, chunks: int, op: str, threads: int = 8
    ) -> tuple[float, float]:
        """One batch's wall time and the CPU time LMCache's process spent meanwhile (every
        thread), seconds."""
        request = {
            "store": store,
            "where": where,
            "chunk_bytes": chunk_bytes,
            "chunks": chunks,
            "threads": threads,
        }
        self._process.stdin.write(json.dumps({**request, "op": op}) + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline()
        if not answer:
            raise RuntimeError(f"LMCache's baseline stopped: {request} {op}")
        answer = json.loads(answer)
        return answer["seconds"], answer["cpu_seconds"]

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait()


class Store:
    """One LMCache store of chunks of one size, with the chunks it stored."""

    def __init__(self, request: dict, loop: asyncio.AbstractEventLoop) -> None:
        chunk_bytes, chunks = request["chunk_bytes"], request["chunks"]
        if chunk_bytes % LAYER_BYTES:
            raise ValueError(f"chunk_bytes must be a multiple of {LAYER_BYTES}")
        layers = chunk_bytes // LAYER_BYTES
        disk = request["store"] == "disk"
        config = LMCacheEngineConfig.from_defaults(
            chunk_size=TOKENS,
            local_cpu=False,
            max_local_cpu_size=2 * chunks * chunk_bytes / 2**30 + 0.1,  # stored + loaded
            local_disk=request["where"] if disk else None,
            # Its count of bytes stored only grows (a forced remove leaves it): no bound here.
            max_local_disk_size=1 << 20 if disk else 0,
            remote_url=None if disk else request["where"],
            remote_serde="naive",
            save_unfull_chunk=False,
            extra_config={"use_odirect": True, "disk_io_threads": request.get("threads", 8)},
        )
        metadata = LMCacheMetadata(
            model_name="numbakv-baseline",
            world_size=1,
            local_world_size=1,
            worker_id=0,
            local_worker_id=0,
            kv_dtype=torch.float16,
            kv_shape=(layers, 2, TOKENS, 8, WIDTH // 8),
            chunk_size=TOKENS,
        )
        self.loop = loop
        self.cpu = LocalCPUBackend(config, metadata)
        if disk:
            self.backend = LocalDiskBackend(config, loop, self.cpu, metadata=metadata)
        else:
            self.backend = CreateConnector(request["where"], loop, self.cpu, config, metadata)
        self.disk = disk
        self.keys = [
            CacheEngineKey("numbakv-baseline", 1, 0, number, torch.float16)
            for number in range(chunks)
        ]
        shape = torch.Size((2, layers, TOKENS, WIDTH))  # LMCache's KV_2LTD, as its connectors say
        self.objects = [
            self.cpu.allocate([shape], [torch.float16], MemoryFormat.KV_2LTD) for _ in self.keys
        ]
        self.stored = []
        for number, memory_obj in enumerate(self.objects):
            generator = torch.Generator().manual_seed(number)
            data = torch.randint(0, 256, (chunk_bytes,), dtype=torch.uint8, generator=generator)
            memory_obj.tensor.view(torch.uint8).view(-1).copy_(data)
            self.stored.append(data)

    def write(self) -> tuple[float, float]:
        if self.disk:  # LMCache's disk store skips a key it holds: forget them first, unclocked
            self.backend.batched_remove(self.keys, force=True)
        started, cpu_started = time.perf_counter(), time.process_time()
        if self.disk:
            done = threading.Semaphore(0)
            self.backend.batched_submit_put_task(
                self.keys, self.objects, on_complete_callback=lambda _key: done.release()
            )
            for _ in self.keys:
                done.acquire()
        else:
            for memory_obj in self.objects:  # a put lets go of its reference: keep them
                memory_obj.ref_count_up()
            self._run(self.backend.batched_put(self.keys, self.objects))
        return time.perf_counter() - started, time.process_time() - cpu_started

    def read(self) -> tuple[float, float]:
        started, cpu_started = time.perf_counter(), time.process_time()
        if self.disk:
            loaded = self.backend.batched_get_blocking(self.keys)
        else:
            loaded = self._run(self._get_all())
        timing = time.perf_counter() - started, time.process_time() - cpu_started
        for stored, found in zip(self.stored, loaded):
            if found is None or not torch.equal(found.tensor.view(torch.uint8).view(-1), stored):
                raise RuntimeError("LMCache loaded bytes that differ from the stored ones")
            found.ref_count_down()
        return timing

    async def _get_all(self) -> list:
        """One batched get where the connector has it, else every get at once (`redis://`)."""
        if self.backend.support_batched_get():
            return await self.backend.batched_get(self.keys)
        return await asyncio.gather(*(self.backend.get(key) for key in self.keys))

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()


def main() -> int:
    logging.disable(logging.WARNING)  # LMCache logs every connector it discovers
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    stores: dict[tuple, Store] = {}
    for line in sys.stdin:
        request = json.loads(line)
        if request["store"] == "disk" and not request.get("where"):
            request["where"] = tempfile.mkdtemp(prefix="lmcache-disk-")
        name = (request["store"], request["where"], request["chunk_bytes"], request["chunks"])
        if name not in stores:
            stores[name] = Store(request, loop)
        seconds, cpu_seconds = getattr(stores[name], request["op"])()
        print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

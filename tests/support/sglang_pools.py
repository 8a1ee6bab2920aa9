"""SGLang for the tests: whether it imports, its real host KV pools on the CPU, its storage config,
and numbakv's backend built the way SGLang builds a dynamic backend.

The SGLang tests skip where SGLang is not installed, and fail there in CI (tests/support/engines.py).
"""

from __future__ import annotations

from typing import Any

from tests.support.engines import require_engine

REQUIRE_SGLANG = "NUMBAKV_REQUIRE_SGLANG"
BACKEND = {
    "backend_name": "numbakv",
    "module_path": "numbakv.integrations.sglang",
    "class_name": "NumbaKVHiCacheStorage",
}
"""The extra config's keys that name numbakv's backend to SGLang's dynamic loader."""


def require_sglang() -> None:
    """Skip the calling test module unless SGLang imports (fail instead under
    NUMBAKV_REQUIRE_SGLANG=1)."""
    require_engine("sglang.srt.mem_cache.hicache_storage", "SGLang", "sglang", REQUIRE_SGLANG)


SHAPE = {"layers": 2, "heads": 2, "head_dim": 16, "page_size": 4, "tokens": 64, "latent": (16, 8)}
"""A small pool: 2 layers of 2 heads of 16 (MLA: a latent of rank 16 and a rope part of 8), pages of
4 tokens, 64 tokens on the device."""


def host_pool(
    layout: str = "page_first", *, mla: bool = False, seed: int = 0, dtype: Any = None, **shape: Any
) -> Any:
    """A real SGLang host KV pool on the CPU, MHA or MLA, of `SHAPE` but for the keys `shape`
    gives, filled with random bytes; it holds twice `tokens` (and a padding page)."""
    import torch
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    if set(shape) - set(SHAPE):
        raise TypeError(f"host_pool takes {sorted(SHAPE)}, got {sorted(shape)}")
    shape = {**SHAPE, **shape}
    dtype = torch.bfloat16 if dtype is None else dtype
    layers, page_size = shape["layers"], shape["page_size"]
    common = {
        "pin_memory": False,
        "device": "cpu",
        "device_capacity_tokens": shape["tokens"],
        "start_layer": 0,
        "end_layer": layers,
    }
    if mla:
        info = _mla_buffers(shape, dtype)
        pool = MLATokenToKVPoolHost(
            info, 2.0, 0, page_size, layout, target_layer_num=layers, **common
        )
    else:
        pool = MHATokenToKVPoolHost(_mha_buffers(shape, dtype), 2.0, 0, page_size, layout, **common)
    generator = torch.Generator().manual_seed(seed)
    raw = pool.kv_buffer.view(-1).view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))
    return pool


def _mla_buffers(shape: dict, dtype: Any) -> Any:
    """SGLang's description of an MLA device pool of `shape`, on the CPU."""
    import torch
    from sglang.srt.mem_cache.device_pool_info import MLABufferInfo

    rank, rope = shape["latent"]
    rows = tuple(
        torch.zeros(shape["tokens"], 1, rank + rope, dtype=dtype) for _ in range(shape["layers"])
    )
    return MLABufferInfo(
        buffers=rows,
        data_ptrs=_pointers(rows),
        layer_indices=tuple(range(shape["layers"])),
        device_layer_num=shape["layers"],
        page_size=shape["page_size"],
        kv_lora_rank=rank,
        qk_rope_head_dim=rope,
        kv_cache_dim=rank + rope,
        dtype=dtype,
        device=torch.device("cpu"),
    )


def _mha_buffers(shape: dict, dtype: Any) -> Any:
    """SGLang's description of an MHA device pool of `shape`, on the CPU."""
    import torch
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo

    rows = (shape["tokens"], shape["heads"], shape["head_dim"])
    k = tuple(torch.zeros(rows, dtype=dtype) for _ in range(shape["layers"]))
    v = tuple(torch.zeros(rows, dtype=dtype) for _ in range(shape["layers"]))
    buffers = KVBuffers(
        k=k, v=v, k_data_ptrs=_pointers(k), v_data_ptrs=_pointers(v), layout=KVBufferLayout.NHD
    )
    return MHABufferInfo(
        buffers=buffers,
        page_size=shape["page_size"],
        head_num=shape["heads"],
        head_dim=shape["head_dim"],
        v_head_dim=shape["head_dim"],
        dtype=dtype,
        device=torch.device("cpu"),
    )


def _pointers(tensors: tuple) -> Any:
    import torch

    return torch.tensor([tensor.data_ptr() for tensor in tensors], dtype=torch.uint64)


def storage_config(
    extra: dict, *, mla: bool = False, tp_rank: int = 0, tp_size: int = 1, **fields: Any
) -> Any:
    """SGLang's HiCacheStorageConfig of one rank of model "tiny", the extra config `extra` beside
    the keys that name numbakv's backend; `fields` override its other fields."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    values = {
        "tp_rank": tp_rank,
        "tp_size": tp_size,
        "pp_rank": 0,
        "pp_size": 1,
        "attn_cp_rank": 0,
        "attn_cp_size": 1,
        "is_mla_model": mla,
        "enable_storage_metrics": True,
        "is_page_first_layout": True,
        "model_name": "tiny",
        "extra_config": {**BACKEND, **extra},
    }
    values.update(fields)
    return HiCacheStorageConfig(**values)


def backend(config: Any, pool: Any) -> Any:
    """The backend as SGLang's cache controller makes it: its factory's dynamic loader (which
    wraps it in HiCacheStorageFailureInjector where SGLang's test variables ask), then the host
    pool registered."""
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    storage = StorageBackendFactory.create_backend("dynamic", config, pool)
    storage.register_mem_pool_host(pool)
    return storage


def page_indices(pages: list[int], page_size: int) -> Any:
    """Host indices of whole pages (`page_size` a page), as SGLang's controller passes them."""
    import torch

    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages])


def page_bytes(pool: Any, page: int) -> bytes:
    """A page's bytes as SGLang's flat page has them (`get_data_page`)."""
    import torch

    return bytes(pool.get_data_page(page * pool.page_size).contiguous().view(torch.uint8).numpy())

"""SGLang for the tests: whether it imports, its real host KV pools on the CPU, its storage config,
and numbakv's backend built the way SGLang builds a dynamic backend.

The SGLang tests skip where SGLang is not installed; .ci/run runs them in an environment of their
own with NUMBAKV_REQUIRE_SGLANG=1, so an SGLang that does not import fails CI instead of skipping.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

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
    try:
        import sglang.srt.mem_cache.hicache_storage  # noqa: F401
    except ImportError as error:
        if os.environ.get(REQUIRE_SGLANG) == "1":
            raise ImportError(f"{REQUIRE_SGLANG}=1 but SGLang does not import: {error}") from error
        pytest.skip(
            f"SGLang is not installed ({error}); pip install -e '.[sglang]' to run these tests",
            allow_module_level=True,
        )


def host_pool(
    layout: str = "page_first",
    *,
    mla: bool = False,
    layers: int = 2,
    heads: int = 2,
    head_dim: int = 16,
    page_size: int = 4,
    tokens: int = 64,
    seed: int = 0,
    dtype: Any = None,
) -> Any:
    """A real SGLang host KV pool on the CPU (MHA, or MLA with a 16+8 latent), filled with random
    bytes; it holds twice `tokens` (and a padding page)."""
    import torch
    from sglang.srt.mem_cache.device_pool_info import (
        KVBufferLayout,
        KVBuffers,
        MHABufferInfo,
        MLABufferInfo,
    )
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    dtype = torch.bfloat16 if dtype is None else dtype
    device = torch.device("cpu")
    common = {
        "pin_memory": False,
        "device": "cpu",
        "device_capacity_tokens": tokens,
        "start_layer": 0,
    }
    if mla:
        latent = tuple(torch.zeros(tokens, 1, 24, dtype=dtype) for _ in range(layers))
        info = MLABufferInfo(
            buffers=latent,
            data_ptrs=_pointers(latent),
            layer_indices=tuple(range(layers)),
            device_layer_num=layers,
            page_size=page_size,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            kv_cache_dim=24,
            dtype=dtype,
            device=device,
        )
        pool = MLATokenToKVPoolHost(
            info, 2.0, 0, page_size, layout, end_layer=layers, target_layer_num=layers, **common
        )
    else:
        k = tuple(torch.zeros(tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
        v = tuple(torch.zeros(tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
        info = MHABufferInfo(
            buffers=KVBuffers(
                k=k,
                v=v,
                k_data_ptrs=_pointers(k),
                v_data_ptrs=_pointers(v),
                layout=KVBufferLayout.NHD,
            ),
            page_size=page_size,
            head_num=heads,
            head_dim=head_dim,
            v_head_dim=head_dim,
            dtype=dtype,
            device=device,
        )
        pool = MHATokenToKVPoolHost(info, 2.0, 0, page_size, layout, end_layer=layers, **common)
    generator = torch.Generator().manual_seed(seed)
    raw = pool.kv_buffer.view(-1).view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))
    return pool


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

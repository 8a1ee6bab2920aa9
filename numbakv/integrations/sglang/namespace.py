"""The namespace of SGLang's pages: everything SGLang's keys leave out that changes their bytes.

SGLang keys a page by a hash of its tokens alone. What the page's bytes mean depends besides on the
model and its revision, the KV dtype (`--kv-cache-dtype` too: fp8 pages of a bf16 model are other
bytes), the page size, the host pool's layout (MHA or MLA, `--hicache-mem-layout`), the layers this
pipeline stage holds, and which heads this rank holds:

- MHA: each tensor-parallel rank holds its own heads, so the namespace names the rank and the size.
  With `tp_lcm_size` in the extra config and the page_head layout, a page is cut into head groups
  of a `tp_lcm_size`-way split, each its own chunk in the namespace of its rank of that split: an
  engine at TP 4 and one at TP 8 then share chunks (SGLang's heterogeneous TP).
- MLA: every rank holds the same latent bytes, so the namespace names no rank at all, and engines
  of any TP size share chunks.
"""

from __future__ import annotations

from typing import Any

from numbakv.tiers import Namespace


def server_setting(name: str) -> Any:
    """A setting of the SGLang server this process runs (`revision`, `kv_cache_dtype`), or None
    outside one."""
    from sglang.srt.runtime_context import get_server_args

    try:
        return getattr(get_server_args(), name, None)
    except ValueError:  # "Global server args is not set yet!": no server in this process
        return None


def head_shards(config: Any) -> tuple[int, int]:
    """How many head groups a page is cut into here, and into how many the model's heads are cut
    in all (`tp_lcm_size` where SGLang splits heads, else the TP size; 1 for MLA)."""
    if config.is_mla_model:
        return 1, 1
    if config.should_split_heads:
        return config.tp_lcm_size // config.tp_size, config.tp_lcm_size
    return 1, config.tp_size


def attention_dp_groups() -> int:
    """How many attention data-parallel groups serve the model (1 without DP attention, or with
    no server in this process). Each group's ranks open the same namespaces as every other's."""
    from sglang.srt.runtime_context import get_flags, get_parallel

    try:  # as SGLang's own `is_dp_attention_enabled`, whose module imports the model layers
        return get_parallel().attn_dp_size if get_flags().dp.enabled else 1
    except ValueError:  # "config namespace 'parallel' not published": no server here
        return 1


def directory_shares(config: Any) -> int:
    """How many indexes bound one model's pages in a directory, each its own files: a head group
    each (1 for MLA, whose ranks share their pages), per pipeline stage, per context-parallel
    rank and per attention data-parallel group. They share the directory's bound."""
    return head_shards(config)[1] * config.pp_size * config.attn_cp_size * attention_dp_groups()


def page_namespace(config: Any, host_pool: Any, shard: int, chunk_bytes: int) -> Namespace:
    """The namespace of head group `shard` (of `head_shards`) of this rank's pages.

    `config` is SGLang's `HiCacheStorageConfig`, `host_pool` its host KV pool, `chunk_bytes` one
    chunk's bytes.
    """
    split, total = head_shards(config)
    mla = config.is_mla_model
    kv_cache_dtype = server_setting("kv_cache_dtype")
    dtype = str(host_pool.dtype).removeprefix("torch.")
    if kv_cache_dtype is not None:
        dtype += f" kv_cache_dtype={kv_cache_dtype}"
    if getattr(host_pool, "storage_format_tag", None):
        dtype += f" {host_pool.storage_format_tag}"
    layout = [
        "sglang",
        "mla" if mla else "mha",
        host_pool.layout,
        f"layers{host_pool.start_layer}-{host_pool.end_layer}of{host_pool.layer_num}",
    ]
    if not mla and host_pool.v_head_dim != host_pool.head_dim:
        layout.append(f"v{host_pool.v_head_dim}")
    if config.attn_cp_size > 1:
        layout.append(f"cp{config.attn_cp_rank}of{config.attn_cp_size}")
    layers = host_pool.layer_num
    return Namespace(
        model=config.model_name or "",
        revision=server_setting("revision") or "",
        dtype=dtype,
        tokens_per_block=host_pool.page_size,
        blocks_per_chunk=1,
        num_layers=layers,
        num_kv_heads=1 if mla else host_pool.head_num // split,
        head_size=host_pool.kv_cache_dim if mla else host_pool.head_dim,
        page_bytes=max(chunk_bytes // (layers * (1 if mla else 2)), 1),
        layout=":".join(layout),
        tensor_parallel_size=total,
        tensor_parallel_rank=0 if mla else config.tp_rank * split + shard,
    )

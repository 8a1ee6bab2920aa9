"""numbakv's tiers below host memory as an SGLang HiCache storage backend (docs/SGLANG.md).

SGLang loads it with `--hicache-storage-backend dynamic` and an extra config naming
`"module_path": "numbakv.integrations.sglang", "class_name": "NumbaKVHiCacheStorage"`.
"""

from numbakv.integrations.sglang.storage import NumbaKVHiCacheStorage

__all__ = ["NumbaKVHiCacheStorage"]

"""What makes a chunk's bytes mean something: engines whose namespaces differ never read each
other's chunks, however their keys collide."""

from __future__ import annotations

import hashlib
import json
import numbers
from dataclasses import asdict, dataclass

from numbakv.checks import SettingTypeError, positive
from numbakv.tiers.chunk_format import FORMAT_VERSION

_STRINGS = {
    "model": "(the model's name; '' if not known)",
    "revision": "(the model's revision; '' if not known)",
    "dtype": "such as 'float16'",
    "layout": "such as 'layer_major'",
}
"""The string fields, and what the error refusing anything else says they hold. A dtype object is
refused, not converted: torch's reads 'torch.float16', NumPy's 'float16' (one namespace in two)."""

_POSITIVE_INTS = (
    "tokens_per_block",
    "blocks_per_chunk",
    "num_layers",
    "num_kv_heads",
    "head_size",
    "page_bytes",
    "tensor_parallel_size",
)


@dataclass(frozen=True)
class Namespace:
    """Everything that changes what a chunk's bytes mean; its digest is stored in every value.

    `model` and `revision` are the model's name and revision when known (empty otherwise);
    `layout` names the page layout of one chunk's bytes (e.g. numbakv's "layer_major");
    `page_bytes` is one page's bytes (one block of one layer's K or V).
    """

    model: str
    revision: str
    dtype: str
    tokens_per_block: int
    blocks_per_chunk: int
    num_layers: int
    num_kv_heads: int
    head_size: int
    page_bytes: int
    layout: str
    tensor_parallel_size: int = 1
    tensor_parallel_rank: int = 0
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        # Every field is checked before any is stored; ints are stored as plain ints, so that the
        # digest's JSON is the same whatever integer type was given (and takes no NumPy scalar).
        for name, holds in _STRINGS.items():
            value = getattr(self, name)
            if not isinstance(value, str):
                raise SettingTypeError(f"Namespace {name} must be a string {holds}, got {value!r}")
        checked = {
            name: positive(f"Namespace {name}", getattr(self, name), integer=True)
            for name in _POSITIVE_INTS
        }
        for name in ("tensor_parallel_rank", "format_version"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise SettingTypeError(f"Namespace {name} must be an int, got {value!r}")
            checked[name] = int(value)
        size, rank = checked["tensor_parallel_size"], checked["tensor_parallel_rank"]
        if not 0 <= rank < size:
            raise ValueError(f"Namespace tensor_parallel_rank must be in [0, {size}), got {rank}")
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @property
    def digest(self) -> bytes:
        """16 bytes that differ whenever any field does (BLAKE2b of the fields, canonical JSON)."""
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.blake2b(canonical.encode(), digest_size=16).digest()

    def describe(self) -> str:
        """One log line: the digest and the fields it covers."""
        fields = ", ".join(f"{name}={value}" for name, value in asdict(self).items())
        return f"namespace {self.digest.hex()} ({fields})"

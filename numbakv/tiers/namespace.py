"""What makes a chunk's bytes mean something: engines whose namespaces differ never read each
other's chunks, however their keys collide."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from numbakv.checks import positive
from numbakv.tiers.chunk_format import FORMAT_VERSION


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
        for name in (
            "tokens_per_block",
            "blocks_per_chunk",
            "num_layers",
            "num_kv_heads",
            "head_size",
            "page_bytes",
            "tensor_parallel_size",
        ):
            # Stored as a plain int: the digest's JSON takes no NumPy integer.
            checked = positive(f"Namespace {name}", getattr(self, name), integer=True)
            object.__setattr__(self, name, checked)
        rank = self.tensor_parallel_rank
        if (
            isinstance(rank, bool)
            or not isinstance(rank, int)
            or not 0 <= rank < self.tensor_parallel_size
        ):
            raise ValueError(
                f"Namespace tensor_parallel_rank must be in [0, {self.tensor_parallel_size}), got {rank!r}"
            )

    @property
    def digest(self) -> bytes:
        """16 bytes that differ whenever any field does (BLAKE2b of the fields, canonical JSON)."""
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.blake2b(canonical.encode(), digest_size=16).digest()

    def describe(self) -> str:
        """One log line: the digest and the fields it covers."""
        fields = ", ".join(f"{name}={value}" for name, value in asdict(self).items())
        return f"namespace {self.digest.hex()} ({fields})"

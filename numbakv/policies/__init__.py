"""Cache policies, chosen by registry name or by an import path `package.module:ClassName`."""

from __future__ import annotations

import importlib

from numbakv.policies.arc import ARCPolicy
from numbakv.policies.base import NOT_READY, CachePolicy
from numbakv.policies.lru import LRUPolicy
from numbakv.policies.s3fifo import S3FIFOPolicy
from numbakv.policies.sarc import SightingARCPolicy
from numbakv.policies.sieve import SIEVEPolicy

POLICIES: dict[str, type[CachePolicy]] = {
    "lru": LRUPolicy,
    "arc": ARCPolicy,
    "s3fifo": S3FIFOPolicy,
    "sieve": SIEVEPolicy,
    "sarc": SightingARCPolicy,
}


def resolve_policy(name: str) -> type[CachePolicy]:
    """The policy class registered as `name`, or loaded from the import path `module:Class`."""
    if not isinstance(name, str):
        raise TypeError(f"cache_policy must be a str, got {type(name).__name__}")
    if name in POLICIES:
        return POLICIES[name]
    if ":" not in name:
        raise ValueError(
            f"unknown cache policy {name!r}: expected one of {sorted(POLICIES)} "
            "or an import path 'package.module:ClassName'"
        )
    module_name, _, class_name = name.partition(":")
    try:
        policy = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot load cache policy {name!r}: {error}") from error
    if not (isinstance(policy, type) and issubclass(policy, CachePolicy)):
        raise TypeError(f"cache policy {name!r} is not a subclass of numbakv.CachePolicy")
    return policy


__all__ = [
    "NOT_READY",
    "POLICIES",
    "ARCPolicy",
    "CachePolicy",
    "LRUPolicy",
    "S3FIFOPolicy",
    "SIEVEPolicy",
    "SightingARCPolicy",
    "resolve_policy",
]

"""Seeded synthetic workloads in the trace format (`python3 -m numbakv.workloads`:
numbakv.tools.workloads.command)."""

from numbakv.tools.workloads.core import (
    WORKLOADS,
    document_loop,
    document_traffic,
    mixed_traffic,
    multi_turn_chat,
)

__all__ = ["WORKLOADS", "document_loop", "document_traffic", "mixed_traffic", "multi_turn_chat"]

"""Typed responses of the sidecar's JSON endpoints."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Health(BaseModel):
    """The sidecar is up; ``status`` says whether it has metrics to serve."""

    status: str = Field(
        description='"ok", or "degraded" when the directory is missing, empty or partly unreadable'
    )
    metrics_dir: str
    dir_exists: bool
    files: int = Field(description="*.db files in the directory")
    unreadable_files: list[str]
    detail: str | None = Field(description="what is wrong, when status is degraded")


class DirectionStats(BaseModel):
    """One transfer direction over the window."""

    gigabytes_per_second: float | None = Field(
        description="successful bytes moved per second / 1e9"
    )
    jobs_per_second: float | None


class Stats(BaseModel):
    """A summary over the last ``window_seconds`` (rates are null until two samples exist)."""

    window_seconds: float = Field(
        description="the span the rates cover; at most the requested window"
    )
    instances: list[str] = Field(description="engine instances seen in the metrics")
    hit_ratio: float | None = Field(
        description="hit blocks / (hit + missed blocks) over the window"
    )
    lookups_per_second: float | None
    evictions_per_second: float | None = Field(description="evicted blocks per second")
    occupancy: float | None = Field(description="used / capacity of the host pools, now")
    transfer: dict[str, DirectionStats] = Field(
        description='per direction: "store" (GPU to host), "load"'
    )

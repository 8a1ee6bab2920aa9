"""Typed responses of the sidecar's JSON endpoints."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Health(BaseModel):
    """The sidecar is up (always 200); ``status`` says whether what it serves is whole and fresh."""

    status: str = Field(
        description='"ok", or "degraded" when the directory is missing or empty, files were '
        "skipped, or the last read is stale"
    )
    metrics_dir: str
    dir_exists: bool | None = Field(description="null until the first read finishes")
    files: int = Field(description="metrics files merged in the last read")
    skipped_files: dict[str, str] = Field(
        description="files left out of the last read, each with the reason"
    )
    dead_writers: int = Field(
        description="writer processes found dead: their live gauges no longer count"
    )
    read_age_seconds: float = Field(description="how long ago the served read finished")
    detail: str | None = Field(description="what is wrong, when status is degraded")


class DirectionStats(BaseModel):
    """One transfer direction over the window."""

    gigabytes_per_second: float | None = Field(
        description="successful bytes moved per second / 1e9"
    )
    jobs_per_second: float | None


class TierStats(BaseModel):
    """One tier below host memory (Redis, a disk) over the window, summed over instances."""

    hit_ratio: float | None = Field(description="chunks found / chunks looked up over the window")
    loaded_from_others: float | None = Field(
        description="share of the chunks loaded over the window that another engine had stored"
    )
    breaker_open: bool = Field(
        description="whether any instance has stopped calling the store, now"
    )
    used_chunks: int | None = Field(
        default=None,
        description="chunks the tier holds now; null where it does not know (Redis: its server "
        "bounds it)",
    )
    capacity_chunks: int | None = Field(
        default=None, description="chunks the tier may hold; null where it does not know"
    )


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
    tiers: dict[str, TierStats] = Field(
        default_factory=dict, description="per tier below host memory, by its name"
    )

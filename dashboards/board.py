"""The numbakv Grafana dashboard as code, built with Grafana Labs' grafana-foundation-sdk (the
``dashboards`` extra). ``python -m numbakv.dashboards.generate`` renders it (see there)."""

from __future__ import annotations

import itertools
import json

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model

from numbakv.metrics.definitions import POLICY_STATE, Definition

UID = "numbakv-overview"
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'instance=~"$instance"'
RATE = "[$__rate_interval]"

POLICY_PANELS = {
    "arc": ("ARC target p and lists", "ARC's target size p of T1, and its list sizes."),
    "sarc": (
        "Sighting ARC target p and lists",
        "Sighting ARC's target size p of T1, and its list sizes.",
    ),
    "s3fifo": ("S3-FIFO queues", "S3-FIFO's small, main and ghost queue sizes."),
}
"""Title and description of the panel of each policy that exports its state."""


def _rate(metric: str, by: str = "instance") -> str:
    return f"sum by ({by}) (rate({metric}{{{SEL}}}{RATE}))"


def _query(expr: str, legend: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def _panel(
    title: str, unit: str, description: str, *queries: prometheus.Dataquery
) -> timeseries.Panel:
    panel = (
        timeseries.Panel().title(title).unit(unit).description(description).datasource(DATASOURCE)
    )
    panel.height(8).span(12).fill_opacity(10)
    for ref_id, query in zip("ABCDEFGH", queries):
        panel.with_target(query.ref_id(ref_id))
    return panel


def _tier_quantile(what: str, q: float) -> prometheus.Dataquery:
    buckets = _rate(f"numbakv_tier_{what}_duration_seconds_bucket", by="le, tier")
    return _query(f"histogram_quantile({q}, {buckets})", f"{what} {{{{tier}}}} p{int(q * 100)}")


def _quantile(q: float) -> prometheus.Dataquery:
    buckets = _rate("numbakv_transfer_duration_seconds_bucket", by="le, direction")
    return _query(f"histogram_quantile({q}, {buckets})", f"{{{{direction}}}} p{int(q * 100)}")


def _state_query(definition: Definition) -> prometheus.Dataquery:
    """A policy's gauge summed per instance, and per list (or queue) where it has several."""
    if definition.label is None:
        by, legend = "instance", definition.fields[0]
    else:
        by, legend = f"instance, {definition.label}", f"{{{{{definition.label}}}}}"
    return _query(f"sum by ({by}) ({definition.name}{{{SEL}}})", f"{legend} {{{{instance}}}}")


def _policy_panel(policy: str, title: str, description: str) -> timeseries.Panel:
    """The gauges the policy exports (``POLICY_STATE``)."""
    return _panel(title, "short", description, *map(_state_query, POLICY_STATE[policy]))


def _sections() -> list[tuple[str, list[timeseries.Panel]]]:
    """Rows of panels: cache effectiveness, transfer throughput and latency, host-pool and policy
    state, the tiers below host memory (Redis, a disk)."""
    hits, misses = _rate("numbakv_hit_blocks_total"), _rate("numbakv_missed_blocks_total")
    cache = [
        _panel(
            "Hit ratio",
            "percentunit",
            "Hit blocks / looked-up blocks.",
            _query(f"{hits} / ({hits} + {misses})", "{{instance}}"),
        ),
        _panel(
            "Lookups/s",
            "ops",
            "Lookup calls per second.",
            _query(_rate("numbakv_lookups_total"), "{{instance}}"),
        ),
        _panel(
            "Evictions/s",
            "short",
            "Blocks evicted from host memory per second.",
            _query(_rate("numbakv_evicted_blocks_total"), "{{instance}}"),
        ),
        _panel(
            "Stored and loaded blocks/s",
            "short",
            "Completed (and failed) stores to host, loads back to GPU, and stores refused for "
            "want of room (every other block being loaded or stored).",
            _query(_rate("numbakv_stored_blocks_total"), "stored {{instance}}"),
            _query(_rate("numbakv_loaded_blocks_total"), "loaded {{instance}}"),
            _query(_rate("numbakv_failed_store_blocks_total"), "failed {{instance}}"),
            _query(_rate("numbakv_refused_store_blocks_total"), "refused {{instance}}"),
        ),
    ]
    transfers = [
        _panel(
            "Throughput per direction",
            "Bps",
            "Bytes moved by successful jobs per second (GB/s).",
            _query(_rate("numbakv_transfer_bytes_total", by="direction"), "{{direction}}"),
        ),
        _panel(
            "Transfer latency p50 / p99",
            "s",
            "Job duration quantiles per direction.",
            _quantile(0.5),
            _quantile(0.99),
        ),
    ]
    pool = [
        _panel(
            "Occupancy",
            "percentunit",
            "Used / capacity of the host pool.",
            _query(
                f"sum by (instance) (numbakv_host_used_blocks{{{SEL}}})"
                f" / sum by (instance) (numbakv_host_capacity_blocks{{{SEL}}})",
                "{{instance}}",
            ),
        ),
        *(_policy_panel(policy, *text) for policy, text in POLICY_PANELS.items()),
    ]
    tier_hits, tier_lookups = (
        _rate("numbakv_tier_lookup_hits_total", by="tier"),
        _rate("numbakv_tier_lookups_total", by="tier"),
    )
    tiers = [
        _panel(
            "Tier hit ratio",
            "percentunit",
            "Chunks a tier below host memory found / chunks looked up in it.",
            _query(f"{tier_hits} / {tier_lookups}", "{{tier}}"),
        ),
        _panel(
            "Tier chunks: loads by whose write, stores",
            "short",
            "Chunks loaded from a tier per second, stored by this engine (own) or another; "
            "chunks stored to it.",
            _query(
                _rate("numbakv_tier_loaded_chunks_total", by="tier, writer"),
                "loaded {{tier}} {{writer}}",
            ),
            _query(_rate("numbakv_tier_stored_chunks_total", by="tier"), "stored {{tier}}"),
        ),
        _panel(
            "Tier throughput",
            "Bps",
            "Bytes loaded from and stored to each tier per second.",
            _query(_rate("numbakv_tier_loaded_bytes_total", by="tier"), "loaded {{tier}}"),
            _query(_rate("numbakv_tier_stored_bytes_total", by="tier"), "stored {{tier}}"),
        ),
        _panel(
            "Tier latency p99",
            "s",
            "Batched lookups (one round trip), load and store jobs: p99 per tier.",
            *(_tier_quantile(what, 0.99) for what in ("lookup", "load", "store")),
        ),
        _panel(
            "Tier faults",
            "short",
            "Per second: stores dropped (store full or down), chunks failing their check "
            "(deleted, never loaded), calls finding the store unreachable, late lookups.",
            _query(_rate("numbakv_tier_dropped_stores_total", by="tier"), "dropped {{tier}}"),
            _query(_rate("numbakv_tier_integrity_failures_total", by="tier"), "corrupt {{tier}}"),
            _query(
                _rate("numbakv_tier_unavailable_calls_total", by="tier"), "unreachable {{tier}}"
            ),
            _query(_rate("numbakv_tier_late_lookups_total", by="tier"), "late {{tier}}"),
        ),
        _panel(
            "Tier occupancy",
            "percentunit",
            "Chunks a tier holds / chunks it may hold, for the tiers that bound themselves (a "
            "disk). Redis has none: its server's maxmemory bounds it (see the server's own "
            "used_memory).",
            _query(
                f"sum by (tier) (numbakv_tier_used_chunks{{{SEL}}})"
                f" / sum by (tier) (numbakv_tier_capacity_chunks{{{SEL}}})",
                "{{tier}}",
            ),
        ),
        _panel(
            "Tier breaker open",
            "short",
            "Engines that have stopped calling a tier's store, found unreachable (serving from "
            "host memory meanwhile).",
            _query(f"sum by (tier) (numbakv_tier_breaker_open{{{SEL}}})", "{{tier}}"),
        ),
    ]
    return [
        ("Cache", cache),
        ("Transfers", transfers),
        ("Host pool", pool),
        ("Tiers below host memory", tiers),
    ]


def build() -> model.Dashboard:
    """The dashboard, with a data-source variable and an (all-by-default) instance variable."""
    board = (
        dashboard.Dashboard("numbakv: KV-cache offloading")
        .uid(UID)
        .tags(["numbakv", "kv-cache"])
        .refresh("10s")
        .time("now-30m", "now")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
        .with_variable(
            dashboard.QueryVariable("instance")
            .label("Instance")
            .description(
                "Engine process (the instance label numbakv writes; scrape with honor_labels)"
            )
            .datasource(DATASOURCE)
            # Every family's: vLLM workers write transfer metrics only, SGLang ranks tier ones.
            .query('label_values({__name__=~"numbakv_.+"}, instance)')
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    ids = itertools.count(1)
    for title, panels in _sections():
        board.with_row(dashboard.Row(title).id(next(ids)))
        for panel in panels:
            board.with_panel(panel.id(next(ids)))
    return board.build()


def render() -> str:
    """The dashboard as the JSON Grafana provisions (stable key order, trailing newline)."""
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"

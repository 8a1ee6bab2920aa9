"""The committed dashboard JSON is what the code generates, and covers what the issue asks for."""

from __future__ import annotations

import json

import pytest

generate = pytest.importorskip(
    "dashboards.generate", reason="grafana-foundation-sdk (extra: dashboards) not installed"
)


def committed() -> dict:
    return json.loads(generate.OUTPUT.read_text())


def test_committed_json_is_what_the_code_generates():
    assert generate.OUTPUT.read_text() == generate.render(), (
        "stale: run `python -m dashboards.generate`"
    )


def test_dashboard_has_the_required_panels_and_variables():
    board = committed()
    titles = {p["title"] for p in board["panels"]}
    assert {
        "Hit ratio",
        "Lookups/s",
        "Evictions/s",
        "Stored and loaded blocks/s",
        "Throughput per direction",
        "Transfer latency p50 / p99",
        "Occupancy",
        "ARC target p and lists",
    } <= titles
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "instance"}
    exprs = " ".join(generate.expressions(board))
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.99," in exprs
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_every_expression_filters_by_the_instance_variable():
    for expr in generate.expressions(committed()):
        assert 'instance=~"$instance"' in expr, expr

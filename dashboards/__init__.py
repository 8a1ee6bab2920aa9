"""Grafana dashboards for numbakv, generated from code (``python -m numbakv.dashboards.generate``)."""

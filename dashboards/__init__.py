"""Grafana dashboards for numbakv, generated from code (``python -m dashboards.generate``)."""

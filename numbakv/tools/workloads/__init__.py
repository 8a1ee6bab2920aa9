"""Seeded synthetic workloads in the trace format (`python3 -m numbakv.workloads`:
numbakv.tools.workloads.command)."""

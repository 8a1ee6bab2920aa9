"""Tools around the runtime: replaying traces, planning capacity, generating workloads, the demo.

Nothing in the runtime (the manager, the data path, the offloader, the metrics, the integrations)
imports them; the commands `python3 -m numbakv.replay`, `numbakv.workloads` and `numbakv.demo`
run them.
"""

"""The replay: a trace through the manager, its hit ratio by policy and capacity, and Belady's MIN
beside them (`python3 -m numbakv.replay`: numbakv.tools.replay.command)."""

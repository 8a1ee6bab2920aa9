"""The fleet replay: a trace routed to N engines, each with its host memory and an optional disk,
over an optional shared tier (`python3 -m numbakv.replay --engines N`: numbakv.tools.fleet.command,
which the replay's command hands over to)."""

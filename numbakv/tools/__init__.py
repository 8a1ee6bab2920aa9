"""Tools around the runtime: replaying traces, planning capacity, generating workloads, the demo.

One subpackage a tool, each holding its logic (`core`), its command line and report (`command`)
and what only it needs: `replay` (with Belady's MIN and the capacity-planning table), `fleet` (the
replay through N engines, their routing and table; the replay's command hands over to it),
`demo` (with its tier option) and `workloads`. What several share stays here: `cli` (one-line
errors, argument types, Ctrl-C), `progress`, `traces` and `ttft_profile` (what the replay's and
the fleet's hits are worth in seconds).

Nothing in the runtime (the manager, the data path, the offloader, the metrics, the integrations)
imports them; the commands `python3 -m numbakv.replay`, `numbakv.workloads` and `numbakv.demo`
run them.
"""

"""The demo: a stand-in engine over numbakv's whole path, every loaded block checked byte for byte,
optionally two engines over a tier below host memory (`python3 -m numbakv.demo`:
numbakv.tools.demo.command)."""

"""``python -m numbakv.service``: the same as ``numbakv-sidecar``."""

from numbakv.service.cli import main

main()

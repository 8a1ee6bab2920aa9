"""``python -m service``: the same as ``numbakv-sidecar``."""

from service.cli import main

main()

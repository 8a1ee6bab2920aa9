"""``python -m numbakv.service.healthcheck``: exit 0 when the local sidecar answers /healthz (the image's HEALTHCHECK)."""

from __future__ import annotations

import os
import sys
import urllib.request

from numbakv.service.settings import PORT_ENV


def main() -> int:
    url = f"http://127.0.0.1:{os.environ.get(PORT_ENV, '9464')}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return 0 if response.status == 200 else 1
    except OSError:
        return 1


if __name__ == "__main__":
    sys.exit(main())

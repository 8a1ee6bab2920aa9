"""``python -m numbakv.service.healthcheck``: exit 0 when the local sidecar answers /healthz (the image's HEALTHCHECK).

Docker's HEALTHCHECK cannot see the arguments ``docker run IMAGE --port 9000`` gave the sidecar, so
the check reads them where the kernel keeps them, ``/proc/PID/cmdline``, and parses them as the
sidecar did, with the environment variables (which Docker gives the check as it gave the sidecar).
"""

from __future__ import annotations

import http.client
import os
import sys
import urllib.error
import urllib.request

from numbakv.service.settings import parse_settings

TIMEOUT_S = 2.0
"""Seconds for each sidecar's answer; the image's HEALTHCHECK allows 5 s in all."""
_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1"}
"""Where a sidecar bound to every interface answers locally."""


def sidecar_flags(argv: list[str]) -> list[str] | None:
    """The flags of a process's command line if it runs the sidecar (``numbakv-sidecar`` or
    ``python -m numbakv.service``), else None."""
    if len(argv) > 1 and os.path.basename(argv[1]) == "numbakv-sidecar":
        return argv[2:]
    if argv[1:3] == ["-m", "numbakv.service"]:
        return argv[3:]
    return None


def sidecar_urls(proc: str = "/proc") -> list[str]:
    """The /healthz address of each sidecar process visible in ``proc``."""
    urls = []
    for pid in filter(str.isdigit, os.listdir(proc)):
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
        except OSError:  # a process that ended meanwhile
            continue
        flags = sidecar_flags(argv)
        if flags is not None:
            settings = parse_settings(flags)
            host = _LOOPBACK.get(settings.host, settings.host)
            address = f"[{host}]" if ":" in host else host
            urls.append(f"http://{address}:{settings.port}/healthz")
    return urls


def main(proc: str = "/proc") -> int:
    """0 when a sidecar answers 200, else 1 and one line on stderr saying what was asked (what
    `docker inspect` shows). Proxies are bypassed: the address is local."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    urls, answers = sidecar_urls(proc), []
    for url in urls:
        try:
            with opener.open(url, timeout=TIMEOUT_S) as response:
                if response.status == 200:
                    return 0
                answers.append(f"{url}: HTTP {response.status}")
        except urllib.error.HTTPError as error:
            answers.append(f"{url}: HTTP {error.code}")
        except (OSError, http.client.HTTPException) as error:
            answers.append(f"{url}: {error}")
    said = "; ".join(answers) if urls else "no numbakv-sidecar process found"
    print(f"numbakv healthcheck: unhealthy: {said}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""The sidecar's settings, from command-line flags with environment variables as defaults (for containers)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

HOST_ENV = "NUMBAKV_SIDECAR_HOST"
PORT_ENV = "NUMBAKV_SIDECAR_PORT"
METRICS_DIR_ENV = "NUMBAKV_METRICS_DIR"
CACHE_ENV = "NUMBAKV_SIDECAR_CACHE_SECONDS"
DEFAULT_METRICS_DIR = "/tmp/numbakv-metrics"


@dataclass(frozen=True)
class Settings:
    """Where to listen and which directory to read; loopback by default."""

    host: str = "127.0.0.1"
    port: int = 9464
    metrics_dir: str = DEFAULT_METRICS_DIR
    cache_s: float = 0.25
    """How often a background thread re-reads the directory; requests share its last read (0: read per request)."""
    sample_interval_s: float = 1.0
    """How often the rate window behind ``/stats`` takes a sample."""


def parse_settings(
    argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ
) -> Settings:
    """Flags win over ``NUMBAKV_SIDECAR_HOST``/``_PORT`` and ``NUMBAKV_METRICS_DIR``
    (then ``PROMETHEUS_MULTIPROC_DIR``), which win over the defaults."""
    parser = argparse.ArgumentParser(prog="numbakv-sidecar", description=__doc__)
    parser.add_argument(
        "--host",
        default=env.get(HOST_ENV, Settings.host),
        help=f"address to bind (env {HOST_ENV}; default %(default)s)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(env.get(PORT_ENV, Settings.port)),
        help=f"port to listen on (env {PORT_ENV}; default %(default)s)",
    )
    parser.add_argument(
        "--metrics-dir",
        default=env.get(METRICS_DIR_ENV, env.get("PROMETHEUS_MULTIPROC_DIR", DEFAULT_METRICS_DIR)),
        help=f"the engine's PROMETHEUS_MULTIPROC_DIR (env {METRICS_DIR_ENV}; default %(default)s)",
    )
    parser.add_argument(
        "--cache-seconds",
        type=float,
        default=float(env.get(CACHE_ENV, Settings.cache_s)),
        help=f"re-read the directory this often, in the background (env {CACHE_ENV}; default %(default)s)",
    )
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be in 1..65535, not {args.port}")
    if not 0 <= args.cache_seconds <= 60:
        parser.error(f"--cache-seconds must be in 0..60, not {args.cache_seconds}")
    return Settings(
        host=args.host, port=args.port, metrics_dir=args.metrics_dir, cache_s=args.cache_seconds
    )

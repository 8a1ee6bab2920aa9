"""The sidecar's settings, from command-line flags with environment variables as defaults (for containers)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

HOST_ENV = "NUMBAKV_SIDECAR_HOST"
PORT_ENV = "NUMBAKV_SIDECAR_PORT"
METRICS_DIR_ENV = "NUMBAKV_METRICS_DIR"
CACHE_ENV = "NUMBAKV_SIDECAR_CACHE_SECONDS"
TIMEOUT_ENV = "NUMBAKV_SIDECAR_REQUEST_TIMEOUT_SECONDS"
MAX_CONNECTIONS_ENV = "NUMBAKV_SIDECAR_MAX_CONNECTIONS"
DEFAULT_METRICS_DIR = "/tmp/numbakv-metrics"


@dataclass(frozen=True)
class Settings:
    """Where to listen, which directory to read, and the connection limits; loopback by default."""

    host: str = "127.0.0.1"
    port: int = 9464
    metrics_dir: str = DEFAULT_METRICS_DIR
    cache_s: float = 0.25
    """How often a background thread re-reads the directory; requests serve its last read."""
    sample_interval_s: float = 1.0
    """How often the rate window behind ``/stats`` takes a sample."""
    request_timeout_s: float = 5.0
    """A connection is closed when it has not sent a request and been answered this long after
    opening or after its previous response (so also when idle that long)."""
    max_connections: int = 128
    """Open connections past this close the oldest one."""


_KINDS = {int: "a whole number", float: "a number"}
"""What a variable's value must be, by type, in the error naming it."""

# flag, Settings field, type, metavar, environment variables (the first set wins), help, range
# (above the first bound, at most the second)
_OPTIONS = (
    ("--host", "host", str, "ADDRESS", (HOST_ENV,), "address to bind", None),
    ("--port", "port", int, "PORT", (PORT_ENV,), "port to listen on", (0, 65535)),
    (
        "--metrics-dir",
        "metrics_dir",
        str,
        "DIR",
        (METRICS_DIR_ENV, "PROMETHEUS_MULTIPROC_DIR"),
        "the engines' PROMETHEUS_MULTIPROC_DIR",
        None,
    ),
    (
        "--cache-seconds",
        "cache_s",
        float,
        "SECONDS",
        (CACHE_ENV,),
        "re-read the directory this often, in the background",
        (0, 60),
    ),
    (
        "--request-timeout-seconds",
        "request_timeout_s",
        float,
        "SECONDS",
        (TIMEOUT_ENV,),
        "close a connection that has not sent a request and been answered this long "
        + "after opening or after its previous response",
        (0, 300),
    ),
    (
        "--max-connections",
        "max_connections",
        int,
        "N",
        (MAX_CONNECTIONS_ENV,),
        "open connections at most; one more closes the oldest",
        (0, 65536),
    ),
)


def fail(message: str) -> NoReturn:
    """One line on stderr, as argparse words an error, and exit status 2."""
    sys.stderr.write(f"numbakv-sidecar: error: {message}\n")
    raise SystemExit(2)


class _Parser(argparse.ArgumentParser):
    """Errors in one line, as numbakv's other commands give them (without argparse's usage)."""

    def error(self, message: str) -> NoReturn:
        fail(message)


def parse_settings(
    argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ
) -> Settings:
    """Flags win over the environment variables, which win over the defaults.

    A bad value exits with status 2 and one line naming the flag or the variable, and the value.
    """
    parser = _Parser(
        prog="numbakv-sidecar",
        description="Serve what an engine's processes record in a prometheus-client multiprocess "
        "directory: GET /metrics, /healthz, /stats.",
    )
    for flag, name, kind, metavar, variables, help_text, _ in _OPTIONS:
        parser.add_argument(
            flag,
            dest=name,
            type=kind,
            metavar=metavar,
            help=f"{help_text} (env {', then '.join(variables)}; default {getattr(Settings, name)})",
        )
    args = parser.parse_args(argv)
    values = {}
    for flag, name, kind, _, variables, _, bounds in _OPTIONS:
        value, source = getattr(args, name), flag
        if value is None:
            variable = next((v for v in variables if v in env), None)
            if variable is None:
                continue
            source = f"the environment variable {variable}"
            text = env[variable]
            if not text.strip():
                fail(f"{source} is set but empty; give it a value or unset it")
            try:
                value = kind(text)
            except ValueError:
                fail(f"{source} is {text!r}, not {_KINDS[kind]}")
        elif kind is str and not value.strip():  # `--host ""` would bind every interface
            fail(f"{flag} is empty; give it a value or leave the flag out")
        if bounds is not None and not bounds[0] < value <= bounds[1]:
            fail(f"{source} must be above {bounds[0]} and at most {bounds[1]}, not {value}")
        values[name] = value
    return Settings(**values)

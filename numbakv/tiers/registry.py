"""`open_tier`: a tier below host memory from a URL, through one registry keyed by its scheme.

    dir:PATH, file:///PATH                        the disk tier (`DiskSettings`)
    redis://, rediss://, valkey://, valkeys://    a Redis or Valkey server (`RedisSettings`);
                                                  `?cluster=true`: a Redis Cluster, the URL one node
    unix:///PATH?db=N                             a Redis or Valkey server on this host, over its
                                                  Unix socket

Settings come from the URL's query (`redis://host:6379/0?ttl_s=600&lookup_deadline_s=0.01`) and
from keyword arguments, never one key both ways; every scheme also takes the tier's own
(`TierSettings`). All are checked, each by name, before anything is opened. A store that cannot be
opened raises `TierOpenError` with one line saying why.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import numpy as np

from numbakv.jobs import JobDoneCallback
from numbakv.tiers.backend import ChunkBackend, TierOpenError
from numbakv.tiers.namespace import Namespace
from numbakv.tiers.settings import (
    field_names,
    from_text,
    redacted,
    refuse_unescaped_credentials,
)
from numbakv.tiers.tier import ChunkTier, HostPoolLike, TierSettings, host_rows


@dataclass(frozen=True)
class BackendKind:
    """One entry of the registry: the module of a backend, its settings class, and which setting
    the URL's location fills (the rest of the URL is the query)."""

    name: str
    module: str
    settings_class: str
    location: str
    needs: str

    def settings_type(self) -> type:
        return getattr(importlib.import_module(self.module), self.settings_class)

    def setting_names(self) -> frozenset[str]:
        """Every key a tier of this kind takes: the tier's own and its backend's."""
        return frozenset({*field_names(TierSettings), *field_names(self.settings_type())})


DISK = BackendKind(
    "disk tier",
    "numbakv.tiers.disk",
    "DiskSettings",
    "root_dir",
    "a directory: dir:PATH, or a root_dir setting",
)
REDIS = BackendKind(
    "Redis tier", "numbakv.tiers.redis", "RedisSettings", "url", "a url: redis://HOST:6379/0"
)
REGISTRY: dict[str, BackendKind] = {
    "dir": DISK,
    "file": DISK,
    "redis": REDIS,
    "rediss": REDIS,
    "valkey": REDIS,
    "valkeys": REDIS,
    "unix": REDIS,
}
"""The backend of each URL scheme."""


@dataclass(frozen=True)
class TierURL:
    """A tier's URL taken apart: its backend, and the settings its location and query give (as
    their fields' types). A Redis URL keeps the query's client options (TLS's, a unix:// URL's
    database), which the client reads."""

    kind: BackendKind
    settings: dict[str, Any]


def parse_tier_url(url: str) -> TierURL:
    """Take `url` apart, refusing an unknown scheme or query key by name; nothing is opened."""
    if not isinstance(url, str):
        raise TypeError(f"a tier's url must be a string, got {url!r}")
    scheme, colon, rest = url.partition(":")
    kind = REGISTRY.get(scheme.lower()) if colon else None
    if kind is None:
        raise ValueError(
            "a tier's url must be dir:PATH or redis://HOST:PORT/DB (or file:///PATH, rediss://, "
            f"valkey://, valkeys://, unix:///SOCKET), got {redacted(url)!r}"
        )
    if kind is not DISK:
        refuse_unescaped_credentials(url)
    parts = urlsplit(url)
    settings_type = kind.settings_type()
    client_options = getattr(importlib.import_module(kind.module), "URL_OPTIONS", ())
    settings, kept = {}, []
    for key, text in parse_qsl(parts.query, keep_blank_values=True):
        if key in client_options:
            kept.append((key, text))
            continue
        if key == kind.location:
            raise ValueError(f"{key} is the url's location, not a setting of its query")
        _check_known(kind, key)
        if key in settings:
            raise ValueError(f"{key} is given twice in the url")
        owner = TierSettings if key in field_names(TierSettings) else settings_type
        settings[key] = from_text(owner, key, text)
    if kind is DISK:  # `dir:` alone leaves root_dir to the settings
        path = unquote(parts.path) if scheme == "file" else rest.partition("?")[0]
        if scheme == "file" and parts.netloc not in ("", "localhost"):
            raise ValueError(f"a file:// url names a local directory, got host {parts.netloc!r}")
        if path:
            settings[kind.location] = path
    else:
        query = f"?{urlencode(kept)}" if kept else ""  # as given, less numbakv's own settings
        settings[kind.location] = url.partition("#")[0].partition("?")[0] + query
    return TierURL(kind, settings)


@dataclass(frozen=True)
class TierConfig:
    """Every setting of a tier, checked: its backend, the tier's own and the backend's."""

    kind: BackendKind
    tier: TierSettings
    backend: Any  # the kind's settings class: RedisSettings, DiskSettings


def tier_config(url: str, **settings: Any) -> TierConfig:
    """The settings `url` and `settings` give, each checked by name as `open_tier` checks them;
    nothing is opened (a command line checks its arguments so, before it starts)."""
    parsed = parse_tier_url(url)
    kind, given = parsed.kind, dict(parsed.settings)
    settings_type = kind.settings_type()
    for key, value in settings.items():
        _check_known(kind, key)
        if key in given:
            where = "the url's location" if key == kind.location else "the url's query"
            raise ValueError(f"{key} is given both in {where} and as an argument")
        given[key] = value
    if kind.location not in given:
        raise ValueError(f"the {kind.name} needs {kind.needs}")
    tier_keys = set(field_names(TierSettings)) & set(given)
    tier = TierSettings(**{key: given.pop(key) for key in tier_keys})
    backend = settings_type.from_mapping(given)
    if kind is REDIS:  # every I/O thread, a batch's stripes and the lookup may each hold one
        needed = tier.io_threads + max(backend.stripes, backend.read_stripes) + 1
        if backend.max_connections < needed:
            raise ValueError(
                f"max_connections must be at least io_threads + max(stripes, read_stripes) + 1 "
                f"= {needed}, got {backend.max_connections}"
            )
    return TierConfig(kind, tier, backend)


def open_tier(
    url: str,
    host_pool: np.ndarray | HostPoolLike,
    namespace: Namespace,
    *,
    on_job_done: JobDoneCallback | None = None,
    **settings: Any,
) -> ChunkTier:
    """The tier `url` names over `host_pool` (a numbakv HostPool or its 2-D uint8 array, one row a
    chunk), its chunks in `namespace`; `settings` beside the URL's query (module docstring). A
    bare `dir:` takes its directory from the `root_dir` setting. `on_job_done` is called with each
    finished job, on the tier's thread (as `ChunkTier` calls it).

    Bad settings raise ValueError (or TypeError) naming the key; a store that cannot be opened
    raises TierOpenError.
    """
    config = tier_config(url, **settings)
    if not isinstance(namespace, Namespace):
        raise TypeError(f"namespace must be a Namespace, got {type(namespace).__name__}")
    rows = host_rows(host_pool)
    backend = _open_backend(config.kind, config.backend, namespace, rows.shape[1])
    try:
        return ChunkTier(backend, rows, namespace, on_job_done=on_job_done, **asdict(config.tier))
    except BaseException:  # refused: no connection or file outlives the error
        backend.close()
        raise


def _open_backend(
    kind: BackendKind, settings: Any, namespace: Namespace, chunk_bytes: int
) -> ChunkBackend:
    module = importlib.import_module(kind.module)
    if kind is REDIS:
        return module.RedisBackend(settings, namespace.digest)
    try:
        return module.DiskBackend(settings, namespace, chunk_bytes)
    except OSError as error:  # the directory cannot be made or written
        why = error.strerror or error  # without the namespace's subdirectory, which is ours
        raise TierOpenError(f"dir:{settings.root_dir}: {why}") from None


def _check_known(kind: BackendKind, key: str) -> None:
    known = kind.setting_names()
    if key not in known:
        raise ValueError(f"unknown {kind.name} setting {key!r}; known: {', '.join(sorted(known))}")

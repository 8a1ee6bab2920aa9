"""The Redis/Valkey backend: one key per chunk on a standalone server or a Redis Cluster.

A key is `<key_prefix>:<namespace digest, hex>:<chunk key>`, so one chunk is one key in one cluster
slot and two namespaces never share a key. Every batch is one pipeline (one round trip per server)
over a bounded connection pool, run on the tier's threads. A value is the chunk header then the
payload, written by one SET: a reader sees all of it or none of it.

Copies of a payload (redis-py with hiredis): a store joins header and payload into one bytes value
(1) which hiredis packs into the command (2), then the kernel sends it; a load gets the reply from
the socket into redis-py's read buffer (1), hiredis's reader (2) and a bytes value (3), copied into
the host-pool row (4). redis-py joins a command's arguments, so none of these can be skipped without
writing protocol code of our own.

Capacity: at start the backend reads each server's `maxmemory-policy`; a policy that refuses writes
when the server is full (`noeviction`, or `volatile-*` with no TTL on our keys) stops the engine
unless `ttl_s` is set (then every value expires). A write refused anyway (OOM) is a dropped store.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    AuthenticationError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.retry import Retry

from numbakv.tiers.backend import BackendUnavailable, ChunkBackend, StoredValue

logger = logging.getLogger("numbakv.tiers")

SCHEMES = ("redis", "rediss")
DEFAULT_PASSWORD_ENV = "NUMBAKV_REDIS_PASSWORD"
# What redis-py raises when a server does not answer (a cluster's own errors are not RedisErrors).
_UNREACHABLE = (RedisError, RedisClusterException, OSError)
# Policies under which a full server refuses writes to keys without a TTL.
_REFUSING_POLICIES = (
    "noeviction",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
)


@dataclass(frozen=True)
class RedisSettings:
    """How to reach the store and what to write there; `from_mapping` checks every key.

    `url`: `redis://` or `rediss://` (TLS), with `user:password@` for AUTH/ACL or without it, the
    password then read from the environment variable named by `password_env` (never logged).
    `cluster`: the URL names one node of a Redis Cluster. `ttl_s`: every value expires after this
    many seconds (required against a server that refuses writes when full). `max_connections`:
    the pool's bound (per node in a cluster). `socket_timeout_s`: how long one batch may wait on
    the server before the store counts as unreachable; `connect_timeout_s` the same for connecting.
    """

    url: str
    cluster: bool = False
    key_prefix: str = "numbakv"
    ttl_s: float | None = None
    password_env: str = DEFAULT_PASSWORD_ENV
    max_connections: int = 8
    socket_timeout_s: float = 2.0
    connect_timeout_s: float = 0.5

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or urlsplit(self.url).scheme not in SCHEMES:
            raise ValueError(f"url must be a redis:// or rediss:// URL, got {redacted(self.url)!r}")
        if not isinstance(self.cluster, bool):
            raise TypeError(f"cluster must be true or false, got {self.cluster!r}")
        if not isinstance(self.key_prefix, str) or not self.key_prefix:
            raise ValueError(f"key_prefix must be a non-empty string, got {self.key_prefix!r}")
        if self.ttl_s is not None and not _positive(self.ttl_s):
            raise ValueError(f"ttl_s must be a positive number of seconds, got {self.ttl_s!r}")
        if not isinstance(self.password_env, str) or not self.password_env:
            raise ValueError(
                f"password_env must name an environment variable, got {self.password_env!r}"
            )
        if (
            isinstance(self.max_connections, bool)
            or not isinstance(self.max_connections, int)
            or self.max_connections < 1
        ):
            raise ValueError(
                f"max_connections must be a positive int, got {self.max_connections!r}"
            )
        for name in ("socket_timeout_s", "connect_timeout_s"):
            if not _positive(getattr(self, name)):
                raise ValueError(
                    f"{name} must be a positive number of seconds, got {getattr(self, name)!r}"
                )

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> RedisSettings:
        """Settings from a configuration's keys; an unknown or missing key is named in the error."""
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(
                f"unknown Redis tier setting {unknown[0]!r}; known: {', '.join(sorted(known))}"
            )
        if "url" not in settings:
            raise ValueError("the Redis tier needs a url setting (redis://host:6379/0)")
        return cls(**settings)

    @property
    def ttl_ms(self) -> int | None:
        return None if self.ttl_s is None else max(1, round(self.ttl_s * 1000))


def redacted(url: object) -> str:
    """The URL with its password and query (which may hold one) hidden: what logs may show."""
    if not isinstance(url, str):
        return repr(url)
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user = netloc.rsplit("@", 1)[0].split(":", 1)[0]
        netloc = f"{user}:***@{netloc.rsplit('@', 1)[1]}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class RedisBackend(ChunkBackend):
    """Chunks as values of a Redis/Valkey server or cluster, in namespace `namespace_digest`."""

    def __init__(self, settings: RedisSettings, namespace_digest: bytes) -> None:
        self.settings = settings
        self._prefix = f"{settings.key_prefix}:{namespace_digest.hex()}:".encode()
        self._client = _connect(settings)
        logger.info(
            "numbakv Redis tier: %s%s, key prefix %r, TTL %s",
            redacted(settings.url),
            " (cluster)" if settings.cluster else "",
            self._prefix.decode(),
            "none" if settings.ttl_s is None else f"{settings.ttl_s} s",
        )
        try:
            self._check_capacity_policy()
        except BaseException:  # refused at start: no connection outlives the error
            self._client.close()
            raise

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        replies = self._pipelined(lambda pipe, key, _: pipe.exists(key), keys)
        return [reply == 1 for reply in replies]

    def write(
        self, keys: Sequence[bytes], headers: Sequence[bytes], payloads: Sequence[memoryview]
    ) -> list[bool]:
        ttl_ms = self.settings.ttl_ms
        values = [b"".join((header, payload)) for header, payload in zip(headers, payloads)]
        replies = self._pipelined(lambda pipe, key, i: pipe.set(key, values[i], px=ttl_ms), keys)
        refused = [reply for reply in replies if isinstance(reply, ResponseError)]
        if refused:
            logger.debug("numbakv Redis tier: %d writes refused: %s", len(refused), refused[0])
        return [reply is True for reply in replies]

    def read_into(
        self, keys: Sequence[bytes], payloads: Sequence[memoryview], header_bytes: int
    ) -> list[StoredValue | None]:
        found: list[StoredValue | None] = []
        for value, payload in zip(
            self._pipelined(lambda pipe, key, _: pipe.get(key), keys), payloads
        ):
            if not isinstance(value, bytes):
                found.append(None)
                continue
            body = memoryview(value)[header_bytes:]
            count = min(body.nbytes, payload.nbytes)
            payload[:count] = body[:count]
            found.append(StoredValue(value[:header_bytes], body.nbytes))
        return found

    def delete(self, keys: Sequence[bytes]) -> None:
        self._pipelined(lambda pipe, key, _: pipe.delete(key), keys)

    def close(self) -> None:
        self._client.close()

    def _pipelined(self, command, keys: Sequence[bytes]) -> list:
        """`command(pipeline, full key, index in keys)` per key, pipelined: one round trip per
        server. A command's error is its reply; so is a cluster node's unreachability for its
        keys (the other nodes' keys still move); a store entirely unreachable is
        BackendUnavailable."""
        if not keys:
            return []
        if not self.settings.cluster:
            return self._pipeline_on(self._client, command, keys, range(len(keys)))
        replies: list = [None] * len(keys)
        by_node: dict[str, list[int]] = {}
        nodes = {}
        for index, key in enumerate(keys):
            try:
                node = self._client.get_node_from_key(self._prefix + key)
            except _UNREACHABLE as error:  # its slot is served by no node now
                replies[index] = BackendUnavailable(str(error))
                continue
            nodes[node.name] = node
            by_node.setdefault(node.name, []).append(index)
        answered = 0
        for name, indexes in by_node.items():
            server = self._client.get_redis_connection(nodes[name])
            try:
                node_replies = self._pipeline_on(server, command, keys, indexes)
                answered += 1
            except BackendUnavailable as error:
                node_replies = [error] * len(indexes)
            for index, reply in zip(indexes, node_replies):
                replies[index] = reply
        if not answered:
            raise BackendUnavailable(
                f"{redacted(self.settings.url)}: no node of the batch answered"
            )
        if answered < len(by_node) or any(_moved(reply) for reply in replies):
            self._refresh_slots()
        return replies

    def _refresh_slots(self) -> None:
        """Ask the cluster again which node serves which slots (a node failed, slots moved)."""
        try:
            self._client.nodes_manager.initialize()
        except _UNREACHABLE as error:
            logger.debug("numbakv Redis tier: cluster slots not refreshed: %s", error)

    def _pipeline_on(
        self,
        server: redis.Redis | RedisCluster,
        command,
        keys: Sequence[bytes],
        indexes: Sequence[int],
    ) -> list:
        try:
            pipe = server.pipeline(transaction=False)
            for index in indexes:
                command(pipe, self._prefix + keys[index], index)
            return pipe.execute(raise_on_error=False)
        except _UNREACHABLE as error:
            raise BackendUnavailable(f"{redacted(self.settings.url)}: {error}") from error

    def _check_capacity_policy(self) -> None:
        """Refuse a server that rejects writes when full unless values expire; say when unknown."""
        nodes = self._client.get_primaries() if self.settings.cluster else [None]
        for node in nodes:
            server = self._client if node is None else self._client.get_redis_connection(node)
            where = redacted(self.settings.url) if node is None else node.name
            try:
                config = server.config_get("maxmemory*")
            except AuthenticationError:
                raise
            except ResponseError as error:
                logger.warning(
                    "numbakv Redis tier: CONFIG GET is disabled on %s (%s): the eviction policy "
                    "cannot be checked; a full server that refuses writes drops stores",
                    where,
                    error,
                )
                continue
            except _UNREACHABLE as error:
                logger.warning(
                    "numbakv Redis tier: %s unreachable at start (%s): serving from host memory "
                    "until it answers; its eviction policy is not checked",
                    where,
                    error,
                )
                continue
            policy, maxmemory = config.get("maxmemory-policy", ""), int(config.get("maxmemory", 0))
            if policy in _REFUSING_POLICIES and self.settings.ttl_s is None:
                raise RuntimeError(
                    f"Redis at {where} has maxmemory-policy {policy}: once full it refuses every "
                    "write. Set ttl_s (seconds) so numbakv's values expire, or give the server an "
                    "allkeys-* policy (allkeys-lru) and a maxmemory"
                )
            if maxmemory == 0:
                logger.warning(
                    "numbakv Redis tier: %s has no maxmemory: it grows until its host runs out of "
                    "memory; set maxmemory and maxmemory-policy allkeys-lru",
                    where,
                )
            logger.info("numbakv Redis tier: %s maxmemory %d, policy %s", where, maxmemory, policy)


def _connect(settings: RedisSettings) -> redis.Redis | RedisCluster:
    """A client over a bounded pool, no retries (the tier's breaker handles a down store). Stops
    the engine when the password is refused, or when no node of a cluster answers."""
    options: dict[str, Any] = {
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.connect_timeout_s,
        "retry": Retry(NoBackoff(), 0),
    }
    if urlsplit(settings.url).password is None and os.environ.get(settings.password_env):
        options["password"] = os.environ[settings.password_env]
    if settings.cluster:
        try:  # the client learns the cluster's slots now: it needs a node to answer
            client = RedisCluster.from_url(
                settings.url, max_connections=settings.max_connections, **options
            )
        except _UNREACHABLE as error:
            raise RuntimeError(
                f"Redis Cluster at {redacted(settings.url)} did not answer at start, so its "
                f"slots are unknown: {error}"
            ) from None
    else:
        pool = redis.BlockingConnectionPool.from_url(
            settings.url,
            max_connections=settings.max_connections,
            timeout=settings.socket_timeout_s,
            **options,
        )
        client = redis.Redis.from_pool(pool)  # owns the pool: close() disconnects it
    try:
        client.ping()
    except AuthenticationError as error:
        client.close()
        raise AuthenticationError(
            f"Redis at {redacted(settings.url)} refused the password (from the url or "
            f"{settings.password_env}): {error}"
        ) from None
    except _UNREACHABLE:
        pass  # unreachable now: the tier serves from host memory until it answers
    return client


def _moved(reply: object) -> bool:
    """A cluster node's answer that another node serves the key (MOVED, or ASK while migrating)."""
    return isinstance(reply, AskError)


def _positive(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0

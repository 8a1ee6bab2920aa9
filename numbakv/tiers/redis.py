"""The Redis/Valkey backend: one key per chunk on a standalone server or a Redis Cluster.

A key is `<key_prefix>:<namespace digest, hex>:<chunk key>`, so one chunk is one key in one cluster
slot and two namespaces never share a key. Every batch is one pipeline (one round trip per server)
over a bounded connection pool, run on the tier's threads. A value is the chunk header then the
payload, written by one SET: a reader sees all of it or none of it.

Copies of a payload: none. redis-py keeps the connections (pool, TLS, AUTH/ACL, the database, a
cluster's nodes); the chunks' commands and replies go through `resp.py`, which hands the kernel the
host-pool row as it lies and reads a loaded value straight into its row (redis-py alone would copy
a payload twice on the way out and three times on the way in, then once more into the row).

Capacity: at start the backend reads each server's `maxmemory-policy`; a policy that refuses writes
when the server is full (`noeviction`, or `volatile-*` with no TTL on our keys) stops the engine
unless `ttl_s` is set (then every value expires). A write refused anyway (OOM) is a dropped store.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

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

from numbakv.checks import positive
from numbakv.tiers.backend import BackendUnavailable, ChunkBackend, StoredValue, TierOpenError
from numbakv.tiers.chunk_format import checksum
from numbakv.tiers.resp import Replies, command, send, set_command, whole_reads
from numbakv.tiers.settings import redacted, refuse_unescaped_credentials, settings_from

logger = logging.getLogger("numbakv.tiers")

SCHEMES = {
    "redis": "redis",
    "rediss": "rediss",
    "valkey": "redis",
    "valkeys": "rediss",
    "unix": "unix",
}
"""The URL schemes taken, and what each is to the client (a Valkey server speaks Redis's protocol;
unix:// is a server on this host, over its Unix socket)."""
TLS_URL_OPTIONS = (
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_cert_reqs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_check_hostname",
    "ssl_min_version",
)
"""The client's TLS options a rediss:// or valkeys:// URL's query may carry (`?ssl_ca_certs=PATH`)."""
UNIX_URL_OPTIONS = ("db",)
"""What a unix:// URL's query may carry: the database number (its path is the socket's)."""
URL_OPTIONS = TLS_URL_OPTIONS + UNIX_URL_OPTIONS
"""Every client option a URL's query may carry; `RedisSettings` checks which its scheme takes."""
DEFAULT_PASSWORD_ENV = "NUMBAKV_REDIS_PASSWORD"
WINDOW_BYTES = 2 << 20
"""Bytes of chunks a connection has asked for and not yet received (at least one chunk)."""
REPLY_WINDOW = 1024
"""Commands with replies of a few bytes (SET, EXISTS, DEL) a connection has sent and not yet had
answered. A batch of stores goes out whole before its first reply is read, paced by the socket's
send buffer; the bound keeps the unread replies within the socket's receive buffer."""
CLEAR_BATCH = 1000
"""Keys a SCAN step asks for, and deleted by one pipeline, when a namespace is cleared."""
STRIPE_BYTES = 8 << 20
"""The least bytes of chunks a stripe of a batch moves: less is not worth a connection's turn."""
NODE_COOLDOWN_S = 5.0
"""How long a cluster node that failed to answer is left alone, its keys' commands failing at once,
before a call asks it again: a hung node cost every call socket_timeout_s, and its keys' misses
made the other nodes' keys late too."""
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
    """How to reach the store and what to write there; checked when built.

    `url`: `redis://`, `rediss://` (TLS), `valkey://` or `valkeys://` (the same for a Valkey
    server), with `user:password@` for AUTH/ACL or without it, the password then read from the
    environment variable named by `password_env` (never logged); its path is the database number
    (`/0` by default), its query only TLS options (`TLS_URL_OPTIONS`). `unix:///PATH?db=N`: a server
    on this host, over its Unix socket at PATH (no TCP stack between the two processes). `cluster`:
    the URL names one node of a Redis Cluster (over TCP). `ttl_s`: every value expires after this
    many seconds (required against a server that refuses writes when full). `max_connections`: the
    pool's bound (per node in a cluster). `stripes`: the connections, each on a thread of its own,
    that one batch of stores is spread over (at least STRIPE_BYTES of chunks a stripe) on a
    standalone server, at most `max_connections` - 1 (one connection is left for lookups); one by
    default: a batch's stores stream out without waiting for their replies, so one connection keeps
    the server busy, and more threads only take turns on the client's cores (raise it where the
    client has cores to spare and the link outruns what one core copies). `read_stripes`: the same
    for a batch of loads, two by default: a connection waits for the values it asked for
    (WINDOW_BYTES at a time), and a second one fills that wait. `socket_timeout_s`: how long the
    server may take over one step of a batch (to send one reply whole, or to take one group of
    commands) before the store counts as unreachable, so a server that trickles bytes is
    unreachable too; `connect_timeout_s` the same for connecting.
    """

    url: str
    cluster: bool = False
    key_prefix: str = "numbakv"
    ttl_s: float | None = None
    password_env: str = DEFAULT_PASSWORD_ENV
    max_connections: int = 16
    stripes: int = 1
    read_stripes: int = 2
    socket_timeout_s: float = 2.0
    connect_timeout_s: float = 0.5

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or urlsplit(self.url).scheme not in SCHEMES:
            raise ValueError(
                f"url must be a {', '.join(f'{scheme}://' for scheme in SCHEMES)} URL, got "
                f"{redacted(self.url)!r}"
            )
        parts = urlsplit(self.url)
        refuse_unescaped_credentials(self.url)
        unix = parts.scheme == "unix"
        if unix and not parts.path:
            raise ValueError(
                f"a unix:// url names the server's socket (unix:///run/redis.sock), got "
                f"{redacted(self.url)!r}"
            )
        if not unix:
            try:
                port = parts.port
            except ValueError:  # not a number, or past 65535
                port = 0
            if port == 0:
                raise ValueError(
                    f"the url's port must be a number from 1 to 65535, got {redacted(self.url)!r}"
                )
        tls = SCHEMES[parts.scheme] == "rediss"
        taken = UNIX_URL_OPTIONS if unix else TLS_URL_OPTIONS if tls else ()
        options = parse_qs(parts.query, keep_blank_values=True)
        for option in options:
            if option not in taken:
                also = f" and {', '.join(taken)}" if taken else " (TLS options need rediss://)"
                raise ValueError(
                    f"unknown Redis URL option {option!r}; a {parts.scheme}:// URL's query takes "
                    f"numbakv's tier settings (through open_tier){also}"
                )
        _check_tls_options({option: values[-1] for option, values in options.items()})
        if not isinstance(self.cluster, bool):
            raise TypeError(f"cluster must be true or false, got {self.cluster!r}")
        if self.cluster and unix:
            raise ValueError(
                "a Redis Cluster is reached over TCP: the url must be redis://, rediss://, "
                "valkey:// or valkeys://"
            )
        database = self.database
        if self.cluster and database != 0:
            raise ValueError(f"a Redis Cluster has database 0 only, the url names /{database}")
        if not isinstance(self.key_prefix, str) or not self.key_prefix:
            raise ValueError(f"key_prefix must be a non-empty string, got {self.key_prefix!r}")
        if self.ttl_s is not None:
            object.__setattr__(self, "ttl_s", positive("ttl_s", self.ttl_s, unit="seconds"))
            _at_most("ttl_s", self.ttl_s, MAX_TTL_S, "a century")
        if not isinstance(self.password_env, str) or not self.password_env:
            raise ValueError(
                f"password_env must name an environment variable, got {self.password_env!r}"
            )
        for name in ("max_connections", "stripes", "read_stripes"):
            object.__setattr__(self, name, positive(name, getattr(self, name), integer=True))
        for name in ("stripes", "read_stripes"):  # a connection is left for the lookups
            value = getattr(self, name)
            if not self.cluster and value >= self.max_connections:
                default = " (the default)" if value == _DEFAULTS[name] else ""
                raise ValueError(
                    f"{name} must be at most max_connections - 1 = {self.max_connections - 1}, "
                    f"got {value}{default}: raise max_connections or lower {name}"
                )
        for name in ("socket_timeout_s", "connect_timeout_s"):
            object.__setattr__(self, name, positive(name, getattr(self, name), unit="seconds"))
            _at_most(name, getattr(self, name), MAX_TIMEOUT_S, "an hour")

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> RedisSettings:
        """Settings from a configuration's keys; an unknown or missing key is named in the error."""
        return settings_from(cls, settings, "Redis tier")

    @property
    def database(self) -> int:
        """The database number the URL names: its path `/N` (`?db=N` for unix://), or 0 for none."""
        parts = urlsplit(self.url)
        if parts.scheme == "unix":
            number = parse_qs(parts.query).get("db", ["0"])[-1]
            if not (number.isascii() and number.isdigit()):
                raise ValueError(
                    f"the url's db must be a database number (?db=0), got ?db={number} in "
                    f"{redacted(self.url)}"
                )
            return int(number)
        path = unquote(parts.path).strip("/")
        if not path:
            return 0
        if not (path.isascii() and path.isdigit()):
            raise ValueError(
                f"the url's path must be a database number (/0), got /{path} in "
                f"{redacted(self.url)}"
            )
        return int(path)

    @property
    def client_url(self) -> str:
        """The URL as the client takes it: valkey:// and valkeys:// spelled redis:// and rediss://."""
        scheme, _, rest = self.url.partition(":")
        return f"{SCHEMES[scheme.lower()]}:{rest}"

    @property
    def ttl_ms(self) -> int | None:
        return None if self.ttl_s is None else max(1, round(self.ttl_s * 1000))


_DEFAULTS = {field.name: field.default for field in fields(RedisSettings)}
MAX_TTL_S = 100 * 365 * 86400
"""The longest `ttl_s`, a century: far longer and the server refuses the expiry, dropping every
store."""
MAX_TIMEOUT_S = 3600.0
"""The longest `socket_timeout_s` and `connect_timeout_s`: far longer overflows the client's clock."""
_CERT_REQS = ("none", "optional", "required")


def _at_most(name: str, value: float, bound: float, said: str) -> None:
    """Raise ValueError naming `name` where `value` is past `bound` (`said` in words)."""
    if value > bound:
        raise ValueError(f"{name} must be at most {bound:g} seconds ({said}), got {value:g}")


def _check_tls_options(options: Mapping[str, str]) -> None:
    """The URL's TLS options that name files or a choice, checked here: the client would find
    a wrong one only when it connects, and report a healthy server unreachable."""
    for option in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if option in options and not os.path.isfile(options[option]):
            raise ValueError(f"the url's {option} must be a file, got {options[option]!r}")
    if "ssl_ca_path" in options and not os.path.isdir(options["ssl_ca_path"]):
        raise ValueError(
            f"the url's ssl_ca_path must be a directory, got {options['ssl_ca_path']!r}"
        )
    if options.get("ssl_cert_reqs", "required").lower() not in _CERT_REQS:
        raise ValueError(
            f"the url's ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}, got "
            f"{options['ssl_cert_reqs']!r}"
        )


class RedisBackend(ChunkBackend):
    """Chunks as values of a Redis/Valkey server or cluster, in namespace `namespace_digest`."""

    def __init__(self, settings: RedisSettings, namespace_digest: bytes) -> None:
        self.settings = settings
        self._prefix = f"{settings.key_prefix}:{namespace_digest.hex()}:".encode()
        self._client = _connect(settings)
        self._node_down_until: dict[str, float] = {}
        """Cluster nodes that failed to answer, and until when they are left alone."""
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
            _close(self._client)
            raise
        self._stripes = ThreadPoolExecutor(
            max(settings.stripes, settings.read_stripes), thread_name_prefix="numbakv-redis"
        )

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        replies = self._pipelined(keys, lambda _, key: command(b"EXISTS", key), _reply)
        return [reply == 1 for reply in replies]

    def write(
        self, keys: Sequence[bytes], headers: Sequence[bytes], payloads: Sequence[memoryview]
    ) -> list[bool]:
        ttl_ms = self.settings.ttl_ms
        replies = self._pipelined(
            keys,
            lambda index, key: set_command(key, headers[index], payloads[index], ttl_ms),
            _reply,
            sum(payload.nbytes for payload in payloads),
            self.settings.stripes,
        )
        refused = [reply for reply in replies if isinstance(reply, ResponseError)]
        if refused:
            logger.debug("numbakv Redis tier: %d writes refused: %s", len(refused), refused[0])
        return [reply == b"OK" for reply in replies]

    def read_into(
        self, keys: Sequence[bytes], payloads: Sequence[memoryview], header_bytes: int
    ) -> list[StoredValue | BackendUnavailable | None]:
        def read(replies: Replies, index: int) -> object:
            """The value into its row, its checksum taken here, on this stripe's thread."""
            value, payload = replies.value_into(header_bytes, payloads[index]), payloads[index]
            if isinstance(value, StoredValue) and value.payload_bytes == payload.nbytes:
                return value._replace(checksum=checksum(payload, keys[index]))
            return value

        payload_bytes = sum(payload.nbytes for payload in payloads)
        replies = self._pipelined(
            keys,
            lambda _, key: command(b"GET", key),
            read,
            payload_bytes,
            self.settings.read_stripes,
            window=max(1, WINDOW_BYTES * len(keys) // max(payload_bytes, 1)),
        )
        return [self._value(reply) for reply in replies]

    def _value(self, reply: object) -> StoredValue | BackendUnavailable | None:
        """What `read_into` answers for a GET's reply: a value of another type under the key
        (WRONGTYPE) is a damaged chunk (no header), which the tier deletes; any other error reply
        says nothing of the key."""
        if reply is None or isinstance(reply, (StoredValue, BackendUnavailable)):
            return reply
        if isinstance(reply, ResponseError) and str(reply).startswith("WRONGTYPE"):
            return StoredValue(b"", 0)
        return BackendUnavailable(f"{redacted(self.settings.url)}: {reply}")

    def delete(self, keys: Sequence[bytes]) -> None:
        self._pipelined(keys, lambda _, key: command(b"DEL", key), _reply)

    def clear(self) -> int:
        """Every key under this namespace's prefix removed, found by SCAN (on every primary of a
        cluster), deleted in pipelines of CLEAR_BATCH."""
        removed, batch = 0, []
        try:
            pattern = re.sub(rb"([*?[\]\\])", rb"\\\1", self._prefix) + b"*"  # prefix as is
            for key in self._client.scan_iter(match=pattern, count=CLEAR_BATCH):
                batch.append(key[len(self._prefix) :])
                if len(batch) == CLEAR_BATCH:
                    self.delete(batch)
                    removed, batch = removed + len(batch), []
        except _UNREACHABLE as error:
            raise BackendUnavailable(f"{redacted(self.settings.url)}: {error}") from error
        self.delete(batch)
        return removed + len(batch)

    def close(self) -> None:
        self._stripes.shutdown()
        _close(self._client)

    def _pipelined(
        self,
        keys: Sequence[bytes],
        pack,
        read,
        payload_bytes: int = 0,
        stripes: int = 1,
        window: int = REPLY_WINDOW,
    ) -> list:
        """One command per key, pipelined: one round trip per server. `pack(index in keys, full
        key)` gives a command's buffers, `read(replies, index)` its reply; at most `window`
        commands a connection go unanswered. A command's error is its reply; so is a cluster
        node's unreachability for its keys (the other nodes' keys still move); a store entirely
        unreachable is BackendUnavailable. On a standalone server, `payload_bytes` of chunks
        are spread over up to `stripes` connections."""
        if not keys:
            return []
        if not self.settings.cluster:
            count = min(stripes, len(keys), payload_bytes // STRIPE_BYTES)
            if count < 2:
                return self._pipeline_on(self._client, keys, range(len(keys)), pack, read, window)
            step = -(-len(keys) // count)
            running = [
                self._stripes.submit(
                    self._pipeline_on,
                    self._client,
                    keys,
                    range(start, min(start + step, len(keys))),
                    pack,
                    read,
                    window,
                )
                for start in range(0, len(keys), step)
            ]
            # Every stripe ends before any answer or error is given: a failed batch's rows are
            # handed back to the caller, so no stripe may still be reading into or from them.
            wait_for_futures(running)
            return [reply for stripe in running for reply in stripe.result()]
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
        answered = failed = 0
        for name, indexes in by_node.items():
            if self._node_down_until.get(name, 0.0) > time.monotonic():
                left_alone = BackendUnavailable(f"cluster node {name} failed lately: left alone")
                node_replies = [left_alone] * len(indexes)
            else:
                server = self._client.get_redis_connection(nodes[name])
                try:
                    node_replies = self._pipeline_on(server, keys, indexes, pack, read, window)
                    answered += 1
                    self._node_down_until.pop(name, None)
                except BackendUnavailable as error:
                    node_replies = [error] * len(indexes)
                    self._node_down_until[name] = time.monotonic() + NODE_COOLDOWN_S
                    failed += 1
            for index, reply in zip(indexes, node_replies):
                replies[index] = reply
        if failed and not answered:
            raise BackendUnavailable(
                f"{redacted(self.settings.url)}: no node of the batch answered"
            )
        if failed or any(_moved(reply) for reply in replies):
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
        server: redis.Redis,
        keys: Sequence[bytes],
        indexes: Sequence[int],
        pack,
        read,
        window: int,
    ) -> list:
        """The commands of `keys[indexes]` on one connection of `server`'s pool, their replies
        read in order (resp.py), at most `window` commands unanswered (refilled when half are
        answered): the server holds that many replies at once instead of the whole batch's (a
        reply queued costs it a copy into fresh memory). A connection left midway is closed, so
        the next one starts clean."""
        pool = server.connection_pool
        try:
            connection = pool.get_connection()
        except _UNREACHABLE as error:
            raise BackendUnavailable(f"{redacted(self.settings.url)}: {error}") from error
        sock, answers, sent = connection._sock, [], 0
        try:
            step_s = self.settings.socket_timeout_s
            with whole_reads(sock) as flags:
                replies = Replies(sock, flags, step_s)
                for position, index in enumerate(indexes):
                    if sent < len(indexes) and sent - position <= window // 2:
                        upto = min(len(indexes), position + window)
                        commands = (pack(i, self._prefix + keys[i]) for i in indexes[sent:upto])
                        send(sock, commands, step_s)
                        sent = upto
                    answers.append(read(replies, index))
            return answers
        except _UNREACHABLE as error:
            connection.disconnect()
            reason = (  # BlockingIOError: the socket's own timeout (SO_RCVTIMEO) expired
                f"no answer within socket_timeout_s ({self.settings.socket_timeout_s} s)"
                if isinstance(error, BlockingIOError)
                else error
            )
            raise BackendUnavailable(f"{redacted(self.settings.url)}: {reason}") from error
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)

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
                raise TierOpenError(
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


class PasswordRefused(TierOpenError, AuthenticationError):
    """The server refused the password or the user, or asked for one none was given: a
    TierOpenError, and the client's AuthenticationError as before."""


def _connect(settings: RedisSettings) -> redis.Redis | RedisCluster:
    """A client over a bounded pool, no retries (the tier's breaker handles a down store). Stops
    the engine (TierOpenError) when the password or user is refused, the database is not there,
    or no node of a cluster answers; a standalone server that does not answer is served around."""
    options: dict[str, Any] = {
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.connect_timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "protocol": 2,  # replies resp.py reads; nothing pushed unasked (RESP3's notifications)
    }
    password = urlsplit(settings.url).password
    if password is None and os.environ.get(settings.password_env):
        options["password"] = password = os.environ[settings.password_env]
    where = redacted(settings.url)
    if settings.cluster:
        try:  # the client learns the cluster's slots now: it needs a node to answer
            client = RedisCluster.from_url(
                settings.client_url, max_connections=settings.max_connections, **options
            )
        except AuthenticationError as error:
            raise _password_error(where, password, settings.password_env, error) from None
        except _UNREACHABLE as error:
            if "cluster mode is not enabled" in str(error).lower():
                raise TierOpenError(
                    f"Redis at {where} answered, but is not a cluster (its cluster mode is not "
                    "enabled): leave cluster=true out"
                ) from None
            raise TierOpenError(
                f"Redis Cluster at {where} did not answer at start, so its slots are unknown: "
                f"{error}"
            ) from None
    else:
        pool = redis.BlockingConnectionPool.from_url(
            settings.client_url,
            max_connections=settings.max_connections,
            timeout=settings.socket_timeout_s,
            **options,
        )
        client = redis.Redis.from_pool(pool)  # owns the pool: close() disconnects it
    try:
        client.ping()
    except AuthenticationError as error:
        client.close()
        raise _password_error(where, password, settings.password_env, error) from None
    except ResponseError as error:  # connected, then refused: SELECT of a database not there
        client.close()
        raise TierOpenError(f"Redis at {where} refused the connection: {error}") from None
    except _UNREACHABLE:
        pass  # unreachable now: the tier serves from host memory until it answers
    return client


def _password_error(
    where: str, password: str | None, password_env: str, error: Exception
) -> PasswordRefused:
    if password is None:
        return PasswordRefused(
            f"Redis at {where} asks for a password: give it in the url "
            f"(redis://USER:PASSWORD@host:port/0) or in {password_env}"
        )
    return PasswordRefused(
        f"Redis at {where} refused the password (from the url or {password_env}): {error}"
    )


def _close(client: redis.Redis | RedisCluster) -> None:
    """Close `client` and its connections (redis-py closes a cluster's node clients without
    disconnecting their pools: their sockets stayed open until collected)."""
    if isinstance(client, RedisCluster):
        for node in client.get_nodes():
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()
    client.close()


def _reply(replies: Replies, _index: int) -> object:
    """The next reply as it is (a pipeline's reader where no reply goes into a row)."""
    return replies.reply()


def _moved(reply: object) -> bool:
    """A cluster node's answer that another node serves the key (MOVED, or ASK while migrating)."""
    return isinstance(reply, AskError)

"""The Redis/Valkey backend against real redis-server processes on loopback (no fakes): a standalone
server and a three-primary cluster; faults made by killing, pausing, filling and misconfiguring them.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import statistics
import tempfile
import time

import numpy as np
import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import AuthenticationError

from numbakv.tiers import ChunkTier, TierOpenError, resp
from numbakv.tiers import redis as redis_backend
from numbakv.tiers.chunk_format import HEADER_BYTES, encode_header
from numbakv.tiers.redis import RedisBackend, RedisSettings, redacted
from numbakv.tiers.registry import parse_tier_url
from tests.support.redis_servers import (
    OPENSSL,
    RedisServer,
    needs_redis,
    redis_cluster,
    redis_server,
    redis_tls_server,
    slow_link,
)
from tests.support.tiers import TEST_LOOKUP_DEADLINE_S, namespace

pytestmark = needs_redis

CHUNK_BYTES = 64 * 1024
KEYS = [b"chunk-%d" % i for i in range(8)]


def pool(rows: int, seed: int, chunk_bytes: int = CHUNK_BYTES) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, chunk_bytes), dtype=np.uint8)


def tier(url: str, host_pool: np.ndarray, ns=None, **settings) -> ChunkTier:
    tier_options = {
        name: settings.pop(name)
        for name in ("lookup_deadline_s", "breaker_cooldown_s")
        if name in settings
    }
    tier_options.setdefault("lookup_deadline_s", TEST_LOOKUP_DEADLINE_S)
    ns = namespace() if ns is None else ns
    backend = RedisBackend(RedisSettings(url=url, **settings), ns.digest)
    return ChunkTier(backend, host_pool, ns, **tier_options)


def run(chunk_tier: ChunkTier, submit, job_id, keys, rows):
    submit(job_id, keys, rows)
    chunk_tier.drain()
    (job,) = [job for job in chunk_tier.take_finished() if job.job_id == job_id]
    return job


def raw_key(chunk_tier: ChunkTier, key: bytes) -> bytes:
    return chunk_tier.backend._prefix + key


@pytest.fixture
def server(tmp_path):
    with redis_server(str(tmp_path)) as started:
        yield started


@pytest.mark.parametrize(("stripes", "read_stripes"), [(8, 2), (3, 5)])
def test_stores_and_loads_spread_over_their_own_stripes(server, monkeypatch, stripes, read_stripes):
    """64 chunks of 1 MiB (8 MiB a stripe at least): a store on `stripes` connections at once, a
    load on `read_stripes`, every byte back."""
    spreads = []
    pipeline_on = RedisBackend._pipeline_on

    def counted(self, server_client, keys, indexes, *rest):
        spreads[-1] += 1
        return pipeline_on(self, server_client, keys, indexes, *rest)

    monkeypatch.setattr(RedisBackend, "_pipeline_on", counted)
    rows, keys = pool(128, 17, 1 << 20), [b"spread-%d" % i for i in range(64)]
    chunk_tier = tier(server.url, rows, stripes=stripes, read_stripes=read_stripes)
    spreads.append(0)
    assert run(chunk_tier, chunk_tier.submit_store, 1, keys, range(64)).success
    spreads.append(0)
    assert run(chunk_tier, chunk_tier.submit_load, 2, keys, range(64, 128)).success
    assert spreads == [stripes, read_stripes]
    np.testing.assert_array_equal(rows[64:], rows[:64])
    chunk_tier.close()


def test_a_store_goes_out_whole_before_its_first_reply_is_read(server, monkeypatch):
    """A batch's stores stream out, about SEND_BYTES a system call, without waiting on their
    replies; its loads ask for WINDOW_BYTES of values, and for more when half have come."""
    events = []
    send_all, reply, value_into = resp._send_all, resp.Replies.reply, resp.Replies.value_into

    def logged(name, call):
        def log(*args):
            events.append(name)
            return call(*args)

        return log

    monkeypatch.setattr(resp, "_send_all", logged("send", send_all))
    monkeypatch.setattr(resp.Replies, "reply", logged("reply", reply))
    monkeypatch.setattr(resp.Replies, "value_into", logged("value", value_into))
    monkeypatch.setattr(resp, "SEND_BYTES", 3 * CHUNK_BYTES)
    monkeypatch.setattr(redis_backend, "WINDOW_BYTES", 4 * CHUNK_BYTES)
    rows, keys = pool(40, 5), [b"stream-%d" % i for i in range(20)]
    chunk_tier = tier(server.url, rows)
    assert run(chunk_tier, chunk_tier.submit_store, 1, keys, range(20)).success
    assert events == ["send"] * 7 + ["reply"] * 20  # 3 chunks a system call
    events.clear()
    assert run(chunk_tier, chunk_tier.submit_load, 2, keys, range(20, 40)).success
    # 4 asked for, then 2 more each time 2 have come, until all 20 are asked for
    assert events == ["send", "value", "value"] * 9 + ["value", "value"]
    np.testing.assert_array_equal(rows[20:], rows[:20])
    chunk_tier.close()


@pytest.mark.parametrize("chunk_bytes", [1, 4096, 1 << 20])
def test_two_engines_share_chunks_byte_exact(server, chunk_bytes):
    writer = tier(server.url, pool(8, 1, chunk_bytes))
    reader = tier(server.url, pool(8, 2, chunk_bytes))
    assert run(writer, writer.submit_store, 1, KEYS, range(8)).success
    assert reader.contains(KEYS + [b"absent"]) == [True] * 8 + [False]
    job = run(reader, reader.submit_load, 2, KEYS[::-1], range(8))
    assert job.success and job.nbytes == 8 * chunk_bytes
    np.testing.assert_array_equal(reader._pool, writer._pool[::-1])
    assert (reader.counters.loaded_own, reader.counters.loaded_other) == (0, 8)
    assert run(writer, writer.submit_load, 3, KEYS[:2], [6, 7]).success
    assert (writer.counters.loaded_own, writer.counters.loaded_other) == (2, 0)
    writer.close()
    reader.close()


def test_namespaces_never_share_a_key(server):
    one = tier(server.url, pool(2, 3))
    other = tier(server.url, pool(2, 4), namespace(dtype="bfloat16"))
    run(one, one.submit_store, 1, KEYS[:1], [0])
    assert other.contains(KEYS[:1]) == [False]
    run(other, other.submit_store, 2, KEYS[:1], [0])
    assert run(one, one.submit_load, 3, KEYS[:1], [1]).success
    np.testing.assert_array_equal(one._pool[1], one._pool[0])
    assert len(redis.Redis.from_url(server.url).keys("numbakv:*")) == 2


def test_clear_removes_its_namespaces_keys_and_no_other(server):
    prefix = "nk*v[1]"  # glob characters in the prefix match only themselves
    one = tier(server.url, pool(4, 3), key_prefix=prefix)
    other = tier(server.url, pool(4, 4), namespace(dtype="bfloat16"), key_prefix=prefix)
    client = redis.Redis.from_url(server.url)
    foreign = raw_key(one, b"foreign").replace(prefix.encode(), b"nk_v1")  # the glob would match
    client.set(foreign, b"kept")
    run(one, one.submit_store, 1, KEYS[:3], range(3))
    run(other, other.submit_store, 2, KEYS[:2], range(2))
    assert one.clear() == 3
    assert one.contains(KEYS[:3]) == [False] * 3 and other.contains(KEYS[:2]) == [True] * 2
    assert client.get(foreign) == b"kept"
    run(one, one.submit_store, 3, KEYS[:1], [0])
    assert one.contains(KEYS[:1]) == [True]


@pytest.mark.parametrize("damage", ["corrupted", "truncated", "other_namespace", "a_list"])
def test_a_damaged_value_is_a_miss_counted_and_deleted(server, damage):
    chunk_tier = tier(server.url, pool(4, 5))
    run(chunk_tier, chunk_tier.submit_store, 1, KEYS[:2], [0, 1])
    client = redis.Redis.from_url(server.url)
    key = raw_key(chunk_tier, KEYS[1])
    value = bytearray(client.get(key))
    if damage == "corrupted":
        value[HEADER_BYTES + 1000] ^= 0x01
    elif damage == "truncated":
        del value[len(value) // 2 :]
    else:
        header = encode_header(
            namespace(model="another").digest, b"w" * 8, memoryview(chunk_tier._pool[1]), KEYS[1]
        )
        value[:HEADER_BYTES] = header
    if damage == "a_list":  # WRONGTYPE: before, a store's "no answer", found again for good
        client.delete(key)
        client.rpush(key, b"x")
    else:
        client.set(key, bytes(value))
    job = run(chunk_tier, chunk_tier.submit_load, 2, KEYS[:2], [2, 3])
    assert job.failed_keys == (KEYS[1],) and chunk_tier.counters.integrity_failures == 1
    np.testing.assert_array_equal(chunk_tier._pool[2], chunk_tier._pool[0])
    assert client.exists(key) == 0
    assert chunk_tier.contains(KEYS[:2]) == [True, False]


def test_a_server_that_refuses_writes_when_full_stops_the_engine_unless_values_expire(tmp_path):
    with redis_server(str(tmp_path), "--maxmemory-policy", "noeviction") as server:
        with pytest.raises(RuntimeError, match="ttl_s"):
            tier(server.url, pool(2, 6))
        chunk_tier = tier(server.url, pool(2, 6), ttl_s=60)
        run(chunk_tier, chunk_tier.submit_store, 1, KEYS[:1], [0])
        ttl_ms = redis.Redis.from_url(server.url).pttl(raw_key(chunk_tier, KEYS[0]))
        assert 0 < ttl_ms <= 60_000


def test_a_full_server_drops_stores_counted_never_an_error(tmp_path):
    config = ("--maxmemory-policy", "noeviction", "--maxmemory", "3mb")
    with redis_server(str(tmp_path), *config) as server:
        chunk_tier = tier(server.url, pool(64, 7), ttl_s=60)
        job = run(
            chunk_tier, chunk_tier.submit_store, 1, [b"k%d" % i for i in range(64)], range(64)
        )
        assert not job.success and 0 < len(job.failed_keys) < 64
        assert chunk_tier.counters.dropped_stores == len(job.failed_keys)
        assert chunk_tier.counters.stored == 64 - len(job.failed_keys)
        assert not chunk_tier.breaker_open  # the server is up: refusing is not being down


def test_config_disabled_is_said_and_the_tier_starts(tmp_path, caplog):
    with redis_server(str(tmp_path), "--rename-command", "CONFIG", "") as server:
        with caplog.at_level(logging.WARNING, "numbakv.tiers"):
            chunk_tier = tier(server.url, pool(2, 8))
        assert any("CONFIG GET is disabled" in r.getMessage() for r in caplog.records)
        assert run(chunk_tier, chunk_tier.submit_store, 1, KEYS[:1], [0]).success


def test_passwords_from_the_url_or_the_environment_never_logged(tmp_path, caplog, monkeypatch):
    secret = "s3cret-Pa55"
    with redis_server(str(tmp_path), "--requirepass", secret) as server:
        wrong = f"redis://default:wrong@127.0.0.1:{server.port}/0"
        with pytest.raises(AuthenticationError, match="refused the password") as refused:
            tier(wrong, pool(2, 9))
        assert "wrong" not in str(refused.value)
        with caplog.at_level(logging.DEBUG):
            by_url = tier(f"redis://default:{secret}@127.0.0.1:{server.port}/0", pool(2, 9))
            monkeypatch.setenv("NUMBAKV_REDIS_PASSWORD", secret)
            by_env = tier(server.url, pool(2, 10))
        assert run(by_url, by_url.submit_store, 1, KEYS[:1], [0]).success
        assert run(by_env, by_env.submit_load, 2, KEYS[:1], [1]).success
        assert secret not in caplog.text and "default:***@" in caplog.text
    assert redacted("rediss://u:p@h:1/0?password=p") == "rediss://u:***@h:1/0"


@pytest.mark.parametrize("password", ["s3cr/et", "s3cr?et", "s3cr#et"])
def test_a_password_a_url_must_escape_is_refused_and_never_shown(password):
    url = f"redis://user:{password}@127.0.0.1:6379/0"
    assert redacted(url) == "redis://user:***@127.0.0.1:6379/0"
    for opening in (RedisSettings, parse_tier_url):
        with pytest.raises(ValueError, match="must escape") as refused:
            opening(url)
        assert "s3cr" not in str(refused.value) and "et@" not in str(refused.value)


def test_a_killed_server_is_served_around_then_reconnected(tmp_path, caplog):
    with redis_server(str(tmp_path)) as server:
        chunk_tier = tier(server.url, pool(8, 11), breaker_cooldown_s=0.2)
        run(chunk_tier, chunk_tier.submit_store, 1, KEYS[:4], range(4))
        server.kill()
        rows_before = chunk_tier._pool[4:8].copy()
        assert chunk_tier.contains(KEYS[:4]) == [False] * 4
        job = run(chunk_tier, chunk_tier.submit_load, 2, KEYS[:4], range(4, 8))
        assert not job.success and job.failed_keys == tuple(KEYS[:4])
        assert not run(chunk_tier, chunk_tier.submit_store, 3, KEYS[4:], range(4, 8)).success
        assert chunk_tier.breaker_open
        np.testing.assert_array_equal(chunk_tier._pool[4:8], rows_before)  # nothing loaded
        server.start()  # same port, empty: nothing persisted
        time.sleep(0.25)
        with caplog.at_level(logging.WARNING, "numbakv.tiers"):
            assert run(chunk_tier, chunk_tier.submit_store, 4, KEYS[4:], range(4, 8)).success
        assert not chunk_tier.breaker_open
        assert "breaker closed" in caplog.text
        assert chunk_tier.contains(KEYS) == [False] * 4 + [True] * 4
        assert run(chunk_tier, chunk_tier.submit_load, 5, KEYS[4:], range(4)).success
        np.testing.assert_array_equal(chunk_tier._pool[:4], chunk_tier._pool[4:8])


def test_a_paused_server_holds_lookups_to_the_deadline(server, caplog):
    deadline = 0.02
    chunk_tier = tier(
        server.url,
        pool(8, 12),
        lookup_deadline_s=deadline,
        socket_timeout_s=0.5,
        breaker_cooldown_s=0.3,
    )
    run(chunk_tier, chunk_tier.submit_store, 1, KEYS, range(8))
    server.cli("CLIENT", "PAUSE", "1500", "ALL")
    waited = []
    with caplog.at_level(logging.WARNING, "numbakv.tiers"):
        for _ in range(5):
            started = time.perf_counter()
            assert chunk_tier.contains(KEYS) == [False] * 8
            waited.append(time.perf_counter() - started)
        assert statistics.median(waited) < deadline + 0.05, waited
        assert max(waited) < 0.5, waited  # never a socket timeout's wait
        assert chunk_tier.counters.late_lookups >= 1
        time.sleep(1.6)  # the pause is over; the breaker's probe finds the server again
    assert "no answer within socket_timeout_s (0.5 s)" in caplog.text
    for _ in range(50):
        if chunk_tier.contains(KEYS) == [True] * 8:
            break
        time.sleep(0.05)
    assert chunk_tier.contains(KEYS) == [True] * 8


def test_a_server_that_trickles_its_replies_fails_the_batch_within_its_timeout(server):
    """Each read brings a few bytes, well within the socket's timeout: the batch must still end
    once one reply has taken longer than `socket_timeout_s`, as if the server were down."""
    rows = pool(4, 18, 256 << 10)
    writer = tier(server.url, rows)
    assert run(writer, writer.submit_store, 1, KEYS[:2], [0, 1]).success
    with slow_link(server.port, 4096, 0.05) as port:  # 80 KB/s: a chunk in about 3 s
        reader = tier(f"redis://127.0.0.1:{port}/0", rows, socket_timeout_s=0.3)
        started = time.perf_counter()
        job = run(reader, reader.submit_load, 2, KEYS[:2], [2, 3])
        waited = time.perf_counter() - started
        reader.close()
    assert not job.success and job.failed_keys == tuple(KEYS[:2])
    assert waited < 1.5, waited
    assert reader.breaker_open
    writer.close()


def stored_in_cluster(nodes, name: bytes, count: int, seed: int, **reader_settings):
    """`count` chunks (`name` and a number) stored by a writer through the cluster's first node,
    and a reader of the same cluster. Its lookups get a second: finding the keys around a node
    killed, paused or moved is the subject of these tests, not the deadline (the paused-server
    tests hold that), and a client meeting a dead node may take past 5 ms."""
    url = f"redis://127.0.0.1:{nodes[0].port}/0"
    keys = [name + b"%d" % i for i in range(count)]
    writer = tier(url, pool(count, seed), cluster=True)
    reader = tier(
        url, pool(count, seed + 1), cluster=True, lookup_deadline_s=1.0, **reader_settings
    )
    assert run(writer, writer.submit_store, 1, keys, range(count)).success
    return keys, writer, reader


def test_a_cluster_spreads_chunks_and_serves_around_a_killed_node(tmp_path):
    with redis_cluster(str(tmp_path)) as nodes:
        keys, writer, reader = stored_in_cluster(nodes, b"c", 32, 13)
        per_node = [int(node.cli("DBSIZE")) for node in nodes]
        assert sum(per_node) == 32 and min(per_node) > 0
        assert run(reader, reader.submit_load, 2, keys, range(32)).success
        np.testing.assert_array_equal(reader._pool, writer._pool)
        nodes[2].kill()
        reader._pool[:] = 0
        found = reader.contains(keys)
        assert 0 < sum(found) < 32
        job = run(reader, reader.submit_load, 3, keys, range(32))
        assert set(job.failed_keys) == {key for key, hit in zip(keys, found) if not hit}
        for row, key in enumerate(keys):
            expected = writer._pool[row] if key not in job.failed_keys else 0
            np.testing.assert_array_equal(reader._pool[row], expected)
        assert not reader.breaker_open


def test_a_hung_node_is_left_alone_while_the_others_serve(tmp_path):
    """A node that stops answering (frozen, or behind a partition) costs one call its timeout;
    then its keys fail at once for NODE_COOLDOWN_S and the others' keys move (before, every
    call waited the timeout on it: every lookup came too late, every job waited)."""
    with redis_cluster(str(tmp_path)) as nodes:
        keys, _writer, reader = stored_in_cluster(nodes, b"h", 24, 19, socket_timeout_s=0.3)
        backend = reader.backend
        hung = nodes[2].port
        on_hung = {
            key
            for key in keys
            if backend._client.get_node_from_key(backend._prefix + key).port == hung
        }
        asked = []
        pipeline_on = backend._pipeline_on

        def counted(server, *rest):
            asked.append(server.connection_pool.connection_kwargs["port"])
            return pipeline_on(server, *rest)

        backend._pipeline_on = counted
        os.kill(nodes[2].process.pid, signal.SIGSTOP)
        try:
            assert backend.exists(keys) == [key not in on_hung for key in keys]
            assert asked.count(hung) == 1  # found hung, once
            for _ in range(5):
                assert backend.exists(keys) == [key not in on_hung for key in keys]
            job = run(reader, reader.submit_load, 2, keys, range(24))
            assert set(job.failed_keys) == on_hung and not reader.breaker_open
            assert asked.count(hung) == 1 and len(asked) > 10  # left alone; the others asked
        finally:
            os.kill(nodes[2].process.pid, signal.SIGCONT)


def test_a_node_that_misses_one_load_serves_the_next(tmp_path, monkeypatch):
    """Once it is left alone no longer (a second here): a paused node's keys load again."""
    monkeypatch.setattr(redis_backend, "NODE_COOLDOWN_S", 1.0)
    with redis_cluster(str(tmp_path)) as nodes:
        keys, writer, reader = stored_in_cluster(nodes, b"p", 32, 16, socket_timeout_s=0.3)
        nodes[2].cli("CLIENT", "PAUSE", "1200", "ALL")
        job = run(reader, reader.submit_load, 2, keys, range(32))
        assert 0 < len(job.failed_keys) < 32  # the paused node's keys: not answered, not absent
        time.sleep(1.3)
        assert reader.contains(keys) == [True] * 32
        assert run(reader, reader.submit_load, 3, keys, range(32)).success
        np.testing.assert_array_equal(reader._pool, writer._pool)


def test_a_slot_moved_to_another_node_is_found_there_after_one_lookup(tmp_path):
    """Resharding moves a slot: the lookup that meets the MOVED reply misses those keys and asks
    the cluster where slots are now; the next finds every key, and loads them byte-exact."""
    with redis_cluster(str(tmp_path)) as nodes:
        keys, writer, reader = stored_in_cluster(nodes, b"m", 16, 18)
        assert reader.contains(keys) == [True] * 16
        slot = key_slot(raw_key(writer, keys[0]))
        clients = [redis.Redis(port=node.port) for node in nodes]
        ids = [client.execute_command("CLUSTER", "MYID") for client in clients]
        source = next(i for i, c in enumerate(clients) if c.cluster("COUNTKEYSINSLOT", slot))
        target = (source + 1) % len(nodes)
        clients[target].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source])
        clients[source].execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[target])
        moving = clients[source].execute_command("CLUSTER GETKEYSINSLOT", slot, 100)
        clients[source].execute_command(
            "MIGRATE", "127.0.0.1", nodes[target].port, "", 0, 5000, "KEYS", *moving
        )
        for client in clients:
            client.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[target])
        first = reader.contains(keys)
        assert not all(first) and any(first)  # the moved keys missed, once
        assert reader.contains(keys) == [True] * 16
        reader._pool[:] = 0
        assert run(reader, reader.submit_load, 2, keys, range(16)).success
        np.testing.assert_array_equal(reader._pool, writer._pool)
        for client in clients:
            client.close()


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"url": "http://h:1"}, "url"),
        ({"url": "redis://h:1", "ttl": 5}, "'ttl'"),
        ({"url": "redis://h:1", "ttl_s": 0}, "ttl_s"),
        ({"url": "redis://h:1", "max_connections": 0}, "max_connections"),
        ({"url": "redis://h:1", "cluster": "yes"}, "cluster"),
        ({"url": "redis://h:1", "socket_timeout_s": -1}, "socket_timeout_s"),
        ({"url": "redis://h:1", "read_stripes": 0}, "read_stripes"),
        ({"url": "redis://h:1", "stripes": 16}, "stripes must be at most max_connections - 1"),
        (
            {"url": "redis://h:1", "max_connections": 2},
            r"read_stripes .* = 1, got 2 \(the default\)",
        ),
        ({"url": "redis://h:1/0?db=1"}, "'db'"),
        ({"url": "unix://"}, "socket"),
        ({"url": "unix:///run/redis.sock?db=one"}, "db"),
        ({"url": "unix:///run/redis.sock?ssl_ca_certs=/ca.pem"}, "ssl_ca_certs"),
        ({"url": "unix:///run/redis.sock", "cluster": True}, "TCP"),
        ({"url": "redis://h:1/0?ssl_cert_reqs=required"}, "TLS options need rediss://"),
        ({"url": "rediss://h:1/0?ssl_ca_certs=/no/ca.pem"}, "ssl_ca_certs must be a file"),
        ({"url": "rediss://h:1/0?ssl_ca_path=/no/cas"}, "ssl_ca_path must be a directory"),
        ({"url": "rediss://h:1/0?ssl_cert_reqs=bogus"}, "ssl_cert_reqs must be one of none"),
        ({"url": "redis://h:1", "ttl_s": 1e300}, "ttl_s must be at most"),
        ({"url": "redis://h:1", "connect_timeout_s": 1e300}, "connect_timeout_s must be at most"),
        ({"url": "redis://h:1/%C2%B2"}, "path must be a database number"),
        ({"url": "unix:///run/redis.sock?db=%C2%B2"}, "db must be a database number"),
        ({}, "url"),
    ],
)
def test_bad_settings_are_named(settings, named):
    with pytest.raises((ValueError, TypeError), match=named):
        RedisSettings.from_mapping(settings)


def test_a_server_on_this_host_over_its_unix_socket(tmp_path):
    """unix:///PATH?db=N: chunks shared byte-exact between two engines, in database N; a socket
    nobody serves is a store down at start, served around."""
    socket_dir = tempfile.mkdtemp(prefix="nkv-")  # a socket's path is at most 107 bytes
    path = os.path.join(socket_dir, "redis.sock")
    try:
        with redis_server(str(tmp_path), "--unixsocket", path, "--unixsocketperm", "700") as server:
            url = f"unix://{path}?db=2"
            writer, reader = tier(url, pool(8, 21)), tier(url, pool(8, 22))
            assert run(writer, writer.submit_store, 1, KEYS, range(8)).success
            assert run(reader, reader.submit_load, 2, KEYS[::-1], range(8)).success
            np.testing.assert_array_equal(reader._pool, writer._pool[::-1])
            assert server.cli("-n", "2", "DBSIZE") == "8" and server.cli("DBSIZE") == "0"
            writer.close()
            reader.close()
        down = tier(url, pool(2, 23))
        assert down.contains(KEYS[:1]) == [False] and down.breaker_open
        down.close()
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


def test_a_cluster_that_does_not_answer_at_start_stops_the_engine_saying_so():
    with pytest.raises(RuntimeError, match="did not answer at start"):
        tier("redis://127.0.0.1:1/0", pool(2, 15), cluster=True)


def test_cluster_true_against_a_standalone_server_says_it_is_not_a_cluster(server):
    with pytest.raises(TierOpenError, match="not a cluster"):
        tier(server.url, pool(2, 15), cluster=True)


def test_a_standalone_server_down_at_start_is_served_around(tmp_path):
    server = RedisServer(str(tmp_path))
    chunk_tier = tier(server.url, pool(2, 16), breaker_cooldown_s=0.1)
    assert chunk_tier.contains(KEYS[:1]) == [False] and chunk_tier.breaker_open
    server.start()
    try:
        time.sleep(0.15)
        assert run(chunk_tier, chunk_tier.submit_store, 1, KEYS[:1], [0]).success
    finally:
        server.kill()


@pytest.mark.skipif(OPENSSL is None, reason="openssl is not installed (to make a certificate)")
def test_tls_with_an_acl_user(tmp_path):
    with redis_tls_server(str(tmp_path)) as server:
        server.cli("ACL", "SETUSER", "engine", "on", ">pw-of-engine", "~numbakv:*", "+@all")
        url = server.url.replace("rediss://", "rediss://engine:pw-of-engine@")
        writer, reader = tier(url, pool(4, 17)), tier(url, pool(4, 18))
        assert run(writer, writer.submit_store, 1, KEYS[:4], range(4)).success
        assert run(reader, reader.submit_load, 2, KEYS[:4], range(4)).success
        np.testing.assert_array_equal(reader._pool, writer._pool)
        plain = f"redis://engine:pw-of-engine@127.0.0.1:{server.port}/0"
        refused = tier(plain, pool(1, 19), socket_timeout_s=0.3)  # no TLS: no answer
        assert refused.contains(KEYS[:1]) == [False] and refused.breaker_open


def test_a_backend_refused_at_start_closes_its_connections(tmp_path):
    with redis_server(str(tmp_path), "--maxmemory-policy", "noeviction") as server:
        admin = redis.Redis.from_url(server.url)
        before = len(admin.client_list())
        with pytest.raises(RuntimeError, match="ttl_s") as refused:
            RedisBackend(RedisSettings(url=server.url), namespace().digest)
        assert len(admin.client_list()) == before, "the refused backend's connection is open"
        del refused


def test_a_closed_cluster_backend_leaves_no_connection_open(tmp_path):
    """redis-py closes a cluster's node clients without disconnecting their pools."""
    with redis_cluster(str(tmp_path)) as nodes:
        admins = [redis.Redis(port=node.port) for node in nodes]
        before = [len(admin.client_list()) for admin in admins]
        settings = RedisSettings(url=f"redis://127.0.0.1:{nodes[0].port}/0", cluster=True)
        backends = [RedisBackend(settings, namespace().digest) for _ in range(3)]
        for backend in backends:
            backend.exists(KEYS)
            backend.close()
        assert [len(admin.client_list()) for admin in admins] == before
        del backends


def test_a_closed_backend_leaves_no_connection_open(server):
    admin = redis.Redis.from_url(server.url)
    before = len(admin.client_list())
    backend = RedisBackend(RedisSettings(url=server.url), namespace().digest)
    backend.exists(KEYS)
    assert len(admin.client_list()) == before + 1
    backend.close()
    assert len(admin.client_list()) == before

"""numbakv's RESP pipelines (numbakv/tiers/resp.py) against a real redis-server: random values of
random sizes out of and into place, byte for byte, beside redis-py's own reading of the same keys."""

from __future__ import annotations

import random

import pytest
import redis

from numbakv.tiers import resp
from numbakv.tiers.resp import Replies, command, send, set_command, whole_reads
from tests.support.redis_servers import needs_redis, redis_server

pytestmark = needs_redis

HEADER = 48
# Around the header, the reader's buffer (64 KiB) and a socket's worth of data.
SIZES = [0, 1, 47, 48, 49, 4096, 65535, 65536, 65537, 65536 + 48, 300_000, 2 << 20]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with redis_server(str(tmp_path_factory.mktemp("resp"))) as started:
        yield started


@pytest.mark.parametrize("seed", range(4))
def test_values_go_out_and_come_back_in_place_byte_for_byte(server, seed, monkeypatch):
    rng = random.Random(seed)
    # Commands written one a system call, a few at a time, or all in one.
    monkeypatch.setattr(resp, "SEND_BYTES", [1, 100_000, 4 << 20][seed % 3])
    client = redis.Redis.from_url(server.url, protocol=2)
    sizes = rng.sample(SIZES, len(SIZES))
    keys = [b"resp-%d-%d" % (seed, number) for number in range(len(sizes))]
    values = [rng.randbytes(size) for size in sizes]
    ttl = rng.choice([None, 60_000])
    connection = client.connection_pool.get_connection()
    try:
        with whole_reads(connection._sock) as flags:
            sets = (
                set_command(key, value[:HEADER], memoryview(value[HEADER:]), ttl)
                for key, value in zip(keys, values)
            )
            send(connection._sock, sets)
            replies = Replies(connection._sock, flags)
            assert [replies.reply() for _ in keys] == [b"OK"] * len(keys)
            # Rows shorter, as long as and longer than what was stored; a key never stored; a
            # key of another type (an error in the middle of the pipeline).
            client.rpush(b"resp-list", b"x")
            asked = [*keys, b"resp-absent", b"resp-list"]
            rows = [bytearray(max(0, len(v) - HEADER + rng.choice([-5, 0, 7]))) for v in values]
            rows += [bytearray(8), bytearray(8)]
            send(connection._sock, [command(b"GET", key) for key in asked])
            found = [replies.value_into(HEADER, memoryview(row)) for row in rows]
            send(connection._sock, [command(b"EXISTS", keys[0]), command(b"DEL", b"resp-list")])
            assert [replies.reply(), replies.reply()] == [1, 1]
    finally:
        client.connection_pool.release(connection)
    for value, row, stored in zip(values, rows, found):
        body = value[HEADER:]
        assert stored.header == value[:HEADER] and stored.payload_bytes == len(body)
        kept = min(len(body), len(row))
        assert row[:kept] == body[:kept] and not any(row[kept:])
    assert found[-2] is None and isinstance(found[-1], redis.ResponseError)
    assert [client.get(key) for key in keys] == values  # what redis-py reads, too
    assert all(0 < client.pttl(key) <= 60_000 for key in keys) if ttl else True

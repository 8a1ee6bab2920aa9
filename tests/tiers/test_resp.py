"""numbakv's RESP pipelines (numbakv/tiers/resp.py) against a real redis-server: random values of
random sizes out of and into place, byte for byte, beside redis-py's own reading of the same keys."""

from __future__ import annotations

import contextlib
import itertools
import random
import socket
import threading

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv.tiers import resp
from numbakv.tiers.resp import Replies, command, send, set_command, whole_reads
from tests.support.redis_servers import needs_redis, redis_server

HEADER = 48
# Around the header, the reader's buffer (64 KiB) and a socket's worth of data.
SIZES = [0, 1, 47, 48, 49, 4096, 65535, 65536, 65537, 65536 + 48, 300_000, 2 << 20]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with redis_server(str(tmp_path_factory.mktemp("resp"))) as started:
        yield started


@needs_redis
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


def encoded(reply: object) -> bytes:
    """`reply` as a server writes it (RESP2, and RESP3's null and booleans)."""
    if isinstance(reply, bool):
        return b"#t\r\n" if reply else b"#f\r\n"
    if isinstance(reply, int):
        return b":%d\r\n" % reply
    if isinstance(reply, redis.ResponseError):
        return b"-%s\r\n" % str(reply).encode()
    if reply is None:
        return b"_\r\n"
    kind, body = reply
    return b"+%s\r\n" % body if kind == "status" else b"$%d\r\n%s\r\n" % (len(body), body)


ONE_REPLY = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.none(),
    st.tuples(st.just("status"), st.sampled_from([b"OK", b"QUEUED", b"PONG"])),
    st.builds(redis.ResponseError, st.sampled_from(["ERR no", "WRONGTYPE Operation", "OOM x"])),
    st.tuples(st.just("bulk"), st.binary(max_size=100)),
    st.tuples(
        st.just("bulk"), st.integers(1, 200_000).map(lambda n: random.Random(n).randbytes(n))
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    replies=st.lists(ONE_REPLY, max_size=300),
    pieces=st.lists(st.integers(1, 70_000), min_size=1, max_size=8),
    into_rows=st.booleans(),
)
def test_replies_come_back_in_order_however_the_bytes_arrive(replies, pieces, into_rows):
    """A pipeline's replies, one-line ones parsed ahead in one pass, bulk ones read into rows,
    against what was sent: whatever pieces the bytes arrive in, each reply is read once, in order."""
    stream = b"".join(encoded(reply) for reply in replies)
    ours, theirs = socket.socketpair()
    ours.settimeout(2.0)  # a reader waiting on bytes that are not coming fails

    def write() -> None:
        sent, sizes = 0, itertools.cycle(pieces)
        with contextlib.suppress(OSError):  # the reader failed and left: nothing to write to
            while sent < len(stream):
                size = next(sizes)
                theirs.sendall(stream[sent : sent + size])
                sent += size
            theirs.shutdown(socket.SHUT_WR)  # a reader asking for more meets the end at once

    writer = threading.Thread(target=write)
    writer.start()
    read = Replies(ours, 0, 10.0)
    try:
        for reply in replies:
            bulk = isinstance(reply, tuple) and reply[0] == "bulk"
            if bulk and into_rows:
                row = bytearray(max(0, len(reply[1]) - HEADER))
                got = read.value_into(HEADER, memoryview(row))
                assert got.header == reply[1][:HEADER] and bytes(row) == reply[1][HEADER:]
                continue
            # a one-line reply where a value was asked for (an error) is that reply
            got = read.value_into(HEADER, memoryview(bytearray(8))) if into_rows else read.reply()
            if isinstance(reply, redis.ResponseError):
                assert type(got) is redis.ResponseError and str(got) == str(reply)
            elif isinstance(reply, tuple):
                assert type(got) is bytes and got == reply[1]
            else:
                assert type(got) is type(reply) and got == reply
    finally:
        ours.close()
        writer.join()
        theirs.close()

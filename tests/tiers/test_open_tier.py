"""`numbakv.tiers.open_tier`, the one front door: a tier from a URL, its settings from the query and
from arguments, each checked by name before anything is opened; real stores on loopback."""

from __future__ import annotations

import os

import numpy as np
import pytest
import redis

from numbakv.checks import SettingTypeError, byte_size, positive
from numbakv.tiers import ChunkTier, TierOpenError, open_tier, parse_tier_url, tier_config
from numbakv.tiers.disk import DiskBackend, DiskSettings
from tests.support.redis_servers import RedisServer, needs_redis, redis_cluster, redis_server
from tests.support.tiers import namespace

CHUNK_BYTES = 8192
KEYS = [b"chunk-%d" % i for i in range(4)]


class PoolLike:
    """What a tier reads of a numbakv HostPool: its rows as `blocks` (the real one needs Numba)."""

    def __init__(self, rows: np.ndarray) -> None:
        self.blocks = rows


def pool(rows: int, seed: int, chunk_bytes: int = CHUNK_BYTES) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, chunk_bytes), dtype=np.uint8)


def round_trip(tier: ChunkTier) -> None:
    """Store rows 0-1, load them into rows 2-3: byte for byte."""
    tier.submit_store(1, KEYS[:2], [0, 1])
    tier.drain()
    tier.submit_load(2, KEYS[:2], [2, 3])
    tier.drain()
    assert [job.success for job in tier.take_finished()] == [True, True]
    rows = tier._pool
    np.testing.assert_array_equal(rows[2:4], rows[0:2])


@pytest.mark.parametrize("form", ["dir", "file"])
@pytest.mark.parametrize("wrap", [False, True], ids=["array", "host_pool"])
def test_a_directory_by_url_round_trips_with_its_query_settings(tmp_path, form, wrap):
    rows = pool(4, 1)
    where = tmp_path / "k v"  # a space, percent-encoded in a file:// url
    url = f"dir:{where}" if form == "dir" else where.as_uri()
    url += f"?bytes_to_use={8 * 3 * CHUNK_BYTES}&cache_policy=arc&lookup_deadline_s=0.25"
    tier = open_tier(url, PoolLike(rows) if wrap else rows, namespace())
    assert isinstance(tier.backend, DiskBackend) and tier.lookup_deadline_s == 0.25
    assert tier.backend.settings.cache_policy == "arc" and tier.backend.capacity_files == 16
    assert tier.backend.directory.startswith(str(where))
    round_trip(tier)
    tier.close()


@pytest.mark.parametrize(
    "url, settings, named",
    [
        ("s3://bucket", {}, "dir:PATH or redis://"),
        ("dir:/x?bytes_to_use=1048576&ttl=5", {}, "'ttl'"),
        ("dir:/x", {"bytes_to_use": 1 << 20, "ttl_s": 5}, "'ttl_s'; known: breaker_cooldown_s"),
        ("dir:/x?bytes_to_use=1MiBs", {}, "bytes_to_use: got '1MiBs': unit 'MiBs' is not one"),
        (
            "dir:/x?bytes_to_use=0.3KiB&stripes=2",
            {},
            "bytes_to_use: got '0.3KiB', expected a whole",
        ),
        ("dir:/x", {"bytes_to_use": 1.5}, "bytes_to_use must be a positive int of bytes, or a"),
        ("dir:/x?bytes_to_use=1048576", {"bytes_to_use": 2}, "bytes_to_use is given both"),
        ("dir:/x?io_threads=1&io_threads=2&bytes_to_use=1048576", {}, "io_threads is given twice"),
        ("dir:/x?bytes_to_use=1048576&io_threads=0", {}, "io_threads must be a positive int"),
        ("dir:", {"bytes_to_use": 1 << 20}, "needs a directory"),
        ("dir:/x", {}, "needs a bytes_to_use setting"),
        ("dir:/x?bytes_to_use=1048576&cache_policy=fifo", {}, "cache policy 'fifo'"),
        ("redis://h:1/0?ttl_s=0", {}, "ttl_s must be a positive number"),
        ("redis://h:1/0?ttl_s=ten", {}, "ttl_s must be a number"),
        ("redis://h:1/0?cluster=maybe", {}, "cluster must be true or false"),
        ("redis://h:1/abc", {}, "database number"),
        ("redis://h:1/2?cluster=true", {}, "database 0 only"),
        ("redis://h:1/0?retry_on_timeout=true", {}, "'retry_on_timeout'"),
        ("redis://h:1/0", {"lookup_deadline_s": "5ms"}, "lookup_deadline_s"),
        ("redis://h:1/0?url=redis://x", {}, "url is the url's location"),
        ("redis://h:1/0?io_threads=14", {}, r"max_connections must be at least .* = 17, got 16"),
        ("redis://h:99999/0", {}, "port must be a number from 1 to 65535"),
        ("redis://h:abc/0", {}, "port must be a number from 1 to 65535"),
        ("redis://h:0/0", {}, "port must be a number from 1 to 65535"),
        ("redis://h:1/0?max_connections=4&read_stripes=2", {}, "at least .* = 7, got 4"),
    ],
)
def test_every_setting_is_checked_by_name_before_anything_opens(tmp_path, url, settings, named):
    url = url.replace("/x", str(tmp_path / "never"))
    with pytest.raises((ValueError, TypeError), match=named):
        open_tier(url, pool(1, 2), namespace(), **settings)
    with pytest.raises((ValueError, TypeError), match=named):
        tier_config(url, **settings)
    assert not (tmp_path / "never").exists()


def test_a_directory_bound_takes_a_unit_wherever_it_is_given(tmp_path):
    """`500GiB` in a URL's query, a keyword or a JSON configuration: the same bytes as the int."""
    for url, settings in [
        (f"dir:{tmp_path}?bytes_to_use=1.5MiB", {}),
        (f"file://{tmp_path}", {"bytes_to_use": "1536 kib"}),
        (f"dir:{tmp_path}?bytes_to_use=1572864", {}),
        (f"dir:{tmp_path}", {"bytes_to_use": 1572864}),
    ]:
        assert tier_config(url, **settings).backend.bytes_to_use == 1572864
        tier = open_tier(url, pool(1, 5), namespace(), **settings)
        assert tier.backend.settings.bytes_to_use == 1572864
        tier.close()


def test_byte_sizes_are_whole_bytes_with_or_without_a_unit():
    assert byte_size("b", "2MiB") == byte_size("b", " 2097152 ") == byte_size("b", 2 << 20)
    assert byte_size("b", "4.1MB") == 4_100_000 and byte_size("b", np.int64(7)) == 7
    for bad in ("0", "0.5", "2 apples", "-1", "", "1e3", "inf"):
        with pytest.raises(ValueError, match=f"^b: got '{bad}'"):
            byte_size("b", bad)
    for bad in (0, -1, 1.5, True, None, b"2MiB"):
        with pytest.raises(ValueError, match="^b must be a positive int of bytes"):
            byte_size("b", bad)


def test_a_backend_whose_chunk_size_is_not_the_rows_is_refused_at_construction(tmp_path):
    backend = DiskBackend(DiskSettings(tmp_path, 1 << 20), namespace(), CHUNK_BYTES)
    with pytest.raises(ValueError, match=r"chunk_bytes \(8,192\) must equal the host pool's row"):
        ChunkTier(backend, pool(2, 3, CHUNK_BYTES // 2), namespace())
    with pytest.raises(ValueError, match="host_pool must be a numbakv HostPool"):
        open_tier(f"dir:{tmp_path}?bytes_to_use=1048576", object(), namespace())


def test_a_directory_that_cannot_be_made_is_one_open_error(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    for root in (blocked, blocked / "kv"):
        with pytest.raises(TierOpenError, match=f"^dir:{root}: Not a directory$"):
            open_tier(f"dir:{root}?bytes_to_use=1048576", pool(1, 4), namespace())


def test_one_positive_number_check():
    assert positive("n", np.int64(3), integer=True) == 3 and positive("s", 0.5) == 0.5
    for bad in (True, "3", None, 2.0):
        with pytest.raises(SettingTypeError, match="n must be a positive int"):
            positive("n", bad, integer=True)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="s must be a positive number of seconds"):
            positive("s", bad, unit="seconds")
    assert issubclass(SettingTypeError, TypeError) and issubclass(SettingTypeError, ValueError)


@needs_redis
def test_a_stock_server_takes_the_ttl_from_the_url_and_valkey_names_it_too(tmp_path):
    server = RedisServer(str(tmp_path))  # no options: maxmemory-policy noeviction
    server.start()
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        with pytest.raises(TierOpenError, match="noeviction.*ttl_s"):
            open_tier(url, pool(4, 5), namespace())
        tier = open_tier(f"{url}?ttl_s=60", pool(4, 5), namespace())
        round_trip(tier)
        (key,) = redis.Redis.from_url(url).keys(b"numbakv:*" + KEYS[0])
        assert 0 < redis.Redis.from_url(url).pttl(key) <= 60_000
        tier.close()
        valkey = open_tier(f"valkey://127.0.0.1:{server.port}/0", pool(4, 6), namespace(), ttl_s=60)
        valkey.submit_load(3, KEYS[:2], [2, 3])
        valkey.drain()
        assert valkey.take_finished()[0].success  # the same server, the same keys
        valkey.close()
    finally:
        server.kill()


@needs_redis
def test_opening_a_server_fails_in_one_line_for_each_reason(tmp_path):
    with redis_server(str(tmp_path), "--requirepass", "right-pw") as server:
        server.cli("ACL", "SETUSER", "engine", "on", ">engine-pw", "~numbakv:*", "+@all")
        at = f"127.0.0.1:{server.port}"
        cases = [
            (f"redis://{at}/0", "asks for a password"),
            (f"redis://:wrong@{at}/0", "refused the password"),
            (f"redis://nobody:right-pw@{at}/0", "refused the password"),
            (f"redis://engine:right-pw@{at}/0", "refused the password"),
            (f"redis://:right-pw@{at}/99", "DB index is out of range"),
            (f"redis://:right-pw@{at}/0?cluster=true", "not a cluster"),
        ]
        for url, reason in cases:
            with pytest.raises(TierOpenError, match=reason) as refused:
                open_tier(url, pool(1, 7), namespace())
            assert "\n" not in str(refused.value) and "pw" not in str(refused.value), url
        tier = open_tier(f"redis://engine:engine-pw@{at}/0", pool(4, 8), namespace())
        round_trip(tier)
        tier.close()
    with pytest.raises(TierOpenError, match="did not answer at start"):
        open_tier(f"redis://{at}/0?cluster=true", pool(1, 9), namespace())


@needs_redis
def test_a_cluster_by_url_query(tmp_path):
    with redis_cluster(str(tmp_path)) as nodes:
        url = f"redis://127.0.0.1:{nodes[0].port}?cluster=true"
        writer, reader = (
            open_tier(url, pool(4, 10), namespace()),
            open_tier(url, pool(4, 11), namespace()),
        )
        writer.submit_store(1, KEYS, range(4))
        writer.drain()
        reader.submit_load(2, KEYS, range(4))
        reader.drain()
        assert reader.take_finished()[0].success
        np.testing.assert_array_equal(reader._pool, writer._pool)
        writer.close()
        reader.close()


def test_the_url_keeps_the_clients_options_and_takes_numbakvs():
    parsed = parse_tier_url("rediss://u:p@h:6380/1?ssl_ca_certs=/ca.pem&ttl_s=600&io_threads=2")
    assert parsed.settings == {
        "ttl_s": 600.0,
        "io_threads": 2,
        "url": "rediss://u:p@h:6380/1?ssl_ca_certs=%2Fca.pem",
    }
    parsed = parse_tier_url("unix:///run/valkey.sock?db=2&ttl_s=60")
    assert parsed.settings == {"ttl_s": 60.0, "url": "unix:///run/valkey.sock?db=2"}
    assert os.fspath(parse_tier_url("file:///a%20b").settings["root_dir"]) == "/a b"

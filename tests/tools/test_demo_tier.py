"""The demo over a tier named by a URL, as a new user first runs it: a stock redis-server, a wrong
password, a server that is not there."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis

from numbakv.tools.demo.command import main as demo_main
from numbakv.tools.demo.tier import TTL_S, tier_failure
from tests.support.redis_servers import RedisServer, needs_redis
from tests.support.servers import free_port

pytestmark = needs_redis

SMALL = ["--sessions", "2", "--gpu-blocks", "72"]


@pytest.fixture
def stock_server(tmp_path):
    """redis-server as installed: no maxmemory, maxmemory-policy noeviction."""
    server = RedisServer(str(tmp_path))
    server.start()
    yield server
    server.kill()


def test_a_stock_server_just_works_its_values_expiring(stock_server, capsys):
    assert stock_server.cli("CONFIG", "GET", "maxmemory-policy").split() == [
        "maxmemory-policy",
        "noeviction",
    ]
    status = demo_main(["--tier", stock_server.url, *SMALL])
    out = capsys.readouterr().out
    assert status == 0, out
    assert f"values expire after {TTL_S:g} s" in out
    second = out.split("engine 2 of 2")[1]
    assert "computed 0)" in second and ", 0 wrong" in second
    client = redis.Redis.from_url(stock_server.url)
    (key, *_) = client.keys("numbakv:*")
    assert 0 < client.ttl(key) <= TTL_S


@pytest.mark.parametrize(
    "credentials, said",
    [("", "asks for a password"), (":wrong@", "refused the password")],
)
def test_a_bad_password_is_one_line_and_exit_2(tmp_path, capfd, credentials, said):
    server = RedisServer(str(tmp_path), ("--requirepass", "right"))
    server.start()
    try:
        with pytest.raises(SystemExit) as exit_:
            demo_main(["--tier", f"redis://{credentials}127.0.0.1:{server.port}/0", *SMALL])
    finally:
        server.kill()
    err = capfd.readouterr().err
    assert exit_.value.code == 2
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert said in line and "Traceback" not in err and "wrong" not in line


@pytest.mark.parametrize("path, said", [("/99", "DB index is out of range"), ("/abc", "/abc")])
def test_a_bad_database_is_one_line_and_exit_2(stock_server, capfd, path, said):
    with pytest.raises(SystemExit) as exit_:
        demo_main(["--tier", stock_server.url.replace("/0", path), *SMALL])
    err = capfd.readouterr().err
    assert exit_.value.code == 2 and said in err and "Traceback" not in err


@pytest.mark.parametrize(
    "tier, said",
    [
        ("redis://127.0.0.1:{port}/0", "Connection refused"),
        ("redis://127.0.0.1:99999/0", "port must be a number from 1 to 65535"),
        ("dir:{dir}/kv?bytes_to_use=10", "bytes_to_use must hold at least one chunk file"),
    ],
)
def test_a_tier_that_cannot_serve_is_one_line_and_exit_2_before_any_engine(
    tier, said, tmp_path, capfd
):
    with pytest.raises(SystemExit) as exit_:
        demo_main(["--tier", tier.format(port=free_port(), dir=tmp_path), *SMALL])
    err = capfd.readouterr().err
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert exit_.value.code == 2 and "argument --tier" in line and said in line
    assert "Traceback" not in err and "engine" not in err


@pytest.mark.parametrize(
    "figures, said",
    [
        (
            {"tier_unavailable": 3},
            "the tier was unreachable: no store to it and no load from it succeeded",
        ),
        ({"tier_unavailable": 3, "tier_stored": 1}, None),
        ({"tier_flush_failed": 5}, "every block flushed to the tier failed (5)"),
        ({"tier_flush_failed": 5, "tier_flushed": 1}, None),
    ],
)
def test_an_engine_whose_tier_failed_it_says_how(figures, said):
    counts = {"tier_unavailable": 0, "tier_stored": 0, "tier_hits": 0, "tier_flushed": 0}
    counts["tier_flush_failed"] = 0
    assert tier_failure(SimpleNamespace(**{**counts, **figures})) == said


def test_the_json_report_names_the_tier_without_its_password(tmp_path, capsys):
    server = RedisServer(str(tmp_path), ("--requirepass", "s3cret-word"))
    server.start()
    try:
        url = f"redis://:s3cret-word@127.0.0.1:{server.port}/0"
        status = demo_main(["--tier", url, "--json", *SMALL])
    finally:
        server.kill()
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "s3cret-word" not in captured.out + captured.err
    assert f"127.0.0.1:{server.port}/0" in captured.out

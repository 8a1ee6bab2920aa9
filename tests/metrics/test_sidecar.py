"""The sidecar's endpoints over good, empty, missing and truncated metrics directories."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import numbakv.service
import pytest
from fastapi.testclient import TestClient
from numbakv.service import healthcheck
from numbakv.service.app import create_app
from numbakv.service.settings import Settings, parse_settings
from prometheus_client.openmetrics.exposition import generate_latest

from tests.support.metrics_fakes import key, run_writers, write_metrics_file
from tests.support.servers import ROOT, SIDECAR, free_port, sidecar
from tests.support.sidecar_app import client, reread


@pytest.fixture(scope="module")
def metrics_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("metrics")
    run_writers(directory, ("gpu0", 1), ("gpu1", 1))
    return directory


def test_metrics_are_prometheus_text_by_default(metrics_dir):
    with client(metrics_dir) as c:
        r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith(
        "text/plain; version=0.0.4"
    )
    assert 'numbakv_lookups_total{instance="gpu0",policy="arc"} 2.0' in r.text
    assert 'numbakv_transfer_bytes_total{direction="store",instance="gpu1"} 6144.0' in r.text


def test_metrics_are_openmetrics_when_asked(metrics_dir):
    with client(metrics_dir) as c:
        r = c.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.endswith("# EOF\n")


PROMETHEUS_3_ACCEPT = (  # what a Prometheus 3 scrape sends by default
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)


def test_a_prometheus_3_scrape_is_served_the_openmetrics_rendered_with_the_read(metrics_dir):
    """numbakv's names need no UTF-8, so any name escaping renders them alike: no render per scrape."""
    with client(metrics_dir) as c:
        side = c.app.state.sidecar
        r = c.get("/metrics", headers={"Accept": PROMETHEUS_3_ACCEPT})
        body, _ = side.exposition(PROMETHEUS_3_ACCEPT)
        assert body is side.snapshot.reading.openmetrics
        assert body == generate_latest(side.snapshot, escaping="allow-utf-8")
    assert r.headers["content-type"].endswith("escaping=allow-utf-8") and r.content == body
    assert 'numbakv_lookups_total{instance="gpu0",policy="arc"} 2.0' in r.text


def test_names_that_need_utf_8_are_escaped_as_the_scrape_asks(tmp_path):
    run_writers(tmp_path, ("gpu0", 1))
    write_metrics_file(tmp_path / "counter_11.db", [(key("jobs.done", "jobs.done_total", {}), 3)])
    with client(tmp_path) as c:
        utf8 = c.get("/metrics", headers={"Accept": PROMETHEUS_3_ACCEPT}).text
        underscores = c.get("/metrics", headers={"Accept": "application/openmetrics-text"}).text
    assert '{"jobs.done_total"} 3.0' in utf8 and "jobs_done_total 3.0" in underscores
    assert 'numbakv_lookups_total{instance="gpu0",policy="arc"} 2.0' in utf8


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)
def test_promtool_finds_nothing_to_report_in_the_merged_exposition(metrics_dir):
    with client(metrics_dir) as c:
        body = c.get("/metrics").content
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=body, check=False, capture_output=True, timeout=30
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")


def test_healthz_ok_with_metrics(metrics_dir):
    with client(metrics_dir) as c:
        health = c.get("/healthz").json()
    assert health["status"] == "ok" and health["files"] >= 2 and health["detail"] is None


@pytest.mark.parametrize("case", ["missing", "empty", "truncated"])
def test_stays_up_and_says_so_when_the_directory_is_bad(tmp_path, metrics_dir, case):
    directory = tmp_path / "metrics"
    if case != "missing":
        directory.mkdir()
    if case == "truncated":
        shutil.copytree(metrics_dir, directory, dirs_exist_ok=True)
        victim = min(p for p in os.listdir(directory) if p.startswith("counter_"))
        with open(directory / victim, "r+b") as f:
            f.truncate(100)
    with client(directory) as c:
        health = c.get("/healthz")
        metrics = c.get("/metrics")
        stats = c.get("/stats")
    assert health.status_code == metrics.status_code == stats.status_code == 200
    assert health.json()["status"] == "degraded" and health.json()["detail"]
    if case == "truncated":
        assert list(health.json()["skipped_files"]) == [victim]
        assert (
            "numbakv_transfer_duration_seconds_bucket" in metrics.text
        )  # the other files still served


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_gauge_that_is_no_number_leaves_stats_answering(tmp_path, value):
    labels = {"tier": "disk", "instance": "gpu0"}
    write_metrics_file(
        tmp_path / "gauge_sum_999991.db",
        [
            (key("numbakv_tier_used_chunks", "numbakv_tier_used_chunks", labels), value),
            (key("numbakv_tier_capacity_chunks", "numbakv_tier_capacity_chunks", labels), 10.0),
        ],
    )
    with client(tmp_path) as c:
        stats = c.get("/stats")
    assert stats.status_code == 200
    assert stats.json()["tiers"]["disk"]["used_chunks"] is None


def test_stats_summarises_rates_over_the_window(tmp_path):
    run_writers(tmp_path, ("gpu0", 1))
    with client(tmp_path) as c:
        first = c.get("/stats").json()
        assert first["instances"] == ["gpu0"]
        run_writers(tmp_path, ("gpu0", 3))  # a second engine run: three more workloads
        reread(c)
        stats = c.get("/stats", params={"window_s": 60}).json()
    assert stats["window_seconds"] > 0
    assert stats["hit_ratio"] == pytest.approx(9 / (9 + 21))
    assert stats["evictions_per_second"] == pytest.approx(3 / stats["window_seconds"])
    store = stats["transfer"]["store"]["gigabytes_per_second"]
    assert store == pytest.approx(3 * 6144 / 1e9 / stats["window_seconds"])
    assert stats["occupancy"] is None  # both writers exited: no live pool gauges


@pytest.mark.parametrize("query", ["window_s=abc", "window_s=0", "window_s=100000"])
def test_bad_stats_queries_get_422(metrics_dir, query):
    with client(metrics_dir) as c:
        assert c.get(f"/stats?{query}").status_code == 422


@pytest.mark.parametrize("method", ["post", "put", "delete"])
def test_nothing_changes_anything(metrics_dir, method):
    with client(metrics_dir) as c:
        for path in ("/metrics", "/healthz", "/stats"):
            assert getattr(c, method)(path).status_code == 405
        assert c.get("/nope").status_code == 404


def test_openapi_documents_the_endpoints(metrics_dir):
    with client(metrics_dir) as c:
        spec = c.get("/openapi.json").json()
        assert c.get("/docs").status_code == 200
    assert {"/metrics", "/healthz", "/stats"} <= set(spec["paths"])
    assert "Stats" in spec["components"]["schemas"]


def test_settings_come_from_flags_then_environment():
    env = {
        "NUMBAKV_SIDECAR_HOST": "0.0.0.0",
        "NUMBAKV_SIDECAR_PORT": "9000",
        "NUMBAKV_METRICS_DIR": "/m",
    }
    assert parse_settings([], env) == Settings(host="0.0.0.0", port=9000, metrics_dir="/m")
    assert parse_settings(["--cache-seconds", "0.5"], env).cache_s == 0.5
    assert parse_settings(["--port", "9100", "--metrics-dir", "/x"], env).port == 9100
    assert parse_settings([], {}) == Settings()
    assert parse_settings([], {"PROMETHEUS_MULTIPROC_DIR": "/p"}).metrics_dir == "/p"
    limits = {"NUMBAKV_SIDECAR_MAX_CONNECTIONS": "7"}
    assert parse_settings(["--request-timeout-seconds", "2"], limits) == Settings(
        request_timeout_s=2.0, max_connections=7
    )


# (flags, environment variables, what the error must show: the flag or the variable, and the value)
BAD_SETTINGS = [
    (["--port", "70000"], {}, ["--port", "70000"]),
    (["--port", "x"], {"NUMBAKV_SIDECAR_PORT": "9000"}, ["--port", "'x'"]),
    (["--cache-seconds", "0"], {}, ["--cache-seconds", "not 0"]),
    (["--request-timeout-seconds", "-1"], {}, ["--request-timeout-seconds", "-1"]),
    (["--max-connections", "0"], {}, ["--max-connections", "not 0"]),
    ([], {"NUMBAKV_SIDECAR_PORT": "abc"}, ["variable NUMBAKV_SIDECAR_PORT is 'abc'"]),
    ([], {"NUMBAKV_SIDECAR_PORT": "70000"}, ["variable NUMBAKV_SIDECAR_PORT", "70000"]),
    ([], {"NUMBAKV_SIDECAR_HOST": ""}, ["variable NUMBAKV_SIDECAR_HOST is set but empty"]),
    (["--host", ""], {}, ["--host is empty"]),  # not every interface
    (["--metrics-dir", " "], {"NUMBAKV_METRICS_DIR": "/m"}, ["--metrics-dir is empty"]),
    ([], {"PROMETHEUS_MULTIPROC_DIR": " "}, ["variable PROMETHEUS_MULTIPROC_DIR is set but"]),
    ([], {"NUMBAKV_SIDECAR_CACHE_SECONDS": "1e3"}, ["NUMBAKV_SIDECAR_CACHE_SECONDS", "1000"]),
    ([], {"NUMBAKV_SIDECAR_REQUEST_TIMEOUT_SECONDS": "5s"}, ["TIMEOUT_SECONDS is '5s'"]),
    ([], {"NUMBAKV_SIDECAR_MAX_CONNECTIONS": "1.5"}, ["CONNECTIONS is '1.5', not a whole"]),
]


@pytest.mark.parametrize(
    "argv, env, shows",
    BAD_SETTINGS,
    ids=[" ".join([*argv, *(f"{k}={v}" for k, v in env.items())]) for argv, env, _ in BAD_SETTINGS],
)
def test_a_bad_setting_names_its_flag_or_variable_and_exits_2(argv, env, shows, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_settings(argv, env)
    assert exit_.value.code == 2
    message = capsys.readouterr().err
    assert message.startswith("numbakv-sidecar: error: ") and message.count("\n") == 1, message
    assert all(text in message for text in shows), message
    assert ("--" in message) == bool(argv), message  # a variable's value is not a flag's


def failed_start(*argv: str, **env: str) -> str:
    """The real command's answer, which must be one line on stderr and exit status 2."""
    done = subprocess.run(
        [*SIDECAR, *argv],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith("numbakv-sidecar: error: ") and done.stderr.count("\n") == 1
    return done.stderr


def test_a_port_in_use_is_one_line_naming_the_address_and_what_to_change(tmp_path):
    port = free_port()
    with sidecar(str(tmp_path), port):
        error = failed_start("--port", str(port))
    assert f"127.0.0.1:{port} is in use" in error, error
    assert "--port or NUMBAKV_SIDECAR_PORT" in error, error


def test_an_address_not_on_this_machine_is_one_line_naming_it():
    error = failed_start("--host", "192.0.2.1")  # TEST-NET-1: documentation only
    assert "cannot listen on 192.0.2.1:9464: " in error and "NUMBAKV_SIDECAR_HOST" in error, error


def test_a_bad_variable_is_named_as_a_variable_by_the_real_command():
    error = failed_start(NUMBAKV_SIDECAR_PORT="abc")
    assert "the environment variable NUMBAKV_SIDECAR_PORT is 'abc'" in error and "--" not in error


def test_metrics_and_sidecar_import_without_numba():
    """The sidecar image has no Numba: the metrics module and the app must not need it.

    (The image has no NumPy either; tests/metrics/test_container.py checks that in the image
    itself.)
    """
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import numbakv.metrics, numbakv.service.app, numbakv.service.cli\n"
        "assert 'numba' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_requests_serve_the_background_read_which_follows_new_data(tmp_path):
    run_writers(tmp_path, ("gpu0", 1))
    with TestClient(create_app(Settings(metrics_dir=str(tmp_path), cache_s=0.05))) as c:
        assert 'numbakv_lookups_total{instance="gpu0",policy="arc"} 2.0' in c.get("/metrics").text
        run_writers(tmp_path, ("gpu0", 1))
        deadline = time.monotonic() + 5
        while (
            'numbakv_lookups_total{instance="gpu0",policy="arc"} 4.0' not in c.get("/metrics").text
        ):
            assert time.monotonic() < deadline, (
                "the background refresh never picked up the new data"
            )
            time.sleep(0.02)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_sidecar_logs_one_line_at_start_and_one_at_a_stop_which_exits_0(tmp_path, stop):
    port = free_port()
    with sidecar(
        str(tmp_path),
        port,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    ) as proc:
        proc.send_signal(stop)
        assert proc.wait(timeout=10) == 0  # a container's stop (SIGTERM) is no crash
    log = proc.stderr.read()
    served = f"http://127.0.0.1:{port} from the metrics directory {tmp_path}"
    assert [line.split(": ", 1)[1] for line in log.splitlines() if ".cli: " in line] == [
        f"numbakv-sidecar {numbakv.service.__version__} serving {served}",
        f"numbakv-sidecar stopped on {stop.name}; it served {served}",
    ]
    assert "Traceback" not in log


WITHOUT_SERVICE_EXTRA = """
import sys
class NoServiceExtra:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fastapi", "uvicorn", "starlette"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoServiceExtra())
from numbakv.service.cli import main
main(sys.argv[1:])
"""


def test_without_the_service_extra_one_line_names_the_pip_command():
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_SERVICE_EXTRA, "--port", "9999"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "pip install -e '.[service]' in numbakv's repository" in result.stderr


def test_uvicorn_logs_in_the_sidecars_format_without_the_websocket_hint(tmp_path):
    """A malformed request and an upgrade request: uvicorn's warnings, formatted as the sidecar's
    own lines, and no advice to install a WebSocket library (WebSockets are off on purpose)."""
    port = free_port()
    with sidecar(str(tmp_path), port, stderr=subprocess.PIPE, text=True) as proc:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GARBAGE\r\n\r\n")
            assert sock.recv(1024).startswith(b"HTTP/1.1 400")
        upgrade = {"Upgrade": "websocket", "Connection": "Upgrade"}
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", headers=upgrade).status_code == 200
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    log = proc.stderr.read()
    line = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) [\w.]+: \S")
    assert all(line.match(text) for text in log.splitlines()), log
    assert "uvicorn.error: Invalid HTTP request received." in log, log
    assert "uvicorn.error: Unsupported upgrade request." in log and "WebSocket library" not in log


def refuse_proxies(monkeypatch) -> None:
    """A proxy that refuses every connection, which nothing local is exempted from."""
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("variable", ["the sidecar's", "another"])
def test_the_health_check_asks_the_sidecar_on_its_own_address_past_any_proxy(
    tmp_path, monkeypatch, variable
):
    """``docker run IMAGE --port 9000``: the image's NUMBAKV_SIDECAR_PORT (9464) is not the port."""
    port = free_port()
    with sidecar(str(tmp_path), port):
        monkeypatch.setenv("NUMBAKV_SIDECAR_PORT", str(port if variable == "the sidecar's" else 9))
        refuse_proxies(monkeypatch)
        assert healthcheck.main() == 0


def write_cmdline(proc, pid: str, *argv: str) -> None:
    (proc / pid).mkdir()
    (proc / pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_the_health_check_parses_each_sidecars_command_line_as_the_sidecar_did(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("NUMBAKV_SIDECAR_HOST", raising=False)
    monkeypatch.setenv("NUMBAKV_SIDECAR_PORT", "9000")
    write_cmdline(tmp_path, "1", "/opt/sidecar/bin/python3", "/opt/sidecar/bin/numbakv-sidecar")
    write_cmdline(tmp_path, "7", "python3", "-m", "numbakv.service", "--host", "::", "--port", "1")
    write_cmdline(tmp_path, "8", "python", "-m", "numbakv.service", "--host", "192.0.2.1")
    write_cmdline(tmp_path, "9", "python3", "-m", "numbakv.service.healthcheck")
    (tmp_path / "10").mkdir()  # a process that ended while the check read /proc
    (tmp_path / "self").mkdir()
    assert sorted(healthcheck.sidecar_urls(str(tmp_path))) == [
        "http://127.0.0.1:9000/healthz",
        "http://192.0.2.1:9000/healthz",
        "http://[::1]:1/healthz",
    ]


def test_the_health_check_fails_without_a_sidecar_that_answers(tmp_path, monkeypatch, capsys):
    refuse_proxies(monkeypatch)
    assert healthcheck.main(str(tmp_path)) == 1
    assert capsys.readouterr().err == (
        "numbakv healthcheck: unhealthy: no numbakv-sidecar process found\n"
    )
    port = free_port()
    write_cmdline(tmp_path, "1", "python", "-m", "numbakv.service", "--port", str(port))
    assert healthcheck.main(str(tmp_path)) == 1
    said = capsys.readouterr().err
    assert said.startswith(f"numbakv healthcheck: unhealthy: http://127.0.0.1:{port}/healthz: ")
    assert said.count("\n") == 1

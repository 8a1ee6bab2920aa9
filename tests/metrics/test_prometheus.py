"""A real Prometheus scrapes the real sidecar every second while two writers run; every dashboard query returns data."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.metrics_fakes import WRITER
from tests.support.servers import ROOT, free_port, running, sidecar

generate = pytest.importorskip(
    "numbakv.dashboards.generate", reason="grafana-foundation-sdk (extra: dashboards) not installed"
)

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="prometheus (Debian package) not installed"
    ),
]

WORKLOAD_S = 30  # an upper bound: the test stops once every query has answered
QUERY_DEADLINE_S = 25

PROMETHEUS_CONFIG = """
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: numbakv
    honor_labels: true  # keep the engine's instance label, as deploy/prometheus.yml does
    static_configs:
      - targets: ["127.0.0.1:{port}"]
"""


MANAGERLESS_PROCESS = """
import sys
from numbakv.jobs import FinishedJob
from numbakv.metrics import OffloadMetrics
from tests.support.metrics_writer import FakeTier
tier = FakeTier()
tiers = {"disk": tier} if sys.argv[1].startswith("sglang") else None
metrics = OffloadMetrics(None, instance=sys.argv[1], tiers=tiers)
metrics.on_job_done(FinishedJob(1, "store", True, 1 << 20, 0.001))
tier.step()
metrics.sync()
"""
"""A process that writes no manager metrics: a vLLM worker (transfers only) or, with ``sglang`` in
its instance, an SGLang rank (its tiers)."""


def as_prometheus_sees_it(expr: str) -> str:
    """Grafana's substitutions for the dashboard's variables."""
    return expr.replace("$instance", ".*").replace("$__rate_interval", "5s")


def test_every_dashboard_query_returns_data(tmp_path):
    metrics_dir, tsdb = tmp_path / "metrics", tmp_path / "tsdb"
    metrics_dir.mkdir()
    sidecar_port, prom_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(PROMETHEUS_CONFIG.format(port=sidecar_port))
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    for instance in ("vllm-worker0", "sglang-tp0"):
        subprocess.run(
            [sys.executable, "-c", MANAGERLESS_PROCESS, instance], cwd=ROOT, env=env, check=True
        )
    # ARC on both instances; the other policies whose state has panels next to it.
    writers = [
        subprocess.Popen([sys.executable, WRITER, name, "1", str(WORKLOAD_S), policy], env=env)
        for name, policy in (("gpu0", "arc"), ("gpu1", "arc"), ("gpu0", "sarc"), ("gpu1", "s3fifo"))
    ]
    prometheus_args = [
        "prometheus",
        f"--config.file={config}",
        f"--storage.tsdb.path={tsdb}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
        "--log.level=warn",
    ]
    api = f"http://127.0.0.1:{prom_port}/api/v1/query"
    try:
        with (
            sidecar(str(metrics_dir), sidecar_port),
            running(
                prometheus_args, f"http://127.0.0.1:{prom_port}/-/ready", stderr=subprocess.DEVNULL
            ),
        ):
            pending = {
                as_prometheus_sees_it(e)
                for e in generate.expressions(json.loads(generate.OUTPUT.read_text()))
            }
            deadline = time.monotonic() + QUERY_DEADLINE_S
            while pending and time.monotonic() < deadline:
                time.sleep(1)
                for expr in sorted(pending):
                    answer = httpx.get(api, params={"query": expr}, timeout=5).json()
                    assert answer["status"] == "success", (expr, answer)
                    if answer["data"]["result"]:
                        pending.discard(expr)
            assert not pending, f"no data for: {sorted(pending)}"
            instances = httpx.get(
                api, params={"query": "count by (instance) (numbakv_lookups_total)"}
            ).json()
            assert {r["metric"]["instance"] for r in instances["data"]["result"]} == {
                "gpu0",
                "gpu1",
            }
            # The instance variable lists every process, with manager metrics or not.
            board = json.loads(generate.OUTPUT.read_text())
            (variable,) = [v for v in board["templating"]["list"] if v["name"] == "instance"]
            selector = re.fullmatch(r"label_values\((.+), instance\)", variable["query"])[1]
            listed = httpx.get(
                f"http://127.0.0.1:{prom_port}/api/v1/label/instance/values",
                params={"match[]": selector},
            ).json()["data"]
            assert set(listed) == {"gpu0", "gpu1", "vllm-worker0", "sglang-tp0"}, listed
    finally:
        for w in writers:
            w.terminate()
            w.wait(timeout=10)


def test_deploy_prometheus_config_is_valid():
    config = os.path.join(os.path.dirname(generate.OUTPUT.parent), "deploy", "prometheus.yml")
    result = subprocess.run(
        ["promtool", "check", "config", config],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr

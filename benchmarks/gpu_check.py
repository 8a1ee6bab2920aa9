"""One command on a GPU machine: the benchmarks, the test suite on the GPU, compute-sanitizer, and
the targets checked against the same run's DMA ceiling.

    python3 benchmarks/gpu_check.py [--out results/gpu_check.json] [--archive OUT.tar.gz]
                                    [--steps bandwidth,overlap,...]

Steps, each a child process group with its own time limit (together under 9 minutes):
1. bandwidth: benchmarks/transfer_bandwidth.py (both paths, per-step jobs, submit, driver calls);
2. overlap: benchmarks/overlap.py (the compute beside a store or a load, by path and launch shape);
3. ttft: benchmarks/ttft.py (time to first token on Llama-3.1-8B's shapes, every row's load
   checked against the recompute's KV);
4. gpu_tests: the tests marked `gpu`, alone on the GPU (their timing asserts need it to
   themselves); none may fail or be skipped;
5. tests: every other test without the simulator, in parallel (pytest-xdist, a worker per core,
   a file per worker), none may fail;
6. memcheck, racecheck: compute-sanitizer over a small byte-checked round trip, where installed.
A step that fails, errs or runs out of time fails the run: it exits 1 and the table says which.
Each step's process group is killed when it ends, so nothing a timed-out step started runs on into
the next. Writes one JSON (every step's result and the full benchmark reports) and a log beside
it, prints one table: each target, the measured figure and whether it holds, then which path each
direction's per-step jobs favour and the default that recommends (a recommendation, which never
fails the run); `--archive` packs them, the JUnit files and the benchmarks' own JSON into one
.tar.gz.

A machine without network: wheels in `.whl/` (made on a machine with one by
`python benchmarks/gpu_wheels.py`) are installed first into a temporary folder, which goes first
on the path of every step (numba-cuda 0.30 needs NumPy < 2.5; the tests need FastAPI and more);
Debian packages in `.whl/debs/` (redis-server) are unpacked with `dpkg -x` beside it and go first
on PATH; then, where the project is not installed, it is installed editable (no dependencies, no
index, with the carried build backend), as `pip install -e .` would on a machine with network.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
SITE_ENV = "NUMBAKV_GPU_CHECK_SITE"
DEBS_ENV = "NUMBAKV_GPU_CHECK_DEBS"
LIMITS_S = {  # what each took on an H200 (2026-11-28) and some room, within the whole
    "bandwidth": 75,
    "overlap": 25,
    "ttft": 130,
    "gpu_tests": 140,
    "tests": 95,
    "memcheck": 20,
    "racecheck": 20,
}
"""Seconds each step may take, in the order they run: 505 together, under 9 minutes with the
install and the probe."""
BENCHMARKS = {"bandwidth": "transfer_bandwidth.py", "overlap": "overlap.py", "ttft": "ttft.py"}
PASSED, FAILED, TIMEOUT, NOT_RUN = "passed", "failed", "timeout", "not run"
LINKS = {"store": "d2h", "load": "h2d"}
PATH_MARGIN = 0.02
"""The other path must be this much faster per step for the run to recommend it over the default
(within it the default stands): a recommendation, not a target, so a faster path never fails the
run."""
COMPUTE_MARGIN = 0.05
"""A store path that slows the compute beside it by this much less (of the compute's own time) is
recommended whatever its rate per step: a store runs beside the engine's next forward pass, which
every request waits for, and its own time is on no request's path."""
TOGETHER_MARGIN = 0.05
"""A load path that moves this much more beside a store on the recommended store path, at every
chunk size from 4 KiB, is recommended whatever its rate per step: an engine's loads run beside its
stores, and the link is shared by both."""

TARGETS = [
    # (name, unit, bound, sense): met when the measured value is >= or <= the bound, as sense says
    ("per-step store (16 x 32 x 16 KiB), submit to done", "% of d2h ceiling", 90, ">="),
    ("per-step load (16 x 32 x 16 KiB), submit to done", "% of h2d ceiling", 90, ">="),
    ("per-step jobs, wait against polling", "min wait / poll", 0.95, ">="),
    ("store + load together, chunks >= 4 KiB", "min x one direction", 1.7, ">="),
    ("compute slowed by a full-rate store beside it", "%", 5, "<="),
    ("submit, 16 blocks, hot", "median us", 20, "<="),
    ("gather, chunks >= 4 KiB, best path and cap", "min % of d2h ceiling", 95, ">="),
    ("scatter, chunks >= 4 KiB, best path and cap", "min % of h2d ceiling", 95, ">="),
    ("zero-copy gather, chunks >= 4 KiB, 16 blocks", "min % of d2h ceiling", 90, ">="),
    ("zero-copy scatter, chunks >= 4 KiB, 16 blocks", "min % of h2d ceiling", 90, ">="),
    ("TTFT of a 16k-token prompt, numbakv", "x sooner than recompute", 10, ">="),
    ("TTFT of a 16k-token prompt, numbakv layer by layer", "x sooner than recompute", 10, ">="),
    ("load of a 16k-token prefix, numbakv", "x bytes / ceiling", 1.15, "<="),
    ("TTFT rows whose load is wrong", "rows", 0, "<="),
]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check.json")
    parser.add_argument("--archive", type=Path, help="also pack every result into this .tar.gz")
    parser.add_argument(
        "--steps",
        default=",".join(LIMITS_S),
        help="comma-separated steps to run (default: all, %(default)s)",
    )
    parser.add_argument("--round-trip", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.round_trip:
        return round_trip()
    steps = args.steps.split(",")
    unknown = set(steps) - set(LIMITS_S)
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; choose from {list(LIMITS_S)}")
    if WHEELS.is_dir() and SITE_ENV not in os.environ:
        return install_carried_and_rerun()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_path = args.out.with_suffix(".log")
    report: dict = {"environment": environment(), "steps": {}}
    work = Path(tempfile.mkdtemp(prefix="numbakv-gpu-check-"))
    with log_path.open("w") as log:
        for name in (name for name in LIMITS_S if name in steps):
            if name in BENCHMARKS:
                report[name] = run_benchmark(name, work, log, report)
            elif name in ("gpu_tests", "tests"):
                report["steps"][name] = run_tests(name, work, log)
            else:
                report["steps"][name] = run_sanitizer(name, log)
    report["targets"] = check_targets(report)
    if report.get("bandwidth"):
        report["paths"] = recommended_paths(report["bandwidth"], report.get("overlap"))
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print_table(report)
    print(f"\nwrote {args.out} and {log_path}")
    if args.archive:
        pack(args.archive, [args.out, log_path, *sorted(work.iterdir())])
        print(f"packed {args.archive}")
    return exit_status(report)


def exit_status(report: dict) -> int:
    """1 if a target is missed or a step did not pass (failed, errored or timed out)."""
    missed = [row for row in report["targets"] if row["ok"] is False]
    broken = [step for step in report["steps"].values() if step["status"] not in (PASSED, NOT_RUN)]
    return 1 if missed or broken else 0


def pack(archive: Path, paths: list[Path]) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for path in paths:
            tar.add(path, arcname=path.name)


def install_carried_and_rerun() -> int:
    """Install the carried wheels into a fresh folder and unpack the carried Debian packages
    beside it, then run this script again with them first on the paths (so the image's own
    packages are used for everything not carried)."""
    site = Path(tempfile.mkdtemp(prefix="numbakv-gpu-site-"))
    wheels = sorted(str(path) for path in WHEELS.glob("*.whl"))
    print(f"installing {len(wheels)} carried wheels into {site}", flush=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        + ["--no-cache-dir", "--target", str(site), *wheels],
        check=True,
    )
    env = {**os.environ, SITE_ENV: str(site)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), str(ROOT), env.get("PYTHONPATH")]))
    debs = sorted((WHEELS / "debs").glob("*.deb"))
    if debs:
        env[DEBS_ENV] = unpack_debs(debs)
    try:
        version("numbakv")
    except PackageNotFoundError:  # numbakv.service and numbakv.dashboards need the install
        print("installing the project (editable, no dependencies)", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
            + ["--no-build-isolation", "--editable", str(ROOT)],
            env=env,
            check=True,
        )
    return subprocess.run([sys.executable, *sys.argv], env=env, check=False).returncode


def unpack_debs(debs: list[Path]) -> str:
    """`dpkg -x` each package into one folder; its root if redis-server runs from there, else ""
    (said in one line: the Redis tests are then skipped, as on any machine without it)."""
    root = Path(tempfile.mkdtemp(prefix="numbakv-gpu-debs-"))
    for deb in debs:
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    env = {**os.environ, **deb_paths(str(root))}
    probe = subprocess.run(
        ["redis-server", "--version"], env=env, capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        print(f"carried redis-server does not run here: {probe.stderr.strip()[:200]}", flush=True)
        return ""
    print(f"carried {probe.stdout.strip()[:60]} from {len(debs)} Debian packages", flush=True)
    return str(root)


def deb_paths(root: str) -> dict:
    """PATH and LD_LIBRARY_PATH with the unpacked Debian packages' folders first."""
    if not root:
        return {}
    return {
        name: os.pathsep.join(filter(None, [os.path.join(root, folder), os.environ.get(name)]))
        for name, folder in (("PATH", "usr/bin"), ("LD_LIBRARY_PATH", "usr/lib/x86_64-linux-gnu"))
    }


def child_env() -> dict:
    """The environment of every step: the repository importable, never the simulator."""
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_ENABLE_CUDASIM"}
    paths = [env.get(SITE_ENV), str(ROOT), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, paths)))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(deb_paths(env.get(DEBS_ENV, "")))
    return env


def environment() -> dict:
    """Versions and the device, as the steps will see them."""
    code = (
        "import json, platform, numpy, numba\n"
        "from importlib.metadata import version\n"
        "info = {'python': platform.python_version(), 'numpy': numpy.__version__,\n"
        "        'numba': numba.__version__, 'numba_cuda': version('numba-cuda')}\n"
        "for name in ('torch', 'transformers'):\n"
        "    try:\n"
        "        info[name] = __import__(name).__version__\n"
        "    except ImportError: pass\n"
        "try:\n"
        "    from numba import cuda\n"
        "    from numba.cuda.core import config\n"
        "    info['simulator'] = bool(config.ENABLE_CUDASIM)\n"
        "    name = getattr(cuda.get_current_device(), 'name', 'simulator')\n"
        "    info['device'] = name.decode() if isinstance(name, bytes) else str(name)\n"
        "except Exception as error:\n"
        "    info['device'] = f'none: {type(error).__name__}: {str(error).strip()[:200]}'\n"
        "print(json.dumps(info))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, check=False
    )
    info = json.loads(result.stdout) if result.returncode == 0 else {"error": result.stderr[-2000:]}
    info["cpus"] = os.cpu_count()
    info["redis_server"] = shutil.which("redis-server", path=child_env().get("PATH"))
    smi = shutil.which("nvidia-smi")
    if smi:
        query = "--query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max"
        info["nvidia_smi"] = subprocess.run(
            [smi, query, "--format=csv,noheader"], capture_output=True, text=True, check=False
        ).stdout.strip()
    return info


def run_step(name: str, command: list[str], log, limit_s: float | None = None) -> dict:
    """Run one step in its own process group under its time limit, its output into the log:
    passed, failed (a non-zero exit) or timeout. The group is killed when the step ends, so
    nothing it started (a server, a worker) outlives it."""
    print(f"[{name}] {' '.join(command)}", flush=True)
    log.write(f"\n===== {name}: {' '.join(command)}\n")
    log.flush()
    started = time.monotonic()
    with tempfile.TemporaryFile("w+", errors="replace") as sink:  # a pipe: what it left holds it
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=child_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            process.wait(timeout=LIMITS_S[name] if limit_s is None else limit_s)
            status = PASSED if process.returncode == 0 else FAILED
        except subprocess.TimeoutExpired:
            status = TIMEOUT
        _kill_group(process.pid)
        process.wait()
        sink.seek(0)
        output = sink.read()
    log.write(output or "")
    log.flush()
    seconds = time.monotonic() - started
    print(f"[{name}] {status} in {seconds:.0f} s", flush=True)
    return {"status": status, "seconds": round(seconds, 1), "tail": (output or "")[-3000:]}


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_tests(name: str, work: Path, log) -> dict:
    """`gpu_tests`: the tests marked gpu, serially; `tests`: every other one, in parallel."""
    junit = work / f"{name}.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("pytest_timeout"):  # a hung test fails alone, the rest still run
        command.append("--timeout=60")
    if name == "gpu_tests":  # only their files: another's skip at collection is not theirs
        command += ["-m", "gpu", *gpu_test_files()]
    else:
        command += ["-m", "not gpu"]
        if importlib.util.find_spec("xdist"):
            command += ["-n", str(os.cpu_count() or 1), "--dist", "loadfile"]
    step = run_step(name, [*command, f"--junitxml={junit}"], log)
    if junit.exists():
        step.update(junit_summary(junit))
        every_gpu_test_ran = step["counts"]["passed"] and not step["skipped"]
        if name == "gpu_tests" and step["status"] == PASSED and not every_gpu_test_ran:
            step["status"] = FAILED  # on a GPU machine every GPU test must run
    return step


def gpu_test_files() -> list[str]:
    """The test files that hold tests marked gpu."""
    files = (ROOT / "tests").rglob("test_*.py")
    return sorted(str(path) for path in files if "pytest.mark.gpu" in path.read_text())


def junit_summary(path: Path) -> dict:
    """Counts from pytest's JUnit XML, the failures by name, and the skipped tests with why."""
    cases = list(ElementTree.parse(path).getroot().iter("testcase"))

    def outcome(case) -> tuple[str, str]:
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                return tag, found.get("message", "")
        return "passed", ""

    outcomes = [(f"{case.get('classname')}::{case.get('name')}", *outcome(case)) for case in cases]
    return {
        "counts": {
            k: sum(o == k for _, o, _ in outcomes)
            for k in ("passed", "failure", "error", "skipped")
        },
        "not_passed": [f"{n} ({o})" for n, o, _ in outcomes if o in ("failure", "error")],
        "skipped": [f"{n}: {why}" for n, o, why in outcomes if o == "skipped"],
    }


def run_benchmark(name: str, work: Path, log, report: dict) -> dict | None:
    out = work / f"{name}.json"
    script = str(ROOT / "benchmarks" / BENCHMARKS[name])
    report["steps"][name] = run_step(name, [sys.executable, script, "--out", str(out)], log)
    return json.loads(out.read_text()) if out.exists() else None


def run_sanitizer(tool: str, log) -> dict:
    sanitizer = shutil.which("compute-sanitizer") or next(
        (str(p) for p in Path("/usr/local").glob("cuda*/bin/compute-sanitizer") if p.exists()),
        None,
    )
    if sanitizer is None:
        return {"status": NOT_RUN, "why": "compute-sanitizer is not on this machine"}
    command = [sanitizer, f"--tool={tool}", "--error-exitcode=3"]
    command += [sys.executable, str(Path(__file__).resolve()), "--round-trip"]
    step = run_step(tool, command, log)
    summary = re.findall(r"ERROR SUMMARY: (\d+) error", step["tail"])
    step["errors"] = int(summary[-1]) if summary else None
    step["round_trip_ok"] = "round trip: bytes exact" in step["tail"]
    return step


def round_trip() -> int:
    """A small store, load and concurrent store + load on each path, byte-checked: what the
    sanitizer runs."""
    import numpy as np
    from numba import cuda

    from numbakv.datapath import HostPool, KVLayout, TransferEngine
    from numbakv.datapath._device import batch_copy_unsupported

    rng = np.random.default_rng(0)
    shape = (2, 32, 8, 2, 64)  # flash-attention, 2 KiB per K or V chunk
    layers = [cuda.to_device(rng.integers(1, 255, shape, dtype=np.uint8)) for _ in range(4)]
    layout = KVLayout.from_arrays("flash_attn", layers)
    pool = HostPool.for_layout(layout, 16)

    def blocks(ids: np.ndarray) -> np.ndarray:
        """The oracle: blocks `ids` as host blocks (layer by layer, K then V)."""
        copies = [layer.copy_to_host() for layer in layers]
        return np.stack([np.concatenate([c[:, i].reshape(-1) for c in copies]) for i in ids])

    ok = True
    paths = ("zero_copy",) + (() if batch_copy_unsupported() else ("staged",))
    for path in paths:  # staged only where the driver batches copies (CUDA 12.8 and newer)
        engine = TransferEngine(layout, pool, path=path, staging_bytes=3 * layout.block_bytes)
        gpu_ids, host_ids = rng.permutation(32)[:8], rng.permutation(16)[:8]
        engine.submit("store", "store", gpu_ids, host_ids)
        engine.wait("store")
        ok = ok and np.array_equal(pool.blocks[host_ids], blocks(gpu_ids))
        # a store and a load at once, on disjoint blocks
        sources = np.setdiff1d(np.arange(16), host_ids)
        targets = np.setdiff1d(np.arange(32), gpu_ids)
        pool.blocks[sources] = rng.integers(1, 255, (8, layout.block_bytes), dtype=np.uint8)
        engine.submit("again", "store", gpu_ids[:4], host_ids[:4])
        engine.submit("load", "load", targets[:8], sources)
        engine.wait("again")
        engine.wait("load")
        ok = ok and np.array_equal(blocks(targets[:8]), pool.blocks[sources])
        engine.get_finished()
    print("round trip: bytes exact" if ok else "round trip: BYTES DIFFER")
    return 0 if ok else 1


def check_targets(report: dict) -> list[dict]:
    """The issue's targets from this run's own figures (None where a figure is missing)."""
    figures: dict[str, float | None] = dict.fromkeys(name for name, *_ in TARGETS)
    if report.get("bandwidth"):
        figures.update(_bandwidth_figures(report["bandwidth"]))
    overlap = report.get("overlap")
    if overlap and overlap.get("overlap"):
        figures["compute slowed by a full-rate store beside it"] = (
            100 * overlap["overlap"]["compute_slowdown"]
        )
    if report.get("ttft"):
        figures.update(_ttft_figures(report["ttft"]))
    checked = []
    for name, unit, bound, sense in TARGETS:
        value = figures[name]
        ok = None if value is None else (value >= bound if sense == ">=" else value <= bound)
        checked.append(
            {"target": name, "unit": unit, "bound": f"{sense} {bound}", "value": value, "ok": ok}
        )
    return checked


def _bandwidth_figures(bandwidth: dict) -> dict:
    """The data path's targets, each from the default path of its direction."""
    ceiling = bandwidth["dma_ceiling_gbps"]
    default = bandwidth["default_paths"]
    step = bandwidth["per_step"]
    rows = [row for row in bandwidth["rows"] if row["chunk_bytes"] >= 4096]
    figures: dict[str, float | None] = {}
    for direction, kernel in (("store", "gather"), ("load", "scatter")):
        link = ceiling[LINKS[direction]]
        mine = step["paths"][default[direction]]
        figures[f"per-step {direction} (16 x 32 x 16 KiB), submit to done"] = (
            100 * mine[f"{direction}_poll_gbps"] / link
        )
        figures[f"{kernel}, chunks >= 4 KiB, best path and cap"] = min(
            100 * max(*row[f"{kernel}_gbps"].values(), row["staged_gbps"][direction]) / link
            for row in rows
        )
        figures[f"zero-copy {kernel}, chunks >= 4 KiB, 16 blocks"] = min(
            100 * row[f"{kernel}_gbps"]["16"] / link for row in rows
        )
    figures["per-step jobs, wait against polling"] = min(
        step["paths"][default[d]][f"{d}_wait_gbps"] / step["paths"][default[d]][f"{d}_poll_gbps"]
        for d in ("store", "load")
    )
    figures["store + load together, chunks >= 4 KiB"] = min(
        row["together_gbps"][f"{default['store']}/{default['load']}"]
        / max(_one_direction_gbps(row, d, default[d]) for d in ("store", "load"))
        for row in rows
    )
    figures["submit, 16 blocks, hot"] = step["paths"][default["store"]]["submit_us_polled"]
    return figures


def _one_direction_gbps(row: dict, direction: str, path: str) -> float:
    """A bandwidth row's rate for `direction` alone on `path` (zero-copy: its best cap)."""
    if path == "staged":
        return row["staged_gbps"][direction]
    return max(row["gather_gbps" if direction == "store" else "scatter_gbps"].values())


def recommended_paths(bandwidth: dict, overlap: dict | None = None) -> dict:
    """Which path each direction's per-step jobs (polled) favour in this run, as a % of its link's
    ceiling, and the default it recommends: the other path where it is more than PATH_MARGIN
    faster, else the default as it is; for a store, the path that slows the compute beside it
    least, where the paths differ by more than COMPUTE_MARGIN (benchmarks/overlap.py's figures at
    each path's own launch shape); for a load, the path that moves more beside a store on that
    store path, where it does by more than TOGETHER_MARGIN at every chunk size from 4 KiB."""
    ceiling = bandwidth["dma_ceiling_gbps"]
    slowdowns = {
        shape["path"]: shape["compute_slowdown"]
        for shape in (overlap or {}).get("overlap_by_shape", [])
        if shape.get("engine_launch") and shape.get("direction", "store") == "store"
    }
    paths = {}
    for direction, link in LINKS.items():
        rates = {
            path: figures[f"{direction}_poll_gbps"]
            for path, figures in bandwidth["per_step"]["paths"].items()
        }
        default = bandwidth["default_paths"][direction]
        fastest = max(rates, key=rates.__getitem__)
        keep = rates[default] >= (1 - PATH_MARGIN) * rates[fastest]
        recommended, by = (default if keep else fastest), "per step"
        if direction == "store" and len(slowdowns) == len(rates):
            gentlest = min(slowdowns, key=slowdowns.__getitem__)
            if max(slowdowns.values()) - slowdowns[gentlest] > COMPUTE_MARGIN:
                recommended, by = gentlest, "compute beside it"
        together = {}
        if direction == "load":
            together = _beside_a_store(bandwidth, paths["store"]["recommended"], list(rates))
            rows = together.values()
            ahead = [
                path
                for path in rates
                if rows
                and all(
                    row[path] > (1 + TOGETHER_MARGIN) * row[other]
                    for row in rows
                    for other in row
                    if other != path
                )
            ]
            if ahead:
                recommended, by = ahead[0], "beside a store"
        paths[direction] = {
            "default": default,
            "faster": fastest,
            "recommended": recommended,
            "by": by,
            "percent_of_ceiling": {
                path: 100 * rate / ceiling[link] for path, rate in rates.items()
            },
            "compute_slowdown": slowdowns if direction == "store" else {},
            "beside_a_store_gbps": together,
        }
    return paths


def _beside_a_store(bandwidth: dict, store: str, loads: list[str]) -> dict:
    """GB/s of a store on `store` and a load on each of `loads` in flight together, per chunk size
    from 4 KiB."""
    return {
        row["chunk_bytes"]: {load: row["together_gbps"][f"{store}/{load}"] for load in loads}
        for row in bandwidth["rows"]
        if row["chunk_bytes"] >= 4096
    }


def _ttft_figures(ttft: dict) -> dict:
    wrong = sum(row.get("ok") is False for row in ttft["rows"])
    figures: dict[str, float | None] = {"TTFT rows whose load is wrong": wrong}
    for row in ttft["rows"]:
        if row["prompt_tokens"] == 16384 and row["path"] == "numbakv":
            figures["TTFT of a 16k-token prompt, numbakv"] = row["speedup"]
            figures["load of a 16k-token prefix, numbakv"] = row["load_vs_ideal"]
        if row["prompt_tokens"] == 16384 and row["path"] == "layerwise":
            figures["TTFT of a 16k-token prompt, numbakv layer by layer"] = row["speedup"]
    return figures


def print_table(report: dict) -> None:
    env = report["environment"]
    print(f"\ndevice: {env.get('device')} | {env.get('nvidia_smi', '')}")
    print(
        f"python {env.get('python')}, numpy {env.get('numpy')}, numba {env.get('numba')}, "
        f"numba-cuda {env.get('numba_cuda')}, torch {env.get('torch')}, "
        f"transformers {env.get('transformers')}, {env.get('cpus')} CPUs, "
        f"redis-server: {env.get('redis_server') or 'none'}"
    )
    bandwidth = report.get("bandwidth")
    if bandwidth:
        _print_bandwidth(bandwidth)
    for shape in (report.get("overlap") or {}).get("overlap_by_shape", []):
        what = shape.get("direction", "store")
        print(
            f"  compute beside a {shape['path']} {what} of {shape['threads_per_block']:>4} threads "
            f"x {shape['thread_blocks'] or 'all'} blocks: {100 * shape['compute_slowdown']:+.1f}%, "
            f"{shape['hidden_share']:.0%} of the {what} hidden"
        )
    for row in (report.get("ttft") or {}).get("rows", []):
        ratio = row.get("load_vs_ideal")
        print(
            f"  TTFT {row['prompt_tokens']:>6} tokens, {row['path']:>9}: {row['ttft_ms']:8.1f} ms "
            f"({row['speedup']:5.1f}x)"
            + ("" if ratio is None else f", load {row['load_ms']:.1f} ms = {ratio:.2f}x ideal")
            + ("" if "ok" not in row else (", KV exact" if row["ok"] else ", LOAD WRONG"))
        )
    print(f"{'step':<12} {'status':<8} {'seconds':>8}  detail")
    for name, step in report["steps"].items():
        print(f"{name:<12} {step['status']:<8} {step.get('seconds', '-'):>8}  {_detail(step)}")
    print(f"\n{'target':<52} {'unit':<24} {'bound':>7} {'value':>8}  ok")
    for row in report["targets"]:
        value = "-" if row["value"] is None else f"{row['value']:.2f}"
        ok = {True: "yes", False: "NO", None: "-"}[row["ok"]]
        print(f"{row['target']:<52} {row['unit']:<24} {row['bound']:>7} {value:>8}  {ok}")
    if report.get("paths"):
        _print_paths(report["paths"])


def _print_paths(paths: dict) -> None:
    print(
        "\npaths, per-step jobs polled (% of the link's ceiling), the compute slowed beside a "
        "store, a load beside a store, and the default they recommend:"
    )
    for direction, choice in paths.items():
        rates = ", ".join(f"{path} {pct:.1f}" for path, pct in choice["percent_of_ceiling"].items())
        beside = ", ".join(
            f"{path} {100 * slowdown:+.1f}%"
            for path, slowdown in choice["compute_slowdown"].items()
        )
        verdict = (
            f"keep {choice['default']}"
            if choice["recommended"] == choice["default"]
            else f"switch from {choice['default']} to {choice['recommended']} (DEFAULT_PATHS)"
        )
        together = "; ".join(
            f"{chunk / 1024:g} KiB " + ", ".join(f"{path} {gbps:.1f}" for path, gbps in row.items())
            for chunk, row in choice.get("beside_a_store_gbps", {}).items()
        )
        print(
            f"  {direction:<5} {rates}"
            + (f"; compute beside it {beside}" if beside else "")
            + (
                f"; GB/s beside a {paths['store']['recommended']} store: {together}"
                if together
                else ""
            )
            + f": {choice['faster']} is faster per step; by {choice['by']}, {verdict}"
        )


def _print_bandwidth(bandwidth: dict) -> None:
    ceiling = bandwidth["dma_ceiling_gbps"]
    print(
        f"DMA ceiling (this run): d2h {ceiling['d2h']:.1f} GB/s, h2d {ceiling['h2d']:.1f} GB/s, "
        f"both at once {ceiling['both']:.1f} GB/s in all"
    )
    peers = next((row for row in bandwidth["rows"] if row["chunk_bytes"] == 16384), None)
    if peers:
        torch_way = peers["torch_gbps"] or {"d2h": float("nan"), "h2d": float("nan")}
        print(
            "16 KiB chunks, GB/s d2h/h2d: zero-copy (16 blocks) "
            f"{peers['gather_gbps']['16']:.1f}/{peers['scatter_gbps']['16']:.1f}, staged "
            f"{peers['staged_gbps']['store']:.1f}/{peers['staged_gbps']['load']:.1f}, torch "
            f"gather + one pinned copy {torch_way['d2h']:.1f}/{torch_way['h2d']:.1f}, "
            f"cudaMemcpyAsync per block and layer {peers['naive_gbps']['d2h']:.2f}/"
            f"{peers['naive_gbps']['h2d']:.2f}; both at once (store/load path): "
            + ", ".join(f"{pair} {gbps:.1f}" for pair, gbps in peers["together_gbps"].items())
        )
    print(f"default paths: {bandwidth['default_paths']}; per-step jobs by path:")
    for path, step in bandwidth["per_step"]["paths"].items():
        print(
            f"  {path:>9}: store {100 * step['store_poll_gbps'] / ceiling['d2h']:.1f} %, load "
            f"{100 * step['load_poll_gbps'] / ceiling['h2d']:.1f} % of the ceiling polling "
            f"(wait: {100 * step['store_wait_gbps'] / ceiling['d2h']:.1f} / "
            f"{100 * step['load_wait_gbps'] / ceiling['h2d']:.1f}); submit us hot "
            f"{step['submit_us_polled']:.1f}, after wait {step['submit_us_after_wait']:.1f}, "
            f"after a sleep {step['submit_us_after_sleep']:.1f}, without the launch "
            f"{step['submit_us_without_launch']:.1f}"
        )
    calls = ", ".join(f"{name} {us:.1f}" for name, us in bandwidth["driver_calls_us"].items())
    print(f"  driver calls of a submit, median us: {calls}")


def _detail(step: dict) -> str:
    if "counts" in step:
        detail = f"{step['counts']}"
        if step["not_passed"]:
            detail += "; not passed: " + ", ".join(step["not_passed"][:8])
        if step["skipped"]:
            detail += "; skipped: " + "; ".join(step["skipped"][:4])
        return detail
    if "errors" in step:
        return f"errors {step['errors']}, round trip ok: {step['round_trip_ok']}"
    return step.get("why", "")


if __name__ == "__main__":
    sys.exit(main())

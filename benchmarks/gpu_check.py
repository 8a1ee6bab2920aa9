"""One command on a GPU machine: the whole test suite on the GPU, the benchmarks, compute-sanitizer,
and the data path's targets checked against the same run's DMA ceiling.

    python3 benchmarks/gpu_check.py [--out results/gpu_check.json] [--steps tests,bandwidth,...]

Steps, each a child process with its own time limit (together under 9 minutes):
1. the whole test suite without the simulator (`pytest -q`: none may fail, no GPU test be skipped);
2. benchmarks/transfer_bandwidth.py (kernels, peers, per-step job, submit cost);
3. benchmarks/e2e.py (load versus recompute; a store next to busy compute);
4. compute-sanitizer memcheck and racecheck over a small round trip, where the machine has it.
Writes one JSON (every step's result and the full benchmark reports) and a log beside it, then
prints one table: each target, the measured figure and whether it holds.

A machine without network: wheels in `.whl/` (made on a machine with one by
`python benchmarks/gpu_wheels.py`) are installed first into a temporary folder, which goes first
on the path of every step (numba-cuda 0.30 needs NumPy < 2.5; the tests need FastAPI and more);
then, where the project is not installed, it is installed editable (no dependencies, no index,
with the carried build backend), as `pip install -e .` would on a machine with network.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
SITE_ENV = "NUMBAKV_GPU_CHECK_SITE"
LIMITS_S = {"tests": 240, "bandwidth": 130, "e2e": 60, "memcheck": 40, "racecheck": 40}
"""Seconds each step may take: 510 together, under 9 minutes with the install and the probe."""

TARGETS = [
    # (name, unit, bound, sense): met when the measured value is >= or <= the bound, as sense says
    ("gather, chunks >= 4 KiB, best cap", "min % of d2h ceiling", 95, ">="),
    ("scatter, chunks >= 4 KiB, best cap", "min % of h2d ceiling", 95, ">="),
    ("gather, chunks >= 4 KiB, 16 thread blocks", "min % of d2h ceiling", 90, ">="),
    ("scatter, chunks >= 4 KiB, 16 thread blocks", "min % of h2d ceiling", 90, ">="),
    ("per-step store (16 x 32 x 16 KiB), submit to done", "% of d2h ceiling", 80, ">="),
    ("per-step load (16 x 32 x 16 KiB), submit to done", "% of h2d ceiling", 80, ">="),
    ("store + load together, chunks >= 4 KiB", "min x one direction", 1.6, ">="),
    ("compute slowed by a store next to it", "%", 10, "<="),
    ("submit, 16 blocks", "median us", 30, "<="),
]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check.json")
    parser.add_argument(
        "--steps",
        default=",".join(LIMITS_S),
        help="comma-separated steps to run (default: all, %(default)s)",
    )
    parser.add_argument("--round-trip", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.round_trip:
        return round_trip()
    if WHEELS.is_dir() and SITE_ENV not in os.environ:
        return install_wheels_and_rerun()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_path = args.out.with_suffix(".log")
    steps = args.steps.split(",")
    unknown = set(steps) - set(LIMITS_S)
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; choose from {list(LIMITS_S)}")
    report: dict = {"environment": environment(), "steps": {}}
    with log_path.open("w") as log:
        work = Path(tempfile.mkdtemp(prefix="numbakv-gpu-check-"))
        if "tests" in steps:
            report["steps"]["tests"] = run_tests(work, log)
        for name, script in (("bandwidth", "transfer_bandwidth.py"), ("e2e", "e2e.py")):
            if name in steps:
                report[name] = run_benchmark(name, script, work, log, report)
        for tool in ("memcheck", "racecheck"):
            if tool in steps:
                report["steps"][tool] = run_sanitizer(tool, log)
    report["targets"] = check_targets(report)
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print_table(report)
    print(f"\nwrote {args.out} and {log_path}")
    failed = [row for row in report["targets"] if row["ok"] is False]
    steps_failed = [name for name, step in report["steps"].items() if step["status"] == "failed"]
    return 1 if failed or steps_failed else 0


def install_wheels_and_rerun() -> int:
    """Install the carried wheels into a fresh folder, then run this script again with it first
    on the path (so the image's own packages are used for everything not carried)."""
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


def child_env() -> dict:
    """The environment of every step: the repository importable, never the simulator."""
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_ENABLE_CUDASIM"}
    paths = [env.get(SITE_ENV), str(ROOT), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, paths)))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def environment() -> dict:
    """Versions and the device, as the steps will see them."""
    code = (
        "import json, platform, numpy, numba\n"
        "from importlib.metadata import version\n"
        "info = {'python': platform.python_version(), 'numpy': numpy.__version__,\n"
        "        'numba': numba.__version__, 'numba_cuda': version('numba-cuda')}\n"
        "try:\n"
        "    import torch; info['torch'] = torch.__version__\n"
        "except ImportError: pass\n"
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
    smi = shutil.which("nvidia-smi")
    if smi:
        query = "--query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max"
        info["nvidia_smi"] = subprocess.run(
            [smi, query, "--format=csv,noheader"], capture_output=True, text=True, check=False
        ).stdout.strip()
    return info


def run_step(name: str, command: list[str], log) -> dict:
    """Run one step under its time limit, its output into the log; status passed/failed/timeout."""
    print(f"[{name}] {' '.join(command)}", flush=True)
    log.write(f"\n===== {name}: {' '.join(command)}\n")
    log.flush()
    started = time.monotonic()
    try:
        result = subprocess.run(
            command,
            cwd=ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=LIMITS_S[name],
            check=False,
        )
        output, status = result.stdout, "passed" if result.returncode == 0 else "failed"
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout
        output, status = output or "", "timeout"
    log.write(output)
    log.flush()
    seconds = time.monotonic() - started
    print(f"[{name}] {status} in {seconds:.0f} s", flush=True)
    return {"status": status, "seconds": round(seconds, 1), "tail": output[-3000:]}


def run_tests(work: Path, log) -> dict:
    junit = work / "pytest.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("pytest_timeout"):  # a hung test fails alone, the rest still run
        command.append("--timeout=90")
    step = run_step("tests", [*command, f"--junitxml={junit}"], log)
    if junit.exists():
        step.update(junit_summary(junit))
        if step["status"] == "passed" and (
            step["gpu_tests_skipped"] or not step["gpu_tests_passed"]
        ):
            step["status"] = "failed"  # on a GPU machine every GPU test must run
    return step


def junit_summary(path: Path) -> dict:
    """Counts from pytest's JUnit XML, the failures by name, and how many GPU tests ran."""
    cases = list(ElementTree.parse(path).getroot().iter("testcase"))

    def outcome(case) -> str:
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                return tag
        return "passed"

    outcomes = [(f"{case.get('classname')}::{case.get('name')}", outcome(case)) for case in cases]
    gpu_files = ("tests.datapath.test_gpu", "tests.tools.test_demo_gpu")
    on_gpu = [o for n, o in outcomes if any(f in n for f in gpu_files)]
    return {
        "counts": {
            k: sum(o == k for _, o in outcomes) for k in ("passed", "failure", "error", "skipped")
        },
        "gpu_tests_passed": on_gpu.count("passed"),
        "gpu_tests_skipped": on_gpu.count("skipped"),
        "not_passed": [f"{n} ({o})" for n, o in outcomes if o in ("failure", "error")],
    }


def run_benchmark(name: str, script: str, work: Path, log, report: dict) -> dict | None:
    out = work / f"{name}.json"
    step = run_step(
        name, [sys.executable, str(ROOT / "benchmarks" / script), "--out", str(out)], log
    )
    report["steps"][name] = step
    return json.loads(out.read_text()) if out.exists() else None


def run_sanitizer(tool: str, log) -> dict:
    sanitizer = shutil.which("compute-sanitizer") or next(
        (str(p) for p in Path("/usr/local").glob("cuda*/bin/compute-sanitizer") if p.exists()),
        None,
    )
    if sanitizer is None:
        return {"status": "not run", "why": "compute-sanitizer is not on this machine"}
    command = [sanitizer, f"--tool={tool}", "--error-exitcode=3"]
    command += [sys.executable, str(Path(__file__).resolve()), "--round-trip"]
    step = run_step(tool, command, log)
    summary = re.findall(r"ERROR SUMMARY: (\d+) error", step["tail"])
    step["errors"] = int(summary[-1]) if summary else None
    step["round_trip_ok"] = "round trip: bytes exact" in step["tail"]
    return step


def round_trip() -> int:
    """A small store, load and concurrent store + load, byte-checked: what the sanitizer runs."""
    import numpy as np
    from numba import cuda

    from numbakv.datapath import HostPool, KVLayout, TransferEngine

    rng = np.random.default_rng(0)
    shape = (2, 32, 8, 2, 64)  # flash-attention, 2 KiB per K or V chunk
    layers = [cuda.to_device(rng.integers(1, 255, shape, dtype=np.uint8)) for _ in range(4)]
    layout = KVLayout.from_arrays("flash_attn", layers)
    pool = HostPool.for_layout(layout, 16)
    engine = TransferEngine(layout, pool)

    def blocks(ids: np.ndarray) -> np.ndarray:
        """The oracle: blocks `ids` as host blocks (layer by layer, K then V)."""
        copies = [layer.copy_to_host() for layer in layers]
        return np.stack([np.concatenate([c[:, i].reshape(-1) for c in copies]) for i in ids])

    gpu_ids, host_ids = rng.permutation(32)[:8], rng.permutation(16)[:8]
    engine.submit("store", "store", gpu_ids, host_ids)
    engine.wait("store")
    ok = np.array_equal(pool.blocks[host_ids], blocks(gpu_ids))
    # a store and a load at once, on disjoint blocks
    sources, targets = np.setdiff1d(np.arange(16), host_ids), np.setdiff1d(np.arange(32), gpu_ids)
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
    bandwidth, e2e = report.get("bandwidth"), report.get("e2e")
    figures: dict[str, float | None] = dict.fromkeys(name for name, *_ in TARGETS)
    if bandwidth:
        ceiling = bandwidth["dma_ceiling_gbps"]
        rows = [row for row in bandwidth["rows"] if row["chunk_bytes"] >= 4096]
        for kernel, link in (("gather", "d2h"), ("scatter", "h2d")):
            speeds = [row[f"{kernel}_gbps"] for row in rows]
            figures[f"{kernel}, chunks >= 4 KiB, best cap"] = min(
                100 * max(s.values()) / ceiling[link] for s in speeds
            )
            figures[f"{kernel}, chunks >= 4 KiB, 16 thread blocks"] = min(
                100 * s["16"] / ceiling[link] for s in speeds
            )
        step = bandwidth["per_step"]
        figures["per-step store (16 x 32 x 16 KiB), submit to done"] = (
            100 * step["store_poll_gbps"] / ceiling["d2h"]
        )
        figures["per-step load (16 x 32 x 16 KiB), submit to done"] = (
            100 * step["load_poll_gbps"] / ceiling["h2d"]
        )
        figures["store + load together, chunks >= 4 KiB"] = min(
            row["concurrent_gbps"]
            / max(max(row["gather_gbps"].values()), max(row["scatter_gbps"].values()))
            for row in rows
        )
        figures["submit, 16 blocks"] = step["submit_us_median"]
    if e2e and e2e.get("overlap"):
        figures["compute slowed by a store next to it"] = 100 * e2e["overlap"]["compute_slowdown"]
    checked = []
    for name, unit, bound, sense in TARGETS:
        value = figures[name]
        ok = None if value is None else (value >= bound if sense == ">=" else value <= bound)
        checked.append(
            {"target": name, "unit": unit, "bound": f"{sense} {bound}", "value": value, "ok": ok}
        )
    return checked


def print_table(report: dict) -> None:
    env = report["environment"]
    print(f"\ndevice: {env.get('device')} | {env.get('nvidia_smi', '')}")
    print(
        f"python {env.get('python')}, numpy {env.get('numpy')}, numba {env.get('numba')}, "
        f"numba-cuda {env.get('numba_cuda')}, torch {env.get('torch')}"
    )
    bandwidth = report.get("bandwidth")
    if bandwidth:
        ceiling = bandwidth["dma_ceiling_gbps"]
        print(
            f"DMA ceiling (this run): d2h {ceiling['d2h']:.1f} GB/s, h2d {ceiling['h2d']:.1f} GB/s"
        )
        peers = next((row for row in bandwidth["rows"] if row["chunk_bytes"] == 16384), None)
        if peers:
            torch_way = peers["torch_gbps"] or {"d2h": float("nan"), "h2d": float("nan")}
            print(
                "16 KiB chunks, GB/s d2h/h2d: numbakv (16 blocks) "
                f"{peers['gather_gbps']['16']:.1f}/{peers['scatter_gbps']['16']:.1f}, "
                f"torch gather + one pinned copy {torch_way['d2h']:.1f}/{torch_way['h2d']:.1f}, "
                f"cudaMemcpyAsync per block and layer {peers['naive_gbps']['d2h']:.2f}/"
                f"{peers['naive_gbps']['h2d']:.2f}"
            )
        if "both" in ceiling:
            print(f"DMA both ways at once: {ceiling['both']:.1f} GB/s in all")
        for shape in bandwidth.get("launch_shapes", []):
            print(
                f"  {shape['threads_per_block']:>4} threads x {shape['thread_blocks']:>2} blocks: "
                f"gather {shape['gather_gbps']:.1f}, scatter {shape['scatter_gbps']:.1f}, "
                f"both {shape['concurrent_gbps']:.1f} GB/s"
            )
    for shape in (report.get("e2e") or {}).get("overlap_by_shape", []):
        print(
            f"  compute beside a store of {shape['threads_per_block']:>4} threads x "
            f"{shape['thread_blocks']:>2} blocks: {100 * shape['compute_slowdown']:+.1f}%, "
            f"{shape['hidden_share']:.0%} of the store hidden"
        )
    print(f"{'step':<12} {'status':<8} {'seconds':>8}  detail")
    for name, step in report["steps"].items():
        detail = ""
        if name == "tests" and "counts" in step:
            detail = f"{step['counts']}, GPU tests passed {step['gpu_tests_passed']}"
            detail += f" (skipped {step['gpu_tests_skipped']})"
            if step["not_passed"]:
                detail += "; not passed: " + ", ".join(step["not_passed"][:8])
        elif "errors" in step:
            detail = f"errors {step['errors']}, round trip ok: {step['round_trip_ok']}"
        elif "why" in step:
            detail = step["why"]
        print(f"{name:<12} {step['status']:<8} {step.get('seconds', '-'):>8}  {detail}")
    print(f"\n{'target':<52} {'unit':<22} {'bound':>7} {'value':>8}  ok")
    for row in report["targets"]:
        value = "-" if row["value"] is None else f"{row['value']:.2f}"
        ok = {True: "yes", False: "NO", None: "-"}[row["ok"]]
        print(f"{row['target']:<52} {row['unit']:<22} {row['bound']:>7} {value:>8}  {ok}")


if __name__ == "__main__":
    sys.exit(main())

"""The bandwidth benchmark runs end to end (a tiny configuration; the simulator reports no timings)."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "transfer_bandwidth.py"


def test_benchmark_writes_every_measurement(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("transfer_bandwidth", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    config = dict(bench.SMOKE, chunks=[512], job_mib=1 / 256, thread_blocks=[1, None])
    out = tmp_path / "bandwidth.json"
    bench.run(config, out)

    report = json.loads(out.read_text())
    assert set(report["dma_ceiling_gbps"]) == {"d2h", "h2d", "both"}
    (row,) = report["rows"]
    assert row["chunk_bytes"] == 512 and row["job_bytes"] == row["blocks_per_job"] * 2 * 512
    assert set(row["gather_gbps"]) == set(row["scatter_gbps"]) == {"1", "all"}
    for key in (
        "together_gbps",
        "naive_gbps",
        "torch_gbps",
        "submit_us_median_16_blocks",
    ):
        assert key in row
    assert set(row["staged_gbps"]) == {"store", "load"}
    pairs = {f"{store}/{load}" for store in bench.PATHS for load in bench.PATHS}
    assert set(row["together_gbps"]) == pairs  # store path / load path
    shapes = [
        (shape["threads_per_block"], shape["thread_blocks"]) for shape in report["launch_shapes"]
    ]
    assert shapes == bench.SMOKE["launch_shapes"]["shapes"]
    assert all(
        {"gather_gbps", "scatter_gbps", "concurrent_gbps"} <= set(s)
        for s in report["launch_shapes"]
    )
    step = report["per_step"]
    assert step["job_bytes"] == 2 * 2 * 512  # 2 blocks x 2 layers x 512 bytes
    assert report["default_paths"] == {"store": "staged", "load": "staged"}
    assert set(step["paths"]) == {"zero_copy", "staged"}
    for figures in step["paths"].values():
        assert figures["submit_us_without_launch"] > 0
        for direction in ("store", "load"):
            assert {f"{direction}_poll_gbps", f"{direction}_wait_gbps"} <= set(figures)
        for before in ("polled", "after_wait", "after_sleep"):
            assert figures[f"submit_us_{before}"] > 0
    assert set(report["driver_calls_us"]) == {
        "event_record",
        "id_upload",
        "launch",
        "batch_copy",
        "batch_copy_one",
        "event_query",
    }
    out = capsys.readouterr().out
    assert "gather" in out and "per-step job" in out and "driver calls" in out

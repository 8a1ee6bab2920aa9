"""One request's load from the disk tier: its chunks read one after another (`stripes=1`) or
spread over the tier's stripes (the default), side by side on the same files.

    python benchmarks/disk_stripes.py --dir /mnt/nvme/bench [--chunks 64] [--repeats 9]

Two tiers open one directory (as two engines may); one stores `--chunks` chunks of 2 MiB of random
bytes, then each loads all of them as one job, in turn, `--repeats` rounds, every load checked
byte for byte. Prints the median milliseconds and GB/s of each.
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numbakv.tiers import Namespace, open_tier

CHUNK_BYTES = 2 << 20


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    for name in ("chunks", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"argument --{name}: expected a whole number >= 1")
    n = args.chunks
    rows = np.frombuffer(mmap.mmap(-1, 2 * n * CHUNK_BYTES), np.uint8).reshape(2 * n, CHUNK_BYTES)
    rows[:n] = np.random.default_rng(0).integers(0, 256, (n, CHUNK_BYTES), dtype=np.uint8)
    namespace = Namespace(
        "disk-stripes", "", "bfloat16", 16, 1, 1, 1, 1, CHUNK_BYTES, "disk-stripes"
    )  # fmt: skip
    root = tempfile.mkdtemp(prefix="numbakv-stripes-", dir=args.dir)
    default = open_tier(f"dir:{root}", rows, namespace, bytes_to_use=2 * n * CHUNK_BYTES)
    one_by_one = open_tier(
        f"dir:{root}", rows, namespace, bytes_to_use=2 * n * CHUNK_BYTES, stripes=1
    )
    tiers = {tier.backend.settings.stripes: tier for tier in (one_by_one, default)}
    keys = [uuid.uuid4().bytes for _ in range(n)]
    writer = default
    writer.submit_store("store", keys, np.arange(n))
    writer.drain()
    assert all(job.success for job in writer.take_finished())
    times: dict[int, list[float]] = {stripes: [] for stripes in tiers}
    jobs = iter(range(10**9))
    for _ in range(args.repeats):
        for stripes, tier in tiers.items():
            rows[n:] = 0
            started = time.perf_counter()
            tier.submit_load(next(jobs), keys, np.arange(n, 2 * n))
            tier.drain()
            times[stripes].append((time.perf_counter() - started) * 1e3)
            assert all(job.success for job in tier.take_finished())
            assert np.array_equal(rows[n:], rows[:n]), "a load differs from what was stored"
    for stripes, tier in tiers.items():
        ms = statistics.median(times[stripes])
        print(f"stripes={stripes}: {ms:.1f} ms, {n * CHUNK_BYTES / ms / 1e6:.2f} GB/s (median)")
        tier.close()


if __name__ == "__main__":
    main()

"""A host pool of the process's own: page-aligned, writable, and asking the kernel for huge pages,
so that a disk tier's O_DIRECT read of a chunk is one request and not several."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from numbakv.datapath import HostPool

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
SMAPS = Path("/proc/self/smaps")


def _mapping_fields(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds `address`."""
    for entry in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", SMAPS.read_text()):
        start, end = (int(bound, 16) for bound in entry.split(maxsplit=1)[0].split("-"))
        if start <= address < end:
            fields = (line.split(":", 1) for line in entry.splitlines()[1:] if ":" in line)
            return {name: value.strip() for name, value in fields}
    raise LookupError(f"no mapping holds {address:#x}")


def test_a_pool_of_its_own_is_page_aligned_and_holds_what_is_written():
    pool = HostPool(3, 40_000)
    assert pool.blocks.ctypes.data % 4096 == 0
    rows = np.random.default_rng(5).integers(0, 256, pool.blocks.shape, dtype=np.uint8)
    pool.blocks[:] = rows
    np.testing.assert_array_equal(pool.blocks, rows)


@pytest.mark.skipif(
    not THP_MODE.exists() or "[never]" in THP_MODE.read_text() or not SMAPS.exists(),
    reason="this kernel gives no transparent huge pages",
)
def test_a_pool_of_its_own_asks_for_huge_pages():
    pool = HostPool(4, 1 << 20)
    pool.blocks[:] = 1
    assert _mapping_fields(pool.blocks.ctypes.data)["THPeligible"] == "1"


def test_a_forked_child_gets_no_copy_of_the_pool():
    pool = HostPool(2, 8192)
    assert "dc" in _mapping_fields(pool.blocks.ctypes.data)["VmFlags"].split()

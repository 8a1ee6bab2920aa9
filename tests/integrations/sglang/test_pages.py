"""Where a page lies in SGLang's real host pools, against SGLang's own flat pages as the reference:
every MHA and MLA layout, random bytes, random pages."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.sglang_pools import host_pool, page_bytes, require_sglang

require_sglang()

import torch

from numbakv.integrations.sglang.pages import page_map

MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct"]
CASES = [(layout, False) for layout in MHA_LAYOUTS] + [(layout, True) for layout in MLA_LAYOUTS]


@pytest.mark.parametrize(("layout", "mla"), CASES)
def test_gathered_pages_are_sglangs_flat_pages_and_scatter_back_byte_exact(layout, mla):
    pool = host_pool(layout, mla=mla, seed=1)
    (chunks,) = page_map(pool)
    pages = np.random.default_rng(2).choice(pool.page_num - 1, size=9, replace=False)
    first_tokens = pages * pool.page_size
    rows = np.zeros((len(pages), chunks.chunk_bytes), np.uint8)
    chunks.gather(first_tokens, rows)
    assert [bytes(row) for row in rows] == [page_bytes(pool, page) for page in pages]

    other = host_pool(layout, mla=mla, seed=3)
    (into,) = page_map(other)
    into.scatter(rows, first_tokens)
    assert [page_bytes(other, page) for page in pages] == [bytes(row) for row in rows]
    untouched = sorted(set(range(pool.page_num)) - set(pages.tolist()))
    fresh = host_pool(layout, mla=mla, seed=3)
    assert [page_bytes(other, p) for p in untouched] == [page_bytes(fresh, p) for p in untouched]


@pytest.mark.parametrize(
    ("layout", "mla", "direct"), [(*case, case[1] and case[0] != "layer_first") for case in CASES]
)
def test_the_pool_is_the_tiers_rows_where_a_page_is_one_range(layout, mla, direct):
    pool = host_pool(layout, mla=mla, seed=4)
    (chunks,) = page_map(pool)
    rows = chunks.direct_rows()
    assert (rows is not None) == direct
    if direct:
        pages = np.array([0, 5, 7])
        row_of = chunks.direct_row_of(pages * pool.page_size)
        assert [bytes(rows[r]) for r in row_of] == [page_bytes(pool, p) for p in pages]
        assert np.shares_memory(rows, pool.kv_buffer.view(-1).view(torch.uint8).numpy())
        with pytest.raises(ValueError, match="page boundaries"):
            chunks.direct_row_of(np.array([1]))


def test_head_groups_of_a_tp4_page_are_the_pages_of_tp8_ranks():
    """tp_lcm_size 8 at TP 4: a rank's page_head page (4 heads) is two chunks, each the page of
    the TP 8 rank holding those 2 heads."""
    wide = host_pool("page_head", heads=4, seed=5)
    groups = page_map(wide, shards=2)
    narrow = [host_pool("page_head", heads=2, seed=6 + j) for j in range(2)]
    pages = np.array([3, 9])
    for j, group in enumerate(groups):
        rows = np.zeros((len(pages), group.chunk_bytes), np.uint8)
        group.gather(pages * wide.page_size, rows)
        (own,) = page_map(narrow[j])
        own.scatter(rows, pages * wide.page_size)
    wide_bytes = wide.kv_buffer.view(torch.uint8)  # [K/V, page, head, token, layer, dim bytes]
    for j in range(2):
        heads = slice(2 * j, 2 * j + 2)
        for page in pages:
            narrow_page = narrow[j].kv_buffer.view(torch.uint8)[:, page]
            assert torch.equal(narrow_page, wide_bytes[:, page, heads])


def test_head_groups_need_the_page_head_layout():
    with pytest.raises(ValueError, match="page_head"):
        page_map(host_pool("page_first", heads=4), shards=2)

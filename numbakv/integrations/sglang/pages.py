"""Where one SGLang page lies in its host pool, and moving many pages between the pool and rows.

An SGLang host pool (MHA or MLA, any of its layouts) keeps a page as a few byte ranges of one
buffer: a page-first MHA page is its K block and its V block, a layer-first one a K and a V block
per layer, a page-first MLA page one block. SGLang's `get_page_buffer_meta` says where they are for
given pages; `page_map` asks it once, for three pages, and keeps the answer as arithmetic: each
range lies at a fixed offset plus the page's first token index times a fixed stride. A chunk is
those ranges in address order, which is the order of SGLang's own flat page (`get_data_page`), so a
page moved here and one moved through SGLang's flat pages are the same bytes.

Moving a batch costs one NumPy copy per range, whatever the number of pages. Where a page is one
range and the pool's pages tile its buffer (page-first MLA), the pool's own memory serves as the
tier's rows (`direct_rows`) and nothing is copied at all.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

PROBE_PAGES = 3
"""Pages whose byte ranges are asked for: two give the stride, the third checks it."""


@dataclass(frozen=True)
class Span:
    """One byte range of a page: `offset` from the buffer's start for the page whose first token
    index is 0, `nbytes` long."""

    offset: int
    nbytes: int


class PageMap:
    """The ranges of one chunk of every page of a host pool, as views of its buffer.

    `buffer` is the pool's memory as flat bytes; a page whose first token index is `t` has its
    range `i` at `spans[i].offset + t * token_stride`. A chunk row holds the ranges one after
    another, in the order given.
    """

    def __init__(
        self, buffer: np.ndarray, page_size: int, token_stride: int, spans: tuple[Span, ...]
    ) -> None:
        self.buffer = buffer
        self.page_size = page_size
        self.token_stride = token_stride
        self.spans = spans
        self.chunk_bytes = sum(span.nbytes for span in spans)
        self._views = tuple(self._view(span) for span in spans)
        ends = np.cumsum([0] + [span.nbytes for span in spans])
        self._columns = tuple(slice(int(a), int(b)) for a, b in itertools.pairwise(ends))

    def _view(self, span: Span) -> np.ndarray:
        """Rows of `span.nbytes` bytes, row `t` where a page starting at token `t` has the span."""
        positions = (self.buffer.nbytes - span.offset - span.nbytes) // self.token_stride + 1
        return np.lib.stride_tricks.as_strided(
            self.buffer[span.offset :],
            shape=(positions, span.nbytes),
            strides=(self.token_stride, 1),
        )

    def gather(self, first_tokens: np.ndarray, rows: np.ndarray) -> None:
        """Copy the pages starting at `first_tokens` into `rows` (one row each)."""
        for view, columns in zip(self._views, self._columns):
            rows[:, columns] = view[first_tokens]

    def scatter(self, rows: np.ndarray, first_tokens: np.ndarray) -> None:
        """Copy `rows` (one each) into the pages starting at `first_tokens`."""
        for view, columns in zip(self._views, self._columns):
            view[first_tokens] = rows[:, columns]

    def direct_rows(self) -> np.ndarray | None:
        """The buffer as one row per page, where a page is one range and pages tile the buffer:
        a tier can then read and write the pool itself. None otherwise."""
        if len(self.spans) != 1:
            return None
        (span,) = self.spans
        if span.nbytes != self.page_size * self.token_stride or span.offset % span.nbytes:
            return None
        count = (self.buffer.nbytes - span.offset) // span.nbytes
        start = span.offset
        return self.buffer[start : start + count * span.nbytes].reshape(count, span.nbytes)

    def direct_row_of(self, first_tokens: np.ndarray) -> np.ndarray:
        """The `direct_rows` row of each page; ValueError when a page does not start on a row."""
        (span,) = self.spans
        page_bytes = span.nbytes
        starts = span.offset + first_tokens * self.token_stride
        if np.any(starts % page_bytes):
            raise ValueError("host indices must start pages on the host pool's page boundaries")
        return starts // page_bytes


def host_bytes(host_pool: Any) -> tuple[np.ndarray, int]:
    """The host pool's KV buffer as flat bytes (no copy), and its address."""
    buffer = getattr(host_pool, "kv_buffer", None)
    if not isinstance(buffer, torch.Tensor) or buffer.device.type != "cpu":
        raise ValueError(
            f"{type(host_pool).__name__} keeps no single host KV buffer (kv_buffer); numbakv's "
            "zero-copy path needs one (an MHA or MLA host pool)"
        )
    if not buffer.is_contiguous():
        raise ValueError(f"{type(host_pool).__name__}'s kv_buffer must be contiguous")
    return buffer.reshape(-1).view(torch.uint8).numpy(), buffer.data_ptr()


def page_map(host_pool: Any, shards: int = 1) -> list[PageMap]:
    """One `PageMap` a shard: with `shards` > 1 every range of a page is cut in that many equal
    parts and shard `j` takes part `j` of each (the head groups of SGLang's page_head layout,
    which `tp_lcm_size` shares across tensor-parallel sizes).

    Raises ValueError naming what the pool does not offer: its layout has no byte ranges, the
    ranges do not follow one stride, or they do not add up to SGLang's flat page.
    """
    buffer, base = host_bytes(host_pool)
    layout = getattr(host_pool, "layout", "?")
    page_size = host_pool.page_size
    probe = torch.arange(PROBE_PAGES * page_size, dtype=torch.int64)
    try:
        addresses, sizes = host_pool.get_page_buffer_meta(probe)
    except (AssertionError, NotImplementedError, ValueError) as error:
        raise ValueError(
            f"the {layout} layout of {type(host_pool).__name__} names no byte ranges for its "
            f"pages ({error}); use --hicache-mem-layout page_first or layer_first"
        ) from None
    per_page = len(addresses) // PROBE_PAGES
    pages = [
        sorted(zip(addresses[i * per_page : (i + 1) * per_page], sizes[i * per_page :]))
        for i in range(PROBE_PAGES)  # zip stops at the page's last address
    ]
    stride = pages[1][0][0] - pages[0][0][0]
    regular = stride > 0 and stride % page_size == 0
    for index, page in enumerate(pages):
        for (address, size), (first, first_size) in zip(page, pages[0]):
            regular &= address == first + index * stride and size == first_size
    spans = tuple(Span(address - base, size) for address, size in pages[0])
    flat = host_pool.get_dummy_flat_data_page()
    flat_bytes = flat.numel() * flat.element_size()
    ends = [span.offset + span.nbytes for span in spans]
    in_buffer = all(span.offset >= 0 for span in spans) and max(ends) <= buffer.nbytes
    if not regular or not in_buffer or sum(span.nbytes for span in spans) != flat_bytes:
        raise ValueError(
            f"the {layout} layout of {type(host_pool).__name__} does not keep its pages at one "
            "stride in its kv_buffer; numbakv cannot map it"
        )
    if shards > 1 and (layout != "page_head" or any(span.nbytes % shards for span in spans)):
        raise ValueError(
            f"a page splits into {shards} head groups only in the page_head layout with heads "
            f"divisible by {shards}; got {layout}"
        )
    return [
        PageMap(
            buffer,
            page_size,
            stride // page_size,
            tuple(
                Span(span.offset + j * (span.nbytes // shards), span.nbytes // shards)
                for span in spans
            ),
        )
        for j in range(shards)
    ]

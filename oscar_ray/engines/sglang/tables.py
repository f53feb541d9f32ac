"""Where each token of an sglang batch lives in the OSCAR pool, and the kernels' page tables.

Two tiers (shapes of oscar_ray.kernels.layout, page = sglang's --page-size P):
  INT2  one page per sglang slot page: token slot s (from sglang's allocator, `req_to_token`)
        is (page s // P, offset s % P).  Every whole page is here (dual residency): extend writes
        each token's codes, a decode step ("side" form) the page's codes when its token completes
        the page (plan_fills, from the arena copy) and only the BF16 copy before.  So a page that
        leaves the BF16 windows needs no demotion copy, and a prefix shared through sglang's radix
        cache (slot ids of whole pages only) is always readable; a partial tail page, which may
        lack codes for its decode rows, is always in its own request's window and never shared.
  BF16  an arena of W = S + R + 1 pages per request slot (req_pool_idx) plus one scratch page:
        sink pages j < S at arena page j, recent pages in a ring of R + 1 pages, page j ≥ S at
        S + (j − S) mod (R + 1).  S, R = sink / recent pages of PageGeometry.
Which pages a request reads in BF16 follows PageGeometry.page_kind (sink, then INT2 history, then
the recent window of R pages plus the partial tail), restricted to pages whose BF16 copy is this
request's own: ring_tag[arena page] holds the slot page it mirrors and slot_owner[slot page] the
arena page mirroring it; both must agree.  A prefix-cache hit, a reused request slot or a ring
page overwritten by a long chunk fails that check, and the page is read from INT2 instead.
All functions are static-shape torch ops (no host sync) given max_pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oscar_ray.cache.geometry import PageGeometry
from oscar_ray.kernels.layout import Segments


@dataclass(frozen=True, slots=True)
class ArenaLayout:
    """The BF16 arena of `max_reqs` request slots for one PageGeometry."""

    geometry: PageGeometry
    max_reqs: int

    def __post_init__(self) -> None:
        if self.max_reqs < 1:
            raise ValueError(f"max_reqs must be >= 1, got {self.max_reqs}")

    @property
    def page_size(self) -> int:
        return self.geometry.page_size

    @property
    def window_pages(self) -> int:
        """W: sink pages + recent pages + the partial tail page."""
        return self.geometry.sink_pages + self.geometry.recent_pages + 1

    @property
    def scratch_page(self) -> int:
        """Target of BF16 writes for tokens outside the windows (keeps every launch static-shape)."""
        return self.max_reqs * self.window_pages

    @property
    def n_pages(self) -> int:
        return self.scratch_page + 1

    def arena_bytes(self) -> int:
        """BF16 bytes of the arena, all layers, K and V."""
        return self.n_pages * self.geometry.bf16_page_bytes()

    def ring_page(self, req_idx: torch.Tensor, page: torch.Tensor) -> torch.Tensor:
        """Arena page of logical page `page` of request slot `req_idx` (broadcasting)."""
        s, r = self.geometry.sink_pages, self.geometry.recent_pages
        local = torch.where(page < s, page, s + torch.remainder(page - s, r + 1))
        return req_idx * self.window_pages + local

    def in_window(self, page: torch.Tensor, n_tokens: torch.Tensor) -> torch.Tensor:
        """PageGeometry.page_kind == BF16 for page `page` of a request of n_tokens (broadcasting)."""
        g = self.geometry
        history = torch.clamp(torch.div(n_tokens, g.page_size, rounding_mode="floor") - g.recent_pages
                              - g.sink_pages, min=0)
        return (page < g.sink_pages) | (page >= g.sink_pages + history)


@dataclass(frozen=True, slots=True)
class WritePlan:
    """Targets of N new tokens (int32 [N] each): INT2 (page, offset) and BF16 (arena page, offset)."""

    int2_page: torch.Tensor
    int2_off: torch.Tensor
    bf16_page: torch.Tensor
    bf16_off: torch.Tensor


def plan_writes(arena: ArenaLayout, loc: torch.Tensor, positions: torch.Tensor, req_idx: torch.Tensor,
                final_len: torch.Tensor, slot_owner: torch.Tensor, ring_tag: torch.Tensor) -> WritePlan:
    """Targets of tokens at slots `loc` [N], sequence positions `positions` [N] of request slots
    `req_idx` [N] whose length after this forward is `final_len` [N]; updates the ownership tags
    in place (call once per forward, before any layer reads).

    A token gets a BF16 copy when its page is in its request's windows at final_len; the windows
    only move forward, so a page that is out stays out.  sglang's paged allocator keeps
    slot % P == position % P, which the INT2 offset relies on.
    """
    p = arena.page_size
    loc, positions = loc.to(torch.int64), positions.to(torch.int64)
    page = torch.div(positions, p, rounding_mode="floor")
    slot_page = torch.div(loc, p, rounding_mode="floor")
    keep = arena.in_window(page, final_len.to(torch.int64))
    ring = arena.ring_page(req_idx.to(torch.int64), page)
    bf16_page = torch.where(keep, ring, torch.full_like(ring, arena.scratch_page))
    # a slot page written without a BF16 copy is no longer mirrored by any arena page
    slot_owner[slot_page] = torch.where(keep, ring, torch.full_like(ring, -1)).to(slot_owner.dtype)
    ring_tag[bf16_page] = slot_page.to(ring_tag.dtype)
    i32 = torch.int32
    return WritePlan(slot_page.to(i32), torch.remainder(loc, p).to(i32), bf16_page.to(i32),
                     torch.remainder(positions, p).to(i32))


@dataclass(frozen=True, slots=True)
class PageFills:
    """Slot pages a decode step completes (int32 [F] each) and the arena pages mirroring them."""

    slot_page: torch.Tensor
    arena_page: torch.Tensor

    @property
    def count(self) -> int:
        return int(self.slot_page.shape[0])


def plan_fills(plan: WritePlan, seq_lens: torch.Tensor, host_seq_lens, page_size: int) -> PageFills | None:
    """The pages a decode step's tokens complete: rows whose length after the step is a whole
    number of pages.  The count comes from the host lengths, so no launch waits on the GPU (a stable
    argsort puts the F completing rows first); None without host lengths (then the caller writes
    INT2 per token).  Only whole pages are ever shared: sglang's radix cache inserts page-aligned
    keys (RadixKey.page_aligned), so a page read from INT2 by another request is always complete.
    Assumed: a page holding decode rows is completed by a decode step, never by a later extend of
    the same request (sglang 0.5.23 has no such path outside speculative decoding, which the
    backend refuses); such an extend would write codes for its own rows only.  The count varies by
    step, so a CUDA-graph decode path would need a fixed-size form of this (the backend has none).
    """
    if host_seq_lens is None:
        return None
    host = host_seq_lens.tolist() if isinstance(host_seq_lens, torch.Tensor) else list(host_seq_lens)
    f = sum(1 for n in host if n % page_size == 0)
    if f == len(host):
        return PageFills(plan.int2_page, plan.bf16_page)
    if f == 0:
        empty = plan.int2_page[:0]
        return PageFills(empty, empty)
    rows = torch.argsort((torch.remainder(seq_lens.to(torch.int64), page_size) != 0).to(torch.int8), stable=True)[:f]
    return PageFills(plan.int2_page[rows].contiguous(), plan.bf16_page[rows].contiguous())


def build_segments(arena: ArenaLayout, req_to_token: torch.Tensor, req_idx: torch.Tensor, lens: torch.Tensor,
                   slot_owner: torch.Tensor, ring_tag: torch.Tensor, max_pages: int) -> Segments:
    """kernels.Segments for B requests (req_idx [B], lens [B] cached tokens each): per tier, the
    pages in position order (only the last can be partial) and the token counts."""
    p = arena.page_size
    dev = req_to_token.device
    req_idx, lens = req_idx.to(dev, torch.int64), lens.to(dev, torch.int64)
    j = torch.arange(max(1, max_pages), device=dev, dtype=torch.int64)[None, :]  # [1, J]
    n = lens[:, None]
    exists = j * p < n
    cols = torch.clamp(j * p, max=req_to_token.shape[1] - 1).expand(lens.shape[0], -1)
    slot_page = torch.div(req_to_token[req_idx[:, None], cols].to(torch.int64), p, rounding_mode="floor")
    slot_page = torch.where(exists, slot_page, torch.zeros_like(slot_page))
    ring = arena.ring_page(req_idx[:, None], j)
    own = (slot_owner[slot_page].to(torch.int64) == ring) & (ring_tag[ring].to(torch.int64) == slot_page)
    bf16 = exists & arena.in_window(j, n) & own
    int2 = exists & ~bf16
    tokens = torch.clamp(n - j * p, 0, p)
    big = j.shape[1]
    # stable compaction: a tier's pages first, in position order (argsort of distinct keys)
    bf16_order = torch.argsort(torch.where(bf16, j, j + big), dim=1)
    int2_order = torch.argsort(torch.where(int2, j, j + big), dim=1)
    i32 = torch.int32
    return Segments(
        int2_page_table=torch.gather(slot_page, 1, int2_order).to(i32).contiguous(),
        int2_lens=(tokens * int2).sum(1).to(i32).contiguous(),
        bf16_page_table=torch.gather(ring, 1, bf16_order).to(i32).contiguous(),
        bf16_lens=(tokens * bf16).sum(1).to(i32).contiguous(),
    )

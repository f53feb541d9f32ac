"""The plugin's slot → tier mapping follows PageGeometry and falls back to INT2 for foreign pages."""

import pytest
import torch

from oscar_ray.cache.geometry import PageGeometry
from oscar_ray.cache.records import PageKind
from oscar_ray.engines.sglang.tables import ArenaLayout, build_segments, plan_writes

P = 4


class Cache:
    """sglang's side of the cache, as its paged allocator and req_to_token leave it: whole slot pages
    per request (slot % P == position % P), page 0 reserved for padding."""

    def __init__(self, geometry, max_reqs=3, n_slot_pages=64, max_ctx=96):
        self.arena = ArenaLayout(geometry, max_reqs)
        self.req_to_token = torch.zeros(max_reqs, max_ctx, dtype=torch.int32)
        self.free = list(range(1, n_slot_pages))
        self.lens = [0] * max_reqs
        self.slot_owner = torch.full((n_slot_pages,), -1, dtype=torch.int32)
        self.ring_tag = torch.full((self.arena.n_pages,), -1, dtype=torch.int32)

    def extend(self, req, n_new, share_from=None, shared_pages=0):
        """Append n_new tokens to request slot `req` (optionally first mapping `shared_pages` pages of
        another request's slots, as a radix-cache hit does) and plan their writes."""
        if share_from is not None:
            self.req_to_token[req, : shared_pages * P] = self.req_to_token[share_from, : shared_pages * P]
            self.lens[req] = shared_pages * P
        start = self.lens[req]
        end = start + n_new
        for j in range(start // P, -(-end // P)):
            if j * P >= start:  # a new page (a partial page keeps its slots)
                page = self.free.pop(0)
                self.req_to_token[req, j * P:(j + 1) * P] = torch.arange(page * P, (page + 1) * P)
        pos = torch.arange(start, end)
        self.lens[req] = end
        return plan_writes(self.arena, self.req_to_token[req, start:end].long(), pos, torch.full_like(pos, req),
                           torch.full_like(pos, end), self.slot_owner, self.ring_tag)

    def segments(self, reqs):
        lens = torch.tensor([self.lens[r] for r in reqs])
        return build_segments(self.arena, self.req_to_token, torch.tensor(reqs), lens, self.slot_owner,
                              self.ring_tag, -(-int(lens.max()) // P))


def _tier_tokens(geometry, n):
    kinds = geometry.layout(n)
    sizes = [min(P, n - j * P) for j in range(len(kinds))]
    return (sum(s for s, k in zip(sizes, kinds) if k is PageKind.INT2),
            sum(s for s, k in zip(sizes, kinds) if k is PageKind.BF16))


@pytest.mark.parametrize("sink, recent", [(4, 8), (0, 8), (8, 0), (0, 0)])
def test_own_request_follows_page_geometry(sink, recent):
    g = PageGeometry(2, 2, 64, P, sink_tokens=sink, recent_tokens=recent)
    c = Cache(g)
    c.extend(1, 13)  # one prefill chunk, then decode steps and a second chunk
    for step in range(40):
        c.extend(1, 9 if step == 20 else 1)
        seg = c.segments([1])
        assert (int(seg.int2_lens[0]), int(seg.bf16_lens[0])) == _tier_tokens(g, c.lens[1])
        # INT2 pages are the request's slot pages of its history, in position order
        n2 = int(seg.int2_lens[0])
        kinds = g.layout(c.lens[1])
        history = [j for j, k in enumerate(kinds) if k is PageKind.INT2]
        slots = [int(c.req_to_token[1, j * P]) // P for j in history]
        assert seg.int2_page_table[0, : -(-n2 // P)].tolist() == slots
        # BF16 pages: distinct arena pages of this request slot
        n16 = -(-int(seg.bf16_lens[0]) // P)
        pages = seg.bf16_page_table[0, :n16].tolist()
        w = c.arena.window_pages
        assert len(set(pages)) == n16 and all(w <= p < 2 * w for p in pages)


def test_prefix_hit_and_reused_slot_read_int2():
    g = PageGeometry(2, 2, 64, P, sink_tokens=4, recent_tokens=8)
    c = Cache(g)
    c.extend(1, 16)  # request A: pages 0..3 (sink 0, INT2 1, recent 2..3)
    c.extend(2, 5, share_from=1, shared_pages=3)  # B shares A's pages 0..2, computes 12..16
    seg = c.segments([2])
    # B's sink page and A's recent page 2 are not B's own BF16: INT2; its own pages 3..4 BF16
    assert (int(seg.int2_lens[0]), int(seg.bf16_lens[0])) == (12, 5)
    # A still reads its own windows unchanged
    a = c.segments([1])
    assert (int(a.int2_lens[0]), int(a.bf16_lens[0])) == _tier_tokens(g, 16)
    # A finishes; a new request C reuses A's request slot 1 with a prefix hit on A's first 2 pages:
    # the arena still holds A's copies, and the tags say so (same slot page): C may read them
    c.extend(1, 3, share_from=1, shared_pages=2)
    seg_c = c.segments([1])
    assert (int(seg_c.int2_lens[0]), int(seg_c.bf16_lens[0])) == (4, 4 + 3)
    # ... but after A's slot page 0 is freed and rewritten by D without a BF16 copy, C's sink is INT2
    page0 = int(c.req_to_token[1, 0]) // P
    c.slot_owner[page0] = -1
    seg_c = c.segments([1])
    assert (int(seg_c.int2_lens[0]), int(seg_c.bf16_lens[0])) == (8, 3)


def test_long_chunk_overwriting_the_ring_invalidates_the_prefix_pages():
    g = PageGeometry(2, 2, 64, P, sink_tokens=4, recent_tokens=8)  # S = 1, R = 2 pages: ring of 3
    c = Cache(g)
    c.extend(1, 22)  # pages 0..5: sink 0, INT2 1..2, recent 3..5 (5 partial)
    before = c.segments([1])
    assert (int(before.int2_lens[0]), int(before.bf16_lens[0])) == (8, 14)
    # a 20-token chunk (to 42: window 0 and 8..10) reuses the ring pages of 3..5, and fills the rest
    # of page 5 without a BF16 copy; the prefix tables built after its tags read 3..5 from INT2
    c.extend(1, 20)
    seg = build_segments(c.arena, c.req_to_token, torch.tensor([1]), torch.tensor([22]), c.slot_owner,
                         c.ring_tag, 6)
    assert (int(seg.int2_lens[0]), int(seg.bf16_lens[0])) == (18, 4)


def test_write_targets():
    g = PageGeometry(2, 2, 64, P, sink_tokens=4, recent_tokens=4)
    c = Cache(g)
    plan = c.extend(1, 11)  # pages 0..2; final window: sink 0 + pages 1..2 (history 0)
    assert plan.int2_page.tolist() == [1] * 4 + [2] * 4 + [3] * 3
    assert plan.int2_off.tolist() == [0, 1, 2, 3] * 2 + [0, 1, 2]
    w = c.arena.window_pages
    assert plan.bf16_page.tolist() == [w + 0] * 4 + [w + 1] * 4 + [w + 2] * 3
    # to 17: window = sink + pages 3..4; token 11 (page 2) is out (scratch), pages 3, 4 use ring
    # slots 1 + (j - 1) % (R + 1) = 1, 2
    plan = c.extend(1, 6)
    assert plan.bf16_page.tolist() == [c.arena.scratch_page] + [w + 1] * 4 + [w + 2]

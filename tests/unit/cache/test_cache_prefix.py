"""Prefix index: deterministic chained hashes, match after insert, precision transparency, LRU."""

import os
import subprocess
import sys

import pytest

from oscar_ray.cache import KVAllocator, OutOfPages, PageGeometry, PageKind, block_hashes

B, I = PageKind.BF16, PageKind.INT2
P = 4


def make(sink=8, recent=8, int2=64, bf16=64):
    g = PageGeometry(1, 1, 8, P, sink_tokens=sink, recent_tokens=recent)
    return KVAllocator(g, num_int2_pages=int2, num_bf16_pages=bf16)


def admit(a, rid, tokens):
    out = a.allocate(rid, len(tokens), token_ids=tokens)
    a.end_step()
    return out


def test_block_hashes_are_chained_and_process_independent():
    keys = [k.hex() for k in block_hashes(list(range(8)), 4)]
    assert keys == ["61abbbbadcb5a29f38974c1405255595", "ceb7796f6f9059e045e6ec8c7df2e484"]
    # Same second block after a different first block: a different key (the chain).
    other = list(block_hashes([9, 9, 9, 9, 4, 5, 6, 7], 4))
    assert other[1].hex() != keys[1]
    assert list(block_hashes(list(range(7)), 4, n_blocks=5)) == list(block_hashes(range(4), 4))
    code = "from oscar_ray.cache import block_hashes; print(next(block_hashes(range(8), 4)).hex())"
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == keys[0], out.stderr
    with pytest.raises(ValueError, match="token_ids"):
        list(block_hashes(["a"] * 4, 4))


def test_match_after_insert_shares_pages_and_counts_hits():
    a = make()
    prompt = list(range(20))
    admit(a, "a", prompt)
    assert a.insert_prefix("a", prompt) == 5  # 5 full blocks
    out = admit(a, "b", prompt + [99, 98])
    assert out.n_cached_tokens == 20 and len(out.slots) == 2 and out.demotions == ()
    a_pages, b_pages = a.slot_table("a")[::P], a.slot_table("b")[::P]
    assert a_pages == b_pages[:5]
    assert a._pools[B].refcount(a.segments("a").sink[0]) == 3  # a, b and the index
    stats = a.prefix.stats()
    assert (stats.lookups, stats.tokens_looked_up, stats.tokens_matched) == (2, 42, 20)
    assert stats.hit_rate == pytest.approx(20 / 42)
    assert a.kv_stats()["prefix_hit_rate"] == pytest.approx(20 / 42)
    a.check_invariants()


def test_match_leaves_at_least_one_token_and_ignores_partial_blocks():
    a = make()
    prompt = list(range(22))
    admit(a, "a", prompt)
    assert a.insert_prefix("a", prompt) == 5  # positions 20, 21 are a partial block
    assert a.match_prefix(prompt).n_tokens == 20
    assert a.match_prefix(prompt[:20]).n_tokens == 16  # 20 cached, but one token must be computed
    assert a.match_prefix([7] + prompt[1:]).n_tokens == 0  # first block differs: chain breaks
    before = a.prefix.stats()
    a.match_prefix(prompt)
    assert a.prefix.stats() == before  # a peek is not a lookup


def test_hit_gets_cold_layout_cached_bf16_demoted_into_private_int2():
    a = make()
    prompt = list(range(16))  # 2 sink + 2 ring pages, all BF16
    admit(a, "a", prompt)
    a.insert_prefix("a", prompt)
    cached_ring = a.segments("a").ring
    long_prompt = prompt + list(range(100, 106))  # 22 tokens, 5 full pages: block 2 is INT2
    out = admit(a, "b", long_prompt)
    assert out.n_cached_tokens == 16
    (d,) = out.demotions
    assert d.src == cached_ring[0] and d.positions == range(8, 12)
    assert a.segments("b").history == (d.dst,)
    assert [s.kind for s in a.slot_table("b")[::P]] == a.geometry.layout(22)
    assert a.segments("a").ring == cached_ring  # the cached BF16 page is untouched
    a.check_invariants()


def test_hit_stops_where_bf16_is_needed_but_only_int2_is_cached():
    a = make()
    prompt = list(range(40))  # 10 full pages: blocks 2..7 INT2
    admit(a, "a", prompt)
    a.insert_prefix("a", prompt)
    # A 26-token prompt needs blocks 2, 3 INT2 and 4, 5 BF16, but only INT2 is cached for 4, 5.
    out = admit(a, "b", prompt[:26])
    assert out.n_cached_tokens == 16  # sink + blocks 2, 3; blocks 4.. are recomputed in BF16
    assert [s.kind for s in a.slot_table("b")[::P]] == a.geometry.layout(26)
    a.check_invariants()


def test_one_key_holds_a_bf16_and_an_int2_page():
    a = make()
    prompt = list(range(16))
    admit(a, "a", prompt)
    a.insert_prefix("a", prompt)  # block 2 cached as BF16
    a.extend("a", 8)  # 6 full pages: blocks 2, 3 demoted in "a"
    a.end_step()
    assert a.insert_prefix("a", prompt) == 2  # blocks 2, 3 now also cached as INT2
    assert len(a.prefix) == 6
    out = admit(a, "b", prompt + [1] * 10)  # needs blocks 2, 3 INT2: reuses them, no demotion
    assert out.demotions == () and out.n_cached_tokens == 16
    a.check_invariants()


def test_lru_eviction_frees_unreferenced_pages_leaves_first():
    a = make(sink=0, recent=0, int2=6, bf16=2)
    admit(a, "a", list(range(10)))  # 2 full INT2 pages + a BF16 tail
    a.insert_prefix("a", list(range(8)))
    admit(a, "b", list(range(50, 60)))
    a.insert_prefix("b", list(range(50, 58)))
    a.free("a")
    a.free("b")
    assert (a.usage().int2.cached, a.usage().int2.used, a._pools[I].n_free) == (4, 4, 2)
    admit(a, "c", list(range(200, 210)))  # 2 INT2 pages: both free ones, no eviction
    assert len(a.prefix) == 4
    admit(a, "d", list(range(300, 306)))  # 1 INT2 page: evicts the oldest, a's leaf block
    assert len(a.prefix) == 3
    assert a.match_prefix(list(range(10))).n_tokens == 4  # a's root block survived
    assert a.match_prefix(list(range(50, 60))).n_tokens == 8
    a.check_invariants()


def test_eviction_never_takes_referenced_pages_and_fails_atomically():
    a = make(sink=0, recent=0, int2=2, bf16=2)
    admit(a, "a", list(range(9)))  # 2 INT2 + 1 BF16 tail
    a.insert_prefix("a", list(range(8)))  # cached, but still referenced by "a"
    assert a.usage().int2.cached == 0
    with pytest.raises(OutOfPages, match="0 evictable"):
        a.allocate("b", 9)
    a.free("a")
    assert a.usage().int2.cached == 2
    a.allocate("b", 9)  # now evicts both
    assert len(a.prefix) == 0
    a.check_invariants()


def test_matched_pages_do_not_count_as_evictable_for_their_own_admission():
    a = make(sink=0, recent=0, int2=2, bf16=2)
    prompt = list(range(9))
    admit(a, "a", prompt)
    a.insert_prefix("a", prompt)
    a.free("a")  # 2 cached INT2 pages, 0 free
    longer = prompt + [1, 2, 3, 4]  # reuses both, needs a third INT2 page
    assert not a.can_allocate(13, token_ids=longer)
    with pytest.raises(OutOfPages):
        a.allocate("b", 13, token_ids=longer)
    a.check_invariants()


def test_admission_evicts_other_cached_pages_not_its_match():
    a = make(sink=0, recent=0, int2=3, bf16=2)
    prompt = list(range(9))
    admit(a, "a", prompt)
    a.insert_prefix("a", prompt)
    admit(a, "x", list(range(500, 505)))
    a.insert_prefix("x", list(range(500, 504)))  # more recent than a's blocks
    a.free("a")
    a.free("x")  # 3 cached INT2 pages, 0 free
    out = admit(a, "b", prompt + [1, 2, 3, 4])
    assert out.n_cached_tokens == 8
    assert a.match_prefix(list(range(500, 505))).n_tokens == 0  # x was evicted, not a's match
    a.check_invariants()


def test_clear_and_full_release_returns_usage_to_zero():
    a = make()
    for rid, base in (("a", 0), ("b", 100)):
        admit(a, rid, list(range(base, base + 30)))
        assert a.insert_prefix(rid, list(range(base, base + 30))) == 7  # full blocks only
        a.free(rid)
    assert a.usage().bf16.used > 0
    assert a.clear_prefix_cache() == 14
    assert a.usage().int2.used == a.usage().bf16.used == 0
    a.check_invariants()

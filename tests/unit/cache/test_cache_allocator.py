"""KVAllocator: layout, ring demotion, fork sharing, atomic OutOfPages, free/abort, steps."""

import pytest

from oscar_ray.cache import KVAllocator, OutOfPages, PageCopy, PageGeometry, PageKind

B, I = PageKind.BF16, PageKind.INT2
P = 4  # tokens per page in these tests: small numbers keep the expected tables readable


def make(sink=8, recent=8, int2=64, bf16=64, page=P):
    g = PageGeometry(1, 1, 8, page, sink_tokens=sink, recent_tokens=recent)
    return KVAllocator(g, num_int2_pages=int2, num_bf16_pages=bf16)


def snapshot(a: KVAllocator):
    """Everything observable plus the internals an atomic failure must not touch."""
    return (
        {k: (p.free_pages(), tuple(p.refcount(i) for i in range(p.capacity)))
         for k, p in a._pools.items()},
        {r: (a.segments(r), a.n_tokens(r)) for r in a._requests},
        tuple((k, dict(e)) for k, e in a.prefix._lru.items()),
        a.prefix.stats(), tuple(a._pins), frozenset(a._busy),
    )


def assert_slot_table_in_order(a, rid):
    """Offsets follow positions; pages follow the segment table (sink, history, ring)."""
    seg = a.segments(rid)
    pages = [(B, p) for p in seg.sink] + [(I, p) for p in seg.history] + [(B, p) for p in seg.ring]
    table = a.slot_table(rid)
    assert len(table) == a.n_tokens(rid)
    for pos, slot in enumerate(table):
        assert slot.offset == pos % P
        assert (slot.kind, slot.page) == pages[pos // P]


def kinds(a, rid):
    return [s.kind for s in a.slot_table(rid)[::P]]


def test_prefill_places_every_page_in_its_final_kind():
    a = make()
    out = a.allocate("r", 30)  # 8 pages: 2 sink, 3 history, 2 full ring + tail of 2
    assert out.demotions == () and out.n_cached_tokens == 0 and len(out.slots) == 30
    assert [s.kind for s in out.slots[::P]] == [B, B, I, I, I, B, B, B]
    seg = a.segments("r")
    assert (len(seg.sink), len(seg.history), len(seg.ring)) == (2, 3, 3)
    assert_slot_table_in_order(a, "r")
    a.check_invariants()


def test_request_shorter_than_sink_then_grows_out_of_it():
    a = make()
    a.allocate("r", 5)  # one full sink page + a partial one
    seg = a.segments("r")
    assert len(seg.sink) == 2 and seg.history == () and seg.ring == ()
    a.end_step()
    out = a.extend("r", 4)  # positions 5..8: fills the sink, opens the ring
    assert out.n_cached_tokens == 5 and [s.kind for s in out.slots] == [B] * 4
    assert len(a.segments("r").ring) == 1
    assert_slot_table_in_order(a, "r")
    a.check_invariants()


def test_ring_overflow_demotes_exactly_the_oldest_page_and_never_the_sink():
    a = make()
    a.allocate("r", 1)
    sink = None
    for n in range(2, 80):
        a.end_step()
        before = a.segments("r")
        out = a.extend("r", 1)
        after = a.segments("r")
        sink = sink or (after.sink if len(after.sink) == 2 else None)
        if sink:
            assert after.sink == sink  # sink pages never move
        full_pages = n // P
        if n % P == 0 and full_pages > 2 + 2:  # the new full page is one more than sink + ring
            (d,) = out.demotions
            assert d.src == before.ring[0]  # the oldest ring page, nothing else
            assert d.positions == range((full_pages - 3) * P, (full_pages - 2) * P)
            assert after.history == before.history + (d.dst,)
            assert after.ring == before.ring[1:]
            assert out.slots[0].kind is B  # the token that filled the tail stays in the ring
        else:
            assert out.demotions == ()
        assert len(after.history) == max(0, full_pages - 4)
        assert_slot_table_in_order(a, "r")
        a.check_invariants()


def test_recent_tokens_zero_keeps_only_the_partial_tail_bf16():
    a = make(sink=4, recent=0)
    a.allocate("r", 6)  # sink page + partial tail
    a.end_step()
    out = a.extend("r", 2)  # fills the tail: it is demoted in the same call
    (d,) = out.demotions
    assert d.positions == range(4, 6)  # only tokens written in earlier steps move
    assert [(s.kind, s.page, s.offset) for s in out.slots] == [(I, d.dst, 2), (I, d.dst, 3)]
    assert kinds(a, "r") == [B, I]
    a.check_invariants()


def test_sink_tokens_zero():
    a = make(sink=0, recent=8)
    a.allocate("r", 21)  # 5 full pages + tail: 3 history, 2 full ring + tail
    assert kinds(a, "r") == [I, I, I, B, B, B]
    assert a.segments("r").sink == ()
    assert_slot_table_in_order(a, "r")
    a.check_invariants()


def test_large_chunk_demotes_old_ring_and_writes_new_history_directly():
    a = make()
    a.allocate("r", 14)  # 2 sink + ring of 1 full + tail(2)
    a.end_step()
    ring = a.segments("r").ring
    out = a.extend("r", 30)  # 44 tokens: 11 full pages, 7 history
    assert [d.src for d in out.demotions] == list(ring)  # both old ring pages, oldest first
    assert out.demotions[1].positions == range(12, 14)
    assert kinds(a, "r") == [B, B] + [I] * 7 + [B, B]
    assert_slot_table_in_order(a, "r")
    a.check_invariants()


def test_fork_shares_pages_copies_partial_tail_and_refcounts_return():
    a = make()
    a.allocate("p", 30)
    a.end_step()
    out = a.fork("p", "c", 30)
    (copy,) = out.copies
    parent, child = a.segments("p"), a.segments("c")
    assert copy == PageCopy(B, parent.ring[-1], child.ring[-1], range(28, 30))
    assert child.sink == parent.sink and child.history == parent.history
    assert child.ring[:-1] == parent.ring[:-1] and child.ring[-1] != parent.ring[-1]
    pool = a._pools[B]
    assert all(pool.refcount(p) == 2 for p in parent.sink + parent.ring[:-1])
    assert all(a._pools[I].refcount(p) == 2 for p in parent.history)
    a.check_invariants()
    a.free("c")
    assert all(pool.refcount(p) == 1 for p in parent.sink)
    a.free("p")
    a.end_step()  # releases the copy's pins
    assert a.usage().int2.used == a.usage().bf16.used == 0
    a.check_invariants()


def test_fork_on_page_boundary_needs_no_copy_and_child_can_extend_at_once():
    a = make()
    a.allocate("p", 16)
    a.end_step()
    out = a.fork("p", "c", 12)
    assert out.copies == () and out.n_cached_tokens == 12
    a.extend("c", 1)  # no pending copy: the child may grow in the same step
    a.check_invariants()


def test_copy_on_demote_gives_each_owner_its_own_int2_page():
    a = make()
    a.allocate("p", 16)  # 2 sink + 2 full ring pages
    a.end_step()
    assert a.fork("p", "c", 16).copies == ()  # page-aligned: everything shared
    shared = a.segments("p").ring[0]
    (dc,) = a.extend("c", 4).demotions  # child: 5 full pages -> demotes the shared page
    assert dc.src == shared
    assert a._pools[B].refcount(shared) == 2  # the parent + the move's pin; child dropped it
    assert a.segments("p").ring[0] == shared  # the parent still reads the BF16 page
    (dp,) = a.extend("p", 4).demotions  # the parent demotes it too, same step
    assert dp.src == shared and dp.dst != dc.dst
    a.end_step()
    assert a._pools[B].refcount(shared) == 0  # both dropped it, pins released
    assert a.segments("c").history == (dc.dst,) and a.segments("p").history == (dp.dst,)
    a.check_invariants()


def test_fork_inside_parent_history_keeps_those_pages_int2():
    a = make()
    a.allocate("p", 40)  # 10 full pages: 6 history
    a.end_step()
    out = a.fork("p", "c", 22)  # page 5 (positions 20..23) is INT2 in the parent
    (copy,) = out.copies
    assert copy.kind is I and copy.positions == range(20, 22)
    assert kinds(a, "c") == [B, B, I, I, I, I]  # never promoted: history 4 > the 1 required
    a.end_step()
    a.extend("c", 10)  # new tokens fill the INT2 tail, then go to fresh ring pages
    assert kinds(a, "c") == [B, B, I, I, I, I, B, B]
    a.check_invariants()


def test_out_of_pages_leaves_state_unchanged():
    a = make(int2=3, bf16=6)
    a.allocate("r", 20)  # 2 sink + 1 history + 2 ring = 4 BF16, 1 INT2
    a.end_step()
    before = snapshot(a)
    assert not a.can_allocate(30)
    with pytest.raises(OutOfPages, match="bf16") as err:
        a.allocate("x", 30)
    assert err.value.kind is B and err.value.needed > err.value.free
    assert snapshot(a) == before
    assert not a.can_extend("r", 20)
    with pytest.raises(OutOfPages, match="num_int2_pages"):
        a.extend("r", 20)  # needs 5 more INT2 pages, 2 free
    assert snapshot(a) == before
    a.allocate("y", 8)  # takes the last 2 BF16 pages
    a.end_step()
    before = snapshot(a)
    with pytest.raises(OutOfPages):
        a.fork("r", "z", 18)  # partial page: needs a BF16 page
    assert snapshot(a) == before and "z" not in a
    a.check_invariants()


def test_abort_frees_at_once_and_free_and_abort_share_one_path():
    a = make()
    a.allocate("r", 50)
    a.end_step()
    assert a.abort("r") is True
    assert a.usage().int2.used == a.usage().bf16.used == 0  # no end_step needed
    assert a.abort("never-admitted") is False
    with pytest.raises(ValueError, match="request_id 'r' is not allocated"):
        a.free("r")
    a.check_invariants()


def test_step_contract_guards():
    a = make()
    a.allocate("r", 10)
    with pytest.raises(ValueError, match="end_step"):
        a.extend("r", 1)  # its prefill slots are not written yet
    with pytest.raises(ValueError, match="parent_id"):
        a.fork("r", "c", 4)
    with pytest.raises(ValueError, match="end_step"):
        a.insert_prefix("r", list(range(8)))
    a.end_step()
    a.extend("r", 1)
    a.check_invariants()


def test_demoted_page_is_not_reused_before_end_step():
    a = make(int2=8, bf16=5)
    a.allocate("r", 19)  # 5 BF16 pages: all of them
    a.end_step()
    (d,) = a.extend("r", 1).demotions  # 20 tokens: demotes a ring page, BF16 tail now full
    assert a._pools[B].n_free == 0  # src is pinned, not free
    assert not a.can_allocate(1)
    a.end_step()
    out = a.allocate("x", 1)
    assert out.slots[0].page == d.src  # reused after the step ended
    a.check_invariants()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda a: a.allocate("r", 0), "n_tokens"),
        (lambda a: a.allocate("a", 3), "already allocated"),
        (lambda a: a.allocate("r", 3, token_ids=[1, 2]), "token_ids"),
        (lambda a: a.extend("a", 0), "n_new_tokens"),
        (lambda a: a.extend("missing", 1), "request_id 'missing'"),
        (lambda a: a.fork("a", "c", 9), "n_prefix_tokens"),
        (lambda a: a.fork("a", "a", 2), "child_id"),
        (lambda a: a.insert_prefix("a", [0] * 9), "token_ids"),
        (lambda a: KVAllocator(a.geometry, -1, 4), "num_int2_pages"),
        (lambda a: KVAllocator("geometry", 1, 4), "geometry"),
    ],
)
def test_input_errors_name_the_parameter(call, match):
    a = make()
    a.allocate("a", 8)
    a.end_step()
    with pytest.raises(ValueError, match=match):
        call(a)


def test_usage_and_kv_stats():
    a = make(int2=10, bf16=20)
    a.allocate("r", 30)
    usage = a.usage()
    assert (usage.int2.used, usage.int2.total, usage.bf16.used) == (3, 10, 5)
    assert usage.bf16.fraction == 0.25
    stats = a.kv_stats()
    assert stats["int2_pages_used"] == 3 and stats["bf16_usage"] == 0.25 and stats["requests"] == 1
    assert stats["prefix_hit_rate"] == 0.0

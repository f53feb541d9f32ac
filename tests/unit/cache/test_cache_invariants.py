"""The invariant checker must fail on each kind of corruption (a checker that cannot fail proves
nothing about the fuzz test that relies on it)."""

import pytest

from oscar_ray.cache import InvariantError, KVAllocator, PageGeometry, PageKind

B, I = PageKind.BF16, PageKind.INT2


@pytest.fixture
def alloc():
    a = KVAllocator(PageGeometry(1, 1, 8, 4, sink_tokens=8, recent_tokens=8), 16, 16)
    a.allocate("r", 30)
    a.end_step()
    a.insert_prefix("r", list(range(30)))
    a.check_invariants()
    return a


def test_duplicate_on_free_list(alloc):
    alloc._pools[B]._free.append(alloc._pools[B]._free[0])
    with pytest.raises(InvariantError, match="duplicates"):
        alloc.check_invariants()


def test_refcount_differs_from_holders(alloc):
    page = alloc.segments("r").sink[0]
    alloc._pools[B]._refs[page] += 1  # a reference nobody holds: a leak
    with pytest.raises(InvariantError, match="refcount 3 != 2 holders"):
        alloc.check_invariants()


def test_held_page_on_free_list(alloc):
    page = alloc.segments("r").history[0]
    alloc._pools[I]._free.append(page)
    with pytest.raises(InvariantError, match="on free list"):
        alloc.check_invariants()


def test_page_twice_in_one_request(alloc):
    req = alloc._requests["r"]
    req.ring[0] = req.sink[0]
    with pytest.raises(InvariantError):
        alloc.check_invariants()


def test_ring_longer_than_the_recent_window(alloc):
    req = alloc._requests["r"]
    req.n_tokens += 2  # fills the tail without demoting: 3 full ring pages, history too short
    with pytest.raises(InvariantError, match="history pages < the 4"):
        alloc.check_invariants()


def test_page_count_differs_from_length(alloc):
    alloc._requests["r"].n_tokens += 5
    with pytest.raises(InvariantError, match="need 9 pages"):
        alloc.check_invariants()


def test_index_entry_and_held_map_disagree(alloc):
    key = next(iter(alloc.prefix._lru))
    alloc.prefix._held[(B, 99)] = key
    with pytest.raises(InvariantError):
        alloc.check_invariants()

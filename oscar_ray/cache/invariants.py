"""Whole-state consistency check of a KVAllocator, for tests and debug builds.

Raises InvariantError (an AssertionError, raised explicitly so `python -O` keeps the checks).
Cost is O(pages + cached blocks), so the fuzz test can run it after every step.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from oscar_ray.cache.records import PageKind

if TYPE_CHECKING:
    from oscar_ray.cache.allocator import KVAllocator


class InvariantError(AssertionError):
    """The allocator's bookkeeping is inconsistent (a bug, never a user error)."""


def _fail(message: str) -> None:
    raise InvariantError(message)


def _check_layout(allocator: KVAllocator, request_id, req) -> None:
    geom = allocator.geometry
    n, P = req.n_tokens, geom.page_size
    n_pages = geom.n_pages(n)
    if len(req.sink) + len(req.history) + len(req.ring) != n_pages:
        _fail(f"request {request_id!r}: {n} tokens need {n_pages} pages, it holds "
              f"{len(req.sink)} sink + {len(req.history)} history + {len(req.ring)} ring")
    if len(req.sink) != min(n_pages, geom.sink_pages):
        _fail(f"request {request_id!r}: {len(req.sink)} sink pages, expected "
              f"{min(n_pages, geom.sink_pages)}")
    if len(req.history) < geom.n_history_pages(n):
        _fail(f"request {request_id!r}: {len(req.history)} history pages < the "
              f"{geom.n_history_pages(n)} its {n} tokens need")
    ring_full = len(req.ring) - (1 if req.ring and n % P else 0)  # the partial tail is not full
    if ring_full > geom.recent_pages:
        _fail(f"request {request_id!r}: {ring_full} full ring pages > {geom.recent_pages}")


def check_invariants(allocator: KVAllocator) -> None:
    """Every page is free (refcount 0, on the free list once) or held, with refcount equal to
    its number of holders: requests + prefix index + pins. No request holds a page twice; every
    request's segment table obeys the layout rule; used + free == total per pool."""
    holders = {kind: Counter() for kind in PageKind}
    for request_id, req in allocator._requests.items():
        _check_layout(allocator, request_id, req)
        pages = req.pages()
        if len(set(pages)) != len(pages):
            dup = [ref for ref, k in Counter(pages).items() if k > 1]
            _fail(f"request {request_id!r} holds pages twice: {dup}")
        for kind, page in pages:
            holders[kind][page] += 1
    for kind, page in allocator.prefix.held_pages():
        holders[kind][page] += 1
    for kind, page in allocator._pins:
        holders[kind][page] += 1
    if not allocator._busy <= allocator._requests.keys():
        _fail(f"busy requests {allocator._busy - allocator._requests.keys()} are not allocated")

    for kind, pool in allocator._pools.items():
        free = pool.free_pages()
        free_set = set(free)
        if len(free_set) != len(free):
            _fail(f"{kind.value} free list has duplicates: {sorted(free)}")
        if not free_set <= set(range(pool.capacity)):
            _fail(f"{kind.value} free list has ids outside 0..{pool.capacity - 1}")
        stray = set(holders[kind]) - set(range(pool.capacity))
        if stray:
            _fail(f"{kind.value} pages {sorted(stray)} are held but outside the pool")
        used = 0
        for page in range(pool.capacity):
            refs, held = pool.refcount(page), holders[kind][page]
            if refs != held:
                _fail(f"{kind.value} page {page}: refcount {refs} != {held} holders")
            if (refs == 0) != (page in free_set):
                _fail(f"{kind.value} page {page}: refcount {refs} but on free list: "
                      f"{page in free_set}")
            used += refs > 0
        if used + len(free) != pool.capacity:
            _fail(f"{kind.value}: {used} used + {len(free)} free != {pool.capacity} total")
        if pool.n_used != used:
            _fail(f"{kind.value}: n_used {pool.n_used} != {used} pages with references")

    _check_index(allocator)


def _check_index(allocator: KVAllocator) -> None:
    index = allocator.prefix
    listed = Counter()
    for key, entry in index._lru.items():
        if not entry:
            _fail(f"prefix entry {key.hex()} is empty")
        for kind, page in entry.items():
            listed[(kind, page)] += 1
            if index._held.get((kind, page)) != key:
                _fail(f"prefix entry {key.hex()} lists {kind.value} page {page} held elsewhere")
    if set(listed) != set(index._held) or any(k > 1 for k in listed.values()):
        _fail("prefix index: entries and held pages disagree")

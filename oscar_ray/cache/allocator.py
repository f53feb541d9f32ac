"""Paged mixed-precision KV allocator: two page pools, per-request segment tables, refcounts.

Page layout per request (sink BF16 | history INT2 | recent ring BF16): see request.py.

Step contract. Calls return slots to write and data moves (`Demotion`, `PageCopy`). Per engine
step: (1) allocator calls, (2) all moves of the step, in any order (one launch per kind),
(3) the forward writes the slots, (4) `end_step()`. Two rules make (2) order-free:
- moves read only data written in earlier steps: a request takes part in at most one allocate /
  extend / fork-as-child per step; `fork` and `insert_prefix` refuse a request with unwritten
  slots (ValueError naming it);
- each page named by a move keeps one extra reference (a pin) until `end_step`, so a page released
  this step (demotion source, aborted request, evicted cache page) is not handed out again before
  the move that reads or writes it ran.

Shared prefixes (`fork`, prefix-cache hits):
- sink, INT2 history and full ring pages are shared by refcount: full pages are never written again;
- the partly filled page ending a forked prefix is never shared: the child gets its own page and a
  `PageCopy`, because parent and child both keep writing into its free offsets;
- demoting a shared BF16 ring page is copy-on-demote: the demoting request gets a private INT2 page
  and drops its reference, the other owners keep the BF16 page until they demote it themselves
  (one INT2 page each, 7x smaller than the BF16 page at head_dim 128);
- INT2 is never promoted back: a child forked where the parent already demoted keeps those pages
  INT2 (a history longer than the minimum); a prefix-cache hit stops where it would need BF16 but
  only INT2 is cached (prefix.py), so a cache hit never changes a request's precision.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Iterator, Sequence

from oscar_ray.cache.geometry import PageGeometry
from oscar_ray.cache.invariants import check_invariants
from oscar_ray.cache.pool import PagePool
from oscar_ray.cache.prefix import PrefixIndex, PrefixMatch
from oscar_ray.cache.records import (
    Allocation, Demotion, OutOfPages, PageCopy, PageKind, PageRef, PoolUsage, Segments, Slot, Usage,
)
from oscar_ray.cache.request import RequestPages, plan_admission, plan_growth

BF16, INT2 = PageKind.BF16, PageKind.INT2
_NO_MATCH = PrefixMatch(n_tokens=0, pages=())


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class KVAllocator:
    """Two fixed page pools (INT2, BF16) shared by requests and a prefix index, with refcounts.

    Mutating calls (allocate, extend, fork, free, abort, end_step, insert_prefix,
    clear_prefix_cache) check capacity first and raise `OutOfPages` before changing anything;
    cached pages nobody else references are evicted (LRU) only when a free list is short. Page ids
    are pool-local (INT2 page 3 is not BF16 page 3). Refcount = holders: requests, index, pins.
    """

    def __init__(self, geometry: PageGeometry, num_int2_pages: int, num_bf16_pages: int) -> None:
        if not isinstance(geometry, PageGeometry):
            raise ValueError(f"geometry must be a PageGeometry, got {type(geometry).__name__}")
        self.geometry = geometry
        self._pools = {
            INT2: PagePool(INT2, _count("num_int2_pages", num_int2_pages, 0)),
            BF16: PagePool(BF16, _count("num_bf16_pages", num_bf16_pages, 0)),
        }
        self.prefix = PrefixIndex(geometry, self._pools)
        self._requests: dict[Hashable, RequestPages] = {}
        self._busy: set[Hashable] = set()  # requests with slots or moves pending this step
        self._pins: list[PageRef] = []  # pages named by this step's moves

    # --- queries -------------------------------------------------------------------------------
    def __contains__(self, request_id: Hashable) -> bool:
        return request_id in self._requests

    def n_tokens(self, request_id: Hashable) -> int:
        return self._get(request_id).n_tokens

    def segments(self, request_id: Hashable) -> Segments:
        req = self._get(request_id)
        return Segments(tuple(req.sink), tuple(req.history), tuple(req.ring))

    def slot_table(self, request_id: Hashable) -> list[Slot]:
        """(kind, page, offset) of every position 0 .. n_tokens - 1 of the request."""
        req = self._get(request_id)
        return list(req.slots(self.geometry.page_size, 0, req.n_tokens))

    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        """What `allocate(..., token_ids)` would reuse now; changes nothing (no LRU, no stats)."""
        return self.prefix.match_prefix(token_ids)

    def usage(self) -> Usage:
        """Pages used / cached (held only by the prefix index) / total, per pool."""
        cached = self.prefix.count_evictable
        pools = {k: PoolUsage(k, p.n_used, cached(k), p.capacity) for k, p in self._pools.items()}
        return Usage(int2=pools[INT2], bf16=pools[BF16])

    def kv_stats(self) -> dict[str, float]:
        """Flat metrics for the serving layer's kv_stats endpoint."""
        stats: dict[str, float] = {"requests": len(self._requests), "pinned_pages": len(self._pins)}
        usage = self.usage()
        for pool in (usage.int2, usage.bf16):
            k = pool.kind.value
            stats |= {f"{k}_pages_used": pool.used, f"{k}_pages_cached": pool.cached,
                      f"{k}_pages_total": pool.total, f"{k}_usage": pool.fraction}
        p = self.prefix.stats()
        stats |= {"prefix_lookups": p.lookups, "prefix_tokens_looked_up": p.tokens_looked_up,
                  "prefix_tokens_matched": p.tokens_matched, "prefix_hit_rate": p.hit_rate}
        return stats

    def check_invariants(self) -> None:
        """Raise InvariantError if the bookkeeping is inconsistent (see invariants.py)."""
        check_invariants(self)

    # --- admission and growth ------------------------------------------------------------------
    def can_allocate(self, n_tokens: int, token_ids: Sequence[int] | None = None) -> bool:
        match, _, need = self._plan_allocate(n_tokens, token_ids)
        return self._shortfall(need, set(match.pages)) is None

    def allocate(
        self, request_id: Hashable, n_tokens: int, token_ids: Sequence[int] | None = None
    ) -> Allocation:
        """Admit a request of `n_tokens` (its prompt); with `token_ids`, reuse cached prefix pages.

        Returns slots for positions n_cached_tokens .. n_tokens - 1, already in their final kind.
        """
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already allocated; free it first")
        match, kinds, need = self._plan_allocate(n_tokens, token_ids)
        self._check(need, set(match.pages))
        for (kind, page), want in zip(match.pages, kinds):  # before eviction, which then skips them
            if kind is want:
                self._pools[kind].ref(page)
            else:
                self._pin(kind, page)  # cached BF16 where this request needs INT2: demotion source
        fresh = self._take(need)
        req, demotions, P = RequestPages(n_tokens), [], self.geometry.page_size
        for j, want in enumerate(kinds):
            cached = match.pages[j] if j < len(match.pages) else None
            if cached is not None and cached[0] is want:
                page = cached[1]
            else:
                page = next(fresh[want])
                if cached is not None:
                    self._pin(INT2, page)
                    demotions.append(Demotion(cached[1], page, range(j * P, (j + 1) * P)))
            req.add(j, want, page, self.geometry.sink_pages)
        self._requests[request_id] = req
        self._busy.add(request_id)
        if token_ids is not None:
            self.prefix.record(match, len(token_ids))
        slots = req.slots(P, match.n_tokens, n_tokens)
        return Allocation(request_id, slots, tuple(demotions), (), match.n_tokens)

    def can_extend(self, request_id: Hashable, n_new_tokens: int) -> bool:
        n_new = _count("n_new_tokens", n_new_tokens, 1)
        plan = plan_growth(self.geometry, self._get(request_id), n_new)
        return self._shortfall(plan.need, ()) is None

    def extend(self, request_id: Hashable, n_new_tokens: int) -> Allocation:
        """Append `n_new_tokens` positions; demote the ring pages the ring no longer holds."""
        req = self._get(request_id, ready=True)
        plan = plan_growth(self.geometry, req, _count("n_new_tokens", n_new_tokens, 1))
        self._check(plan.need, ())
        fresh = self._take(plan.need)
        geom, n_old, demotions = self.geometry, req.n_tokens, []
        for _ in range(plan.n_demote):
            dst = next(fresh[INT2])
            j, src = req.demote_oldest(dst)
            self._pin(BF16, src)
            self._pin(INT2, dst)
            self._pools[BF16].unref(src)  # copy-on-demote: other owners of src keep their reference
            positions = range(j * geom.page_size, min((j + 1) * geom.page_size, n_old))
            demotions.append(Demotion(src, dst, positions))
        for j, kind in enumerate(plan.new_kinds, start=geom.n_pages(n_old)):
            req.add(j, kind, next(fresh[kind]), geom.sink_pages)
        req.n_tokens += n_new_tokens
        self._busy.add(request_id)
        slots = req.slots(geom.page_size, n_old, req.n_tokens)
        return Allocation(request_id, slots, tuple(demotions), (), n_old)

    def fork(self, parent_id: Hashable, child_id: Hashable, n_prefix_tokens: int) -> Allocation:
        """New request `child_id` sharing the parent's first `n_prefix_tokens` positions."""
        parent = self._get(parent_id, "parent_id", ready=True)
        if child_id in self._requests:
            raise ValueError(f"child_id {child_id!r} is already allocated; pick a new id")
        if _count("n_prefix_tokens", n_prefix_tokens, 1) > parent.n_tokens:
            raise ValueError(f"n_prefix_tokens={n_prefix_tokens} > parent length {parent.n_tokens}")
        P, sink_pages = self.geometry.page_size, self.geometry.sink_pages
        n_full, n_rest = divmod(n_prefix_tokens, P)
        tail = parent.page(n_full) if n_rest else None
        need = Counter({tail[0]: 1}) if tail else Counter()
        self._check(need, ())
        fresh = self._take(need)
        child = RequestPages(n_prefix_tokens)
        for j in range(n_full):
            kind, page = parent.page(j)
            self._pools[kind].ref(page)
            child.add(j, kind, page, sink_pages)
        copies = ()
        if tail is not None:
            kind, src = tail
            dst = next(fresh[kind])
            self._pin(kind, src)
            self._pin(kind, dst)
            child.add(n_full, kind, dst, sink_pages)
            copies = (PageCopy(kind, src, dst, range(n_full * P, n_prefix_tokens)),)
            self._busy.add(child_id)
        self._requests[child_id] = child
        return Allocation(child_id, (), (), copies, n_prefix_tokens)

    # --- release -------------------------------------------------------------------------------
    def free(self, request_id: Hashable) -> None:
        """Release a finished request's pages now (shared pages stay with their other holders)."""
        self._get(request_id)
        self._release(request_id)

    def abort(self, request_id: Hashable) -> bool:
        """Same path as `free`, but an id never admitted is fine (returns False)."""
        if request_id not in self._requests:
            return False
        self._release(request_id)
        return True

    def _release(self, request_id: Hashable) -> None:
        req = self._requests.pop(request_id)
        self._busy.discard(request_id)
        for kind, page in req.pages():
            self._pools[kind].unref(page)

    def end_step(self) -> None:
        """The step's moves and writes are issued: unpin their pages, allow the next calls."""
        for kind, page in self._pins:
            self._pools[kind].unref(page)
        self._pins.clear()
        self._busy.clear()

    # --- prefix cache --------------------------------------------------------------------------
    def insert_prefix(self, request_id: Hashable, token_ids: Sequence[int]) -> int:
        """Cache the request's full pages under the chained hashes of `token_ids` (its first
        len(token_ids) tokens); returns the number of pages newly cached."""
        req = self._get(request_id, ready=True)
        if len(token_ids) > req.n_tokens:
            raise ValueError(f"token_ids has {len(token_ids)} ids, the request only {req.n_tokens}")
        n_blocks = len(token_ids) // self.geometry.page_size
        return self.prefix.insert(token_ids, [req.page(j) for j in range(n_blocks)])

    def clear_prefix_cache(self) -> int:
        """Drop every cached page; returns how many (pages requests still use stay allocated)."""
        return self.prefix.clear()

    # --- internals -----------------------------------------------------------------------------
    def _get(self, request_id: Hashable, name: str = "request_id", ready: bool = False):
        if request_id not in self._requests:
            raise ValueError(f"{name} {request_id!r} is not allocated")
        if ready and request_id in self._busy:
            raise ValueError(
                f"{name} {request_id!r} has unwritten slots or moves this step;"
                " call end_step() after the forward that writes them"
            )
        return self._requests[request_id]

    def _plan_allocate(self, n_tokens, token_ids) -> tuple[PrefixMatch, list[PageKind], Counter]:
        _count("n_tokens", n_tokens, 1)
        match = _NO_MATCH
        if token_ids is not None:
            if len(token_ids) != n_tokens:
                raise ValueError(f"token_ids has {len(token_ids)} ids but n_tokens={n_tokens}")
            match = self.prefix.match_prefix(token_ids)
        kinds, need = plan_admission(self.geometry, n_tokens, match.pages)
        return match, kinds, need

    def _shortfall(self, need: Counter, keep: Collection[PageRef]):
        for kind, n in need.items():
            free = self._pools[kind].n_free
            if n > free:
                evictable = self.prefix.count_evictable(kind, keep)
                if n > free + evictable:
                    return kind, n, free, evictable
        return None

    def _check(self, need: Counter, keep: Collection[PageRef]) -> None:
        if (short := self._shortfall(need, keep)) is not None:
            raise OutOfPages(*short)

    def _take(self, need: Counter) -> dict[PageKind, Iterator[int]]:
        fresh = {}
        for kind, n in need.items():
            pool = self._pools[kind]
            if n > pool.n_free:
                self.prefix.evict(kind, n - pool.n_free)
                assert n <= pool.n_free, "capacity check and eviction disagree"
            fresh[kind] = iter(pool.alloc(n))
        return fresh

    def _pin(self, kind: PageKind, page: int) -> None:
        self._pools[kind].ref(page)
        self._pins.append((kind, page))

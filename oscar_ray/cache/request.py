"""One request's segment table and the pure planning of how it grows.

A request of n tokens owns one page per page_size (P) positions, page j holding [j*P, (j+1)*P):
    sink     pages j < sink_pages, BF16, never demoted
    history  the next h pages, INT2, h >= n // P - recent_pages - sink_pages
    ring     the remaining pages, BF16: at most recent_pages full pages plus the partly filled tail
Growth that would leave more than recent_pages full pages in the ring demotes the oldest ones.
Positions that are history from the start (a long prefill or chunk) get INT2 slots directly, so
nothing is written twice. Planning here only counts; the allocator mutates after the check.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from oscar_ray.cache.geometry import PageGeometry
from oscar_ray.cache.records import PageKind, PageRef, Slot

BF16, INT2 = PageKind.BF16, PageKind.INT2


@dataclass(slots=True)
class RequestPages:
    """Segment table of one request. Mutated only by the allocator, appending in position order
    (`add`) and moving the oldest ring page to history (`demote_oldest`)."""

    n_tokens: int
    sink: list[int] = field(default_factory=list)
    history: list[int] = field(default_factory=list)
    ring: deque[int] = field(default_factory=deque)

    def page(self, j: int) -> PageRef:
        if j < len(self.sink):
            return BF16, self.sink[j]
        j -= len(self.sink)
        if j < len(self.history):
            return INT2, self.history[j]
        return BF16, self.ring[j - len(self.history)]  # deque: O(1) near either end

    def pages(self) -> list[PageRef]:
        sink = [(BF16, p) for p in self.sink]
        return sink + [(INT2, p) for p in self.history] + [(BF16, p) for p in self.ring]

    def add(self, j: int, kind: PageKind, page: int, sink_pages: int) -> None:
        if j < sink_pages:
            self.sink.append(page)
        elif kind is INT2:
            self.history.append(page)
        else:
            self.ring.append(page)

    def demote_oldest(self, dst: int) -> tuple[int, int]:
        """Replace the oldest ring page by INT2 page `dst`; returns (page index, BF16 page id)."""
        j = len(self.sink) + len(self.history)
        self.history.append(dst)
        return j, self.ring.popleft()

    def slots(self, page_size: int, start: int, stop: int) -> tuple[Slot, ...]:
        first = start // page_size
        pages = [self.page(j) for j in range(first, -(-stop // page_size))]
        return tuple(
            Slot(*pages[pos // page_size - first], pos % page_size) for pos in range(start, stop)
        )


@dataclass(frozen=True, slots=True)
class GrowthPlan:
    """`n_demote` oldest ring pages become INT2, then pages of `new_kinds` are appended;
    `need` counts the fresh pages per kind."""

    n_demote: int
    new_kinds: tuple[PageKind, ...]
    need: Counter


def plan_growth(geometry: PageGeometry, req: RequestPages, n_new_tokens: int) -> GrowthPlan:
    n_after = req.n_tokens + n_new_tokens
    # History never shrinks (INT2 is not promoted back), so a forked child keeps a longer one.
    h_after = max(len(req.history), geometry.n_history_pages(n_after))
    n_demote = min(len(req.ring), h_after - len(req.history))
    first, last = geometry.n_pages(req.n_tokens), geometry.n_pages(n_after)
    new_kinds = tuple(geometry.page_kind(j, h_after) for j in range(first, last))
    need = Counter(new_kinds)
    need[INT2] += n_demote
    return GrowthPlan(n_demote, new_kinds, need)


def plan_admission(geometry: PageGeometry, n_tokens: int, cached: tuple[PageRef, ...]):
    """Kinds of a new request's pages (as if it computed everything itself) and the fresh pages
    it needs given the `cached` prefix pages; a cached BF16 page where it needs INT2 costs one
    fresh INT2 page (copy-on-demote)."""
    kinds = geometry.layout(n_tokens)
    reused = sum(1 for (kind, _), want in zip(cached, kinds) if kind is want)
    need = Counter(kinds[len(cached) :])
    need[INT2] += len(cached) - reused
    return kinds, need

"""Plain records handed across the cache API: page kinds, slots, data-move records, usage.

All records are frozen (immutable) and slotted: the allocator creates many of them per step and an
engine may keep them in a queue until the matching kernel launch, so they must not change under it.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass


class PageKind(str, enum.Enum):
    """Which pool a page lives in. The str value is used in messages and `kv_stats` keys."""

    INT2 = "int2"  # packed 2-bit codes + per-group scale/zero (history tokens)
    BF16 = "bf16"  # full precision (sink tokens and the recent ring)


PageRef = tuple[PageKind, int]  # (pool, page id): page ids are pool-local


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one token position lives: pool `kind`, page id `page`, token `offset` in the page."""

    kind: PageKind
    page: int
    offset: int


@dataclass(frozen=True, slots=True)
class Demotion:
    """Move the tokens `positions` from BF16 page `src` to INT2 page `dst` (quantize on the way).

    Offsets inside both pages are `position % page_size`; `positions` always starts on a page
    boundary, so the offsets are `0 .. len(positions) - 1`. `src` holds only tokens written in an
    earlier step (the new tokens of the call that demoted it get INT2 slots directly).
    """

    src: int
    dst: int
    positions: range


@dataclass(frozen=True, slots=True)
class PageCopy:
    """Copy the tokens `positions` from page `src` to page `dst`, both of `kind` (no conversion).

    Issued by `fork` for a partially filled page: it cannot be shared because both owners keep
    writing into its free offsets.
    """

    kind: PageKind
    src: int
    dst: int
    positions: range


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one `allocate` / `extend` / `fork` call asks the engine to do for `request_id`.

    `slots`: one per position the engine must compute and write, in position order (positions
    `n_cached_tokens .. n_tokens - 1` of this call). `demotions` and `copies`: data moves to run
    before those writes (see the step contract in the package docstring). `n_cached_tokens`: how
    many leading positions already hold valid KV (prefix-cache hit, fork prefix, or earlier steps).
    """

    request_id: Hashable
    slots: tuple[Slot, ...]
    demotions: tuple[Demotion, ...]
    copies: tuple[PageCopy, ...]
    n_cached_tokens: int


@dataclass(frozen=True, slots=True)
class Segments:
    """A request's segment table, page ids in position order.

    `sink`: BF16 pages of the first `sink_tokens`; `history`: INT2 pages; `ring`: BF16 pages of
    the recent window, oldest first, the last one possibly partially filled.
    """

    sink: tuple[int, ...]
    history: tuple[int, ...]
    ring: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PoolUsage:
    """One pool's occupancy. `used` includes `cached` (held only by the prefix index, evictable)."""

    kind: PageKind
    used: int
    cached: int
    total: int

    @property
    def fraction(self) -> float:
        return self.used / self.total if self.total else 0.0


@dataclass(frozen=True, slots=True)
class Usage:
    """Occupancy of both pools."""

    int2: PoolUsage
    bf16: PoolUsage


class OutOfPages(RuntimeError):
    """A pool cannot supply the pages a call needs, even after evicting unreferenced cached pages.

    Raised before anything is mutated: the allocator and the prefix index are unchanged.
    """

    def __init__(self, kind: PageKind, needed: int, free: int, evictable: int) -> None:
        self.kind = kind
        self.needed = needed
        self.free = free
        self.evictable = evictable
        super().__init__(
            f"out of {kind.value} pages: need {needed}, have {free} free + {evictable} evictable;"
            f" finish or abort requests, or raise num_{kind.value}_pages"
        )

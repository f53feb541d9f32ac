"""Prefix index: chained hashes of page_size-token blocks -> cached pages, with LRU eviction.

Block j's key hashes block j's token ids together with block j-1's key (as nano-vllm's
BlockManager.compute_hash does), so a key names the whole prefix up to the end of block j. The
hash is BLAKE2b over little-endian int64 token ids: deterministic across processes and machines,
unlike Python's salted `hash()`. 128-bit keys: a collision among 2**32 cached blocks has odds of
about 2**-64.

One key can hold one BF16 and one INT2 page with the same content: a block cached while it was in
a request's recent ring is BF16, the same block cached from a longer request is INT2.

Cache hits never change precision. `match_prefix` gives a request exactly the page kinds it would
have had computing everything itself (`PageGeometry.layout`): where it needs INT2 and only BF16 is
cached it takes the BF16 page and the allocator demotes a private copy (copy-on-demote); where it
needs BF16 and only INT2 is cached the match stops there, since INT2 cannot be promoted back.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from oscar_ray.cache.geometry import PageGeometry
from oscar_ray.cache.pool import PagePool
from oscar_ray.cache.records import PageKind, PageRef


def block_hashes(
    token_ids: Sequence[int], page_size: int, n_blocks: int | None = None
) -> Iterator[bytes]:
    """Yield the chained key of each full block of `token_ids` (lazily: a miss stops the caller
    before the rest of a 128K-token prompt is hashed)."""
    full = len(token_ids) // page_size
    n_blocks = full if n_blocks is None else min(n_blocks, full)
    packer = struct.Struct(f"<{page_size}q")
    previous = b""
    for j in range(n_blocks):
        try:
            block = packer.pack(*token_ids[j * page_size : (j + 1) * page_size])
        except struct.error as exc:
            raise ValueError(f"token_ids must be ints in the int64 range ({exc})") from None
        previous = hashlib.blake2b(previous + block, digest_size=16).digest()
        yield previous


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """`n_tokens` leading tokens are cached in `pages` (one per block, position order) under
    `keys` (the blocks' chained hashes). A BF16 page at a position where the request needs INT2
    is not reused as is: it is the source of the request's own demotion."""

    n_tokens: int
    pages: tuple[PageRef, ...]
    keys: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class PrefixStats:
    """Lookups counted by admissions (`record`), not by read-only `match_prefix` peeks."""

    lookups: int
    tokens_looked_up: int
    tokens_matched: int
    cached_pages: int

    @property
    def hit_rate(self) -> float:
        return self.tokens_matched / self.tokens_looked_up if self.tokens_looked_up else 0.0


class PrefixIndex:
    """Maps block-hash chains to cached pages; holds one reference per cached page.

    Mutates the pools' refcounts in `insert` (+1), `evict` and `clear` (-1). A page is cached
    under at most one key. Entries are kept in LRU order; `evict` drops only pages nobody else
    references, oldest first.
    """

    def __init__(self, geometry: PageGeometry, pools: Mapping[PageKind, PagePool]) -> None:
        self.geometry = geometry
        self._pools = pools
        self._lru: OrderedDict[bytes, dict[PageKind, int]] = OrderedDict()  # oldest first
        self._held: dict[PageRef, bytes] = {}  # cached page -> its key
        self._lookups = self._tokens_looked_up = self._tokens_matched = 0

    def __len__(self) -> int:
        return len(self._held)

    def held_pages(self) -> Iterator[PageRef]:
        return iter(self._held)

    def _touch(self, keys: list[bytes]) -> None:
        # Deepest block first, root last: the root becomes the most recent, so eviction takes
        # leaves before the blocks their keys chain from (an orphaned leaf could never match).
        for key in reversed(keys):
            if key in self._lru:  # a key whose pages were all evicted since the match is gone
                self._lru.move_to_end(key)

    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        """Longest cached prefix usable by a request whose prompt is `token_ids`; read-only.

        At most len(token_ids) - 1 tokens match, so at least one token is computed to give the
        next-token logits.
        """
        geom = self.geometry
        n_history = geom.n_history_pages(len(token_ids))
        max_blocks = max(0, len(token_ids) - 1) // geom.page_size
        keys: list[bytes] = []
        pages: list[PageRef] = []
        for j, key in enumerate(block_hashes(token_ids, geom.page_size, max_blocks)):
            entry = self._lru.get(key)
            if entry is None:
                break
            want = geom.page_kind(j, n_history)
            page = entry.get(want)
            if page is None and want is PageKind.INT2 and PageKind.BF16 in entry:
                want, page = PageKind.BF16, entry[PageKind.BF16]  # the allocator demotes a copy
            if page is None:
                break  # needs BF16, only INT2 cached: recompute rather than lose precision
            keys.append(key)
            pages.append((want, page))
        return PrefixMatch(len(pages) * geom.page_size, tuple(pages), tuple(keys))

    def record(self, match: PrefixMatch, n_tokens_looked_up: int) -> None:
        """An admission used `match`: refresh its blocks in LRU order and count the lookup."""
        self._touch(list(match.keys))
        self._lookups += 1
        self._tokens_looked_up += n_tokens_looked_up
        self._tokens_matched += match.n_tokens

    def insert(self, token_ids: Sequence[int], pages: Sequence[PageRef]) -> int:
        """Cache `pages[j]` under block j's key for every full block; returns pages newly cached.

        A block whose key already holds a page of that kind keeps the old page (same content).
        """
        keys: list[bytes] = []
        added = 0
        for key, (kind, page) in zip(block_hashes(token_ids, self.geometry.page_size), pages):
            keys.append(key)
            entry = self._lru.get(key)
            if (entry is not None and kind in entry) or (kind, page) in self._held:
                continue
            if entry is None:
                entry = self._lru[key] = {}
            self._pools[kind].ref(page)
            entry[kind] = page
            self._held[(kind, page)] = key
            added += 1
        self._touch([key for key in keys if key in self._lru])
        return added

    def _evictable(self, kind: PageKind, keep: Collection[PageRef]) -> Iterator[tuple[bytes, int]]:
        pool = self._pools[kind]
        for key, entry in self._lru.items():
            page = entry.get(kind)
            if page is not None and pool.refcount(page) == 1 and (kind, page) not in keep:
                yield key, page

    def count_evictable(self, kind: PageKind, keep: Collection[PageRef] = ()) -> int:
        """Cached pages of `kind` only the index references, not counting those in `keep`."""
        return sum(1 for _ in self._evictable(kind, keep))

    def evict(self, kind: PageKind, n: int) -> int:
        """Free up to `n` unreferenced cached pages of `kind`, least recently used first."""
        victims = []
        for victim in self._evictable(kind, ()):
            if len(victims) == n:
                break
            victims.append(victim)
        for key, page in victims:
            self._drop(key, kind, page)
        return len(victims)

    def _drop(self, key: bytes, kind: PageKind, page: int) -> None:
        entry = self._lru[key]
        del entry[kind]
        del self._held[(kind, page)]
        if not entry:
            del self._lru[key]
        self._pools[kind].unref(page)  # a page other holders reference stays allocated

    def clear(self) -> int:
        """Drop every cached page (referenced ones stay allocated to their requests)."""
        n = len(self._held)
        for (kind, page), key in list(self._held.items()):
            self._drop(key, kind, page)
        return n

    def stats(self) -> PrefixStats:
        return PrefixStats(
            self._lookups, self._tokens_looked_up, self._tokens_matched, len(self._held)
        )

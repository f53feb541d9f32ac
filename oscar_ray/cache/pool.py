"""A fixed-size pool of page ids of one kind, with reference counts."""

from __future__ import annotations

from dataclasses import dataclass, field

from oscar_ray.cache.records import PageKind


@dataclass(slots=True)
class PagePool:
    """Page ids `0 .. capacity - 1` of one `kind`; a page is free iff its refcount is 0.

    Holders (requests, the prefix index, in-flight data moves) each own one reference. Mutated by
    `alloc`, `ref` and `unref` only; callers check `n_free` first, so running out here is a bug
    (assert), not an input error.
    """

    kind: PageKind
    capacity: int
    _free: list[int] = field(init=False, repr=False)
    _refs: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # A stack popped from the end: page 0 goes out first and a just-freed page is reused
        # first (its memory is the most likely to still sit in L2 on the device).
        self._free = list(range(self.capacity - 1, -1, -1))
        self._refs = [0] * self.capacity

    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def n_used(self) -> int:
        return self.capacity - len(self._free)

    def alloc(self, n: int) -> list[int]:
        """Take `n` free pages, each with refcount 1."""
        assert 0 <= n <= len(self._free), f"{self.kind.value}: alloc {n} of {len(self._free)} free"
        pages = [self._free.pop() for _ in range(n)]
        for page in pages:
            self._refs[page] = 1
        return pages

    def ref(self, page: int) -> None:
        assert self._refs[page] > 0, f"{self.kind.value} page {page}: ref on a free page"
        self._refs[page] += 1

    def unref(self, page: int) -> bool:
        """Drop one reference; returns True when that freed the page."""
        assert self._refs[page] > 0, f"{self.kind.value} page {page}: unref on a free page"
        self._refs[page] -= 1
        if self._refs[page]:
            return False
        self._free.append(page)
        return True

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def free_pages(self) -> tuple[int, ...]:
        return tuple(self._free)

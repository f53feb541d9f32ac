"""Engine-agnostic paged mixed-precision KV cache bookkeeping (standard library only).

Pages of `page_size` tokens live in two pools: BF16 (the first `sink_tokens` and the recent ring
of the last `recent_tokens` plus the partial tail page) and INT2 (the history in between). The
allocator hands out slots and data-move records (demotions, copies); a kernel does the moves. No
tensor is touched here, so this package imports nothing outside the standard library.
"""

from oscar_ray.cache.allocator import KVAllocator
from oscar_ray.cache.geometry import (
    REFERENCE_MODELS, Cost, Fit, PageGeometry, format_capacity_table, reference_geometries,
)
from oscar_ray.cache.invariants import InvariantError, check_invariants
from oscar_ray.cache.prefix import PrefixIndex, PrefixMatch, PrefixStats, block_hashes
from oscar_ray.cache.records import (
    Allocation, Demotion, OutOfPages, PageCopy, PageKind, PoolUsage, Segments, Slot, Usage,
)

__all__ = [
    "REFERENCE_MODELS",
    "Allocation",
    "Cost",
    "Demotion",
    "Fit",
    "InvariantError",
    "KVAllocator",
    "OutOfPages",
    "PageCopy",
    "PageGeometry",
    "PageKind",
    "PoolUsage",
    "PrefixIndex",
    "PrefixMatch",
    "PrefixStats",
    "Segments",
    "Slot",
    "Usage",
    "block_hashes",
    "check_invariants",
    "format_capacity_table",
    "reference_geometries",
]

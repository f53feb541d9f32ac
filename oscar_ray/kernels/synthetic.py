"""Random mixed INT2 / BF16 caches for kernel tests and benchmarks (any device, shuffled pages)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .layout import PagedKV, Segments, head_major

UNUSED_PAGE = 2**30  # padding entries of a page table: far out of range, so a kernel that reads one faults


def _table(lens: Sequence[int], page_size: int, n_pages: int, device, gen) -> torch.Tensor:
    """Page ids for each request, drawn without replacement from a shuffled pool of n_pages."""
    need = [-(-n // page_size) for n in lens]
    order = torch.randperm(n_pages, generator=gen)
    table = torch.full((len(lens), max(need, default=0)), UNUSED_PAGE, dtype=torch.int32)
    used = 0
    for b, k in enumerate(need):
        table[b, :k] = order[used : used + k].to(torch.int32)
        used += k
    return table.to(device)


def random_scales(shape: tuple[int, ...], n_groups: int, dtype: torch.dtype, device, gen=None) -> torch.Tensor:
    """Interleaved (s, z) [..., 2·G]: s ∈ [0.02, 0.3], z ∈ [0, 3], as min–max quantisation produces."""
    s = torch.rand(*shape, n_groups, generator=gen) * 0.28 + 0.02
    z = torch.rand(*shape, n_groups, generator=gen) * 3
    return torch.stack([s, z], dim=-1).flatten(-2).to(device=device, dtype=dtype)


def random_mixed_cache(int2_lens: Sequence[int], bf16_lens: Sequence[int], n_kv_heads: int, head_dim: int, *,
                       int2_page_size: int = 8, bf16_page_size: int = 8, group_size: int | None = None,
                       scale_dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                       spare_pages: int = 3, seed: int | None = None, key_bits: int = 2,
                       head_major_scales: bool = False, head_major_codes: bool = False) -> tuple[PagedKV, Segments]:
    """A PagedKV + Segments holding random codes, scales and bf16 rows for requests of the given lengths.

    Pages are shuffled across requests and `spare_pages` extra pages per tier stay unused, so a kernel
    that mixes up page ids or reads past a request's tokens produces a wrong answer.
    head_major_scales: the (s, z) tensors keep their logical [page, token, kv_head, 2·G] shape but are
    stored head-major ([page, kv_head, token, 2·G] in memory), so one KV head's pairs of a page are
    adjacent (the kernels read them through strides).
    head_major_codes: the same for the INT2 code rows: one KV head's rows of a page are one contiguous
    page·d/4-byte run (256 B at page 8, d 128) instead of d/4-byte rows n_kv_heads·d/4 bytes apart.
    Example: kv, seg = random_mixed_cache([100, 0], [320, 5], n_kv_heads=2, head_dim=64)
    """
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    n_groups = 1 if group_size is None else head_dim // group_size
    n2 = sum(-(-n // int2_page_size) for n in int2_lens) + spare_pages
    n16 = sum(-(-n // bf16_page_size) for n in bf16_lens) + spare_pages
    code_shape = (n2, int2_page_size, n_kv_heads, head_dim // 4)
    bf16_shape = (n16, bf16_page_size, n_kv_heads, head_dim)

    def stored(x, on):  # same logical shape and values, stored [page, kv_head, token, ...] when on
        return head_major(x) if on else x

    def codes(bits=2):
        shape = code_shape[:3] + (head_dim * bits // 8,)  # 3-bit keys: one more d/8-byte bit plane
        if torch.device(device).type == "cuda":  # GB-sized caches: draw on the device
            return stored(torch.randint(0, 256, shape, dtype=torch.uint8, device=device), head_major_codes)
        return stored(torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen), head_major_codes)

    def rows():
        if torch.device(device).type == "cuda":
            return (torch.randn(bf16_shape, device=device) * 0.5).to(torch.bfloat16)
        return (torch.randn(bf16_shape, generator=gen) * 0.5).to(torch.bfloat16)

    def scales():
        return stored(random_scales(code_shape[:3], n_groups, scale_dtype, device, gen), head_major_scales)

    kv = PagedKV(codes(key_bits).to(device), scales(), codes().to(device), scales(),
                 rows().to(device), rows().to(device), group_size, key_bits)
    seg = Segments(_table(int2_lens, int2_page_size, n2, device, gen),
                   torch.tensor(list(int2_lens), dtype=torch.int32, device=device),
                   _table(bf16_lens, bf16_page_size, n16, device, gen),
                   torch.tensor(list(bf16_lens), dtype=torch.int32, device=device))
    return kv, seg

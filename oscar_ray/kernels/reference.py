"""Torch references and glue for the kernels: rotation of q/o, the write path, gathering a request's cache.

The attention references dequantise a request's INT2 tokens with quant/int2.py, append its BF16
tokens, and call quant/attention.reference_attention in float64, so a kernel is checked against the
OSCAR math core and not against a second copy of its own arithmetic.
"""

from __future__ import annotations

import torch

from oscar_ray.quant.attention import reference_attention
from oscar_ray.quant.clip import clip_rows
from oscar_ray.quant.int2 import dequantize_int2, pack_codes, quantize_int2, unpack_codes

from .layout import PagedKV, Segments


def rotate_heads(x: torch.Tensor, r: torch.Tensor | None, transpose: bool = False) -> torch.Tensor:
    """x [..., H, d] → x·R (or x·Rᵀ) in fp32.  R [d, d], or [H_kv, d, d] with head h using R[h // (H/H_kv)]."""
    xf = x.to(torch.float32)
    if r is None:
        return xf
    r = r.to(x.device, torch.float32)
    if transpose:
        r = r.transpose(-1, -2)
    if r.ndim == 2:
        return xf @ r
    h, hkv, d = x.shape[-2], r.shape[0], x.shape[-1]
    grouped = xf.reshape(*x.shape[:-2], hkv, h // hkv, d)  # contiguous GQA grouping: head h*g+j → KV head h
    return torch.einsum("...hgi,hij->...hgj", grouped, r).reshape(xf.shape)


def int2_write_reference(x: torch.Tensor, rotation: torch.Tensor | None, clip_ratio: float,
                         group_size: int | None, scale_dtype: torch.dtype,
                         bits: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, H, d] → (packed codes uint8 [N, H, d·bits/8], scales [N, H, 2·G]): pack(Q_bits(clip(x·R)))."""
    codes, scales = quantize_int2(clip_rows(rotate_heads(x, rotation), clip_ratio), group_size, scale_dtype,
                                  bits=bits)
    return pack_codes(codes, bits), scales


def bf16_write_reference(x: torch.Tensor, rotation: torch.Tensor | None) -> torch.Tensor:
    """x [N, H, d] → (x·R) rounded to bf16."""
    return rotate_heads(x, rotation).to(torch.bfloat16)


def gather_pages(pages: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """pages [P, page_size, ...], table_row [max_pages] → the first `length` tokens [length, ...]."""
    page_size = pages.shape[1]
    t = torch.arange(length, device=pages.device)
    return pages[table_row.long()[t // page_size], t % page_size]


def request_kv(kv: PagedKV, seg: Segments, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, V) float32 [T, H_kv, d] of request b: its dequantised INT2 tokens, then its BF16 tokens."""
    n2, n16 = int(seg.int2_lens[b]), int(seg.bf16_lens[b])
    out = []
    for codes, scales, bf16, bits in ((kv.k_codes, kv.k_scales, kv.k_bf16, kv.key_bits),
                                      (kv.v_codes, kv.v_scales, kv.v_bf16, 2)):
        c = unpack_codes(gather_pages(codes, seg.int2_page_table[b], n2), bits)
        x2 = dequantize_int2(c, gather_pages(scales, seg.int2_page_table[b], n2), kv.group_size)
        x16 = gather_pages(bf16, seg.bf16_page_table[b], n16).to(torch.float32)
        out.append(torch.cat([x2, x16], dim=0))
    return out[0], out[1]


def decode_attention_reference(q: torch.Tensor, kv: PagedKV, seg: Segments) -> torch.Tensor:
    """q [B, Hq, d] (rotated) → o [B, Hq, d] float64; a request with no tokens gets zeros (kernel rule)."""
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for b in range(q.shape[0]):
        k, v = request_kv(kv, seg, b)
        if k.shape[0]:
            out[b] = reference_attention(q[b : b + 1], k, v, causal=False)[0]
    return out


def extend_attention_reference(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, kv: PagedKV,
                               seg: Segments, qo_indptr: torch.Tensor) -> torch.Tensor:
    """Chunk queries [ΣC, Hq, d] over [dequantised prefix ‖ chunk] with the causal mask, float64."""
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    bounds = qo_indptr.tolist()
    for b in range(len(bounds) - 1):
        lo, hi = bounds[b], bounds[b + 1]
        if hi == lo:
            continue
        k, v = request_kv(kv, seg, b)
        k = torch.cat([k, k_new[lo:hi].float()], dim=0)
        v = torch.cat([v, v_new[lo:hi].float()], dim=0)
        out[lo:hi] = reference_attention(q[lo:hi], k, v, causal=True)
    return out

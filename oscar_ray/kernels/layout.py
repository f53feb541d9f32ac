"""The engine-agnostic mixed INT2 / BF16 cache of one layer, as the attention kernels read it.

Shapes (OSCAR_SPEC §3-§4), separately for K and V:
    codes   uint8      [n_int2_pages, int2_page_size, H_kv, d/4]   quartered packing (quant/int2.py);
                                                                   keys d/4 + d/8 with key_bits 3
                                                                   (pack_codes: one more bit plane)
    scales  fp16|fp32  [n_int2_pages, int2_page_size, H_kv, 2·G]   interleaved (s_0, z_0, s_1, z_1, ...)
    bf16    bfloat16   [n_bf16_pages, bf16_page_size, H_kv, d]     sink + recent tokens
All stored K are rotated (k·R_K) and V rotated (v·R_V) or absorbed, so every tier shares one basis.
Codes and scales may be stored head-major (`head_major()`: same shapes, [page, H_kv, token, ...] in
memory): every kernel reads them through their strides.

Per request b of a batch, `Segments` lists the pages of each tier in order: int2_lens[b] tokens fill
int2_page_table[b, 0], [b, 1], ... (the last page possibly partial); likewise the BF16 tier.  Decode
attention is permutation-invariant over keys, so the order of sink, INT2 and recent does not matter.

Example:
    kv = PagedKV(k_codes, k_scales, v_codes, v_scales, k_bf16, v_bf16)          # group_size None = d
    seg = Segments(int2_table, int2_lens, bf16_table, bf16_lens)
    o = int2_decode_attention(q, kv, seg)                                         # [B, Hq, d] fp32
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oscar_ray.quant.int2 import check_bits

from ._validate import SCALE_DTYPES, check_pow2, check_tensor, code_bytes, group_count


def head_major(x: torch.Tensor) -> torch.Tensor:
    """x with the same logical [..., page, token, H_kv, w] shape and values, stored [..., page, H_kv,
    token, w] in memory: one KV head's rows of a page contiguous (a copy)."""
    return x.transpose(-3, -2).contiguous().transpose(-3, -2)


def int2_zeros(shape: tuple[int, ...], dtype: torch.dtype, device, head_major: bool = False) -> torch.Tensor:
    """Zero pages of logical shape [..., page, token, H_kv, w]; head_major allocates them in the
    [..., page, H_kv, token, w] order directly (a pool is GBs: no second, token-major copy)."""
    if not head_major:
        return torch.zeros(shape, dtype=dtype, device=device)
    *lead, p, t, h, w = shape
    return torch.zeros((*lead, p, h, t, w), dtype=dtype, device=device).transpose(-3, -2)


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """Sizes read off a PagedKV (validated)."""

    n_kv_heads: int
    head_dim: int
    int2_page_size: int
    bf16_page_size: int
    group_size: int
    n_groups: int
    scale_fp16: bool
    key_bits: int = 2


@dataclass(frozen=True, slots=True)
class PagedKV:
    """One layer's K and V pages in both tiers; `group_size` None means one (s, z) pair per row;
    `key_bits` 3 means 3-bit key codes (d/4 + d/8 bytes a row), values stay INT2."""

    k_codes: torch.Tensor
    k_scales: torch.Tensor
    v_codes: torch.Tensor
    v_scales: torch.Tensor
    k_bf16: torch.Tensor
    v_bf16: torch.Tensor
    group_size: int | None = None
    key_bits: int = 2

    @property
    def device(self) -> torch.device:
        return self.k_bf16.device

    def geometry(self) -> KVGeometry:
        """Check dtypes, shapes and devices of all six tensors; raise ValueError naming the first bad one."""
        dev = self.device
        check_tensor("k_bf16", self.k_bf16, (torch.bfloat16,), ndim=4, device=dev)
        _, bf16_page, h, d = self.k_bf16.shape
        # each packed quarter (d/4 columns) feeds its own tl.dot, whose K extent must be >= 16: d >= 64
        check_pow2("head_dim", d, minimum=64)
        check_tensor("v_bf16", self.v_bf16, (torch.bfloat16,), shape=(None, bf16_page, h, d), device=dev)
        check_tensor("k_codes", self.k_codes, (torch.uint8,), ndim=4, device=dev)
        int2_page = self.k_codes.shape[1]
        bits = check_bits(self.key_bits)
        check_tensor("k_codes", self.k_codes, (torch.uint8,), shape=(None, int2_page, h, code_bytes(d, bits)),
                     device=dev)
        check_tensor("v_codes", self.v_codes, (torch.uint8,), shape=(None, int2_page, h, d // 4), device=dev)
        gs, n_groups = group_count(d, self.group_size)
        shape = (self.k_codes.shape[0], int2_page, h, 2 * n_groups)
        check_tensor("k_scales", self.k_scales, SCALE_DTYPES, shape=shape, device=dev)
        check_tensor("v_scales", self.v_scales, (self.k_scales.dtype,),
                     shape=(self.v_codes.shape[0], int2_page, h, 2 * n_groups), device=dev)
        # the kernels take one stride set per tier, shared by K and V (3-bit key codes, wider rows,
        # bring their own)
        pairs = [("v_scales", self.v_scales, self.k_scales), ("v_bf16", self.v_bf16, self.k_bf16)]
        if bits == 2:
            pairs.append(("v_codes", self.v_codes, self.k_codes))
        for name, pages, ref in pairs:
            if pages.stride() != ref.stride():
                raise ValueError(f"{name} strides {pages.stride()} must equal those of its K tensor {ref.stride()}")
        return KVGeometry(h, d, int2_page, bf16_page, gs, n_groups, self.k_scales.dtype == torch.float16, bits)


@dataclass(frozen=True, slots=True)
class Segments:
    """Page tables and token counts of both tiers for a batch of B requests (int32 on the cache device)."""

    int2_page_table: torch.Tensor
    int2_lens: torch.Tensor
    bf16_page_table: torch.Tensor
    bf16_lens: torch.Tensor

    @property
    def batch(self) -> int:
        return self.int2_lens.shape[0]

    def check(self, device: torch.device) -> int:
        """Validate and return the batch size B."""
        check_tensor("int2_lens", self.int2_lens, (torch.int32,), ndim=1, device=device)
        b = self.int2_lens.shape[0]
        check_tensor("bf16_lens", self.bf16_lens, (torch.int32,), shape=(b,), device=device)
        check_tensor("int2_page_table", self.int2_page_table, (torch.int32,), shape=(b, None), device=device)
        check_tensor("bf16_page_table", self.bf16_page_table, (torch.int32,), shape=(b, None), device=device)
        if not (self.int2_lens.is_contiguous() and self.bf16_lens.is_contiguous()):
            raise ValueError("int2_lens and bf16_lens must be contiguous")
        return b

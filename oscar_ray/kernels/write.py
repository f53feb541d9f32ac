"""Write path kernels: fused rotate → clip → INT2 quantise → pack into pages; BF16 rows; page demotion.

int2_write   new rows x [N, H_kv, d] (not yet rotated) → INT2 slots (page id, offset) of codes + scales
bf16_write   new rows x [N, H_kv, d] → rotated bf16 rows in BF16 page slots (sink / recent ring)
demote_pages BF16 pages (already rotated) → INT2 pages, every token of every listed page, one launch

Codes and scales equal quant/int2.py's bit for bit (see _quant_tiles.py); the rotation is one fp32
tl.dot with input_precision "ieee", so it agrees with torch's x·R to fp32 rounding (exactly when the
products and their sums are representable, which the unit tests use to pin the codes bit-exactly).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from oscar_ray.quant.clip import check_ratio, clip_index
from oscar_ray.quant.int2 import check_bits

from ._quant_tiles import _clip_rows, _quantize_pack_store, _round_bf16
from ._validate import FLOAT_ROWS, SCALE_DTYPES, check_pow2, check_rotation, check_tensor, code_bytes, group_count


@triton.jit
def _load_rotated_rows(x_ptr, r_ptr, n, rmask, h, sxn, sxh, srh,
                       D: tl.constexpr, ROTATE: tl.constexpr, KC: tl.constexpr):
    """x[n, h, :] for the BR tokens n of one KV head h → fp32 [BR, D], times R[h] when ROTATE.

    x·R runs as D/KC dots over KC-row slices of R: holding all of R (fp32 [128, 128] = 64 KB, 128
    registers a thread at 4 warps) spilled ~7 KB of stack per thread and made bf16_write take
    ~150 µs for any batch; a [16, D] slice is 16 registers.  On the GPU the "ieee" dot is a chain
    of FMAs in ascending k either way, so slicing changes no bit; the interpreter's numpy matmul sums
    in its own order, so there the launcher passes KC = D (one dot, as torch's reference sums).
    """
    cols = tl.arange(0, D)
    rows = x_ptr + n.to(tl.int64)[:, None] * sxn + h * sxh
    if ROTATE:
        kc = tl.arange(0, KC)
        x = tl.zeros([n.shape[0], D], tl.float32)
        for k0 in tl.static_range(0, D, KC):
            xk = tl.load(rows + k0 + kc[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
            r = tl.load(r_ptr + h * srh + (k0 + kc)[:, None] * D + cols[None, :])
            x = tl.dot(xk, r, x, input_precision="ieee")  # tf32 would round x and R to 10 mantissa bits
    else:
        x = tl.load(rows + cols[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    return x


@triton.jit
def _int2_write_kernel(x_ptr, r_ptr, page_ptr, off_ptr, codes_ptr, scales_ptr, n_tokens,
                       sxn, sxh, srh, scp, sco, sch, ssp, sso, ssh,
                       D: tl.constexpr, GS: tl.constexpr, BR: tl.constexpr, ROTATE: tl.constexpr, KC: tl.constexpr,
                       CLIP: tl.constexpr, CLIP_IDX: tl.constexpr, SCALE_FP16: tl.constexpr, BITS: tl.constexpr):
    h = tl.program_id(1)
    n = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = n < n_tokens
    x = _load_rotated_rows(x_ptr, r_ptr, n, rmask, h, sxn, sxh, srh, D, ROTATE, KC)
    if CLIP:
        x = _clip_rows(x, CLIP_IDX)
    page = tl.load(page_ptr + n, mask=rmask, other=0).to(tl.int64)
    off = tl.load(off_ptr + n, mask=rmask, other=0)
    code_rows = codes_ptr + page * scp + off * sco + h * sch
    scale_rows = scales_ptr + page * ssp + off * sso + h * ssh
    _quantize_pack_store(x, rmask, code_rows, scale_rows, BR, D, GS, SCALE_FP16, BITS)


@triton.jit
def _bf16_write_kernel(x_ptr, r_ptr, page_ptr, off_ptr, out_ptr, n_tokens, sxn, sxh, srh, sop, soo, soh,
                       D: tl.constexpr, BR: tl.constexpr, ROTATE: tl.constexpr, KC: tl.constexpr):
    h = tl.program_id(1)
    n = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = n < n_tokens
    x = _load_rotated_rows(x_ptr, r_ptr, n, rmask, h, sxn, sxh, srh, D, ROTATE, KC)
    page = tl.load(page_ptr + n, mask=rmask, other=0).to(tl.int64)
    off = tl.load(off_ptr + n, mask=rmask, other=0)
    ptrs = out_ptr + (page * sop + off * soo + h * soh)[:, None] + tl.arange(0, D)[None, :]
    tl.store(ptrs, _round_bf16(x), mask=rmask[:, None])


@triton.jit
def _demote_pages_kernel(src_ptr, src_ids_ptr, dst_ids_ptr, codes_ptr, scales_ptr, page_size,
                         sbp, sbt, sbh, scp, sco, sch, ssp, sso, ssh,
                         D: tl.constexpr, GS: tl.constexpr, BR: tl.constexpr,
                         CLIP: tl.constexpr, CLIP_IDX: tl.constexpr, SCALE_FP16: tl.constexpr, BITS: tl.constexpr):
    i = tl.program_id(0)
    h = tl.program_id(1)
    t = tl.program_id(2) * BR + tl.arange(0, BR)  # token offsets inside the page
    rmask = t < page_size
    src = tl.load(src_ids_ptr + i).to(tl.int64)
    dst = tl.load(dst_ids_ptr + i).to(tl.int64)
    ptrs = src_ptr + src * sbp + (t * sbt + h * sbh)[:, None] + tl.arange(0, D)[None, :]
    x = tl.load(ptrs, mask=rmask[:, None], other=0.0).to(tl.float32)
    if CLIP:
        x = _clip_rows(x, CLIP_IDX)
    code_rows = codes_ptr + dst * scp + t * sco + h * sch
    scale_rows = scales_ptr + dst * ssp + t * sso + h * ssh
    _quantize_pack_store(x, rmask, code_rows, scale_rows, BR, D, GS, SCALE_FP16, BITS)


def _check_int2_pages(codes: torch.Tensor, scales: torch.Tensor, h: int, d: int, group_size: int | None,
                      device: torch.device, bits: int = 2) -> tuple[int, int]:
    """(group_size, n_groups) after checking codes [P, page, H, d·bits/8] uint8 and scales [P, page, H, 2G]."""
    gs, n_groups = group_count(d, group_size)
    check_tensor("codes", codes, (torch.uint8,), shape=(None, None, h, code_bytes(d, bits)), device=device)
    check_tensor("scales", scales, SCALE_DTYPES, shape=(codes.shape[0], codes.shape[1], h, 2 * n_groups),
                 device=device)
    return gs, n_groups


def _check_rows_and_slots(x, page_ids, offsets) -> tuple[int, int, int]:
    check_tensor("x", x, FLOAT_ROWS, ndim=3)
    n, h, d = x.shape
    check_pow2("head_dim", d, minimum=16)  # tl.dot needs every extent >= 16
    check_tensor("page_ids", page_ids, (torch.int32,), shape=(n,), device=x.device)
    check_tensor("offsets", offsets, (torch.int32,), shape=(n,), device=x.device)
    return n, h, d


def _rotation_chunk(d: int) -> int:
    """Rows of R per rotation dot (see _load_rotated_rows): 16 compiled, all of them interpreted."""
    return d if os.environ.get("TRITON_INTERPRET") == "1" else 16


def _clip_args(clip_ratio: float, d: int) -> tuple[bool, int]:
    """(CLIP, CLIP_IDX); ratio 0 disables, and idx d−1 (τ = max |x|) is the identity, so both skip it."""
    idx = clip_index(check_ratio(clip_ratio), d)
    return (clip_ratio > 0.0 and idx < d - 1), idx


def int2_write(x: torch.Tensor, rotation: torch.Tensor | None, clip_ratio: float, page_ids: torch.Tensor,
               offsets: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, group_size: int | None = None,
               block_rows: int = 16, num_warps: int = 4, bits: int = 2) -> None:
    """Store pack(Q₂(clip(x·R, clip_ratio))) of x [N, H_kv, d] into INT2 slot (page_ids[i], offsets[i]).

    rotation: fp32 [d, d] or [H_kv, d, d], or None when x is already rotated (or V is absorbed).
    codes uint8 [P, page, H_kv, d·bits/8] and scales fp16|fp32 [P, page, H_kv, 2·G] are written in
    place; bits 3 is the cache's 3-bit key layout (quant/int2.pack_codes).
    Example: int2_write(k, R_K, 0.96, pages, offs, k_codes, k_scales)  # N new tokens of one layer
    """
    n, h, d = _check_rows_and_slots(x, page_ids, offsets)
    bits = check_bits(bits)
    gs, _ = _check_int2_pages(codes, scales, h, d, group_size, x.device, bits)
    r = check_rotation("rotation", rotation, d, h, x.device)
    check_pow2("block_rows", block_rows, minimum=16)
    clip, idx = _clip_args(clip_ratio, d)
    if n == 0:
        return
    grid = (triton.cdiv(n, block_rows), h)
    _int2_write_kernel[grid](
        x, x if r is None else r, page_ids, offsets, codes, scales, n,
        x.stride(0), x.stride(1), 0 if r is None or r.ndim == 2 else d * d,
        codes.stride(0), codes.stride(1), codes.stride(2), scales.stride(0), scales.stride(1), scales.stride(2),
        D=d, GS=gs, BR=block_rows, ROTATE=r is not None, KC=_rotation_chunk(d), CLIP=clip, CLIP_IDX=idx,
        SCALE_FP16=scales.dtype == torch.float16, BITS=bits, num_warps=num_warps)


def bf16_write(x: torch.Tensor, rotation: torch.Tensor | None, page_ids: torch.Tensor, offsets: torch.Tensor,
               pages: torch.Tensor, block_rows: int = 16, num_warps: int = 4) -> None:
    """Store (x·R) rounded to bf16 of x [N, H_kv, d] into BF16 slot (page_ids[i], offsets[i]) of
    pages bf16 [P, page, H_kv, d].  rotation as in int2_write."""
    n, h, d = _check_rows_and_slots(x, page_ids, offsets)
    check_tensor("pages", pages, (torch.bfloat16,), shape=(None, None, h, d), device=x.device)
    r = check_rotation("rotation", rotation, d, h, x.device)
    check_pow2("block_rows", block_rows, minimum=16)
    if n == 0:
        return
    grid = (triton.cdiv(n, block_rows), h)
    _bf16_write_kernel[grid](
        x, x if r is None else r, page_ids, offsets, pages, n,
        x.stride(0), x.stride(1), 0 if r is None or r.ndim == 2 else d * d,
        pages.stride(0), pages.stride(1), pages.stride(2),
        D=d, BR=block_rows, ROTATE=r is not None, KC=_rotation_chunk(d), num_warps=num_warps)


def demote_pages(bf16_pages: torch.Tensor, src_page_ids: torch.Tensor, dst_page_ids: torch.Tensor,
                 codes: torch.Tensor, scales: torch.Tensor, clip_ratio: float, group_size: int | None = None,
                 num_warps: int = 4, bits: int = 2) -> None:
    """Quantise every token of BF16 pages src_page_ids[i] into INT2 page dst_page_ids[i], one launch.

    bf16_pages [P16, page, H_kv, d] hold rotated rows, so no rotation is applied; the INT2 pages
    must have the same page size.  The source pages are left as they are (the caller frees them).
    """
    check_tensor("bf16_pages", bf16_pages, (torch.bfloat16,), ndim=4)
    _, page, h, d = bf16_pages.shape
    check_pow2("head_dim", d, minimum=16)
    bits = check_bits(bits)
    gs, _ = _check_int2_pages(codes, scales, h, d, group_size, bf16_pages.device, bits)
    if codes.shape[1] != page:
        raise ValueError(f"codes page size {codes.shape[1]} must equal bf16_pages page size {page}")
    check_tensor("src_page_ids", src_page_ids, (torch.int32,), ndim=1, device=bf16_pages.device)
    check_tensor("dst_page_ids", dst_page_ids, (torch.int32,), shape=src_page_ids.shape, device=bf16_pages.device)
    clip, idx = _clip_args(clip_ratio, d)
    if src_page_ids.numel() == 0:
        return
    br = min(triton.next_power_of_2(page), 64)  # page 8 → 8 rows per program, no tl.dot so no 16 minimum
    grid = (src_page_ids.numel(), h, triton.cdiv(page, br))
    _demote_pages_kernel[grid](
        bf16_pages, src_page_ids, dst_page_ids, codes, scales, page,
        bf16_pages.stride(0), bf16_pages.stride(1), bf16_pages.stride(2),
        codes.stride(0), codes.stride(1), codes.stride(2), scales.stride(0), scales.stride(1), scales.stride(2),
        D=d, GS=gs, BR=br, CLIP=clip, CLIP_IDX=idx, SCALE_FP16=scales.dtype == torch.float16, BITS=bits,
        num_warps=num_warps)

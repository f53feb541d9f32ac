"""INT2 write kernels: fused rotate → clip → INT2 quantise → pack into pages.

BF16 rows alone: write_bf16.py; page demotion: demote.py.

int2_write     new rows x [N, H_kv, d] (not yet rotated) → INT2 slots (page id, offset) of codes + scales
int2_write_kv  the same for the K and V rows of a step in one launch, optionally with their BF16
               copies (bf16_copy); the BF16 writes alone are in write_bf16.py

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
from .write_bf16 import _check_bf16_pages, _check_rows_and_slots, _column_program, _rotated_cols, _rotation_cols


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
def _int2_rows(x_ptr, r_ptr, n, rmask, h, sxn, sxh, srh, code_rows, scale_rows, D: tl.constexpr, GS: tl.constexpr,
               BR: tl.constexpr, ROTATE: tl.constexpr, KC: tl.constexpr, CLIP: tl.constexpr, CLIP_IDX: tl.constexpr,
               SCALE_FP16: tl.constexpr, BITS: tl.constexpr, bf16_rows=None, BF16_OUT: tl.constexpr = False):
    """Rows n of head h rotated, clipped, quantised and packed into code_rows / scale_rows [BR]; with
    BF16_OUT the rotated rows before the clip also go to bf16_rows [BR] (+ column) rounded to bf16:
    the bits bf16_write_kv stores (its rotation sums in the same ascending-k FMA order)."""
    x = _load_rotated_rows(x_ptr, r_ptr, n, rmask, h, sxn, sxh, srh, D, ROTATE, KC)
    if BF16_OUT:
        tl.store(bf16_rows[:, None] + tl.arange(0, D)[None, :], _round_bf16(x), mask=rmask[:, None])
    if CLIP:
        x = _clip_rows(x, CLIP_IDX)
    _quantize_pack_store(x, rmask, code_rows, scale_rows, BR, D, GS, SCALE_FP16, BITS)


@triton.jit
def _int2_write_kernel(xk_ptr, xv_ptr, rk_ptr, rv_ptr, page_ptr, off_ptr, kc_ptr, ks_ptr, vc_ptr, vs_ptr, n_tokens,
                       sxkn, sxkh, sxvn, sxvh, srkh, srvh, skcp, skco, skch, svcp, svco, svch, ssp, sso, ssh,
                       bp_ptr, bo_ptr, bk_ptr, bv_ptr, sbp, sbo, sbh,
                       D: tl.constexpr, GS: tl.constexpr, BR: tl.constexpr, KC: tl.constexpr,
                       ROTATE_K: tl.constexpr, CLIP_K: tl.constexpr, CLIP_IDX_K: tl.constexpr, BITS_K: tl.constexpr,
                       ROTATE_V: tl.constexpr, CLIP_V: tl.constexpr, CLIP_IDX_V: tl.constexpr,
                       SCALE_FP16: tl.constexpr, BF16_OUT: tl.constexpr = False):
    # grid axis 2: K (0) and V (1) of the same tokens in one launch; V is always INT2 (2 bits).
    # BF16_OUT: also store the rotated, unclipped rows rounded to bf16 into BF16 slots (bp, bo): the
    # bits bf16_write_kv stores (the same rotation dot), one launch fewer per step
    h = tl.program_id(1)
    n = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = n < n_tokens
    page = tl.load(page_ptr + n, mask=rmask, other=0).to(tl.int64)
    off = tl.load(off_ptr + n, mask=rmask, other=0)
    scale_off = page * ssp + off * sso + h * ssh
    bslot = 0
    if BF16_OUT:
        bslot = (tl.load(bp_ptr + n, mask=rmask, other=0).to(tl.int64) * sbp
                 + tl.load(bo_ptr + n, mask=rmask, other=0) * sbo + h * sbh)
    if tl.program_id(2) == 0:
        _int2_rows(xk_ptr, rk_ptr, n, rmask, h, sxkn, sxkh, srkh, kc_ptr + page * skcp + off * skco + h * skch,
                   ks_ptr + scale_off, D, GS, BR, ROTATE_K, KC, CLIP_K, CLIP_IDX_K, SCALE_FP16, BITS_K,
                   bk_ptr + bslot, BF16_OUT)
    else:
        _int2_rows(xv_ptr, rv_ptr, n, rmask, h, sxvn, sxvh, srvh, vc_ptr + page * svcp + off * svco + h * svch,
                   vs_ptr + scale_off, D, GS, BR, ROTATE_V, KC, CLIP_V, CLIP_IDX_V, SCALE_FP16, 2,
                   bv_ptr + bslot, BF16_OUT)


@triton.jit
def _rotate_rows_kernel(xa_ptr, xb_ptr, ra_ptr, rb_ptr, out_ptr, n_tokens, sxan, sxah, sxbn, sxbh, srah, srbh,
                        H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr, CN: tl.constexpr):
    # first pass of a two-pass int2_write_kv: out [sides, N, H, D] fp32 = x·R of each rotated side,
    # split over D/CN column programs as _bf16_write_kernel is (grid axis 2 = side × column slice)
    h, n, rmask, side, c0 = _column_program(n_tokens, D, BR, CN)
    dst = out_ptr + ((side * n_tokens).to(tl.int64) + n) * (H * D) + h * D
    if side == 0:
        _rotated_cols(xa_ptr, ra_ptr, n, rmask, h, c0, sxan, sxah, srah, dst, D, CN, True, False)
    else:
        _rotated_cols(xb_ptr, rb_ptr, n, rmask, h, c0, sxbn, sxbh, srbh, dst, D, CN, True, False)


def _check_int2_pages(codes: torch.Tensor, scales: torch.Tensor, h: int, d: int, group_size: int | None,
                      device: torch.device, bits: int = 2) -> tuple[int, int]:
    """(group_size, n_groups) after checking codes [P, page, H, d·bits/8] uint8 and scales [P, page, H, 2G]."""
    gs, n_groups = group_count(d, group_size)
    check_tensor("codes", codes, (torch.uint8,), shape=(None, None, h, code_bytes(d, bits)), device=device)
    check_tensor("scales", scales, SCALE_DTYPES, shape=(codes.shape[0], codes.shape[1], h, 2 * n_groups),
                 device=device)
    return gs, n_groups


def _rotation_chunk(d: int) -> int:
    """Rows of R per rotation dot (see _load_rotated_rows): 16 compiled, all of them interpreted."""
    return d if os.environ.get("TRITON_INTERPRET") == "1" else 16


def _clip_args(clip_ratio: float, d: int, name: str = "clip_ratio") -> tuple[bool, int]:
    """(CLIP, CLIP_IDX); ratio 0 disables, and idx d−1 (τ = max |x|) is the identity, so both skip it."""
    idx = clip_index(check_ratio(clip_ratio, name), d)
    return (clip_ratio > 0.0 and idx < d - 1), idx


def int2_write(x: torch.Tensor, rotation: torch.Tensor | None, clip_ratio: float, page_ids: torch.Tensor,
               offsets: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, group_size: int | None = None,
               block_rows: int = 16, num_warps: int | None = None, bits: int = 2) -> None:
    """Store pack(Q₂(clip(x·R, clip_ratio))) of x [N, H_kv, d] into INT2 slot (page_ids[i], offsets[i]).

    rotation: fp32 [d, d] or [H_kv, d, d], or None when x is already rotated (or V is absorbed).
    codes uint8 [P, page, H_kv, d·bits/8] and scales fp16|fp32 [P, page, H_kv, 2·G] are written in
    place; bits 3 is the cache's 3-bit key layout (quant/int2.pack_codes).
    Example: int2_write(k, R_K, 0.96, pages, offs, k_codes, k_scales)  # N new tokens of one layer
    """
    check_ratio(clip_ratio)  # named as this function names it
    int2_write_kv(x, None, rotation, None, clip_ratio, 0.0, page_ids, offsets, codes, scales, None, None,
                  group_size, block_rows, num_warps, key_bits=bits)


def int2_write_kv(k: torch.Tensor, v: torch.Tensor | None, k_rotation: torch.Tensor | None,
                  v_rotation: torch.Tensor | None, k_clip: float, v_clip: float, page_ids: torch.Tensor,
                  offsets: torch.Tensor, k_codes: torch.Tensor, k_scales: torch.Tensor, v_codes: torch.Tensor | None,
                  v_scales: torch.Tensor | None, group_size: int | None = None, block_rows: int = 16,
                  num_warps: int | None = None, key_bits: int = 2, two_pass: bool | None = None,
                  bf16_copy: tuple | None = None) -> None:
    """int2_write of K (key_bits 2 or 3) and V (2 bits) rows into the same slots, one launch.

    v, v_codes, v_scales None writes K only.  V's scales must have K's dtype and layout.
    two_pass: rotate in a first launch split over column programs (fp32 scratch [sides, N, H_kv, d])
    and clip/quantise/pack in a second; None picks it for N <= TWO_PASS_MAX_ROWS when a rotation is
    given (a decode step's few rows, where the one-launch form waits on d/16 serial rotation slices).
    Same codes either way.  bf16_copy = (page_ids, offsets, k_pages, v_pages): the same launch also
    stores the rows as bf16_write_kv(k, v, k_rotation, v_rotation, ...) would (same bits; v_pages
    None iff v is None), the sglang pool's dual write in one launch (two with two_pass) instead of
    two (three).  num_warps None: 8 for the two-pass form, 4 for one launch (H200, bs 1:
    two-pass 8.3 µs at 4 warps, 6.9 at 8, 6.6 at 16; one launch 11.2 at 4, 13.2 at 8).
    Example: int2_write_kv(k, v, R_K, None, 0.96, 0.0, pages, offs, kc, ks, vc, vs)   # V absorbed
    """
    n, h, d = _check_rows_and_slots(k, page_ids, offsets)
    key_bits = check_bits(key_bits)
    gs, _ = _check_int2_pages(k_codes, k_scales, h, d, group_size, k.device, key_bits)
    rk = check_rotation("k_rotation", k_rotation, d, h, k.device)
    clip_k, idx_k = _clip_args(k_clip, d, "k_clip")
    rv, clip_v, idx_v = None, False, 0
    if (v is None) != (v_codes is None) or (v is None) != (v_scales is None):
        raise ValueError("v, v_codes and v_scales: give all three or none")
    if v is not None:
        check_tensor("v", v, FLOAT_ROWS, shape=(n, h, d), device=k.device)
        _check_int2_pages(v_codes, v_scales, h, d, group_size, k.device, 2)
        if v_scales.dtype != k_scales.dtype or v_scales.stride() != k_scales.stride():
            raise ValueError("v_scales must have k_scales' dtype and strides")
        rv = check_rotation("v_rotation", v_rotation, d, h, k.device)
        clip_v, idx_v = _clip_args(v_clip, d, "v_clip")
    check_pow2("block_rows", block_rows, minimum=16)
    bf16 = _check_bf16_copy(bf16_copy, n, h, d, v is not None, k.device)
    if n == 0:
        return
    if two_pass is None:
        two_pass = n <= TWO_PASS_MAX_ROWS
    two_pass = two_pass and (rk is not None or rv is not None)
    if num_warps is None:
        num_warps = 8 if two_pass else 4
    if two_pass:
        k, v = _rotate_first(k, v, rk, rv, block_rows, num_warps)
        rk = rv = None
    vx, vc, vs = (k, k_codes, k_scales) if v is None else (v, v_codes, v_scales)
    grid = (triton.cdiv(n, block_rows), h, 1 if v is None else 2)
    _int2_write_kernel[grid](
        k, vx, k if rk is None else rk, vx if rv is None else rv, page_ids, offsets, k_codes, k_scales, vc, vs, n,
        k.stride(0), k.stride(1), vx.stride(0), vx.stride(1),
        0 if rk is None or rk.ndim == 2 else d * d, 0 if rv is None or rv.ndim == 2 else d * d,
        *k_codes.stride()[:3], *vc.stride()[:3], *k_scales.stride()[:3],
        *(bf16 or (page_ids, offsets, k, k)), *(bf16[2].stride()[:3] if bf16 else (0, 0, 0)),
        D=d, GS=gs, BR=block_rows, KC=_rotation_chunk(d), ROTATE_K=rk is not None, CLIP_K=clip_k, CLIP_IDX_K=idx_k,
        BITS_K=key_bits, ROTATE_V=rv is not None, CLIP_V=clip_v, CLIP_IDX_V=idx_v,
        SCALE_FP16=k_scales.dtype == torch.float16, BF16_OUT=bf16 is not None, num_warps=num_warps)


def _check_bf16_copy(bf16_copy, n: int, h: int, d: int, has_v: bool, device) -> tuple | None:
    """int2_write_kv's bf16_copy checked as bf16_write_kv checks its slots and pages."""
    if bf16_copy is None:
        return None
    if not (isinstance(bf16_copy, (tuple, list)) and len(bf16_copy) == 4):
        raise ValueError("bf16_copy must be (page_ids, offsets, k_pages, v_pages)")
    pages, offs, kp, vp = bf16_copy
    check_tensor("bf16_copy page_ids", pages, (torch.int32,), shape=(n,), device=device)
    check_tensor("bf16_copy offsets", offs, (torch.int32,), shape=(n,), device=device)
    if (vp is None) == has_v:
        raise ValueError("bf16_copy v_pages: give it exactly when v is given")
    _check_bf16_pages(kp, vp, h, d, device, prefix="bf16_copy ")
    return pages, offs, kp, kp if vp is None else vp


# Rows up to which int2_write_kv rotates in a launch of its own (two_pass None).  A decode step's
# rows: bs 1-32 × 1 token measured on the H200 (decode_h200.md, writes); prefill chunks of thousands
# of rows keep the one-launch form, which does not write and re-read an fp32 copy of every row.
TWO_PASS_MAX_ROWS = 64


def _rotate_first(k, v, rk, rv, block_rows: int, num_warps: int):
    """(k·R_K, v·R_V) as fp32 [N, H_kv, d] views of one scratch tensor; a side without a rotation
    (or v None) is returned as it was."""
    sides = [(x, r) for x, r in ((k, rk), (v, rv)) if r is not None]
    n, h, d = k.shape
    out = torch.empty(len(sides), n, h, d, dtype=torch.float32, device=k.device)
    (xa, ra), (xb, rb) = sides[0], sides[-1]
    cn = _rotation_cols(d)
    grid = (triton.cdiv(n, block_rows), h, len(sides) * (d // cn))
    _rotate_rows_kernel[grid](xa, xb, ra, rb, out, n, xa.stride(0), xa.stride(1), xb.stride(0), xb.stride(1),
                              0 if ra.ndim == 2 else d * d, 0 if rb.ndim == 2 else d * d,
                              H=h, D=d, BR=block_rows, CN=cn, num_warps=num_warps)
    k_out = out[0] if rk is not None else k
    v_out = out[-1] if rv is not None else v
    return k_out, v_out

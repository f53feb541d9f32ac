"""BF16 write kernels: rotated rows rounded to bf16 into the sink / recent pages' slots.

bf16_write     new rows x [N, H_kv, d] (not yet rotated) → rotated bf16 rows in BF16 page slots
bf16_write_kv  the K and V rows of a step in one launch

The rotation is split over D/CN column programs per row block (_rotated_cols), each one fp32 "ieee"
tl.dot: the same ascending-k FMA chains as write.py's 16-row slices, so the rows equal those
int2_write_kv(bf16_copy=...) stores and write.py's two-pass rotation computes.  Split from write.py
(the INT2 writes) at 350 lines; write.py and rotate.py use the column helpers.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ._quant_tiles import _round_bf16
from ._validate import FLOAT_ROWS, check_pow2, check_rotation, check_tensor


@triton.jit
def _rotated_cols(x_ptr, r_ptr, n, rmask, h, c0, sxn, sxh, srh, dst, D: tl.constexpr, CN: tl.constexpr,
                  ROTATE: tl.constexpr, BF16: tl.constexpr):
    """Columns c0 … c0+CN of x·R[h] (bf16-rounded when BF16, else fp32) for BR tokens n of KV head h,
    stored at dst [BR] + col."""
    cols = c0 + tl.arange(0, CN)
    rows = x_ptr + n.to(tl.int64)[:, None] * sxn + h * sxh
    if ROTATE:
        x = tl.load(rows + tl.arange(0, D)[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
        r = tl.load(r_ptr + h * srh + tl.arange(0, D)[:, None] * D + cols[None, :])
        y = tl.dot(x, r, input_precision="ieee")  # [BR, D]·[D, CN]: ascending-k FMA chains, as sliced
    else:
        y = tl.load(rows + cols[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    if BF16:
        tl.store(dst[:, None] + cols[None, :], _round_bf16(y), mask=rmask[:, None])
    else:
        tl.store(dst[:, None] + cols[None, :], y, mask=rmask[:, None])


@triton.jit
def _column_program(n_tokens, D: tl.constexpr, BR: tl.constexpr, CN: tl.constexpr):
    """(KV head, token rows [BR], row mask, side, first column) of a program whose grid axis 2 is
    side × D/CN column slices."""
    n = tl.program_id(0) * BR + tl.arange(0, BR)
    NC: tl.constexpr = D // CN
    return tl.program_id(1), n, n < n_tokens, tl.program_id(2) // NC, (tl.program_id(2) % NC) * CN


@triton.jit
def _bf16_write_kernel(xk_ptr, xv_ptr, rk_ptr, rv_ptr, page_ptr, off_ptr, ok_ptr, ov_ptr, n_tokens,
                       sxkn, sxkh, sxvn, sxvh, srkh, srvh, sop, soo, soh,
                       D: tl.constexpr, BR: tl.constexpr, CN: tl.constexpr, ROTATE_K: tl.constexpr,
                       ROTATE_V: tl.constexpr):
    # grid axis 2 = (tensor, column slice): K and V (when given) in one launch, and the rotation split
    # over D/CN programs per row block, so a decode step's few rows do not run 8 dependent
    # load → dot rounds in one program (H200, bs 1: ~9 µs per call that way, mostly latency)
    h, n, rmask, which, c0 = _column_program(n_tokens, D, BR, CN)
    _slot_rows(xk_ptr, xv_ptr, rk_ptr, rv_ptr, page_ptr, off_ptr, ok_ptr, ov_ptr, n, rmask, h, which, c0, sxkn, sxkh,
               sxvn, sxvh, srkh, srvh, sop, soo, soh, D, CN, ROTATE_K, ROTATE_V)


@triton.jit
def _slot_rows(xk_ptr, xv_ptr, rk_ptr, rv_ptr, page_ptr, off_ptr, ok_ptr, ov_ptr, n, rmask, h, which, c0, sxkn, sxkh,
               sxvn, sxvh, srkh, srvh, sop, soo, soh, D: tl.constexpr, CN: tl.constexpr, ROTATE_K: tl.constexpr,
               ROTATE_V: tl.constexpr):
    """Columns c0 … c0+CN of rows n of KV head h, K (which 0) or V, rotated and rounded to bf16 into
    their slots (page_ptr[n], off_ptr[n]): bf16_write_kv's program, also rotate_qk's store programs."""
    page = tl.load(page_ptr + n, mask=rmask, other=0).to(tl.int64)
    off = tl.load(off_ptr + n, mask=rmask, other=0)
    slot = page * sop + off * soo + h * soh
    if which == 0:
        _rotated_cols(xk_ptr, rk_ptr, n, rmask, h, c0, sxkn, sxkh, srkh, ok_ptr + slot, D, CN, ROTATE_K, True)
    else:
        _rotated_cols(xv_ptr, rv_ptr, n, rmask, h, c0, sxvn, sxvh, srvh, ov_ptr + slot, D, CN, ROTATE_V, True)


def _check_rows_and_slots(x, page_ids, offsets) -> tuple[int, int, int]:
    check_tensor("x", x, FLOAT_ROWS, ndim=3)
    n, h, d = x.shape
    check_pow2("head_dim", d, minimum=16)  # tl.dot needs every extent >= 16
    check_tensor("page_ids", page_ids, (torch.int32,), shape=(n,), device=x.device)
    check_tensor("offsets", offsets, (torch.int32,), shape=(n,), device=x.device)
    return n, h, d


def _check_bf16_pages(k_pages, v_pages, h: int, d: int, device, prefix: str = "") -> None:
    """k_pages bf16 [P, page, H_kv, d] and v_pages (or None) of k_pages' shape and strides, as the
    BF16 writes (bf16_write_kv, int2_write_kv's bf16_copy) take them; prefix names the argument."""
    check_tensor(f"{prefix}k_pages", k_pages, (torch.bfloat16,), shape=(None, None, h, d), device=device)
    if v_pages is not None:
        check_tensor(f"{prefix}v_pages", v_pages, (torch.bfloat16,), shape=k_pages.shape, device=device)
        if v_pages.stride() != k_pages.stride():
            raise ValueError(f"{prefix}v_pages strides {v_pages.stride()} must equal k_pages strides "
                             f"{k_pages.stride()}")


def _check_kv_rows(k, v, v_rotation, page_ids, offsets, k_pages, v_pages, prefix: str = ""):
    """(N, H_kv, d, checked v rotation or None) of a step's rows for BF16 slots, as bf16_write_kv takes
    them (also rotate_qk's store, whose fields `prefix` names): k [N, H_kv, d], v of k's shape or None
    with v_pages, the slots' ids and the pages."""
    n, h, d = _check_rows_and_slots(k, page_ids, offsets)
    if (v is None) != (v_pages is None):
        raise ValueError(f"{prefix}v and {prefix}v_pages: give both or neither")
    _check_bf16_pages(k_pages, v_pages, h, d, k.device, prefix=prefix)
    rv = None
    if v is not None:
        check_tensor(f"{prefix}v", v, FLOAT_ROWS, shape=(n, h, d), device=k.device)
        rv = check_rotation(f"{prefix}v_rotation", v_rotation, d, h, k.device)
    return n, h, d, rv


def _rotation_cols(d: int) -> int:
    """Output columns per bf16_write program: 32 compiled (4 programs share a row block's rotation),
    all of them interpreted (one numpy matmul per row block, summed as torch's reference sums)."""
    return d if os.environ.get("TRITON_INTERPRET") == "1" else min(d, 32)


def bf16_write(x: torch.Tensor, rotation: torch.Tensor | None, page_ids: torch.Tensor, offsets: torch.Tensor,
               pages: torch.Tensor, block_rows: int = 16, num_warps: int = 4) -> None:
    """Store (x·R) rounded to bf16 of x [N, H_kv, d] into BF16 slot (page_ids[i], offsets[i]) of
    pages bf16 [P, page, H_kv, d].  rotation as in int2_write."""
    bf16_write_kv(x, None, rotation, None, page_ids, offsets, pages, None, block_rows, num_warps)


def bf16_write_kv(k: torch.Tensor, v: torch.Tensor | None, k_rotation: torch.Tensor | None,
                  v_rotation: torch.Tensor | None, page_ids: torch.Tensor, offsets: torch.Tensor,
                  k_pages: torch.Tensor, v_pages: torch.Tensor | None, block_rows: int = 16,
                  num_warps: int = 4) -> None:
    """bf16_write of K and V rows into the same slots, one launch (a decode step's BF16 ring write).

    k, v [N, H_kv, d]; k_pages / v_pages bf16 [P, page, H_kv, d] of one layout; v / v_pages None
    writes K only.  Each rotation as in int2_write (None: rows already rotated, or V absorbed).
    Example: bf16_write_kv(k, v, R_K, None, pages, offs, k_bf16, v_bf16)   # V absorbed
    """
    n, h, d, rv = _check_kv_rows(k, v, v_rotation, page_ids, offsets, k_pages, v_pages)
    rk = check_rotation("k_rotation", k_rotation, d, h, k.device)
    check_pow2("block_rows", block_rows, minimum=16)
    if n == 0:
        return
    cn = _rotation_cols(d)
    vx = k if v is None else v
    grid = (triton.cdiv(n, block_rows), h, (1 if v is None else 2) * (d // cn))
    _bf16_write_kernel[grid](
        k, vx, k if rk is None else rk, vx if rv is None else rv, page_ids, offsets, k_pages,
        k_pages if v_pages is None else v_pages, n, k.stride(0), k.stride(1), vx.stride(0), vx.stride(1),
        0 if rk is None or rk.ndim == 2 else d * d, 0 if rv is None or rv.ndim == 2 else d * d,
        k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        D=d, BR=block_rows, CN=cn, ROTATE_K=rk is not None, ROTATE_V=rv is not None, num_warps=num_warps)

"""rotate_qk: a step's query (and key) rows times R_K in one Triton launch.

int2_decode_attention rotates q into the cache's K basis before reading it.  As torch ops that was
a cast and a matmul (rotate_heads): 5.9 / 9.0 / 3.5 µs at bs 1 / 8 / 32 on an H100 (2026-12-07,
benchmarks/results/raw, the decode table's "same launch with R_K" against the launch without),
more than the 14 µs step's whole write.  Here each program computes CN output columns of BR rows of
one head (write_bf16.py's _rotated_cols: one fp32 "ieee" tl.dot, the write kernels' arithmetic), query
head h reading R[h // g] (contiguous GQA grouping), key head h R[h]; any float input dtype, fp32 out.
With `store` the same launch also writes a decode step's new K / V rows, rotated and rounded to bf16,
into their BF16 page slots: the programs of bf16_write_kv (the same _rotated_cols calls, so the same
bits), beside the query programs instead of in a launch of their own (bf16_write_kv's 2.4-2.6 µs
launch was the sglang decode step's write at bs 1: +1.7 µs over a 16.6 µs attention on the H200).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._validate import FLOAT_ROWS, check_rotation, check_tensor
from .write_bf16 import _check_kv_rows, _rotated_cols, _rotation_cols, _slot_rows


class NewRows(NamedTuple):
    """A decode step's new rows for rotate_qk(store=...): k, v [N, H_kv, d] in the model's basis (v
    None: K only), stored BF16 at slot (page_ids[i], offsets[i]) of k_pages / v_pages bf16 [P, page,
    H_kv, d]; k rotated by rotate_qk's rotation, v by v_rotation (None: as given, e.g. V absorbed)."""

    k: torch.Tensor
    v: torch.Tensor | None
    v_rotation: torch.Tensor | None
    page_ids: torch.Tensor
    offsets: torch.Tensor
    k_pages: torch.Tensor
    v_pages: torch.Tensor | None


@triton.jit
def _rotate_qk_kernel(q_ptr, k_ptr, r_ptr, qo_ptr, ko_ptr, n_rows, sqn, sqh, skn, skh, srh,
                      xk_ptr, xv_ptr, rv_ptr, page_ptr, off_ptr, ok_ptr, ov_ptr, n_new, sxkn, sxkh, sxvn, sxvh,
                      srvh, sop, soo, soh,
                      HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BR: tl.constexpr, CN: tl.constexpr,
                      KEYS: tl.constexpr, STORE: tl.constexpr, ROTATE_V: tl.constexpr):
    # grid axis 1: HQ query heads, then HKV key heads (KEYS), then STORE x HKV store heads (1: K, 2: K and V)
    h = tl.program_id(1)
    n = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = n < n_rows
    c0 = tl.program_id(2) * CN
    rows = n.to(tl.int64)
    KH: tl.constexpr = HKV if KEYS else 0
    if h < HQ:
        dst = qo_ptr + rows * (HQ * D) + h * D
        _rotated_cols(q_ptr + h * sqh, r_ptr + (h // (HQ // HKV)) * srh, n, rmask, 0, c0, sqn, 0, 0, dst, D, CN,
                      True, False)
    elif h < HQ + KH:
        kh = h - HQ
        dst = ko_ptr + rows * (HKV * D) + kh * D
        _rotated_cols(k_ptr + kh * skh, r_ptr + kh * srh, n, rmask, 0, c0, skn, 0, 0, dst, D, CN, True, False)
    elif STORE:  # bf16_write_kv's program, row block for row block (compiled only with a store)
        _slot_rows(xk_ptr, xv_ptr, r_ptr, rv_ptr, page_ptr, off_ptr, ok_ptr, ov_ptr, n, n < n_new, (h - HQ - KH) % HKV,
                   (h - HQ - KH) // HKV, c0, sxkn, sxkh, sxvn, sxvh, srh, srvh, sop, soo, soh, D, CN, True, ROTATE_V)


def rotate_qk(q: torch.Tensor, rotation: torch.Tensor, k: torch.Tensor | None = None, n_kv_heads: int | None = None,
              block_rows: int = 16, num_warps: int = 4,
              store: NewRows | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(q·R, k·R) fp32 of q [N, Hq, d] and k [N, H_kv, d] (or None) in one launch.

    rotation: fp32 [d, d], or [H_kv, d, d] with query head h using R[h // (Hq / H_kv)].
    n_kv_heads: H_kv when k is None and R is [d, d] (default: k's heads, R's, else Hq).
    Equal to reference.rotate_heads to fp32 rounding (the sums' order differs from torch's matmul).
    store (NewRows): also write those rows as bf16_write_kv(store.k, store.v, rotation,
    store.v_rotation, ...) would, bit for bit, in this launch (their own row count; block_rows 16
    as bf16_write_kv's default).
    Example: q_rot, k_rot = rotate_qk(q, R_K, k)
    """
    check_tensor("q", q, FLOAT_ROWS, ndim=3, device=None)
    if rotation is None:
        raise ValueError("rotation is required (None means the rows are already rotated)")
    n, hq, d = q.shape
    hkv = k.shape[1] if k is not None else (rotation.shape[0] if rotation.ndim == 3 else n_kv_heads or hq)
    if hq % hkv:
        raise ValueError(f"q has {hq} heads, not a multiple of {hkv} KV heads")
    if k is not None:
        check_tensor("k", k, FLOAT_ROWS, shape=(n, hkv, d), device=q.device)
    r = check_rotation("rotation", rotation, d, hkv, q.device)
    st = _check_store(store, hkv, d, q.device) if store is not None else None
    q_out = torch.empty(n, hq, d, dtype=torch.float32, device=q.device)
    k_out = torch.empty(n, hkv, d, dtype=torch.float32, device=q.device) if k is not None else None
    n_new = st[0] if st is not None else 0
    if n == 0 and n_new == 0:
        return q_out, k_out
    if st is not None and block_rows != 16:  # the store programs are bf16_write_kv's, at its default rows
        raise ValueError(f"block_rows must be 16 with store (bf16_write_kv's row block), got {block_rows}")
    cn = _rotation_cols(d)
    kk = k if k is not None else q  # a placeholder pointer the key programs (none) never read
    if st is None:  # placeholders the store programs (not compiled: STORE 0) never read
        n_store, rv, xk, xv, ids, pages, slot_strides = 0, None, q, q, (q_out, q_out), (q_out, q_out), (0, 0, 0)
    else:
        n_store, rv = (2 if store.v is not None else 1), st[1]
        xk, xv = store.k, (store.v if store.v is not None else store.k)
        ids = (store.page_ids, store.offsets)
        pages = (store.k_pages, store.v_pages if store.v_pages is not None else store.k_pages)
        slot_strides = tuple(store.k_pages.stride()[:3])
    grid = (triton.cdiv(max(n, n_new), block_rows), hq + (hkv if k is not None else 0) + n_store * hkv, d // cn)
    _rotate_qk_kernel[grid](q, kk, r, q_out, k_out if k_out is not None else q_out, n, q.stride(0), q.stride(1),
                            kk.stride(0), kk.stride(1), 0 if r.ndim == 2 else d * d,
                            xk, xv, rv if rv is not None else r, *ids, *pages, n_new, xk.stride(0), xk.stride(1),
                            xv.stride(0), xv.stride(1), 0 if rv is None or rv.ndim == 2 else d * d, *slot_strides,
                            HQ=hq, HKV=hkv, D=d, BR=block_rows, CN=cn, KEYS=k is not None, STORE=n_store,
                            ROTATE_V=rv is not None, num_warps=num_warps)
    return q_out, k_out


def _check_store(store: NewRows, hkv: int, d: int, device) -> tuple[int, torch.Tensor | None]:
    """(rows, v rotation) of rotate_qk's store, checked as bf16_write_kv checks its arguments."""
    if not isinstance(store, NewRows):
        raise ValueError(f"store must be a rotate.NewRows, got {type(store).__name__}")
    if store.k.device != device or tuple(store.k.shape[1:]) != (hkv, d):
        raise ValueError(f"store.k must be [N, {hkv}, {d}] on {device}, got {tuple(store.k.shape)} on {store.k.device}")
    n, _, _, rv = _check_kv_rows(store.k, store.v, store.v_rotation, store.page_ids, store.offsets, store.k_pages,
                                 store.v_pages, prefix="store.")
    return n, rv

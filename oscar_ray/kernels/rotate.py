"""rotate_qk: a step's query (and key) rows times R_K in one Triton launch.

int2_decode_attention rotates q into the cache's K basis before reading it.  As torch ops that was
a cast and a matmul (rotate_heads): 5.9 / 9.0 / 3.5 µs at bs 1 / 8 / 32 on an H100 (2026-12-07,
benchmarks/results/raw, the decode table's "same launch with R_K" against the launch without),
more than the 14 µs step's whole write.  Here each program computes CN output columns of BR rows of
one head (write_bf16.py's _rotated_cols: one fp32 "ieee" tl.dot, the write kernels' arithmetic), query
head h reading R[h // g] (contiguous GQA grouping), key head h R[h]; any float input dtype, fp32 out.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._validate import FLOAT_ROWS, check_rotation, check_tensor
from .write_bf16 import _rotated_cols, _rotation_cols


@triton.jit
def _rotate_qk_kernel(q_ptr, k_ptr, r_ptr, qo_ptr, ko_ptr, n_rows, sqn, sqh, skn, skh, srh,
                      HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BR: tl.constexpr, CN: tl.constexpr):
    # grid axis 1: HQ query heads, then HKV key heads (none when k is absent)
    h = tl.program_id(1)
    n = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = n < n_rows
    c0 = tl.program_id(2) * CN
    rows = n.to(tl.int64)
    if h < HQ:
        dst = qo_ptr + rows * (HQ * D) + h * D
        _rotated_cols(q_ptr + h * sqh, r_ptr + (h // (HQ // HKV)) * srh, n, rmask, 0, c0, sqn, 0, 0, dst, D, CN,
                      True, False)
    else:
        kh = h - HQ
        dst = ko_ptr + rows * (HKV * D) + kh * D
        _rotated_cols(k_ptr + kh * skh, r_ptr + kh * srh, n, rmask, 0, c0, skn, 0, 0, dst, D, CN, True, False)


def rotate_qk(q: torch.Tensor, rotation: torch.Tensor, k: torch.Tensor | None = None, n_kv_heads: int | None = None,
              block_rows: int = 16, num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(q·R, k·R) fp32 of q [N, Hq, d] and k [N, H_kv, d] (or None) in one launch.

    rotation: fp32 [d, d], or [H_kv, d, d] with query head h using R[h // (Hq / H_kv)].
    n_kv_heads: H_kv when k is None and R is [d, d] (default: k's heads, R's, else Hq).
    Equal to reference.rotate_heads to fp32 rounding (the sums' order differs from torch's matmul).
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
    q_out = torch.empty(n, hq, d, dtype=torch.float32, device=q.device)
    k_out = torch.empty(n, hkv, d, dtype=torch.float32, device=q.device) if k is not None else None
    if n == 0:
        return q_out, k_out
    cn = _rotation_cols(d)
    kk = k if k is not None else q  # a placeholder pointer the key programs (none) never read
    grid = (triton.cdiv(n, block_rows), hq + (hkv if k is not None else 0), d // cn)
    _rotate_qk_kernel[grid](q, kk, r, q_out, k_out if k_out is not None else q_out, n, q.stride(0), q.stride(1),
                            kk.stride(0), kk.stride(1), 0 if r.ndim == 2 else d * d,
                            HQ=hq, HKV=hkv, D=d, BR=block_rows, CN=cn, num_warps=num_warps)
    return q_out, k_out

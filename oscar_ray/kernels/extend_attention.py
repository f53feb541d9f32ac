"""Extend / prefill attention: a chunk of new tokens over [mixed-cache prefix ‖ itself] (OSCAR_SPEC §5.2).

A program per (block of BLOCK_M chunk queries, query head, request) runs one online softmax over
  1. the request's INT2 prefix tokens, unpacked in registers (non-causal: all precede the chunk),
  2. its BF16 prefix tokens (sink / recent pages, also non-causal),
  3. the chunk's own full-precision K/V, causally (query i sees chunk keys j <= i), stopping at the
     block's last query so the upper triangle costs nothing.
This matches the original's flash_attn_varlen over [dequantised prefix ‖ chunk]: tokens inside a
chunk see each other unquantised.  Requests are batched varlen (qo_indptr), so one launch serves a
whole extend batch; programs past a request's chunk exit at once.  Each query head re-reads its KV
head's tiles (g-fold, mostly from L2).
On CUDA outside graph capture the launcher sends chunks of >= 64 rows the other way (extend_routes.py,
extend_dequant.py): gather the dequantised prefix and the chunk, then torch SDPA; on the H200 that
runs at 0.87-0.96× BF16 SDPA vs this kernel's 0.51-0.54× (decode_h200.md).  Decode rows and short
chunks stay here.
"""

from __future__ import annotations

from functools import partial

import torch
import triton
import triton.language as tl

from ._attn_tiles import _int2_step, _load_q4, _page_bases, _rows_step, _store4
from ._validate import FLOAT_ROWS, check_pow2, check_precision, check_rotation, check_tensor, nonempty_table
from .decode_attention import LOG2E
from .extend_dequant import OUT_DTYPES
from .extend_routes import DEQUANT_MIN_CHUNK, host_lengths_of, run_routes
from .layout import PagedKV, Segments
from .reference import rotate_heads


@triton.jit
def _extend_kernel(q_ptr, kn_ptr, vn_ptr, kc_ptr, ks_ptr, vc_ptr, vs_ptr, kb_ptr, vb_ptr,
                   t2_ptr, l2_ptr, t16_ptr, l16_ptr, indptr_ptr, out_ptr, qk_scale,
                   sqt, sqh, snt, snh, scp, sct, sch, skp, skt, skh, ssp, sst, ssh, sbp, sbt, sbh, st2, st16, sot, soh,
                   GQA: tl.constexpr, PAGE2: tl.constexpr, PAGE16: tl.constexpr, D: tl.constexpr,
                   GS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                   KEY_BITS: tl.constexpr):
    QD: tl.constexpr = D // 4
    m_start = tl.program_id(0) * BLOCK_M
    hq = tl.program_id(1)
    b = tl.program_id(2)
    kh = hq // GQA
    q_start = tl.load(indptr_ptr + b)
    c_len = tl.load(indptr_ptr + b + 1) - q_start
    if m_start < c_len:
        rows = m_start + tl.arange(0, BLOCK_M)
        rmask = rows < c_len
        q_rows = (q_start + rows).to(tl.int64)
        q0, q1, q2, q3, qsum = _load_q4(q_ptr, q_rows * sqt + hq * sqh, rmask, qk_scale, QD, PRECISION)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        a0 = tl.zeros([BLOCK_M, QD], tl.float32)
        a1 = tl.zeros([BLOCK_M, QD], tl.float32)
        a2 = tl.zeros([BLOCK_M, QD], tl.float32)
        a3 = tl.zeros([BLOCK_M, QD], tl.float32)

        n2 = tl.load(l2_ptr + b)
        table2 = t2_ptr + b.to(tl.int64) * st2
        for n0 in range(0, n2, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            nmask = offs < n2
            cbase = _page_bases(table2, offs, nmask, PAGE2, scp, sct, kh * sch)
            sbase = _page_bases(table2, offs, nmask, PAGE2, ssp, sst, kh * ssh)
            if KEY_BITS == 2:
                kbase = cbase
            else:
                kbase = _page_bases(table2, offs, nmask, PAGE2, skp, skt, kh * skh)
            m, l, a0, a1, a2, a3 = _int2_step(q0, q1, q2, q3, qsum, kc_ptr, ks_ptr, vc_ptr, vs_ptr, cbase, kbase,
                                              sbase, nmask, m, l, a0, a1, a2, a3, QD, GS, PRECISION, KEY_BITS)

        n16 = tl.load(l16_ptr + b)
        table16 = t16_ptr + b.to(tl.int64) * st16
        for n0 in range(0, n16, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            nmask = offs < n16
            base = _page_bases(table16, offs, nmask, PAGE16, sbp, sbt, kh * sbh)
            m, l, a0, a1, a2, a3 = _rows_step(q0, q1, q2, q3, kb_ptr, vb_ptr, base, nmask, nmask[None, :],
                                              m, l, a0, a1, a2, a3, QD, PRECISION)

        hi = tl.minimum(c_len, m_start + BLOCK_M)  # causal: no chunk key beyond this block's last query
        for n0 in range(0, hi, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            nmask = offs < hi
            base = (q_start + offs).to(tl.int64) * snt + kh * snh
            keep = nmask[None, :] & (offs[None, :] <= rows[:, None])
            m, l, a0, a1, a2, a3 = _rows_step(q0, q1, q2, q3, kn_ptr, vn_ptr, base, nmask, keep,
                                              m, l, a0, a1, a2, a3, QD, PRECISION)

        inv_l = 1.0 / tl.where(l > 0, l, 1.0)  # l > 0 always: query i sees chunk key 0
        _store4(out_ptr, q_rows * sot + hq * soh, rmask, a0, a1, a2, a3, inv_l, QD)


def int2_extend_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, kv: PagedKV,
                          prefix: Segments, qo_indptr: torch.Tensor | None = None, *, max_chunk: int | None = None,
                          k_rotation: torch.Tensor | None = None, v_rotation: torch.Tensor | None = None,
                          sm_scale: float | None = None, block_m: int | None = None, block_n: int = 32,
                          num_warps: int = 4, num_stages: int = 3, precision: str = "bf16",
                          method: str = "auto", host_lengths: list[tuple[int, int, int]] | None = None) -> torch.Tensor:
    """Chunk queries q [ΣC, Hq, d] over each request's cached prefix and, causally, its own chunk.

    k_new / v_new [ΣC, H_kv, d] are the chunk's K/V at full precision; request b owns rows
    qo_indptr[b] : qo_indptr[b+1] (None: one request, all rows) and the prefix pages of `prefix`
    row b.  All in the rotated basis, unless k_rotation (applied to q and k_new) / v_rotation
    (applied to v_new, and Rᵀ to the output) are given.  Returns o [ΣC, Hq, d] float32.
    max_chunk (the largest C) sizes the grid; without it the launcher reads qo_indptr (a host sync).
    precision "bf16" (default, like the original's flash-attn prefill), "fp16", "tf32" or "ieee"
    (see int2_decode_attention).  Under CUDA graphs pass qo_indptr and max_chunk (no host work).
    block_m None: 128 query rows per program, 64 when max_chunk <= 64.  H200, one 2048 chunk over an
    8K / 32K context (benchmarks/results/extend_sweep_h200.md): 128:32:4:3 (block_m:block_n:warps:
    stages) ran 1388 / 6114 µs vs 1730 / 8258 for the earlier 64:32:4:2, since each unpacked INT2
    tile then serves twice the queries; 256 rows or 16-token tiles are 1.5-3× slower.
    method "fused" runs that kernel; "dequant" gathers each request's [prefix ‖ chunk] K/V in the
    precision's dtype (one Triton launch, extend_dequant.py) and runs torch SDPA per request;
    "mixed" sends requests with chunks of >= 64 rows that way and the rest (decode rows, short
    chunks) through the kernel, as sub-batches; "auto" is "mixed" on CUDA outside graph capture,
    within extend_routes.py's caps, else "fused".  The routes other than "fused" need the lengths on
    the host: host_lengths, (INT2 tokens, BF16 tokens, chunk rows) of each request as the caller's
    scheduler holds them (equal to prefix's lens and qo_indptr), or one sync reading them back.
    Example: o = int2_extend_attention(q, k, v, kv, prefix)        # one request, C = q.shape[0]
    """
    geo = kv.geometry()
    nb = prefix.check(kv.device)
    check_tensor("q", q, FLOAT_ROWS, shape=(None, None, geo.head_dim), device=kv.device)
    c_total, hq, d = q.shape
    hkv = geo.n_kv_heads
    if hq % hkv:
        raise ValueError(f"q has {hq} heads, not a multiple of the cache's {hkv} KV heads")
    check_tensor("k_new", k_new, FLOAT_ROWS, shape=(c_total, hkv, d), device=kv.device)
    check_tensor("v_new", v_new, FLOAT_ROWS, shape=(c_total, hkv, d), device=kv.device)
    if qo_indptr is None:
        if nb != 1:
            raise ValueError(f"qo_indptr is required for a batch of {nb} requests")
        qo_indptr = torch.tensor([0, c_total], dtype=torch.int32, device=q.device)
        max_chunk = c_total
    check_tensor("qo_indptr", qo_indptr, (torch.int32,), shape=(nb + 1,), device=kv.device)
    if max_chunk is None:
        max_chunk = int((qo_indptr[1:] - qo_indptr[:-1]).max()) if nb else 0
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value is not None:
            check_pow2(name, value, minimum=16)
    precision = check_precision(precision)
    if method not in ("auto", "fused", "dequant", "mixed"):
        raise ValueError(f"method must be 'auto', 'fused', 'dequant' or 'mixed', got {method!r}")
    check_rotation("k_rotation", k_rotation, d, hkv, kv.device)
    check_rotation("v_rotation", v_rotation, d, hkv, kv.device)
    if k_rotation is not None:
        q, k_new = rotate_heads(q, k_rotation), rotate_heads(k_new, k_rotation)
    if v_rotation is not None:
        v_new = rotate_heads(v_new, v_rotation)
    if k_new.stride() != v_new.stride():
        v_new = v_new.contiguous()
        k_new = k_new.contiguous()
    out = torch.zeros(c_total, hq, d, dtype=torch.float32, device=q.device)
    if nb == 0 or max_chunk == 0:
        return out
    fused = partial(_launch_fused, kv=kv, geo=geo, block_m=block_m, block_n=block_n, num_warps=num_warps,
                    num_stages=num_stages, precision=precision, sm_scale=sm_scale)
    if method == "auto" and not (q.is_cuda and not torch.cuda.is_current_stream_capturing()
                                 and max_chunk >= DEQUANT_MIN_CHUNK):
        method = "fused"  # off the GPU, under capture, or no chunk long enough to gather for
    if method == "fused":
        fused(q, k_new, v_new, prefix, qo_indptr, max_chunk, out)
    else:
        lengths = host_lengths_of(prefix, qo_indptr, nb, host_lengths)
        scale = d**-0.5 if sm_scale is None else sm_scale
        run_routes(method, q, k_new, v_new, kv, prefix, qo_indptr, lengths, OUT_DTYPES[precision], scale, out, fused)
    return out if v_rotation is None else rotate_heads(out, v_rotation, transpose=True)


def _launch_fused(q, k_new, v_new, prefix, qo_indptr, max_chunk, out, *, kv, geo, block_m, block_n, num_warps,
                  num_stages, precision, sm_scale) -> None:
    """The one-kernel extend of a (sub-)batch, rows in the rotated basis, into out."""
    hq, d, hkv, nb = q.shape[1], q.shape[2], geo.n_kv_heads, prefix.batch
    if block_m is None:  # per (sub-)batch: a mixed batch's short part gets 64-row blocks
        block_m = 64 if max_chunk <= 64 else 128
    t2, t16 = nonempty_table(prefix.int2_page_table), nonempty_table(prefix.bf16_page_table)
    qk_scale = (d**-0.5 if sm_scale is None else sm_scale) * LOG2E
    grid = (triton.cdiv(max_chunk, block_m), hq, nb)
    _extend_kernel[grid](
        q, k_new, v_new, kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, kv.k_bf16, kv.v_bf16,
        t2, prefix.int2_lens, t16, prefix.bf16_lens, qo_indptr, out, qk_scale,
        q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1), *kv.v_codes.stride()[:3],
        *kv.k_codes.stride()[:3], *kv.k_scales.stride()[:3], *kv.k_bf16.stride()[:3], t2.stride(0), t16.stride(0),
        out.stride(0), out.stride(1),
        GQA=hq // hkv, PAGE2=geo.int2_page_size, PAGE16=geo.bf16_page_size, D=d, GS=geo.group_size,
        BLOCK_M=block_m, BLOCK_N=block_n, PRECISION=precision, KEY_BITS=geo.key_bits, num_warps=num_warps,
        num_stages=num_stages)

"""Row packing for small GQA groups: SUB token sub-tiles share the 16 MMA rows (decode stage 1).

tl.dot needs 16 rows, and a KV head of Qwen3-8B has 4 query heads, so the plain tile computes 12 of
16 score rows for nothing: the softmax, scale and reduction work on a [16, N] tile is 75% padding.
Packed, row r = j·G + h (G = BLOCK_H / SUB ≥ g rows per sub-tile, h < g real) holds query head h
against sub-tile j of the tile's SUB·N tokens: every dot still multiplies all 16 q rows (the MMA
count per token is unchanged), but each row keeps only its own sub-tile's scores (a select), so the
softmax runs on [16, N] for SUB·N tokens.  Each row carries its own online-softmax state (m, l, acc),
like a split; `_merge_packed_rows` joins the SUB rows of a head with the usual LSE weights at the end.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._attn_tiles import _qk4, _softmax_p
from ._mma import _mm, _op
from ._unpack import CODE_OFFSET, _codes4, _codes4_offset


@triton.jit
def _sub_pages(table, offs, nmask, PAGE: tl.constexpr):
    """Page ids (int64 [N]) and in-page offsets of one sub-tile's tokens: one table load serves every stream."""
    return tl.load(table + offs // PAGE, mask=nmask, other=0).to(tl.int64), offs % PAGE


@triton.jit
def _sub_codes(ptr, page, slot, nmask, s_page, s_tok, head_off, QD: tl.constexpr, TRANS: tl.constexpr,
               PRECISION: tl.constexpr, BITS: tl.constexpr):
    base = page * s_page + slot * s_tok + head_off
    if PRECISION == "bf16" or PRECISION == "bf16_interp":
        return _codes4_offset(ptr, base, nmask, QD, TRANS, PRECISION, BITS)
    return _codes4(ptr, base, nmask, QD, TRANS, PRECISION, BITS)


@triton.jit
def _sub_scales(ptr, base, nmask, PRECISION: tl.constexpr):
    """(s, z [+ CODE_OFFSET]) of one sub-tile's tokens, fp32 [N] each."""
    s = tl.load(ptr + base, mask=nmask, other=0.0).to(tl.float32)
    z = tl.load(ptr + base + 1, mask=nmask, other=0.0).to(tl.float32)
    if PRECISION == "bf16" or PRECISION == "bf16_interp":
        z = z + CODE_OFFSET
    return s, z


@triton.jit
def _int2_step_packed(q0, q1, q2, q3, qsum, kc_ptr, ks_ptr, vc_ptr, vs_ptr, table, n0, end, rsub, m, l,
                      a0, a1, a2, a3, s_page, s_tok, sk_page, sk_tok, ss_page, ss_tok, c_off, kc_off, s_off,
                      R: tl.constexpr, PAGE: tl.constexpr, QD: tl.constexpr, SUB: tl.constexpr,
                      BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, KEY_BITS: tl.constexpr):
    """One tile of SUB·BLOCK_N INT2 tokens (one (s, z) group per row) for the packed rows (rsub [R]:
    each row's sub-tile).  Same algebra as _attn_tiles._int2_step, per sub-tile."""
    cols = tl.arange(0, BLOCK_N)
    sel = rsub[:, None]
    qc = tl.zeros([R, BLOCK_N], tl.float32)
    ks = tl.zeros([R, BLOCK_N], tl.float32)
    kz = tl.zeros([R, BLOCK_N], tl.float32)
    valid = tl.zeros([R, BLOCK_N], tl.int1)
    vs = tl.zeros([R, BLOCK_N], tl.float32)
    vz = tl.zeros([R, BLOCK_N], tl.float32)
    for j in tl.static_range(SUB):
        offs = n0 + j * BLOCK_N + cols
        nmask = offs < end
        page, slot = _sub_pages(table, offs, nmask, PAGE)
        k0, k1, k2, k3 = _sub_codes(kc_ptr, page, slot, nmask, sk_page, sk_tok, kc_off, QD, True, PRECISION,
                                    KEY_BITS)
        sbase = page * ss_page + slot * ss_tok + s_off
        s_j, z_j = _sub_scales(ks_ptr, sbase, nmask, PRECISION)
        t_j, u_j = _sub_scales(vs_ptr, sbase, nmask, PRECISION)  # V's (s, z) too: same rows, loaded early
        mine = sel == j
        qc = tl.where(mine, _qk4(q0, q1, q2, q3, k0, k1, k2, k3, PRECISION), qc)
        ks = tl.where(mine, s_j[None, :], ks)
        kz = tl.where(mine, z_j[None, :], kz)
        vs = tl.where(mine, t_j[None, :], vs)
        vz = tl.where(mine, u_j[None, :], vz)
        valid = tl.where(mine, nmask[None, :], valid)
    qk = tl.where(valid, ks * (qc - kz * qsum[:, None]), float("-inf"))
    m, alpha, p, l = _softmax_p(qk, m, l)
    ps = _op(p * vs, PRECISION)
    corr = tl.sum(ps.to(tl.float32) * vz, 1)[:, None]
    a0 = a0 * alpha[:, None] - corr
    a1 = a1 * alpha[:, None] - corr
    a2 = a2 * alpha[:, None] - corr
    a3 = a3 * alpha[:, None] - corr
    for j in tl.static_range(SUB):
        offs = n0 + j * BLOCK_N + cols
        nmask = offs < end
        page, slot = _sub_pages(table, offs, nmask, PAGE)
        v0, v1, v2, v3 = _sub_codes(vc_ptr, page, slot, nmask, s_page, s_tok, c_off, QD, False, PRECISION, 2)
        pj = tl.where(sel == j, ps, tl.zeros_like(ps))
        a0 = _mm(pj, v0, a0, PRECISION)
        a1 = _mm(pj, v1, a1, PRECISION)
        a2 = _mm(pj, v2, a2, PRECISION)
        a3 = _mm(pj, v3, a3, PRECISION)
    return m, l, a0, a1, a2, a3


@triton.jit
def _merge_one(a, w, inv, SUB: tl.constexpr, G: tl.constexpr, QD: tl.constexpr):
    return tl.sum(tl.reshape(a, [SUB, G, QD]) * w[:, :, None], 0) * inv[:, None]


@triton.jit
def _merge_packed_rows(m, l, a0, a1, a2, a3, SUB: tl.constexpr, G: tl.constexpr, QD: tl.constexpr):
    """Join the SUB rows of each head: (normalised quarters [G, QD] ×4, log2-sum-exp [G]; −inf if empty)."""
    m2 = tl.reshape(m, [SUB, G])
    l2 = tl.reshape(l, [SUB, G])
    top = tl.max(m2, 0)
    ref = tl.where(top == float("-inf"), 0.0, top)
    w = tl.where(m2 == float("-inf"), 0.0, tl.exp2(m2 - ref[None, :]))
    total = tl.sum(w * l2, 0)
    inv = tl.where(total > 0, 1.0 / tl.where(total > 0, total, 1.0), 0.0)
    lse = tl.where(total > 0, ref + tl.log2(tl.where(total > 0, total, 1.0)), float("-inf"))
    return (_merge_one(a0, w, inv, SUB, G, QD), _merge_one(a1, w, inv, SUB, G, QD),
            _merge_one(a2, w, inv, SUB, G, QD), _merge_one(a3, w, inv, SUB, G, QD), lse)

"""Triton device functions shared by the decode and extend attention kernels.

Every head vector is handled as its four quarters of QD = d/4 columns, because byte b of a packed
row holds elements b, b+d/4, b+d/2, b+3d/4: unpacking a [N, d/4] byte tile yields the four quarters
directly, and q·kᵀ = Σ_k q_k·k_kᵀ (four tl.dot of K extent d/4, the same MMA count as one of
extent d) re-joins them without any register shuffle.  BF16 tiles are loaded as quarters too, so
the accumulators and the online softmax are shared by both tiers.  Scores are kept in the log2
domain (q pre-scaled by sm_scale·log2 e) so the softmax uses exp2.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._mma import _mm, _op
from ._unpack import CODE_OFFSET, _codes4, _codes4_offset


@triton.jit
def _load_q4(q_ptr, row_off, rmask, qk_scale, QD: tl.constexpr, PRECISION: tl.constexpr):
    """Quarters [R, QD] of the R query rows at q_ptr + row_off, pre-scaled by qk_scale and rounded to
    the dot operand once (not once per key tile), and Σ_i q_i [R] of those rounded values."""
    col = tl.arange(0, QD)
    ptrs = q_ptr + row_off[:, None] + col[None, :]
    m2 = rmask[:, None]
    q0 = _op(tl.load(ptrs, mask=m2, other=0.0).to(tl.float32) * qk_scale, PRECISION)
    q1 = _op(tl.load(ptrs + QD, mask=m2, other=0.0).to(tl.float32) * qk_scale, PRECISION)
    q2 = _op(tl.load(ptrs + 2 * QD, mask=m2, other=0.0).to(tl.float32) * qk_scale, PRECISION)
    q3 = _op(tl.load(ptrs + 3 * QD, mask=m2, other=0.0).to(tl.float32) * qk_scale, PRECISION)
    qsum = (tl.sum(q0.to(tl.float32), 1) + tl.sum(q1.to(tl.float32), 1) + tl.sum(q2.to(tl.float32), 1)
            + tl.sum(q3.to(tl.float32), 1))
    return q0, q1, q2, q3, qsum


@triton.jit
def _page_bases(table_ptr, offs, nmask, PAGE: tl.constexpr, s_page, s_tok, head_off):
    """Element offsets (int64 [N]) of tokens `offs` of one request/head: page = table[t // PAGE]."""
    page = tl.load(table_ptr + offs // PAGE, mask=nmask, other=0).to(tl.int64)
    return page * s_page + (offs % PAGE) * s_tok + head_off


@triton.jit
def _load_rows4(ptr, base, nmask, QD: tl.constexpr, TRANS: tl.constexpr, PRECISION: tl.constexpr):
    """Full-precision rows at ptr + base as dot-operand quarters: [QD, N] each when TRANS (keys),
    else [N, QD].  bf16 rows stay bf16 in "bf16" mode (no fp32 round trip in registers)."""
    col = tl.arange(0, QD)
    if TRANS:
        ptrs = ptr + base[None, :] + col[:, None]
        m2 = nmask[None, :]
    else:
        ptrs = ptr + base[:, None] + col[None, :]
        m2 = nmask[:, None]
    x0 = _op(tl.load(ptrs, mask=m2, other=0.0), PRECISION)
    x1 = _op(tl.load(ptrs + QD, mask=m2, other=0.0), PRECISION)
    x2 = _op(tl.load(ptrs + 2 * QD, mask=m2, other=0.0), PRECISION)
    x3 = _op(tl.load(ptrs + 3 * QD, mask=m2, other=0.0), PRECISION)
    return x0, x1, x2, x3


@triton.jit
def _group_dequant(c, scales_ptr, sbase, m2, col, K: tl.constexpr, QD: tl.constexpr, GS: tl.constexpr,
                   TRANS: tl.constexpr):
    """(c − z)·s for quarter K when a row has several groups: column b of quarter K is group (K·QD+b)//GS."""
    grp2 = 2 * ((K * QD + col) // GS)
    if TRANS:
        sp = scales_ptr + sbase[None, :] + grp2[:, None]
    else:
        sp = scales_ptr + sbase[:, None] + grp2[None, :]
    s = tl.load(sp, mask=m2, other=0.0).to(tl.float32)
    z = tl.load(sp + 1, mask=m2, other=0.0).to(tl.float32)
    return (c.to(tl.float32) - z) * s


@triton.jit
def _dequant4(codes_ptr, scales_ptr, cbase, sbase, nmask, QD: tl.constexpr, GS: tl.constexpr,
              TRANS: tl.constexpr, BITS: tl.constexpr = 2):
    """Dequantised fp32 quarters (c − z)·s of N packed rows with several (s, z) groups per row.

    Masked tokens read codes 0 and s = z = 0, so they dequantise to 0, never NaN (V must stay finite).
    """
    c0, c1, c2, c3 = _codes4(codes_ptr, cbase, nmask, QD, TRANS, "ieee", BITS)
    col = tl.arange(0, QD)
    m2 = nmask[None, :] if TRANS else nmask[:, None]
    return (_group_dequant(c0, scales_ptr, sbase, m2, col, 0, QD, GS, TRANS),
            _group_dequant(c1, scales_ptr, sbase, m2, col, 1, QD, GS, TRANS),
            _group_dequant(c2, scales_ptr, sbase, m2, col, 2, QD, GS, TRANS),
            _group_dequant(c3, scales_ptr, sbase, m2, col, 3, QD, GS, TRANS))


@triton.jit
def _qk4(q0, q1, q2, q3, k0, k1, k2, k3, PRECISION: tl.constexpr):
    """Scores [R, N] = Σ_k q_k [R, QD] · k_k [QD, N]."""
    s = _mm(q0, k0, None, PRECISION)
    s = _mm(q1, k1, s, PRECISION)
    s = _mm(q2, k2, s, PRECISION)
    return _mm(q3, k3, s, PRECISION)


@triton.jit
def _softmax_p(qk, m, l):
    """Online-softmax bookkeeping for log2-domain scores qk [R, N] (−inf = masked): (m', α, p, l')."""
    m_new = tl.maximum(m, tl.max(qk, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet stays at l = 0, no NaN
    alpha = tl.exp2(m - m_ref)
    p = tl.exp2(qk - m_ref[:, None])
    return m_new, alpha, p, l * alpha + tl.sum(p, 1)


@triton.jit
def _pv4(p, v0, v1, v2, v3, a0, a1, a2, a3, alpha, corr, PRECISION: tl.constexpr):
    """a_k ← α·a_k − corr + p·v_k for the four quarters (corr [R, 1] or a scalar 0)."""
    a0 = _mm(p, v0, a0 * alpha[:, None] - corr, PRECISION)
    a1 = _mm(p, v1, a1 * alpha[:, None] - corr, PRECISION)
    a2 = _mm(p, v2, a2 * alpha[:, None] - corr, PRECISION)
    a3 = _mm(p, v3, a3 * alpha[:, None] - corr, PRECISION)
    return a0, a1, a2, a3


@triton.jit
def _rows_step(q0, q1, q2, q3, k_ptr, v_ptr, base, nmask, keep, m, l, a0, a1, a2, a3,
               QD: tl.constexpr, PRECISION: tl.constexpr):
    """One tile of full-precision K/V rows at base [N]; keep [R, N] (or [1, N]) masks scores."""
    k0, k1, k2, k3 = _load_rows4(k_ptr, base, nmask, QD, True, PRECISION)
    qk = tl.where(keep, _qk4(q0, q1, q2, q3, k0, k1, k2, k3, PRECISION), float("-inf"))
    m, alpha, p, l = _softmax_p(qk, m, l)
    v0, v1, v2, v3 = _load_rows4(v_ptr, base, nmask, QD, False, PRECISION)
    a0, a1, a2, a3 = _pv4(p, v0, v1, v2, v3, a0, a1, a2, a3, alpha, 0.0, PRECISION)
    return m, l, a0, a1, a2, a3


@triton.jit
def _int2_step(q0, q1, q2, q3, qsum, kc_ptr, ks_ptr, vc_ptr, vs_ptr, cbase, kcbase, sbase, nmask, m, l,
               a0, a1, a2, a3, QD: tl.constexpr, GS: tl.constexpr, PRECISION: tl.constexpr, KEY_BITS: tl.constexpr):
    """One tile of N packed INT2 tokens (codes at cbase, key codes at kcbase, (s, z) at sbase) for
    query rows q [R, ·].  KEY_BITS 3: keys carry a third bit plane (_unpack._plane); values are INT2.

    One group per row (GS = d, the default layout): the scales factor out of both dots,
        q·k_n = s_n·(q·c_n − z_n·Σq)      p·V = (p∘s)·C − Σ_n p_n s_n z_n,
    so the MMAs read the raw codes (exact as bf16/fp16) and dequantisation costs O(R·N) instead of
    O(N·d) per tile: 16·64 vs 64·128·2 element ops at BLOCK_H 16, BLOCK_N 64, d 128.  Several groups
    per row fall back to dequantising each element.
    """
    if GS == 4 * QD:
        OFFSET: tl.constexpr = PRECISION == "bf16" or PRECISION == "bf16_interp"
        if OFFSET:
            k0, k1, k2, k3 = _codes4_offset(kc_ptr, kcbase, nmask, QD, True, PRECISION, KEY_BITS)
        else:
            k0, k1, k2, k3 = _codes4(kc_ptr, kcbase, nmask, QD, True, PRECISION, KEY_BITS)
        ks = tl.load(ks_ptr + sbase, mask=nmask, other=0.0).to(tl.float32)
        kz = tl.load(ks_ptr + sbase + 1, mask=nmask, other=0.0).to(tl.float32)
        if OFFSET:
            kz = kz + CODE_OFFSET
        qc = _qk4(q0, q1, q2, q3, k0, k1, k2, k3, PRECISION)
        qk = tl.where(nmask[None, :], ks[None, :] * (qc - kz[None, :] * qsum[:, None]), float("-inf"))
        m, alpha, p, l = _softmax_p(qk, m, l)
        vs = tl.load(vs_ptr + sbase, mask=nmask, other=0.0).to(tl.float32)
        vz = tl.load(vs_ptr + sbase + 1, mask=nmask, other=0.0).to(tl.float32)
        if OFFSET:
            vz = vz + CODE_OFFSET
        ps = _op(p * vs[None, :], PRECISION)
        corr = tl.sum(ps.to(tl.float32) * vz[None, :], 1)[:, None]
        if OFFSET:
            v0, v1, v2, v3 = _codes4_offset(vc_ptr, cbase, nmask, QD, False, PRECISION)
        else:
            v0, v1, v2, v3 = _codes4(vc_ptr, cbase, nmask, QD, False, PRECISION)
        a0, a1, a2, a3 = _pv4(ps, v0, v1, v2, v3, a0, a1, a2, a3, alpha, corr, PRECISION)
    else:
        k0, k1, k2, k3 = _dequant4(kc_ptr, ks_ptr, kcbase, sbase, nmask, QD, GS, True, KEY_BITS)
        qk = tl.where(nmask[None, :], _qk4(q0, q1, q2, q3, k0, k1, k2, k3, PRECISION), float("-inf"))
        m, alpha, p, l = _softmax_p(qk, m, l)
        v0, v1, v2, v3 = _dequant4(vc_ptr, vs_ptr, cbase, sbase, nmask, QD, GS, False)
        a0, a1, a2, a3 = _pv4(p, v0, v1, v2, v3, a0, a1, a2, a3, alpha, 0.0, PRECISION)
    return m, l, a0, a1, a2, a3


@triton.jit
def _store4(ptr, row_off, rmask, a0, a1, a2, a3, scale, QD: tl.constexpr):
    """Store the quarters a_k [R, QD] · scale[:, None] as contiguous d-vectors at ptr + row_off."""
    col = tl.arange(0, QD)
    ptrs = ptr + row_off[:, None] + col[None, :]
    m2 = rmask[:, None]
    tl.store(ptrs, a0 * scale[:, None], mask=m2)
    tl.store(ptrs + QD, a1 * scale[:, None], mask=m2)
    tl.store(ptrs + 2 * QD, a2 * scale[:, None], mask=m2)
    tl.store(ptrs + 3 * QD, a3 * scale[:, None], mask=m2)

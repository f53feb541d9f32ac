"""The INT2 decode step with tokens as the MMA's M side: scores S^T = C·q^T [N, R], not q·C^T [R, N].

Why (sm_90 SASS of the stage-1 loop, BLOCK_N 128, 4 warps, ptxas via Triton 3.6): with q as the A
operand, ptxas kept the loop-invariant q fragments outside the HMMA register quads and copied them
in before every one of the 32 QK HMMAs per warp and tile (~190 IMAD.MOV of 1175 instructions).  As
the B operand, q^T needs aligned pairs only, and the A operand is the freshly unpacked codes, which
the unpack writes straight into place.  The algebra is _attn_tiles._int2_step's one-group case.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._attn_tiles import CODE_OFFSET, _codes4, _codes4_offset, _mm, _op


@triton.jit
def _int2_step_t(qt0, qt1, qt2, qt3, qsum, kc_ptr, ks_ptr, vc_ptr, vs_ptr, cbase, sbase, nmask, m, l,
                 a0, a1, a2, a3, QD: tl.constexpr, PRECISION: tl.constexpr):
    """One tile of N packed INT2 tokens (one (s, z) group per row); qt_k = q_k^T [QD, R]."""
    OFFSET: tl.constexpr = PRECISION == "bf16" or PRECISION == "bf16_interp"
    if OFFSET:
        k0, k1, k2, k3 = _codes4_offset(kc_ptr, cbase, nmask, QD, False, PRECISION)
    else:
        k0, k1, k2, k3 = _codes4(kc_ptr, cbase, nmask, QD, False, PRECISION)
    ks = tl.load(ks_ptr + sbase, mask=nmask, other=0.0).to(tl.float32)
    kz = tl.load(ks_ptr + sbase + 1, mask=nmask, other=0.0).to(tl.float32)
    if OFFSET:
        kz = kz + CODE_OFFSET
    qc = _mm(k0, qt0, None, PRECISION)  # [N, R]
    qc = _mm(k1, qt1, qc, PRECISION)
    qc = _mm(k2, qt2, qc, PRECISION)
    qc = _mm(k3, qt3, qc, PRECISION)
    qk = tl.where(nmask[:, None], ks[:, None] * (qc - kz[:, None] * qsum[None, :]), float("-inf"))
    m_new = tl.maximum(m, tl.max(qk, 0))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet stays at l = 0, no NaN
    alpha = tl.exp2(m - m_ref)
    p = tl.exp2(qk - m_ref[None, :])
    l = l * alpha + tl.sum(p, 0)
    vs = tl.load(vs_ptr + sbase, mask=nmask, other=0.0).to(tl.float32)
    vz = tl.load(vs_ptr + sbase + 1, mask=nmask, other=0.0).to(tl.float32)
    if OFFSET:
        vz = vz + CODE_OFFSET
    ps = _op(p * vs[:, None], PRECISION)  # [N, R]
    corr = tl.sum(ps.to(tl.float32) * vz[:, None], 0)[:, None]
    if OFFSET:
        v0, v1, v2, v3 = _codes4_offset(vc_ptr, cbase, nmask, QD, False, PRECISION)
    else:
        v0, v1, v2, v3 = _codes4(vc_ptr, cbase, nmask, QD, False, PRECISION)
    pt = tl.trans(ps)  # [R, N]
    al = alpha[:, None]
    a0 = _mm(pt, v0, a0 * al - corr, PRECISION)
    a1 = _mm(pt, v1, a1 * al - corr, PRECISION)
    a2 = _mm(pt, v2, a2 * al - corr, PRECISION)
    a3 = _mm(pt, v3, a3 * al - corr, PRECISION)
    return m_new, l, a0, a1, a2, a3

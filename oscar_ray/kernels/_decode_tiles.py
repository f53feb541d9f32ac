"""INT2 decode steps with tokens as the MMA's M side: scores S^T = C·q^T [N, R], not q·C^T [R, N].

Why (sm_90 SASS of the stage-1 loop, BLOCK_N 128, 4 warps, ptxas via Triton 3.6): with q as the A
operand, ptxas kept the loop-invariant q fragments outside the HMMA register quads and copied them
in before every one of the 32 QK HMMAs per warp and tile (~190 IMAD.MOV of 1175 instructions).  As
the B operand, q^T needs aligned pairs only, and the A operand is the freshly unpacked codes, which
the unpack writes straight into place.  The algebra is _attn_tiles._int2_step's one-group case.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._attn_tiles import CODE_OFFSET, _codes4, _codes4_offset, _mm, _op, _page_bases


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


@triton.jit
def _join4(c0, c1, c2, c3):
    """Quarters c_k [N, QD] → the full rows [N, 4·QD] in element order (column k·QD + b = c_k[:, b])."""
    x = tl.join(tl.join(c0, c1), tl.join(c2, c3))  # [N, QD, 2 (k % 2), 2 (k // 2)]
    return tl.reshape(tl.permute(x, (0, 3, 2, 1)), (x.shape[0], 4 * x.shape[1]))


@triton.jit
def _join4_t(c0, c1, c2, c3):
    """_join4's transpose [4·QD, N], built as one reshape (see _int2_step_staged for why K takes this form)."""
    x = tl.join(tl.join(c0, c1), tl.join(c2, c3))
    return tl.reshape(tl.permute(x, (3, 2, 1, 0)), (4 * x.shape[1], x.shape[0]))


@triton.jit
def _int2_step_staged(qt, qsum, kc_ptr, ks_ptr, vc_ptr, vs_ptr, cbase, sbase, nmask, m, l, ot,
                      QD: tl.constexpr, PRECISION: tl.constexpr, MASKED: tl.constexpr):
    """One tile, both products with tokens / dims on the M side: S^T = C_K·q^T [N, R], O^T += C_V^T·P^T [d, R].

    At BLOCK_N 128 and 4 warps Triton 3.6 emits wgmma (m64n16k16) for both, B = q^T / P^T from shared
    memory.  The codes are unpacked in their load layout (4 bytes of one token per thread) and staged
    through shared memory as bf16.  For K that needs the unpack marked impure: as a pure op Triton
    re-assigned it the register-A layout, which gathers single bytes (LDS.U16 + 64 PRMT per warp per
    tile).  sm_90 SASS of the loop per warp per 128-token tile: 943 instructions (q as A: 1319 before
    the lop3 unpack, 1175 after; _int2_step_t: 1142), 164 registers.
    """
    OFFSET: tl.constexpr = PRECISION == "bf16" or PRECISION == "bf16_interp"
    if OFFSET:
        k0, k1, k2, k3 = _codes4_offset(kc_ptr, cbase, nmask, QD, False, PRECISION, False)
    else:
        k0, k1, k2, k3 = _codes4(kc_ptr, cbase, nmask, QD, False, PRECISION)
    ks = tl.load(ks_ptr + sbase, mask=nmask, other=0.0).to(tl.float32)
    kz = tl.load(ks_ptr + sbase + 1, mask=nmask, other=0.0).to(tl.float32)
    if OFFSET:
        kz = kz + CODE_OFFSET
    qc = _mm(tl.trans(_join4_t(k0, k1, k2, k3)), qt, None, PRECISION)  # [N, R]
    qk = ks[:, None] * (qc - kz[:, None] * qsum[None, :])
    if MASKED:
        qk = tl.where(nmask[:, None], qk, float("-inf"))
    m_new = tl.maximum(m, tl.max(qk, 0))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_ref)
    p = tl.exp2(qk - m_ref[None, :])
    l = l * alpha + tl.sum(p, 0)
    vs = tl.load(vs_ptr + sbase, mask=nmask, other=0.0).to(tl.float32)
    vz = tl.load(vs_ptr + sbase + 1, mask=nmask, other=0.0).to(tl.float32)
    if OFFSET:
        vz = vz + CODE_OFFSET
    ps = _op(p * vs[:, None], PRECISION)  # [N, R]
    corr = tl.sum(ps.to(tl.float32) * vz[:, None], 0)
    if OFFSET:
        v0, v1, v2, v3 = _codes4_offset(vc_ptr, cbase, nmask, QD, False, PRECISION)
    else:
        v0, v1, v2, v3 = _codes4(vc_ptr, cbase, nmask, QD, False, PRECISION)
    vt = tl.trans(_join4(v0, v1, v2, v3))  # [d, N]
    ot = _mm(vt, ps, ot * alpha[None, :] - corr[None, :], PRECISION)
    return m_new, l, ot


@triton.jit
def _int2_partial_staged(q_ptr, k_ptr, ks_ptr, v_ptr, vs_ptr, table_ptr, lens_ptr, mid_o_ptr, mid_lse_ptr,
                         qk_scale, sqb, sqh, s_page, s_tok, s_head, ss_page, ss_tok, ss_head, s_table,
                         n_q_heads, b, kh, split, total_splits,
                         GQA: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """decode_attention._tier_partial for the INT2 tier with _int2_step_staged (one (s, z) group per row)."""
    QD: tl.constexpr = D // 4
    seq_len = tl.load(lens_ptr + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    hj = tl.arange(0, BLOCK_H)
    hmask = hj < GQA
    heads = kh * GQA + hj
    dp = tl.arange(0, D)
    qptrs = q_ptr + b * sqb + heads[None, :] * sqh + dp[:, None]
    qt = _op(tl.load(qptrs, mask=hmask[None, :], other=0.0).to(tl.float32) * qk_scale, PRECISION)  # [D, R]
    qsum = tl.sum(qt.to(tl.float32), 0)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    ot = tl.zeros([D, BLOCK_H], tl.float32)
    table = table_ptr + b.to(tl.int64) * s_table
    # whole tiles without masks (no select on the scores, unmasked loads), then one masked tail tile
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
    for n0 in range(start, full_end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        nmask = offs < end
        base = _page_bases(table, offs, nmask, PAGE, s_page, s_tok, kh * s_head)
        sbase = _page_bases(table, offs, nmask, PAGE, ss_page, ss_tok, kh * ss_head)
        m, l, ot = _int2_step_staged(qt, qsum, k_ptr, ks_ptr, v_ptr, vs_ptr, base, sbase, nmask, m, l, ot,
                                     QD, PRECISION, False)
    if full_end < end:
        offs = full_end + tl.arange(0, BLOCK_N)
        nmask = offs < end
        base = _page_bases(table, offs, nmask, PAGE, s_page, s_tok, kh * s_head)
        sbase = _page_bases(table, offs, nmask, PAGE, ss_page, ss_tok, kh * ss_head)
        m, l, ot = _int2_step_staged(qt, qsum, k_ptr, ks_ptr, v_ptr, vs_ptr, base, sbase, nmask, m, l, ot,
                                     QD, PRECISION, True)
    row = (b * n_q_heads + heads).to(tl.int64) * total_splits + split  # [R]
    inv_l = tl.where(l > 0, 1.0 / tl.where(l > 0, l, 1.0), 0.0)
    tl.store(mid_o_ptr + row[None, :] * D + dp[:, None], ot * inv_l[None, :], mask=hmask[None, :])
    lse = tl.where(l > 0, m + tl.log2(tl.where(l > 0, l, 1.0)), float("-inf"))
    tl.store(mid_lse_ptr + row, lse, mask=hmask)

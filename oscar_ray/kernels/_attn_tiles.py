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


@triton.jit
def _round_tf32(x):
    """Round fp32 to tf32 (10 mantissa bits, to nearest, ties away) so the MMA's own rounding is exact."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + 0x1000) & -8192).to(tl.float32, bitcast=True)  # -8192 = 0xFFFFE000


@triton.jit
def _op(x, PRECISION: tl.constexpr):
    """x (any float dtype) as the dot operand it will be: bf16 / fp16, or fp32 already rounded as the
    MMA rounds.  Factored sums (Σq, Σ p·s·z below) must use the same rounded numbers as their dots."""
    if PRECISION == "bf16":
        return x.to(tl.bfloat16)
    elif PRECISION == "fp16":
        return x.to(tl.float16)
    elif PRECISION == "bf16_interp":
        return x.to(tl.bfloat16).to(tl.float32)
    elif PRECISION == "tf32":
        return _round_tf32(x.to(tl.float32))
    else:
        return x.to(tl.float32)


@triton.jit
def _mm(a, b, acc, PRECISION: tl.constexpr):
    """acc + a·b with fp32 accumulation: "ieee" fp32 FMA, "tf32" / "bf16" / "fp16" tensor cores."""
    if PRECISION == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    elif PRECISION == "fp16":
        return tl.dot(a.to(tl.float16), b.to(tl.float16), acc)
    elif PRECISION == "bf16_interp":
        # the Triton 3.6 interpreter multiplies bf16 bit patterns (stored as uint16) as integers, so
        # under TRITON_INTERPRET the bf16 rounding is emulated on fp32 operands (_validate.py)
        return tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc, input_precision=PRECISION)


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
def _codes4(codes_ptr, cbase, nmask, QD: tl.constexpr, TRANS: tl.constexpr, PRECISION: tl.constexpr,
            BITS: tl.constexpr = 2):
    """The four code quarters of N packed rows as dot operands (0..7 is exact in every precision):
    [QD, N] each when TRANS (keys), else [N, QD].  Masked tokens read code 0.  BITS 3 adds the bit
    plane after the d/4 quartered bytes: quarter k's high bits are bits 2k (columns < d/8) and 2k+1
    of bytes col mod d/8 (quant/int2.pack_codes)."""
    col = tl.arange(0, QD)
    if TRANS:
        packed = tl.load(codes_ptr + cbase[None, :] + col[:, None], mask=nmask[None, :], other=0).to(tl.int32)
    else:
        packed = tl.load(codes_ptr + cbase[:, None] + col[None, :], mask=nmask[:, None], other=0).to(tl.int32)
    c0 = packed & 3
    c1 = (packed >> 2) & 3
    c2 = (packed >> 4) & 3
    c3 = (packed >> 6) & 3
    if BITS == 3:
        E: tl.constexpr = QD // 2
        half = col // E  # 0 for the first d/8 columns of a quarter, 1 for the rest
        if TRANS:
            plane = tl.load(codes_ptr + cbase[None, :] + QD + (col % E)[:, None], mask=nmask[None, :],
                            other=0).to(tl.int32)
            half = half[:, None]
        else:
            plane = tl.load(codes_ptr + cbase[:, None] + QD + (col % E)[None, :], mask=nmask[:, None],
                            other=0).to(tl.int32)
            half = half[None, :]
        c0 = c0 | (((plane >> half) & 1) << 2)
        c1 = c1 | (((plane >> (2 + half)) & 1) << 2)
        c2 = c2 | (((plane >> (4 + half)) & 1) << 2)
        c3 = c3 | (((plane >> (6 + half)) & 1) << 2)
    return (_op(c0.to(tl.float32), PRECISION), _op(c1.to(tl.float32), PRECISION),
            _op(c2.to(tl.float32), PRECISION), _op(c3.to(tl.float32), PRECISION))


# bf16 bit pattern of 128.0: its ulp is 1, so OR-ing a code c ∈ 0..3 into the low mantissa bits gives
# exactly 128 + c.  Three integer ops per element (shift, and, or) replace the uint8 → bf16 conversion
# (I2F, a quarter-rate unit on sm_90: 128 per thread per 64-token K+V tile at 4 warps, ~1000 cycles
# per tile per SM, the decode kernel's bottleneck).  The +128 folds into the zero points for free.
CODE_OFFSET = tl.constexpr(128.0)
# Four packed bytes (one 32-bit register, elements e0..e3) → quarters k = 0..3 as bf16 pairs
# (e0, e1), (e2, e3): prmt spreads the bytes into the two 16-bit lanes once, then per quarter one
# shift and one lop3 ((t & 0x00030003) | 0x43004300, LUT 0xEA) make two elements: 12 integer ops per
# 16 elements.  Written as separate and / or, ptxas kept two LOP3s per output (offline sm_90 SASS of
# the decode stage-1 loop, Triton 3.6: 263 -> 135 LOP3, 1319 -> 1175 instructions per warp per
# 128-token tile; H200, bs 8 × 64K: 376.9 -> 364.7 µs).
_UNPACK4_ASM = tl.constexpr("""{
    .reg .b32 lo, hi, t;
    prmt.b32 lo, $8, 0, 0x4140;
    prmt.b32 hi, $8, 0, 0x4342;
    lop3.b32 $0, lo, 0x00030003, 0x43004300, 0xEA;
    lop3.b32 $1, hi, 0x00030003, 0x43004300, 0xEA;
    shr.b32 t, lo, 2; lop3.b32 $2, t, 0x00030003, 0x43004300, 0xEA;
    shr.b32 t, hi, 2; lop3.b32 $3, t, 0x00030003, 0x43004300, 0xEA;
    shr.b32 t, lo, 4; lop3.b32 $4, t, 0x00030003, 0x43004300, 0xEA;
    shr.b32 t, hi, 4; lop3.b32 $5, t, 0x00030003, 0x43004300, 0xEA;
    shr.b32 t, lo, 6; lop3.b32 $6, t, 0x00030003, 0x43004300, 0xEA;
    shr.b32 t, hi, 6; lop3.b32 $7, t, 0x00030003, 0x43004300, 0xEA;
}""")


@triton.jit
def _codes4_offset(codes_ptr, cbase, nmask, QD: tl.constexpr, TRANS: tl.constexpr, PRECISION: tl.constexpr):
    """The four code quarters as bf16 dot operands holding c + CODE_OFFSET (exact), for "bf16" precision.

    Under the interpreter ("bf16_interp") the same values are made by fp32 addition, since its bf16
    bitcast is not a float; the algebra the caller applies (zero point + CODE_OFFSET) is identical.
    Masked tokens read code 0 (value CODE_OFFSET), which their zero scale / −inf score discards.
    """
    col = tl.arange(0, QD)
    if TRANS:
        packed = tl.load(codes_ptr + cbase[None, :] + col[:, None], mask=nmask[None, :], other=0)
    else:
        packed = tl.load(codes_ptr + cbase[:, None] + col[None, :], mask=nmask[:, None], other=0)
    if PRECISION == "bf16":
        c0, c1, c2, c3 = tl.inline_asm_elementwise(_UNPACK4_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r", [packed],
                                                   dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16),
                                                   is_pure=True, pack=4)
    else:
        packed = packed.to(tl.int16)
        c0 = (packed & 3).to(tl.float32) + CODE_OFFSET
        c1 = ((packed >> 2) & 3).to(tl.float32) + CODE_OFFSET
        c2 = ((packed >> 4) & 3).to(tl.float32) + CODE_OFFSET
        c3 = ((packed >> 6) & 3).to(tl.float32) + CODE_OFFSET
    return c0, c1, c2, c3


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
    query rows q [R, ·].  KEY_BITS 3: keys carry a third bit plane; they skip the CODE_OFFSET unpack
    (its lop3 masks two bits) and take the generic one, values are unchanged.

    One group per row (GS = d, the default layout): the scales factor out of both dots,
        q·k_n = s_n·(q·c_n − z_n·Σq)      p·V = (p∘s)·C − Σ_n p_n s_n z_n,
    so the MMAs read the raw codes (exact as bf16/fp16) and dequantisation costs O(R·N) instead of
    O(N·d) per tile: 16·64 vs 64·128·2 element ops at BLOCK_H 16, BLOCK_N 64, d 128.  Several groups
    per row fall back to dequantising each element.
    """
    if GS == 4 * QD:
        OFFSET: tl.constexpr = PRECISION == "bf16" or PRECISION == "bf16_interp"
        K_OFFSET: tl.constexpr = OFFSET and KEY_BITS == 2
        if K_OFFSET:
            k0, k1, k2, k3 = _codes4_offset(kc_ptr, kcbase, nmask, QD, True, PRECISION)
        else:
            k0, k1, k2, k3 = _codes4(kc_ptr, kcbase, nmask, QD, True, PRECISION, KEY_BITS)
        ks = tl.load(ks_ptr + sbase, mask=nmask, other=0.0).to(tl.float32)
        kz = tl.load(ks_ptr + sbase + 1, mask=nmask, other=0.0).to(tl.float32)
        if K_OFFSET:
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

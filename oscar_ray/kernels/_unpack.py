"""Packed INT2 / 3-bit code tiles → dot-operand quarters (layout: quant/int2.pack_codes).

Byte b of a packed row holds elements b, b+d/4, b+d/2, b+3d/4 in bits 0-1, 2-3, 4-5, 6-7, so one
byte tile unpacks into the four quarters; 3-bit codes add a d/8-byte plane after the d/4 bytes."""

from __future__ import annotations

import triton
import triton.language as tl

from ._mma import _op


@triton.jit
def _plane(codes_ptr, cbase, nmask, QD: tl.constexpr, TRANS: tl.constexpr):
    """The bit plane of 3-bit rows aligned with the quartered bytes: uint8 tiles (shape as in _codes4)
    whose bit 2k is bit 2 of quarter k.  Plane byte e holds bit 2 of elements e + j·d/8 (j = 0..7),
    so column b of quarter k finds it in byte b mod d/8 at bit 2k + (b ≥ d/8); the shift by that
    half-select makes it bit 2k for every column."""
    E: tl.constexpr = QD // 2
    col = tl.arange(0, QD)
    if TRANS:
        plane = tl.load(codes_ptr + cbase[None, :] + QD + (col % E)[:, None], mask=nmask[None, :], other=0)
        return plane >> (col // E).to(tl.uint8)[:, None]
    else:
        plane = tl.load(codes_ptr + cbase[:, None] + QD + (col % E)[None, :], mask=nmask[:, None], other=0)
        return plane >> (col // E).to(tl.uint8)[None, :]


@triton.jit
def _codes4(codes_ptr, cbase, nmask, QD: tl.constexpr, TRANS: tl.constexpr, PRECISION: tl.constexpr,
            BITS: tl.constexpr = 2):
    """The four code quarters of N packed rows as dot operands (0..7 is exact in every precision):
    [QD, N] each when TRANS (keys), else [N, QD].  Masked tokens read code 0.  BITS 3 adds bit 2
    from the plane after the d/4 quartered bytes (_plane)."""
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
        plane = _plane(codes_ptr, cbase, nmask, QD, TRANS).to(tl.int32)
        c0 = c0 | ((plane & 1) << 2)
        c1 = c1 | (plane & 4)
        c2 = c2 | ((plane >> 2) & 4)
        c3 = c3 | ((plane >> 4) & 4)
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


# 3-bit rows: the same per quarter plus bit 2 from the plane tile p (_plane: quarter k's bit at 2k),
# moved to bit 2 of each 16-bit lane by one shift and merged by lop3 select (c ? b : a, LUT 0xD8)
# before the 0xEA mask-and-offset: 32 integer ops per 16 elements instead of the generic path's
# 16 I2F conversions (quarter rate) plus masks; 128 + c stays exact for c ≤ 7 (bf16 ulp 1 up to 256).
_UNPACK4_3BIT_ASM = tl.constexpr("""{
    .reg .b32 lo, hi, plo, phi, t, u;
    prmt.b32 lo, $8, 0, 0x4140;
    prmt.b32 hi, $8, 0, 0x4342;
    prmt.b32 plo, $9, 0, 0x4140;
    prmt.b32 phi, $9, 0, 0x4342;
    shl.b32 u, plo, 2; lop3.b32 t, lo, u, 0x00040004, 0xD8; lop3.b32 $0, t, 0x00070007, 0x43004300, 0xEA;
    shl.b32 u, phi, 2; lop3.b32 t, hi, u, 0x00040004, 0xD8; lop3.b32 $1, t, 0x00070007, 0x43004300, 0xEA;
    shr.b32 t, lo, 2; lop3.b32 t, t, plo, 0x00040004, 0xD8; lop3.b32 $2, t, 0x00070007, 0x43004300, 0xEA;
    shr.b32 t, hi, 2; lop3.b32 t, t, phi, 0x00040004, 0xD8; lop3.b32 $3, t, 0x00070007, 0x43004300, 0xEA;
    shr.b32 t, lo, 4; shr.b32 u, plo, 2; lop3.b32 t, t, u, 0x00040004, 0xD8;
    lop3.b32 $4, t, 0x00070007, 0x43004300, 0xEA;
    shr.b32 t, hi, 4; shr.b32 u, phi, 2; lop3.b32 t, t, u, 0x00040004, 0xD8;
    lop3.b32 $5, t, 0x00070007, 0x43004300, 0xEA;
    shr.b32 t, lo, 6; shr.b32 u, plo, 4; lop3.b32 t, t, u, 0x00040004, 0xD8;
    lop3.b32 $6, t, 0x00070007, 0x43004300, 0xEA;
    shr.b32 t, hi, 6; shr.b32 u, phi, 4; lop3.b32 t, t, u, 0x00040004, 0xD8;
    lop3.b32 $7, t, 0x00070007, 0x43004300, 0xEA;
}""")


@triton.jit
def _codes4_offset(codes_ptr, cbase, nmask, QD: tl.constexpr, TRANS: tl.constexpr, PRECISION: tl.constexpr,
                   BITS: tl.constexpr = 2):
    """The four code quarters as bf16 dot operands holding c + CODE_OFFSET (exact), for "bf16" precision.

    Under the interpreter ("bf16_interp") the same values are made by fp32 addition, since its bf16
    bitcast is not a float; the algebra the caller applies (zero point + CODE_OFFSET) is identical.
    Masked tokens read code 0 (value CODE_OFFSET), which their zero scale / −inf score discards.
    """
    if PRECISION == "bf16":
        col = tl.arange(0, QD)
        if TRANS:
            packed = tl.load(codes_ptr + cbase[None, :] + col[:, None], mask=nmask[None, :], other=0)
        else:
            packed = tl.load(codes_ptr + cbase[:, None] + col[None, :], mask=nmask[:, None], other=0)
        if BITS == 3:
            plane = _plane(codes_ptr, cbase, nmask, QD, TRANS)
            c0, c1, c2, c3 = tl.inline_asm_elementwise(_UNPACK4_3BIT_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r",
                                                       [packed, plane],
                                                       dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16),
                                                       is_pure=True, pack=4)
        else:
            c0, c1, c2, c3 = tl.inline_asm_elementwise(_UNPACK4_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r", [packed],
                                                       dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16),
                                                       is_pure=True, pack=4)
    else:
        c0, c1, c2, c3 = _codes4(codes_ptr, cbase, nmask, QD, TRANS, "ieee", BITS)
        c0 = c0 + CODE_OFFSET
        c1 = c1 + CODE_OFFSET
        c2 = c2 + CODE_OFFSET
        c3 = c3 + CODE_OFFSET
    return c0, c1, c2, c3

"""Triton device functions of the write path: exact order-statistic clip, INT2 quantise, quartered pack.

Each one works on a register tile x [BR, D] fp32 of BR rows (one row = one token of one KV head) and
reproduces quant/clip.py + quant/int2.py bit for bit:
  * every division is `tl.math.div_rn` (IEEE round-to-nearest); Triton's `/` on fp32 compiles to the
    approximate `div.full.f32` on NVIDIA (up to 2 ulp off), which would flip codes at bucket edges;
  * s and z are rounded to the storage dtype before the codes are computed, as the reference does;
  * the fp16 floors are quant/int2.py's FP16_MIN_SCALE / FP16_MAX_ZERO, imported, not copied.
"""

from __future__ import annotations

import triton
import triton.language as tl

from oscar_ray.quant.int2 import FP16_MAX_ZERO, FP16_MIN_SCALE

# jit code may read module globals only when they are constexpr
_MIN_SCALE_FP16 = tl.constexpr(FP16_MIN_SCALE)
_MAX_ZERO_FP16 = tl.constexpr(FP16_MAX_ZERO)


@triton.jit
def _clip_rows(x, CLIP_IDX: tl.constexpr):
    """Clamp each row of x [BR, D] to ±τ, τ = sort(|x|)[CLIP_IDX], computed exactly without a sort.

    |x| ≥ 0 orders like its int32 bit pattern, and #{i: |x_i| <= t} is a step function of t that
    jumps only at element values, so the smallest bit pattern t with count >= CLIP_IDX + 1 is
    exactly sort(|x|)[CLIP_IDX].  A bisection over [min, max] bit patterns finds it in 31 steps
    (the int32 range of finite non-negative floats), i.e. 31·D compares per row instead of the
    D² = 16384 (d = 128) of an all-pairs count.  When few values lie above τ (ratio ≥ ~0.9), walking
    down from the maximum takes fewer serial steps (_top_value); both give the same τ.
    """
    bits = tl.abs(x).to(tl.int32, bitcast=True)
    TOP: tl.constexpr = x.shape[1] - 1 - CLIP_IDX  # values allowed above τ (d 128, ratio 0.96: 5)
    if 2 * (TOP + 1) < 31:
        tau = _top_value(bits, TOP)
    else:
        tau = _bisect_value(bits, CLIP_IDX)
    tau = tau.to(tl.float32, bitcast=True)[:, None]
    return tl.minimum(tl.maximum(x, -tau), tau)


@triton.jit
def _top_value(bits, TOP: tl.constexpr):
    """sort(bits)[D − 1 − TOP] per row by walking the distinct values down from the maximum: step i
    takes the largest value below the previous one and counts the elements at or above it; the first
    value with count ≥ TOP + 1 is the order statistic.  Each step adds ≥ 1 element, so TOP + 1 steps
    always reach it: 2·(TOP + 1) row reductions (12 at d 128, ratio 0.96) instead of the bisection's
    31, which the serial reductions of a decode step's few rows are bound by."""
    prev = tl.full([bits.shape[0]], 0x7FFFFFFF, tl.int32)  # above every finite |x| pattern
    tau = tl.zeros([bits.shape[0]], tl.int32)
    done = tl.zeros([bits.shape[0]], tl.int1)
    for _ in tl.static_range(TOP + 1):
        cand = tl.max(tl.where(bits < prev[:, None], bits, -1), axis=1)
        count = tl.sum((bits >= cand[:, None]).to(tl.int32), axis=1)
        hit = (count >= TOP + 1) & ~done
        tau = tl.where(hit, cand, tau)
        done = done | hit
        prev = cand
    return tau


@triton.jit
def _bisect_value(bits, CLIP_IDX: tl.constexpr):
    """sort(bits)[CLIP_IDX] per row by bisection over the bit patterns (31 count steps)."""
    lo = tl.min(bits, axis=1)
    hi = tl.max(bits, axis=1)  # invariant: count(hi) >= CLIP_IDX + 1, count(lo - 1) < CLIP_IDX + 1
    for _ in range(31):
        mid = lo + ((hi - lo) >> 1)
        count = tl.sum((bits <= mid[:, None]).to(tl.int32), axis=1)
        ok = count >= CLIP_IDX + 1
        hi = tl.where(ok, mid, hi)
        lo = tl.where(ok, lo, mid + 1)
    return hi


@triton.jit
def _quantize_pack_store(x, rmask, code_rows, scale_rows, BR: tl.constexpr, D: tl.constexpr,
                         GS: tl.constexpr, SCALE_FP16: tl.constexpr, BITS: tl.constexpr = 2):
    """Quantise x [BR, D] fp32 per group of GS, pack quartered, store codes [BR, D/4] and scales [BR, 2G].

    code_rows / scale_rows are [BR] pointers to the first byte / scale of each destination row.
    BITS 3 (keys): 7 steps, and bit 2 of each code goes to the bit plane after the D/4 bytes
    (quant/int2.pack_codes: byte e holds bit 2 of elements e + j·D/8 at bit j).
    """
    G: tl.constexpr = D // GS
    QD: tl.constexpr = D // 4
    LEVELS: tl.constexpr = 2.0**BITS - 1.0
    xg = tl.reshape(x, (BR, G, GS))
    mn = tl.min(xg, axis=2)  # [BR, G]
    mx = tl.max(xg, axis=2)
    s = tl.math.div_rn(tl.maximum(mx - mn, 1e-8), LEVELS)
    if SCALE_FP16:
        # fp16 floors of quant/int2.py: s stays a normal fp16 and |z| = |min|/s stays below 65504
        s = tl.maximum(tl.maximum(s, _MIN_SCALE_FP16), tl.math.div_rn(tl.abs(mn), _MAX_ZERO_FP16))
        s_st = s.to(tl.float16)
        z_st = tl.math.div_rn(-mn, s).to(tl.float16)
    else:
        s_st = s
        z_st = tl.math.div_rn(-mn, s)
    sf = s_st.to(tl.float32)[:, :, None]
    zf = z_st.to(tl.float32)[:, :, None]
    c = tl.floor(tl.math.div_rn(xg, sf) + zf + 0.5)
    c = tl.minimum(tl.maximum(c, 0.0), LEVELS).to(tl.int32)
    if BITS == 3:
        E: tl.constexpr = D // 8
        hi = tl.reshape((c >> 2) & 1, (BR, 8, E))
        plane = tl.sum(hi << tl.arange(0, 8)[None, :, None], axis=1).to(tl.uint8)
        tl.store(code_rows[:, None] + QD + tl.arange(0, E)[None, :], plane, mask=rmask[:, None])
        c = c & 3
    # quartered packing: byte b holds elements b, b+D/4, b+D/2, b+3D/4 at bits 0/2/4/6
    c4 = tl.reshape(c, (BR, 4, QD))
    shift = (tl.arange(0, 4) * 2)[None, :, None]
    packed = tl.sum(c4 << shift, axis=1).to(tl.uint8)  # disjoint bits, so the sum is an OR
    qd = tl.arange(0, QD)
    tl.store(code_rows[:, None] + qd[None, :], packed, mask=rmask[:, None])
    gi = tl.arange(0, G)
    tl.store(scale_rows[:, None] + 2 * gi[None, :], s_st, mask=rmask[:, None])
    tl.store(scale_rows[:, None] + 2 * gi[None, :] + 1, z_st, mask=rmask[:, None])


@triton.jit
def _round_bf16(x):
    """fp32 → bf16 round-to-nearest-even, as torch's .to(bfloat16) does.

    The GPU's cvt.rn.bf16.f32 already rounds so, but the Triton 3.6 interpreter truncates, which
    made 1161 of 5376 rows differ in the unit test; rounding the bit pattern first makes the final
    cast exact on both (finite inputs; overflow rounds to ±inf as RNE does).
    """
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # -65536 = 0xFFFF0000
    return bits.to(tl.float32, bitcast=True).to(tl.bfloat16)

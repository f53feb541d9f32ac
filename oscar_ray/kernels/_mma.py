"""Dot operands and MMAs in the precisions the attention kernels support (ieee, tf32, bf16, fp16, and
bf16 emulated on fp32 under the interpreter)."""

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

"""INT2 reference: token-wise asymmetric min–max per group, "quartered" packing, Lloyd-Max variant.

This is the bit-exact reference for the Triton write kernels.  Layout (OSCAR_SPEC §3), per row of d:
  codes   uint8 [..., d/4]      byte b holds elements b, b+d/4, b+d/2, b+3d/4 at bits 0/2/4/6
  scales  fp16|fp32 [..., 2·G]  interleaved (s_0, z_0, s_1, z_1, ...), G = d / group_size
  s = max(max − min, 1e-8) / 3,  z = −min / s (a float, not rounded),  c = floor(x/s + z + 0.5) ∈ [0, 3]
  x̂ = (c − z)·s
3-bit codes (the cache's key option): s = (max − min)/7, c ∈ [0, 7], stored as the layout above for
the low two bits plus a d/8-byte bit plane for the third (pack_codes).
Quantisation arithmetic is float32.  s and z are rounded to the storage dtype *before* the codes are
computed, so codes and dequantisation use the very numbers that are stored.
"""

from __future__ import annotations

import torch

from oscar_ray._defaults import KEY_BITS  # INT2, or 3-bit keys (one more bit plane)

_SCALE_DTYPES = {"float16": torch.float16, "float32": torch.float32, torch.float16: torch.float16,
                 torch.float32: torch.float32}

# Gaussian 4-level Lloyd-Max: boundaries ±0.98107 and 0; outer centroid 1.50956; the authors decode
# with the uniform formula and widen the step by LM_RATIO 1.16 (levels μ ± {0.584, 1.751}σ).
LLOYD_MAX_BOUNDARY = 0.98107
LLOYD_MAX_OUTER = 1.50956
LLOYD_MAX_RATIO = 1.16


# fp16 storage needs two floors the authors' fp32 formula lacks (both found by the constant-row test):
# s must stay a normal fp16 (>= 6.1e-5; 1e-8/3 flushes to 0 and z = -min/s becomes inf), and
# |z| = |min|/s must stay below fp16's 65504, so s >= |min|/32768.  Both only coarsen rows whose
# range is ~0 anyway.  fp32 keeps the authors' 1e-8 floor.
FP16_MIN_SCALE = 6.2e-5
FP16_MAX_ZERO = 32768.0


def scale_dtype_of(name) -> torch.dtype:
    if name not in _SCALE_DTYPES:
        raise ValueError(f"scale_dtype must be 'float16' or 'float32', got {name!r}")
    return _SCALE_DTYPES[name]


def _groups(x: torch.Tensor, group_size: int | None) -> tuple[torch.Tensor, int]:
    d = x.shape[-1]
    gs = d if group_size is None else int(group_size)
    if gs < 1 or d % gs:
        raise ValueError(f"group_size ({group_size}) must divide head_dim ({d})")
    return x.to(torch.float32).reshape(*x.shape[:-1], d // gs, gs), gs




def check_bits(bits) -> int:
    if isinstance(bits, bool) or bits not in KEY_BITS:
        raise ValueError(f"bits must be one of {KEY_BITS}, got {bits!r}")
    return int(bits)


def quantize_int2(
    x: torch.Tensor, group_size: int | None = None, scale_dtype="float16", lloyd_max: bool = False,
    bits: int = 2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] → (codes uint8 [..., d] unpacked values 0..2^bits−1, scales [..., 2·G] interleaved s, z).

    bits 3 is the same min–max grid with 7 steps instead of 3 (s = (max − min)/7): the 3-bit key
    option of the cache (geometry.key_bits), stored as this layout plus one bit plane (pack_codes).
    """
    sd = scale_dtype_of(scale_dtype)
    levels = float(2 ** check_bits(bits) - 1)
    if lloyd_max and bits != 2:
        raise ValueError("lloyd_max is a 4-level quantiser: bits must be 2")
    xg, _ = _groups(x, group_size)
    if lloyd_max:
        mu = xg.mean(-1, keepdim=True)
        sigma = xg.std(-1, unbiased=False, keepdim=True)
        s = torch.clamp(sigma * (2 * LLOYD_MAX_OUTER / 3 * LLOYD_MAX_RATIO), min=1e-8)
        z = 1.5 - mu / s
        zs = (xg - mu) / torch.clamp(sigma, min=1e-8)
        bounds = torch.tensor([-LLOYD_MAX_BOUNDARY, 0.0, LLOYD_MAX_BOUNDARY], device=x.device)
        codes = torch.bucketize(zs, bounds, right=True).to(torch.uint8)
    else:
        mn, mx = xg.amin(-1, keepdim=True), xg.amax(-1, keepdim=True)
        # Divide by device tensors, not Python numbers: on CUDA, torch turns x / 3 into x * (1/3),
        # which differs from IEEE x / 3 in the last bit (caught by the GPU bit-exactness test).
        three, max_zero = (torch.tensor(v, device=x.device) for v in (levels, FP16_MAX_ZERO))
        s = torch.clamp(mx - mn, min=1e-8) / three
        if sd == torch.float16:
            s = torch.maximum(torch.clamp(s, min=FP16_MIN_SCALE), mn.abs() / max_zero)
        z = -mn / s
    s_st, z_st = s.to(sd), z.to(sd)
    if not lloyd_max:
        codes = torch.floor(xg / s_st.float() + z_st.float() + 0.5).clamp_(0, levels).to(torch.uint8)
    scales = torch.stack([s_st.squeeze(-1), z_st.squeeze(-1)], dim=-1).flatten(-2)  # [..., 2G]
    return codes.flatten(-2), scales


def dequantize_int2(codes: torch.Tensor, scales: torch.Tensor, group_size: int | None = None) -> torch.Tensor:
    """codes uint8 [..., d] (unpacked), scales [..., 2·G] → float32 [..., d]."""
    cg, _ = _groups(codes, group_size)
    n_groups = cg.shape[-2]
    if scales.shape[-1] != 2 * n_groups or scales.shape[:-1] != codes.shape[:-1]:
        raise ValueError(f"scales {tuple(scales.shape)} do not match codes {tuple(codes.shape)} "
                         f"with {n_groups} groups per row")
    sz = scales.to(torch.float32).reshape(*scales.shape[:-1], n_groups, 2)
    s, z = sz[..., 0:1], sz[..., 1:2]
    return ((cg - z) * s).flatten(-2)


def pack_int2(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., d] (values 0..3, d % 4 == 0) → packed uint8 [..., d/4], quartered layout."""
    d = codes.shape[-1]
    if d % 4:
        raise ValueError(f"head_dim must be a multiple of 4 to pack INT2, got {d}")
    if codes.dtype != torch.uint8:
        raise ValueError(f"codes must be uint8, got {codes.dtype}")
    q = d // 4
    c = codes & 3
    return c[..., :q] | (c[..., q : 2 * q] << 2) | (c[..., 2 * q : 3 * q] << 4) | (c[..., 3 * q :] << 6)


def unpack_int2(packed: torch.Tensor) -> torch.Tensor:
    """packed uint8 [..., d/4] → codes uint8 [..., d]; exact inverse of pack_int2."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed codes must be uint8, got {packed.dtype}")
    return torch.cat([(packed >> shift) & 3 for shift in (0, 2, 4, 6)], dim=-1)


def pack_codes(codes: torch.Tensor, bits: int = 2) -> torch.Tensor:
    """uint8 codes [..., d] → packed [..., d·bits/8].  bits 2: pack_int2.  bits 3: pack_int2 of the low two
    bits, then a bit plane of d/8 bytes where byte e holds bit 2 of elements e + j·d/8 at bit j, so the
    kernels' quarter k (elements k·d/4 ...) finds its high bits at bits 2k and 2k+1 of bytes 0..d/8−1."""
    if check_bits(bits) == 2:
        return pack_int2(codes)
    d = codes.shape[-1]
    if d % 8:
        raise ValueError(f"head_dim must be a multiple of 8 for 3-bit codes, got {d}")
    e = d // 8
    hi = (codes >> 2) & 1
    plane = torch.zeros(*codes.shape[:-1], e, dtype=torch.uint8, device=codes.device)
    for j in range(8):
        plane |= hi[..., j * e:(j + 1) * e] << j
    return torch.cat([pack_int2(codes & 3), plane], dim=-1)


def unpack_codes(packed: torch.Tensor, bits: int = 2) -> torch.Tensor:
    """packed [..., d·bits/8] → codes uint8 [..., d]; exact inverse of pack_codes."""
    if check_bits(bits) == 2:
        return unpack_int2(packed)
    if packed.dtype != torch.uint8 or packed.shape[-1] % 3:
        raise ValueError(f"3-bit packed codes must be uint8 [..., 3·d/8], got {packed.dtype} {tuple(packed.shape)}")
    e = packed.shape[-1] // 3
    lo = unpack_int2(packed[..., :2 * e])
    plane = packed[..., 2 * e:]
    hi = torch.cat([(plane >> j) & 1 for j in range(8)], dim=-1)
    return lo | (hi << 2)


def fake_quantize(
    x: torch.Tensor,
    rotation: torch.Tensor | None = None,
    clip_ratio: float = 0.0,
    group_size: int | None = None,
    scale_dtype="float16",
    lloyd_max: bool = False,
    mean: torch.Tensor | None = None,
    feedback: torch.Tensor | None = None,
    bits: int = 2,
) -> torch.Tensor:
    """x̂ = Q₂(clip((x − μ)·R))·Rᵀ + μ in x's original basis, float64.  x: [T, H, d]; R: [d, d] or
    [H, d, d]; mean μ: [H, d] or [d] channel means (centre.py), None for none; feedback: [H, d, d]
    factor of feedback.py (query-aware rounding of the codes on the same grid), None for nearest;
    bits: 2, or 3 for the cache's 3-bit key option (nearest rounding only)."""
    from .centre import centred
    from .clip import clip_rows
    from .feedback import quantize_int2_feedback

    x64 = centred(x.to(torch.float64), mean)
    r = None if rotation is None else rotation.to(x64.device, torch.float64)
    xr = x64 if r is None else _rotate(x64, r)
    if feedback is None:
        codes, scales = quantize_int2(clip_rows(xr, clip_ratio), group_size, scale_dtype, lloyd_max, bits)
    elif check_bits(bits) != 2:
        raise ValueError("feedback (query-aware rounding) is implemented for 4 levels: bits must be 2")
    elif lloyd_max:
        raise ValueError("feedback (query-aware rounding) works on the uniform grid: lloyd_max must be False")
    else:
        xr32 = xr.to(torch.float32)
        codes, scales = quantize_int2_feedback(xr32, clip_rows(xr32, clip_ratio), feedback, group_size, scale_dtype)
    xq = dequantize_int2(codes, scales, group_size).to(torch.float64)
    xq = xq if r is None else _rotate(xq, r.transpose(-1, -2))
    return xq if mean is None else xq + mean.to(xq.device, xq.dtype)


def _rotate(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    if r.ndim == 2:
        return x @ r
    return torch.einsum("thi,hij->thj", x, r)  # one rotation per KV head

"""Query-aware rounding of key rows: choose INT2 codes that minimise the *logit* error, not the MSE.

A query q sees a key error e = k̂ − k as the logit error q·eᵀ, so the error that matters for a row is
e·M·eᵀ with M = R_Kᵀ C_Q R_K, the query second moment in the rotated key basis. Nearest rounding
minimises ‖e‖² element by element; with the grid fixed (s, z from the clipped row, as stored) the
codes can instead be picked one element at a time, each time folding the rounding error of element
i into the not-yet-rounded elements j > i along the Cholesky factor of M⁻¹ (the GPTQ/OBS update,
here over the d elements of one row instead of the columns of a weight matrix).
Nothing else changes: the stored (s, z) and the dequantisation are those of quant/int2.py, so the
decode kernels read these codes unchanged; only the write path does more work (d sequential steps
per row, on prefill and page demotion, not on the per-token decode path).

Measured on SmolLM2 (benchmarks/results/quality_smollm2.md): logit error 0.0226 → 0.009 and
attention-output error 0.376 → 0.29 with the per-KV-head, centred, fitted-clip rotations.

The arithmetic is fp32 with no fused multiply-add and no division but the one rounding step of
quant/int2.py, so a kernel can reproduce the codes bit for bit.
"""

from __future__ import annotations

import torch

from .int2 import _groups, quantize_int2, scale_dtype_of

DEFAULT_DAMP = 0.01  # λ = 0.01 · mean diag(M): 0.001-0.1 changed SmolLM2's error by < 0.5 %


def feedback_factor(metric: torch.Tensor, damp: float = DEFAULT_DAMP) -> torch.Tensor:
    """metric M [..., d, d] (symmetric PSD) → G [..., d, d] float32, upper triangular, unit diagonal.

    G = diag(U)⁻¹·U with U the upper Cholesky factor of (M + λI)⁻¹, λ = damp · mean diag(M): row i
    of G is how much of element i's rounding error each later element takes over (computed in fp64).
    """
    if metric.ndim < 2 or metric.shape[-1] != metric.shape[-2]:
        raise ValueError(f"metric must be [..., d, d], got {tuple(metric.shape)}")
    if not damp > 0:
        raise ValueError(f"damp must be > 0 (M may be singular), got {damp!r}")
    m = metric.to(torch.float64)
    m = 0.5 * (m + m.transpose(-1, -2))
    d = m.shape[-1]
    lam = damp * m.diagonal(dim1=-2, dim2=-1).mean(-1).clamp(min=1e-30)
    h = m + lam[..., None, None] * torch.eye(d, dtype=torch.float64, device=m.device)
    try:
        u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    except torch.linalg.LinAlgError as e:
        raise ValueError(f"metric is not positive semi-definite: {e}") from None
    return (u / u.diagonal(dim1=-2, dim2=-1)[..., :, None]).to(torch.float32)


def quantize_int2_feedback(x: torch.Tensor, clipped: torch.Tensor, factor: torch.Tensor,
                           group_size: int | None = None, scale_dtype="float16") -> tuple[torch.Tensor, torch.Tensor]:
    """Rows x [N, H, d] (rotated, unclipped) → (codes uint8 [N, H, d], scales [N, H, 2·G]).

    scales are quantize_int2(clipped)'s (the grid of the clipped rows, exactly as nearest rounding
    stores it); codes are chosen in order i = 0..d−1 against the unclipped target x with the
    error-feedback factor G [H, d, d] (`feedback_factor`): an outlier the clip cut off is passed
    on to the other elements instead of being lost.
    """
    if x.ndim != 3 or clipped.shape != x.shape:
        raise ValueError(f"x and clipped must both be [N, H, d], got {tuple(x.shape)} and {tuple(clipped.shape)}")
    n, h, d = x.shape
    if factor.shape != (h, d, d):
        raise ValueError(f"factor must be [{h}, {d}, {d}] (one per KV head), got {tuple(factor.shape)}")
    scale_dtype_of(scale_dtype)
    _, scales = quantize_int2(clipped, group_size, scale_dtype)
    _, gs = _groups(x, group_size)
    sz = scales.to(torch.float32).reshape(n, h, d // gs, 2)
    s = sz[..., 0].repeat_interleave(gs, dim=-1)  # [N, H, d]: each element's group scale
    z = sz[..., 1].repeat_interleave(gs, dim=-1)
    g = factor.to(x.device, torch.float32)
    w = x.to(torch.float32).clone()
    codes = torch.empty_like(w)
    for i in range(d):
        c = torch.floor(w[..., i] / s[..., i] + z[..., i] + 0.5).clamp_(0, 3)
        codes[..., i] = c
        err = w[..., i] - (c - z[..., i]) * s[..., i]
        w = w - err[..., None] * g[:, i, :]  # row i of G is 0 before i, so only later elements move
    return codes.to(torch.uint8), scales

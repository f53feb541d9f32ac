"""INT2 baselines at the same bits as OSCAR, as fake-quantisers returning (k̂, v̂) in the original basis.

All use 16-bit (s, z) pairs and 2-bit codes, so at d = group = 64 each costs 2.5 bits/element:
  naive   per-token asymmetric min–max, no rotation, no clip
  quarot  data-free Hadamard rotation, per-token asymmetric, no clip (QuaRot-INT2 of the paper)
  kivi2   keys per-channel over groups of `token_group` tokens, values per-token; the last
          `residual` tokens (and any partial group) stay full precision, as KIVI's residual does
Shapes: k, v [T, Hkv, d].
"""

from __future__ import annotations

import torch

from .hadamard import hadamard
from .int2 import dequantize_int2, fake_quantize, quantize_int2


def naive_int2(k: torch.Tensor, v: torch.Tensor, group_size=None, scale_dtype="float16"):
    return fake_quantize(k, None, 0.0, group_size, scale_dtype), fake_quantize(v, None, 0.0, group_size, scale_dtype)


def quarot_int2(k: torch.Tensor, v: torch.Tensor, group_size=None, scale_dtype="float16"):
    h = hadamard(k.shape[-1])
    return (fake_quantize(k, h, 0.0, group_size, scale_dtype), fake_quantize(v, h, 0.0, group_size, scale_dtype))


def per_channel_int2(x: torch.Tensor, token_group: int, scale_dtype="float16") -> torch.Tensor:
    """Asymmetric INT2 along the token axis: one (s, z) per channel per `token_group` tokens.

    x: [T, H, d]; tokens past the last whole group are returned unchanged (full precision).
    """
    if token_group < 1:
        raise ValueError(f"token_group must be >= 1, got {token_group}")
    t, h, d = x.shape
    n_full = (t // token_group) * token_group
    out = x.to(torch.float64).clone()
    if n_full == 0:
        return out
    blocks = out[:n_full].reshape(n_full // token_group, token_group, h, d).permute(0, 2, 3, 1)  # [B, H, d, G]
    codes, scales = quantize_int2(blocks, None, scale_dtype)
    deq = dequantize_int2(codes, scales).to(torch.float64)
    out[:n_full] = deq.permute(0, 3, 1, 2).reshape(n_full, h, d)
    return out


def kivi2(k: torch.Tensor, v: torch.Tensor, token_group: int | None = None, residual: int = 0,
          group_size=None, scale_dtype="float16"):
    """KIVI-2: per-channel keys, per-token values, last `residual` tokens full precision."""
    if residual < 0:
        raise ValueError(f"residual must be >= 0, got {residual}")
    tg = k.shape[-1] if token_group is None else token_group  # = head_dim: same bits as per-token
    t = k.shape[0]
    n_q = max(t - residual, 0)
    k_hat = k.to(torch.float64).clone()
    v_hat = v.to(torch.float64).clone()
    if n_q:
        k_hat[:n_q] = per_channel_int2(k[:n_q], tg, scale_dtype)
        v_hat[:n_q] = fake_quantize(v[:n_q], None, 0.0, group_size, scale_dtype)
    return k_hat, v_hat


def oscar_int2(k, v, r_k, r_v, k_clip=0.96, v_clip=0.92, group_size=None, scale_dtype="float16",
               lloyd_max=False, k_mean=None, v_mean=None, k_feedback=None):
    """OSCAR: k̂ = Q₂(clip((k − μ_K) R_K)) R_Kᵀ + μ_K, same for v with R_V (μ None: no centring);
    k_feedback [Hkv, d, d]: query-aware rounding of the key codes (feedback.py), None for nearest."""
    return (fake_quantize(k, r_k, k_clip, group_size, scale_dtype, lloyd_max, k_mean, k_feedback),
            fake_quantize(v, r_v, v_clip, group_size, scale_dtype, lloyd_max, v_mean))

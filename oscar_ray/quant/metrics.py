"""Quality metrics: attention-logit error, attention-output error, effective bits per element."""

from __future__ import annotations

import torch

from .attention import check_qkv, reference_attention


def logit_error(q: torch.Tensor, k: torch.Tensor, k_hat: torch.Tensor, relative: bool = True) -> float:
    """Σ_h tr((K_h − K̂_h) Q_hᵀQ_h (K_h − K̂_h)ᵀ) = ‖Q(K − K̂)ᵀ‖²_F over all (query, key) pairs.

    relative=True divides by ‖QKᵀ‖²_F.  q: [Tq, Hq, d]; k, k_hat: [Tk, Hkv, d].  Uses the d×d moment
    QᵀQ, so cost is O(T·d²) rather than O(T²).
    """
    g = check_qkv(q, k, k_hat)
    hkv, d = k.shape[1], k.shape[2]
    qq = q.to(torch.float64).reshape(q.shape[0], hkv, g, d)
    m = torch.einsum("thgi,thgj->hij", qq, qq)  # [Hkv, d, d]
    e = k.to(torch.float64) - k_hat.to(torch.float64)
    err = torch.einsum("thi,hij,thj->", e, m, e)
    if not relative:
        return float(err)
    kk = k.to(torch.float64)
    return float(err / torch.einsum("thi,hij,thj->", kk, m, kk))


def attention_output_error(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_hat: torch.Tensor, v_hat: torch.Tensor,
    causal: bool = True,
) -> float:
    """‖O − Ô‖_F / ‖O‖_F with O = attention(q, k, v) and Ô = attention(q, k̂, v̂), float64."""
    out = reference_attention(q, k, v, causal=causal)
    out_hat = reference_attention(q, k_hat, v_hat, causal=causal)
    return float(torch.linalg.vector_norm(out - out_hat) / torch.linalg.vector_norm(out))


def int2_region_bits(head_dim: int, group_size: int | None = None, scale_bits: int = 16) -> float:
    """Bits per element of an INT2 row: 2 + 2·scale_bits / group_size (s and z per group)."""
    gs = head_dim if group_size is None else group_size
    return 2.0 + 2.0 * scale_bits / gs


def bits_per_element(
    context_len: int, sink_tokens: int = 64, recent_tokens: int = 256, head_dim: int = 128,
    group_size: int | None = None, scale_bits: int = 16,
) -> float:
    """Effective bits/element of K and V at a context length: BF16 windows + INT2 history.

    2.25 + 320·13.75/T at d = group = 128 with 16-bit scales: 2.284 at 131072, 2.384 at 32768.
    """
    if context_len < 1:
        raise ValueError(f"context_len must be >= 1, got {context_len}")
    bf16 = min(context_len, sink_tokens + recent_tokens)
    int2 = context_len - bf16
    return (bf16 * 16.0 + int2 * int2_region_bits(head_dim, group_size, scale_bits)) / context_len

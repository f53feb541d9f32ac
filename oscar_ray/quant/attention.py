"""Reference causal GQA attention in float64, chunked over queries so memory stays O(chunk * T)."""

from __future__ import annotations

import torch


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None) -> int:
    """Validate q [Tq, Hq, d], k/v [Tk, Hkv, d]; return the GQA ratio g = Hq / Hkv."""
    if q.ndim != 3 or k.ndim != 3:
        raise ValueError(f"q and k must be [tokens, heads, head_dim]; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"head_dim differs: q {q.shape[-1]} vs k {k.shape[-1]}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"n_q_heads ({q.shape[1]}) must be a multiple of n_kv_heads ({k.shape[1]})")
    if v is not None and v.shape != k.shape:
        raise ValueError(f"v shape {tuple(v.shape)} must equal k shape {tuple(k.shape)}")
    return q.shape[1] // k.shape[1]


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    chunk_size: int = 256,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d)) v with query head h*g+j reading KV head h (contiguous GQA grouping).

    q: [Tq, Hq, d]; k, v: [Tk, Hkv, d].  With causal=True the queries are the *last* Tq positions of the
    Tk keys (offset Tk - Tq), which covers a full prefill (Tq == Tk) and a chunk appended to a prefix.
    Returns [Tq, Hq, d] in `dtype`.
    """
    g = check_qkv(q, k, v)
    tq, hq, d = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    if causal and tq > tk:
        raise ValueError(f"causal attention needs Tq <= Tk (got {tq} queries, {tk} keys)")
    kk = k.to(dtype).permute(1, 0, 2)  # [Hkv, Tk, d]
    vv = v.to(dtype).permute(1, 0, 2)
    out = torch.empty(tq, hq, d, dtype=dtype, device=q.device)
    scale = d**-0.5
    offset = tk - tq
    key_pos = torch.arange(tk, device=q.device)
    for start in range(0, tq, chunk_size):
        stop = min(start + chunk_size, tq)
        qc = q[start:stop].to(dtype).view(stop - start, hkv, g, d).permute(1, 2, 0, 3)  # [Hkv, g, c, d]
        scores = torch.einsum("hgcd,htd->hgct", qc, kk) * scale
        if causal:
            q_pos = torch.arange(start, stop, device=q.device) + offset
            scores.masked_fill_(key_pos[None, :] > q_pos[:, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        oc = torch.einsum("hgct,htd->hgcd", probs, vv)  # [Hkv, g, c, d]
        out[start:stop] = oc.permute(2, 0, 1, 3).reshape(stop - start, hq, d)
    return out

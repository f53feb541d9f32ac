"""Value-rotation absorption on one tensor-parallel shard of sglang's fused attention weights.

oscar_ray.models.absorb folds R_V into transformers' separate v_proj / o_proj; sglang keeps
`qkv_proj` (`layers/linear.py::QKVParallelLinear`, local rows [q | k | v] = [h_q·d | h_kv·d |
h_kv·d]) and `o_proj` (`RowParallelLinear`, local columns [h_q·d]) per rank, so the same algebra
is applied here to a rank's shard: W_v,h ← R_V,hᵀ·W_v,h (and b_v,h ← b_v,h·R_V,h) per local KV
head, W_o,j ← W_o,j·R_V,h(j) per local query head j reading KV head h(j) = j // (h_q/h_kv).
Both only touch whole heads of the shard, so no TP communication is needed.  Products in float64.
"""

from __future__ import annotations

import torch


def per_local_head(r_v: torch.Tensor, n_kv_local: int) -> torch.Tensor:
    """R_V of one layer, [d, d] or [h_kv_local, d, d] → float64 [h_kv_local, d, d]."""
    r = r_v.to(torch.float64)
    if r.ndim == 2:
        r = r.expand(n_kv_local, *r.shape)
    if r.ndim != 3 or r.shape[0] != n_kv_local or r.shape[1] != r.shape[2]:
        raise ValueError(f"R_V must be [d, d] or [h_kv={n_kv_local}, d, d], got {tuple(r_v.shape)}")
    return r


@torch.no_grad()
def fold_value_rotation_(qkv_weight: torch.Tensor, qkv_bias: torch.Tensor | None, o_weight: torch.Tensor,
                         r_v: torch.Tensor, n_q_local: int, n_kv_local: int, head_dim: int) -> None:
    """Fold R_V into one layer's local qkv_proj (V rows, bias) and o_proj (columns), in place.

    qkv_weight [(h_q + 2·h_kv)·d, hidden]; o_weight [hidden, h_q·d]; r_v [d, d] or [h_kv, d, d].
    Afterwards the layer emits v·R_V, and o_proj undoes it: the model's output is unchanged.
    """
    d = head_dim
    if n_q_local % n_kv_local:
        raise ValueError(f"{n_q_local} local query heads are not a multiple of {n_kv_local} KV heads")
    rows = (n_q_local + 2 * n_kv_local) * d
    if qkv_weight.shape[0] != rows:
        raise ValueError(f"qkv_proj has {qkv_weight.shape[0]} rows, expected (h_q + 2·h_kv)·d = {rows}")
    if o_weight.shape[1] != n_q_local * d:
        raise ValueError(f"o_proj has {o_weight.shape[1]} columns, expected h_q·d = {n_q_local * d}")
    r = per_local_head(r_v, n_kv_local).to(qkv_weight.device)
    v0 = (n_q_local + n_kv_local) * d
    wv = qkv_weight[v0:]
    w = wv.to(torch.float64).reshape(n_kv_local, d, -1)
    wv.copy_(torch.einsum("hij,hik->hjk", r, w).reshape(wv.shape).to(wv.dtype))  # R_Vᵀ·W_v,h
    if qkv_bias is not None:
        b = qkv_bias[v0:]
        b.copy_(torch.einsum("hi,hij->hj", b.to(torch.float64).reshape(n_kv_local, d), r).reshape(b.shape).to(b.dtype))
    g = n_q_local // n_kv_local
    o = o_weight.to(torch.float64).reshape(o_weight.shape[0], n_kv_local, g, d)
    o_weight.copy_(torch.einsum("ohgi,hij->ohgj", o, r.to(o.device)).reshape(o_weight.shape).to(o_weight.dtype))

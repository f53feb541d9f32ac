"""Value-rotation absorption at load time: W_v ← R_Vᵀ·W_v per KV head, W_o ← W_o·R_V per query head.

Row-vector algebra (nn.Linear computes y = x·Wᵀ + b):
  v_h = x·W_v,hᵀ + b_v,h                      W_v,h: the [d, hidden] rows of KV head h
  v′_h = v_h·R_V  ⇔  W_v,h ← R_Vᵀ·W_v,h, b_v,h ← b_v,h·R_V
Attention is linear in V, so query head j (reading KV head h = j // g) outputs o′_j = o_j·R_V, and
  o_j·W_o,jᵀ = o′_j·R_Vᵀ·W_o,jᵀ = o′_j·(W_o,j·R_V)ᵀ  ⇔  W_o,j ← W_o,j·R_V  (W_o,j: its [hidden, d] columns)
so the model's output is unchanged while the cache stores values already in the R_V basis: no
o·R_Vᵀ GEMM at runtime (the authors' code keeps that GEMM; folding it is the spec's §8 item 9).
The products are formed in float64 and cast back to each weight's dtype.
"""

from __future__ import annotations

import torch

from .arch import arch_facts

_ABSORBED = "_oscar_absorbed_v_rotation"  # float64 CPU copy of the R_V folded into the weights


def _attention_modules(model) -> list:
    mods = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "v_proj") and hasattr(m, "o_proj")]
    if not mods:
        raise ValueError(f"{type(model).__name__} has no attention modules with layer_idx/v_proj/o_proj")
    return sorted(mods, key=lambda m: m.layer_idx)


def per_head_rotations(r_v: torch.Tensor, n_layers: int, n_kv_heads: int) -> torch.Tensor:
    """[L, d, d] (one per layer) or [L, Hkv, d, d] → float64 [L, Hkv, d, d]."""
    r = r_v.to(torch.float64)
    if r.ndim == 3:
        r = r[:, None].expand(r.shape[0], n_kv_heads, *r.shape[1:])
    if r.ndim != 4 or r.shape[:2] != (n_layers, n_kv_heads) or r.shape[-1] != r.shape[-2]:
        raise ValueError(f"v_rotation must be [L={n_layers}, d, d] or [L, Hkv={n_kv_heads}, d, d], "
                         f"got {tuple(r_v.shape)}")
    return r


@torch.no_grad()
def absorb_value_rotation(model, v_rotation: torch.Tensor) -> None:
    """Fold R_V (v_rotation [L, d, d] or [L, Hkv, d, d], row convention x·R) into every layer's
    v_proj and o_proj in place. Afterwards the attention function receives v·R_V and must return
    its output in that basis (the OSCAR cache does: it never un-rotates V).

    Absorbing twice would rotate the values twice, so the model remembers what it holds: the same
    rotation again is a no-op (two OSCAR engines over one loaded model with one artifact), another
    one is a ValueError.

    Example:
        absorb_value_rotation(lm, rotations.v_rotation)   # then serve with the OSCAR cache
    """
    held = getattr(model, _ABSORBED, None)
    if held is not None:
        if held.shape == v_rotation.shape and torch.equal(held, v_rotation.detach().to("cpu", torch.float64)):
            return
        raise ValueError("v_rotation: this model already holds another absorbed value rotation; "
                         "load a fresh model for a different rotation set")
    facts = arch_facts(model.config)
    if not facts.v_absorbable:
        raise ValueError(f"{facts.family}: values pass through a nonlinearity, R_V cannot be absorbed")
    cfg = model.config
    n_q = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", n_q)
    mods = _attention_modules(model)
    r_all = per_head_rotations(v_rotation, len(mods), n_kv)
    d = r_all.shape[-1]
    g = n_q // n_kv
    for m in mods:
        r = r_all[m.layer_idx]  # [Hkv, d, d]
        wv = m.v_proj.weight
        if wv.shape[0] != n_kv * d:
            raise ValueError(f"layer {m.layer_idx}: v_proj has {wv.shape[0]} rows, expected {n_kv}·{d}")
        w = wv.to(torch.float64).reshape(n_kv, d, -1)
        wv.copy_(torch.einsum("hij,hik->hjk", r, w).reshape(wv.shape).to(wv.dtype))  # R_Vᵀ·W_v,h
        if m.v_proj.bias is not None:
            b = m.v_proj.bias
            b.copy_(torch.einsum("hi,hij->hj", b.to(torch.float64).reshape(n_kv, d), r).reshape(b.shape).to(b.dtype))
        wo = m.o_proj.weight  # [hidden, Hq·d]
        o = wo.to(torch.float64).reshape(wo.shape[0], n_kv, g, d)
        wo.copy_(torch.einsum("ohgi,hij->ohgj", o, r).reshape(wo.shape).to(wo.dtype))  # W_o,j·R_V
    # a plain attribute, not a buffer: it must not enter state_dict or move with .to()
    object.__setattr__(model, _ABSORBED, v_rotation.detach().to("cpu", torch.float64).clone())

"""Which KV heads, and so which rotations, one tensor-parallel rank of sglang holds.

sglang 0.5.23 `layers/linear.py::QKVParallelLinear` splits the KV heads of every layer evenly:
with tp <= H_kv, rank r holds heads [r·H_kv/tp, (r+1)·H_kv/tp); with tp > H_kv each head is
replicated on tp/H_kv consecutive ranks (`num_kv_head_replicas`, shard id r // replicas), one
head per rank.  A per-layer rotation [L, d, d] is shared by all heads and so by every rank; a
per-head one [L, H_kv, d, d] is cut the same way as the heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oscar_ray import _defaults as D
from oscar_ray.quant.artifact import ModelGeometry, RotationSet


def kv_heads_of_rank(n_kv_heads: int, tp_rank: int, tp_size: int) -> range:
    """Global KV-head indices held by `tp_rank` (ValueError when tp and H_kv do not divide)."""
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must lie in [0, tp_size={tp_size}), got {tp_rank}")
    if n_kv_heads < 1:
        raise ValueError(f"n_kv_heads must be >= 1, got {n_kv_heads}")
    if tp_size <= n_kv_heads:
        if n_kv_heads % tp_size:
            raise ValueError(f"n_kv_heads={n_kv_heads} is not divisible by tp_size={tp_size}")
        per = n_kv_heads // tp_size
        return range(tp_rank * per, (tp_rank + 1) * per)
    if tp_size % n_kv_heads:
        raise ValueError(f"tp_size={tp_size} is not a multiple of n_kv_heads={n_kv_heads}")
    head = tp_rank // (tp_size // n_kv_heads)
    return range(head, head + 1)


def shard_rotation(r: torch.Tensor, n_kv_heads: int, tp_rank: int, tp_size: int) -> torch.Tensor:
    """[L, d, d] → itself (shared by all heads); [L, H_kv, d, d] → [L, h_rank, d, d] of this rank."""
    if r.ndim == 3:
        return r
    if r.ndim != 4 or r.shape[1] != n_kv_heads:
        raise ValueError(f"rotation must be [L, d, d] or [L, H_kv={n_kv_heads}, d, d], got {tuple(r.shape)}")
    heads = kv_heads_of_rank(n_kv_heads, tp_rank, tp_size)
    return r[:, heads.start:heads.stop].contiguous()


@dataclass(frozen=True, slots=True)
class RankRotations:
    """One rank's rotations for its layers [start_layer, start_layer + L): k / v are fp32
    [L, d, d] or [L, h_rank, d, d], or None for identity; clip ratios per layer."""

    start_layer: int
    k: torch.Tensor | None
    v: torch.Tensor | None
    k_clip: tuple[float, ...]
    v_clip: tuple[float, ...]
    # centring (quant/centre.py): μ_K, μ_V and μ_V·R_V, each [L, h_rank, d] fp32, or None
    k_mean: torch.Tensor | None = None
    v_mean: torch.Tensor | None = None
    v_mean_rotated: torch.Tensor | None = None

    def means(self, layer_id: int, absorbed_v: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(μ_K, μ_V in the basis V reaches the backend in) of global layer `layer_id`, or None."""
        if self.k_mean is None:
            return None
        i = layer_id - self.start_layer
        return self.k_mean[i], (self.v_mean_rotated if absorbed_v else self.v_mean)[i]

    def layer(self, layer_id: int) -> tuple[torch.Tensor | None, torch.Tensor | None, float, float]:
        """(R_K, R_V, k clip, v clip) of global layer `layer_id`."""
        i = layer_id - self.start_layer
        if not 0 <= i < len(self.k_clip):
            raise ValueError(f"layer {layer_id} is not on this rank (layers {self.start_layer}.."
                             f"{self.start_layer + len(self.k_clip) - 1})")
        pick = (lambda t: None if t is None else t[i])
        return pick(self.k), pick(self.v), self.k_clip[i], self.v_clip[i]

    def to(self, device) -> "RankRotations":
        move = (lambda t: None if t is None else t.to(device))
        return RankRotations(self.start_layer, move(self.k), move(self.v), self.k_clip, self.v_clip,
                             move(self.k_mean), move(self.v_mean), move(self.v_mean_rotated))


def rank_rotations(rotations: RotationSet | None, *, n_layers: int, n_kv_heads: int, head_dim: int,
                   tp_rank: int, tp_size: int, start_layer: int = 0, end_layer: int | None = None,
                   k_clip: float | None = None, v_clip: float | None = None) -> RankRotations:
    """This rank's slice of a RotationSet (None = identity) for global layers [start_layer, end_layer)
    (pipeline stages hold a range).  k_clip / v_clip override the artifact's per-layer ratios."""
    end = n_layers if end_layer is None else end_layer
    if not 0 <= start_layer < end <= n_layers:
        raise ValueError(f"layer range [{start_layer}, {end}) must lie in [0, {n_layers})")
    n = end - start_layer
    kv_heads_of_rank(n_kv_heads, tp_rank, tp_size)  # validates the split even for identity
    if rotations is None:
        kc = D.K_CLIP_RATIO if k_clip is None else k_clip
        vc = D.V_CLIP_RATIO if v_clip is None else v_clip
        return RankRotations(start_layer, None, None, (kc,) * n, (vc,) * n)
    rotations.validate(ModelGeometry(n_layers, n_kv_heads, head_dim))
    k = shard_rotation(rotations.k_rotation, n_kv_heads, tp_rank, tp_size)[start_layer:end]
    v = shard_rotation(rotations.v_rotation, n_kv_heads, tp_rank, tp_size)[start_layer:end]
    kc = tuple(float(x) for x in rotations.k_clip[start_layer:end]) if k_clip is None else (k_clip,) * n
    vc = tuple(float(x) for x in rotations.v_clip[start_layer:end]) if v_clip is None else (v_clip,) * n
    means = {}
    if rotations.centred:
        heads = kv_heads_of_rank(n_kv_heads, tp_rank, tp_size)
        cut = lambda m: m[start_layer:end, heads.start:heads.stop].contiguous()  # noqa: E731
        means = {"k_mean": cut(rotations.k_mean), "v_mean": cut(rotations.v_mean),
                 "v_mean_rotated": cut(rotations.value_mean_rotated())}
    return RankRotations(start_layer, k.contiguous(), v.contiguous(), kc, vc, **means)

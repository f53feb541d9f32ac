"""Per-layer calibration statistics and the fit that turns them into a RotationSet.

Two passes over the same data, as the authors' value target needs C_Q first:
  pass 1: QueryMoment (C_Q), ValueTargetSoftmax (exact VᵀSᵀSV) and key/value channel means per layer
  pass 2: ValueTargetDiag (w_t = k_t C_Q k_tᵀ) per layer, and ClipFit on held-out calibration tokens
Every piece is a mergeable accumulator, so the distributed job reduces partial results exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..quant import ChannelMean, ClipFit, feedback_factor, QueryMoment, RotationSet, ValueTargetDiag, ValueTargetSoftmax, fit_rotation
from ..models.loader import AttentionGeometry

VALUE_TARGETS = ("diag", "softmax")


@dataclass
class PassOneStats:
    geometry: AttentionGeometry
    exact_value_target: bool = True
    mean_skip: int = 64  # the cache's sink: never quantised, so left out of the means
    c_q: dict[int, QueryMoment] = field(default_factory=dict)
    c_s_softmax: dict[int, ValueTargetSoftmax] = field(default_factory=dict)
    k_mean: dict[int, ChannelMean] = field(default_factory=dict)
    v_mean: dict[int, ChannelMean] = field(default_factory=dict)

    def sink(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        g = self.geometry
        if layer not in self.c_q:
            self.c_q[layer] = QueryMoment(g.n_kv_heads, g.head_dim, n_q_heads=g.n_q_heads)
            self.k_mean[layer] = ChannelMean(g.n_kv_heads, g.head_dim, self.mean_skip)
            self.v_mean[layer] = ChannelMean(g.n_kv_heads, g.head_dim, self.mean_skip)
            if self.exact_value_target:
                self.c_s_softmax[layer] = ValueTargetSoftmax(g.n_kv_heads, g.head_dim, n_q_heads=g.n_q_heads)
        self.c_q[layer].update(q)
        self.k_mean[layer].update(k)
        self.v_mean[layer].update(v)
        if self.exact_value_target:
            self.c_s_softmax[layer].update(q, k, v)


@dataclass
class PassTwoStats:
    geometry: AttentionGeometry
    c_q: dict[int, torch.Tensor]  # per-head C_Q from pass 1, [Hkv, d, d]
    c_s_diag: dict[int, ValueTargetDiag] = field(default_factory=dict)

    def sink(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        g = self.geometry
        if layer not in self.c_s_diag:
            self.c_s_diag[layer] = ValueTargetDiag(g.n_kv_heads, g.head_dim, c_q=self.c_q[layer])
        self.c_s_diag[layer].update(k, v)


def merge_layer_stats(parts: list[dict]) -> dict:
    """Per-layer accumulators of every worker, merged in worker order (deterministic bits)."""
    out: dict = {}
    for part in parts:
        for layer, acc in part.items():
            out[layer] = acc if layer not in out else out[layer].merge(acc)
    return out


def fit_layers(c_q: dict[int, QueryMoment], c_s: dict[int, object], composition: str = "r_h_pbr",
               per_kv_head: bool = False):
    """{layer: (R_K, R_V, λ_K, λ_V)}: one rotation per layer (the authors' grouping) or per KV head."""
    out = {}
    for layer in sorted(c_q):
        target = (lambda acc: acc.per_head()) if per_kv_head else (lambda acc: acc.layer())
        r_k, e_k = fit_rotation(target(c_q[layer]), composition)
        r_v, e_v = fit_rotation(target(c_s[layer]), composition)
        out[layer] = (r_k, r_v, e_k, e_v)
    return out


def key_feedback_factors(fits: dict, c_q: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """{layer: [Hkv, d, d]} query-aware rounding factors (quant/feedback.py) of the fitted key
    rotations: the metric is C_Q,h in the rotated basis, R_hᵀ C_Q,h R_h."""
    out = {}
    for layer, fit in fits.items():
        r = fit[0].to(torch.float64)
        r = r.expand(c_q[layer].shape[0], -1, -1) if r.ndim == 2 else r
        out[layer] = feedback_factor(r.transpose(-1, -2) @ c_q[layer].to(torch.float64) @ r)
    return out


def to_rotation_set(fits: dict, k_clip: dict[int, float], v_clip: dict[int, float], manifest: dict,
                    means: tuple[dict, dict] | None = None) -> RotationSet:
    """means: ({layer: [Hkv, d] key mean}, {layer: value mean}) to centre the cache, or None."""
    layers = sorted(fits)
    if layers != list(range(len(layers))):
        raise ValueError(f"fits must cover layers 0..L-1, got {layers[:5]}…")
    stack = lambda i: torch.stack([fits[l][i] for l in layers])  # noqa: E731
    extra = {} if means is None else {"k_mean": torch.stack([means[0][l] for l in layers]),
                                      "v_mean": torch.stack([means[1][l] for l in layers])}
    return RotationSet(stack(0), stack(1), stack(2), stack(3),
                       torch.tensor([k_clip[l] for l in layers]), torch.tensor([v_clip[l] for l in layers]),
                       manifest=manifest, **extra)


@dataclass
class ClipFitStats:
    """Pass-2 sink feeding one ClipFit per layer with held-out calibration tokens."""

    fits: dict[int, tuple]
    c_q: dict[int, torch.Tensor]
    group_size: int | None = None
    scale_dtype: str = "float16"
    means: tuple[dict, dict] | None = None  # ({layer: μ_K}, {layer: μ_V}) when the cache centres
    k_feedback: dict[int, torch.Tensor] | None = None  # {layer: [Hkv, d, d]} query-aware key rounding
    key_objective: str = "logit"
    sink_tokens: int = 0
    clip: dict[int, ClipFit] = field(default_factory=dict)

    def sink(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if layer not in self.clip:
            r_k, r_v = self.fits[layer][0], self.fits[layer][1]
            mk, mv = (None, None) if self.means is None else (self.means[0][layer], self.means[1][layer])
            fb = None if self.k_feedback is None else self.k_feedback[layer]
            self.clip[layer] = ClipFit(self.c_q[layer], r_k, r_v, group_size=self.group_size,
                                       scale_dtype=self.scale_dtype, k_mean=mk, v_mean=mv, k_feedback=fb,
                                       key_objective=self.key_objective, sink=self.sink_tokens)
        self.clip[layer].update(k, v, q)

    def best(self) -> tuple[dict[int, float], dict[int, float]]:
        picks = {l: f.best() for l, f in self.clip.items()}
        return {l: p[0] for l, p in picks.items()}, {l: p[1] for l, p in picks.items()}

"""Offline clip-ratio fit: per layer, the ratio with the least attention-aware error on held-out tokens.

Errors are sums over tokens, so this too is a mergeable streaming accumulator (the calibration job's
second pass feeds it on every worker and reduces with `merge`).
  keys:   Σ_t e_t (Rᵀ C_Q,h R) e_tᵀ    e_t = k_t R − Q₂(clip(k_t R))     (= logit error, OSCAR_SPEC §6)
  values: Σ_t w_t ‖e_t‖²               w_t = k_t C_Q,h k_tᵀ, the diagonal proxy of Σ_q p_qt²
With key_objective "attention" the key error is instead the causal attention-output error with exact
values, Σ ‖softmax(qK̂ᵀ)V − softmax(qKᵀ)V‖² (needs the queries; the first `sink` keys stay exact,
as the cache's BF16 sink does). With query-aware rounding (k_feedback, feedback.py) the logit error
keeps falling as the clip tightens while the attention error does not (SmolLM2: the logit objective
picks 0.90, attention-output error 0.296; the attention objective 0.92-0.94, 0.289).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .attention import reference_attention
from .centre import centred
from .clip import DEFAULT_CANDIDATES, check_ratio, clip_rows
from .feedback import quantize_int2_feedback
from .int2 import dequantize_int2, quantize_int2

KEY_OBJECTIVES = ("logit", "attention")


def _rot(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return x @ r if r.ndim == 2 else torch.einsum("thi,hij->thj", x, r)


@dataclass
class ClipFit:
    """Accumulates per-candidate K and V errors for one layer; `best()` picks (r_K, r_V)."""

    c_q: torch.Tensor  # [Hkv, d, d] per-head query moment
    r_k: torch.Tensor  # [d, d] or [Hkv, d, d]
    r_v: torch.Tensor
    candidates: tuple[float, ...] = DEFAULT_CANDIDATES
    group_size: int | None = None
    scale_dtype: str = "float16"
    k_err: torch.Tensor = field(default=None)  # [n_candidates] float64
    v_err: torch.Tensor = field(default=None)
    k_mean: torch.Tensor | None = None  # [Hkv, d] channel means the cache subtracts (centre.py), or None
    v_mean: torch.Tensor | None = None
    k_feedback: torch.Tensor | None = None  # [Hkv, d, d] factor: keys rounded query-aware (feedback.py)
    key_objective: str = "logit"
    sink: int = 0  # leading keys of each sequence left exact (attention objective only)

    def __post_init__(self) -> None:
        if self.key_objective not in KEY_OBJECTIVES:
            raise ValueError(f"key_objective must be one of {KEY_OBJECTIVES}, got {self.key_objective!r}")
        if not self.candidates:
            raise ValueError("candidates must list at least one clip ratio")
        self.candidates = tuple(check_ratio(c, "candidates") for c in self.candidates)
        self.c_q, self.r_k, self.r_v = (t.to(torch.float64) for t in (self.c_q, self.r_k, self.r_v))
        rk = self.r_k if self.r_k.ndim == 3 else self.r_k.expand(self.c_q.shape[0], -1, -1)
        self._m = rk.transpose(-1, -2) @ self.c_q @ rk  # [Hkv, d, d]: C_Q in the rotated basis
        n = len(self.candidates)
        self.k_err = torch.zeros(n, dtype=torch.float64) if self.k_err is None else self.k_err
        self.v_err = torch.zeros(n, dtype=torch.float64) if self.v_err is None else self.v_err

    def _residual(self, xr: torch.Tensor, ratio: float, feedback: torch.Tensor | None = None) -> torch.Tensor:
        if feedback is None:
            codes, scales = quantize_int2(clip_rows(xr, ratio), self.group_size, self.scale_dtype)
        else:
            x32 = xr.to(torch.float32)
            codes, scales = quantize_int2_feedback(x32, clip_rows(x32, ratio), feedback, self.group_size,
                                                   self.scale_dtype)
        return xr - dequantize_int2(codes, scales, self.group_size).to(torch.float64)

    def _key_attention_error(self, q, k64, v64, ek, r_k) -> torch.Tensor:
        """Σ‖O(K̂) − O(K)‖² with exact values; ek is the rotated residual of rows sink.. (k̂ = k − e·Rᵀ)."""
        e = torch.einsum("thj,hij->thi", ek, r_k) if r_k.ndim == 3 else ek @ r_k.T
        k_hat = k64.clone()
        k_hat[self.sink:] -= e
        ref = reference_attention(q, k64, v64)
        return (reference_attention(q, k_hat, v64) - ref).pow(2).sum()

    def update(self, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor | None = None) -> None:
        """k, v: [T, Hkv, d] held-out keys (post-RoPE) and values of this layer; q [T, Hq, d] its
        queries (needed by key_objective "attention", ignored otherwise)."""
        if k.shape != v.shape or k.ndim != 3 or k.shape[1:] != self.c_q.shape[:2]:
            raise ValueError(f"k and v must be [T, {self.c_q.shape[0]}, {self.c_q.shape[1]}], "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        attention = self.key_objective == "attention"
        if attention and (q is None or q.ndim != 3 or q.shape[0] != k.shape[0]):
            raise ValueError(f"key_objective 'attention' needs q [{k.shape[0]}, Hq, d], got "
                             f"{None if q is None else tuple(q.shape)}")
        # Work where the activations are (a GPU worker's keys stay on the GPU); the fitted state and
        # the error sums stay on the CPU, so accumulators pickle and merge across workers anywhere.
        dev = k.device
        c_q, m, r_k, r_v = (t.to(dev) for t in (self.c_q, self._m, self.r_k, self.r_v))
        fb = None if self.k_feedback is None else self.k_feedback.to(dev)
        k64, v64 = k.to(torch.float64), v.to(torch.float64)
        w = torch.einsum("thi,hij,thj->th", k64, c_q, k64)
        # the cache quantises centred rows; the importance weights w keep the raw keys
        kr, vr = _rot(centred(k64, self.k_mean), r_k), _rot(centred(v64, self.v_mean), r_v)
        for i, ratio in enumerate(self.candidates):
            if attention:
                ek = self._residual(kr[self.sink:], ratio, fb)
                self.k_err[i] += self._key_attention_error(q.to(dev, torch.float64), k64, v64, ek, r_k).cpu()
            else:
                ek = self._residual(kr, ratio, fb)
                self.k_err[i] += torch.einsum("thi,hij,thj->", ek, m, ek).cpu()
            ev = self._residual(vr, ratio)
            self.v_err[i] += (w * ev.pow(2).sum(-1)).sum().cpu()

    def merge(self, other: "ClipFit") -> "ClipFit":
        if other.candidates != self.candidates:
            raise ValueError("cannot merge ClipFit accumulators with different candidate lists")
        return ClipFit(self.c_q, self.r_k, self.r_v, self.candidates, self.group_size, self.scale_dtype,
                       self.k_err + other.k_err, self.v_err + other.v_err, self.k_mean, self.v_mean,
                       self.k_feedback, self.key_objective, self.sink)

    def best(self) -> tuple[float, float]:
        """(r_K, r_V) minimising each error; ties go to the earlier candidate."""
        return self.candidates[int(torch.argmin(self.k_err))], self.candidates[int(torch.argmin(self.v_err))]

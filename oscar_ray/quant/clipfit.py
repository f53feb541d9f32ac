"""Offline clip-ratio fit: per layer, the ratio with the least attention-aware error on held-out tokens.

Errors are sums over tokens, so this too is a mergeable streaming accumulator (the calibration job's
second pass feeds it on every worker and reduces with `merge`).
  keys:   Σ_t e_t (Rᵀ C_Q,h R) e_tᵀ    e_t = k_t R − Q₂(clip(k_t R))     (= logit error, OSCAR_SPEC §6)
  values: Σ_t w_t ‖e_t‖²               w_t = k_t C_Q,h k_tᵀ, the diagonal proxy of Σ_q p_qt²
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .centre import centred
from .clip import DEFAULT_CANDIDATES, check_ratio, clip_rows
from .int2 import dequantize_int2, quantize_int2


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

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("candidates must list at least one clip ratio")
        self.candidates = tuple(check_ratio(c, "candidates") for c in self.candidates)
        self.c_q, self.r_k, self.r_v = (t.to(torch.float64) for t in (self.c_q, self.r_k, self.r_v))
        rk = self.r_k if self.r_k.ndim == 3 else self.r_k.expand(self.c_q.shape[0], -1, -1)
        self._m = rk.transpose(-1, -2) @ self.c_q @ rk  # [Hkv, d, d]: C_Q in the rotated basis
        n = len(self.candidates)
        self.k_err = torch.zeros(n, dtype=torch.float64) if self.k_err is None else self.k_err
        self.v_err = torch.zeros(n, dtype=torch.float64) if self.v_err is None else self.v_err

    def _residual(self, xr: torch.Tensor, ratio: float) -> torch.Tensor:
        codes, scales = quantize_int2(clip_rows(xr, ratio), self.group_size, self.scale_dtype)
        return xr - dequantize_int2(codes, scales, self.group_size).to(torch.float64)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [T, Hkv, d] held-out keys (post-RoPE) and values of this layer."""
        if k.shape != v.shape or k.ndim != 3 or k.shape[1:] != self.c_q.shape[:2]:
            raise ValueError(f"k and v must be [T, {self.c_q.shape[0]}, {self.c_q.shape[1]}], "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        # Work where the activations are (a GPU worker's keys stay on the GPU); the fitted state and
        # the error sums stay on the CPU, so accumulators pickle and merge across workers anywhere.
        dev = k.device
        c_q, m, r_k, r_v = (t.to(dev) for t in (self.c_q, self._m, self.r_k, self.r_v))
        k64, v64 = k.to(torch.float64), v.to(torch.float64)
        w = torch.einsum("thi,hij,thj->th", k64, c_q, k64)
        # the cache quantises centred rows; the importance weights w keep the raw keys
        kr, vr = _rot(centred(k64, self.k_mean), r_k), _rot(centred(v64, self.v_mean), r_v)
        for i, ratio in enumerate(self.candidates):
            ek = self._residual(kr, ratio)
            self.k_err[i] += torch.einsum("thi,hij,thj->", ek, m, ek).cpu()
            ev = self._residual(vr, ratio)
            self.v_err[i] += (w * ev.pow(2).sum(-1)).sum().cpu()

    def merge(self, other: "ClipFit") -> "ClipFit":
        if other.candidates != self.candidates:
            raise ValueError("cannot merge ClipFit accumulators with different candidate lists")
        return ClipFit(self.c_q, self.r_k, self.r_v, self.candidates, self.group_size, self.scale_dtype,
                       self.k_err + other.k_err, self.v_err + other.v_err, self.k_mean, self.v_mean)

    def best(self) -> tuple[float, float]:
        """(r_K, r_V) minimising each error; ties go to the earlier candidate."""
        return self.candidates[int(torch.argmin(self.k_err))], self.candidates[int(torch.argmin(self.v_err))]

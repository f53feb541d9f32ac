"""Streaming second-moment statistics for OSCAR calibration (float64, mergeable).

Every accumulator keeps *sums* and *counts*, never means, so partial results from many workers add
up exactly to the single-pass result (up to float64 summation order, ~1e-15 relative) with `merge`.
Memory is O(H_kv * d^2) regardless of how many tokens stream through (d=128, 8 heads: 1 MiB).

Shapes: q [T, Hq, d], k/v [T, Hkv, d]; query heads [h*g, (h+1)*g) belong to KV head h (g = Hq/Hkv).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .attention import check_qkv, reference_attention


def _symmetrise(c: torch.Tensor) -> torch.Tensor:
    return (c + c.transpose(-1, -2)) / 2


@dataclass
class _Moment:
    """Σ xᵀx per KV head plus the weight total; the shared core of the accumulators below."""

    n_kv_heads: int
    head_dim: int
    sums: torch.Tensor = field(default=None)  # [Hkv, d, d] float64
    weights: torch.Tensor = field(default=None)  # [Hkv] float64 (row counts or weight totals)
    rows: int = 0  # rows seen per KV head: tokens·g for query-side targets, tokens for key/value-side

    def __post_init__(self) -> None:
        if self.n_kv_heads < 1 or self.head_dim < 1:
            raise ValueError(f"n_kv_heads and head_dim must be >= 1, got {self.n_kv_heads}, {self.head_dim}")
        if self.sums is None:
            self.sums = torch.zeros(self.n_kv_heads, self.head_dim, self.head_dim, dtype=torch.float64)
        if self.weights is None:
            self.weights = torch.zeros(self.n_kv_heads, dtype=torch.float64)

    def _add(self, sums: torch.Tensor, weights: torch.Tensor) -> None:
        self.sums += sums.to(self.sums.device, torch.float64)
        self.weights += weights.to(self.weights.device, torch.float64)

    def merge(self, other: "_Moment") -> "_Moment":
        """A new accumulator holding self + other (neither input is modified)."""
        if type(other) is not type(self) or other.sums.shape != self.sums.shape:
            raise ValueError(f"cannot merge {type(other).__name__}{tuple(other.sums.shape)} into "
                             f"{type(self).__name__}{tuple(self.sums.shape)}")
        out = self._empty_like()
        out._add(self.sums + other.sums.to(self.sums.device), self.weights + other.weights.to(self.weights.device))
        out.rows = self.rows + other.rows
        return out

    def _empty_like(self) -> "_Moment":
        return type(self)(self.n_kv_heads, self.head_dim)

    def per_head(self) -> torch.Tensor:
        """[Hkv, d, d]: the normalised, symmetrised matrix of each KV head."""
        if bool((self.weights <= 0).any()):
            raise ValueError(f"{type(self).__name__} has seen no data: feed tokens before fitting")
        return _symmetrise(self.sums / self.weights[:, None, None])

    def layer(self) -> torch.Tensor:
        """[d, d]: the per-layer target, the mean of the per-head matrices (authors' `source_grouping: layer`)."""
        return _symmetrise(self.per_head().mean(0))


@dataclass
class QueryMoment(_Moment):
    """C_Q,h = Q_hᵀQ_h / (T·g), the key-rotation target (logit error is tr(E C_Q Eᵀ))."""

    n_q_heads: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_q_heads < self.n_kv_heads or self.n_q_heads % self.n_kv_heads:
            raise ValueError(f"n_q_heads ({self.n_q_heads}) must be a positive multiple of n_kv_heads "
                             f"({self.n_kv_heads})")

    def _empty_like(self) -> "QueryMoment":
        return QueryMoment(self.n_kv_heads, self.head_dim, n_q_heads=self.n_q_heads)

    def update(self, q: torch.Tensor) -> None:
        """q: [T, Hq, d] post-norm, post-RoPE queries of one layer."""
        if q.ndim != 3 or q.shape[1] != self.n_q_heads or q.shape[2] != self.head_dim:
            raise ValueError(f"q must be [T, {self.n_q_heads}, {self.head_dim}], got {tuple(q.shape)}")
        g = self.n_q_heads // self.n_kv_heads
        qq = q.to(torch.float64).reshape(q.shape[0], self.n_kv_heads, g, self.head_dim)
        self._add(torch.einsum("thgi,thgj->hij", qq, qq), torch.full((self.n_kv_heads,), float(q.shape[0] * g)))
        self.rows += q.shape[0] * g


@dataclass
class ValueTargetDiag(_Moment):
    """Authors' value target: C_S,h = Σ_t w_t v_tᵀv_t / Σ_t w_t with w_t = k_t C_Q,h k_tᵀ.

    A diagonal, pre-softmax proxy for VᵀSᵀSV (cross-token terms dropped).  Needs C_Q from a first pass
    over the same data, so it is the second pass of a calibration.  Normalising by Σw is the authors'
    "rescale w to mean 1, divide by T".
    """

    c_q: torch.Tensor = field(default=None)  # [Hkv, d, d] from QueryMoment.per_head()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.c_q is None or tuple(self.c_q.shape) != (self.n_kv_heads, self.head_dim, self.head_dim):
            got = None if self.c_q is None else tuple(self.c_q.shape)
            raise ValueError(f"c_q must be [{self.n_kv_heads}, {self.head_dim}, {self.head_dim}], got {got}")
        self.c_q = self.c_q.to(torch.float64)

    def _empty_like(self) -> "ValueTargetDiag":
        return ValueTargetDiag(self.n_kv_heads, self.head_dim, c_q=self.c_q)

    def merge(self, other: "ValueTargetDiag") -> "ValueTargetDiag":
        if not torch.equal(self.c_q, other.c_q.to(self.c_q.device)):
            raise ValueError("cannot merge ValueTargetDiag accumulators built on different C_Q")
        return super().merge(other)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [T, Hkv, d] keys (post-RoPE) and values of one layer."""
        if k.ndim != 3 or k.shape[1:] != (self.n_kv_heads, self.head_dim) or v.shape != k.shape:
            raise ValueError(f"k and v must both be [T, {self.n_kv_heads}, {self.head_dim}], "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        kk, vv = k.to(torch.float64), v.to(torch.float64)
        c_q = self.c_q.to(kk.device)
        w = torch.einsum("thi,hij,thj->th", kk, c_q, kk)  # [T, Hkv] importance of each token
        self._add(torch.einsum("th,thi,thj->hij", w, vv, vv), w.sum(0))
        self.rows += k.shape[0]


@dataclass
class ValueTargetSoftmax(_Moment):
    """Exact value target C_S,h = Σ_q (S V)ᵀ(S V) / (T·g), S = causal softmax(QKᵀ/√d).

    S·V is the attention output O, so C_S,h = O_hᵀO_h / rows: computed chunk by chunk over queries
    (memory O(chunk · T)), no N×N matrix is ever formed.  Needs no first pass.
    """

    n_q_heads: int = 0
    chunk_size: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_q_heads < self.n_kv_heads or self.n_q_heads % self.n_kv_heads:
            raise ValueError(f"n_q_heads ({self.n_q_heads}) must be a positive multiple of n_kv_heads "
                             f"({self.n_kv_heads})")

    def _empty_like(self) -> "ValueTargetSoftmax":
        return ValueTargetSoftmax(self.n_kv_heads, self.head_dim, n_q_heads=self.n_q_heads,
                                  chunk_size=self.chunk_size)

    def update(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """q: [Tq, Hq, d], the last Tq positions of one sequence; k, v: [Tk, Hkv, d] the whole sequence."""
        g = check_qkv(q, k, v)
        if q.shape[1] != self.n_q_heads or k.shape[1:] != (self.n_kv_heads, self.head_dim):
            raise ValueError(f"expected q [T, {self.n_q_heads}, {self.head_dim}] and k/v "
                             f"[T, {self.n_kv_heads}, {self.head_dim}], got {tuple(q.shape)}, {tuple(k.shape)}")
        out = reference_attention(q, k, v, causal=True, chunk_size=self.chunk_size)  # [Tq, Hq, d]
        oo = out.reshape(q.shape[0], self.n_kv_heads, g, self.head_dim)
        self._add(torch.einsum("thgi,thgj->hij", oo, oo), torch.full((self.n_kv_heads,), float(q.shape[0] * g)))
        self.rows += q.shape[0] * g

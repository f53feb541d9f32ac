"""Channel means for centring keys and values before INT2, and why centring is exact.

Post-RoPE keys of real models carry a large per-channel offset shared by every token (SmolLM2:
the low-frequency RoPE pairs).  A per-token INT2 row spends its 4 levels on that offset; subtracting
a calibrated per-KV-head mean μ first leaves only the part that differs between tokens.  Both
shifts are exact in exact arithmetic, so no kernel needs to know about them:
  keys    q·(k − μ_K) = q·k − q·μ_K: the same shift for every key a query sees, softmax-invariant,
          provided *every* cached key (BF16 sink/recent too) is centred;
  values  Σ_t p_t (v_t − μ_V) + μ_V = Σ_t p_t v_t since Σ_t p_t = 1: add μ_V to the attention output.
Measured on SmolLM2 (benchmarks/results/quality_smollm2.md): attention-output error 0.48 → 0.37.

The means skip each sequence's first `skip` tokens (the BF16 sink, whose keys have 10-100× norms
and are never quantised). Accumulators keep sums and counts, so workers' parts merge exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ChannelMean:
    """Σ x and the row count per KV head; `mean()` is [Hkv, d] float64."""

    n_kv_heads: int
    head_dim: int
    skip: int = 0
    sums: torch.Tensor = field(default=None)  # [Hkv, d] float64
    count: int = 0

    def __post_init__(self) -> None:
        if self.n_kv_heads < 1 or self.head_dim < 1 or self.skip < 0:
            raise ValueError(f"n_kv_heads, head_dim must be >= 1 and skip >= 0, got {self.n_kv_heads}, "
                             f"{self.head_dim}, {self.skip}")
        if self.sums is None:
            self.sums = torch.zeros(self.n_kv_heads, self.head_dim, dtype=torch.float64)

    def update(self, x: torch.Tensor) -> None:
        """x: [T, Hkv, d], one whole sequence from position 0 (its first `skip` rows are ignored)."""
        if x.ndim != 3 or x.shape[1:] != self.sums.shape:
            raise ValueError(f"x must be [T, {self.n_kv_heads}, {self.head_dim}], got {tuple(x.shape)}")
        rows = x[self.skip:]
        self.sums += rows.to(torch.float64).sum(0).to(self.sums.device)
        self.count += rows.shape[0]

    def merge(self, other: "ChannelMean") -> "ChannelMean":
        if type(other) is not ChannelMean or other.sums.shape != self.sums.shape or other.skip != self.skip:
            raise ValueError("cannot merge ChannelMean accumulators of different shapes or skips")
        return ChannelMean(self.n_kv_heads, self.head_dim, self.skip, self.sums + other.sums.to(self.sums.device),
                           self.count + other.count)

    def mean(self) -> torch.Tensor:
        if self.count <= 0:
            raise ValueError("ChannelMean has seen no rows past its skip: feed longer sequences")
        return self.sums / self.count


def centred(x: torch.Tensor, mean: torch.Tensor | None) -> torch.Tensor:
    """x [T, Hkv, d] − mean ([Hkv, d] or [d]); None leaves x as it is."""
    return x if mean is None else x - mean.to(x.device, x.dtype)


def add_value_mean(out: torch.Tensor, v_mean: torch.Tensor | None) -> torch.Tensor:
    """Attention output out [T, Hq, d] over centred values + μ_V [Hkv, d] of each query head's KV
    head (query head j reads KV head j // (Hq / Hkv)); exact because the weights sum to 1."""
    if v_mean is None:
        return out
    return out + v_mean.to(out.device, out.dtype).repeat_interleave(out.shape[1] // v_mean.shape[0], dim=0)

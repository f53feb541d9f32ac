"""Per-token clipping of rotated rows: the authors' fixed quantile ratio and an offline ratio fit."""

from __future__ import annotations

import torch


def clip_index(ratio: float, d: int) -> int:
    """Order statistic used as threshold: idx = min(max(floor(r·d), 0), d − 1).  d=128: K 0.96 → 122."""
    return min(max(int(ratio * d), 0), d - 1)


def check_ratio(ratio: float, name: str = "clip_ratio") -> float:
    if not (0.0 <= float(ratio) <= 1.0):
        raise ValueError(f"{name} must be in [0, 1] (0 disables clipping), got {ratio!r}")
    return float(ratio)


def clip_rows(x: torch.Tensor, ratio: float) -> torch.Tensor:
    """Symmetric clamp of each row x[..., :] to ±τ, τ = sort(|x|)[clip_index(ratio, d)].

    ratio 0 disables clipping (the authors' environment default); ratio 1 keeps the maximum, also a
    no-op.  d=128, ratio 0.96 clips exactly the 5 largest |values| of a row (ties aside).
    """
    ratio = check_ratio(ratio)
    if ratio == 0.0:
        return x
    idx = clip_index(ratio, x.shape[-1])
    tau = torch.sort(x.abs(), dim=-1).values[..., idx : idx + 1]
    return torch.maximum(torch.minimum(x, tau), -tau)


DEFAULT_CANDIDATES = (0.0, 0.80, 0.84, 0.86, 0.88, 0.90, 0.92, 0.94, 0.96, 0.98)

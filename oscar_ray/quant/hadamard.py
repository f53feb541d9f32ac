"""Normalised Sylvester Hadamard matrices and the eigenvalue-ordered bit-reversal permutation."""

from __future__ import annotations

import torch


def _check_power_of_two(d: int, name: str) -> int:
    if not isinstance(d, int) or d < 1 or d & (d - 1):
        raise ValueError(
            f"{name} must be a power of two (got {d!r}): the Sylvester Hadamard and the bit-reversal "
            "permutation exist only for sizes 1, 2, 4, ..., 128, 256"
        )
    return d.bit_length() - 1


def hadamard(d: int, dtype: torch.dtype = torch.float64, device=None) -> torch.Tensor:
    """Sylvester Hadamard of size d scaled by 1/sqrt(d), so H @ H.T == I.  Returns [d, d]."""
    _check_power_of_two(d, "head_dim")
    h = torch.ones(1, 1, dtype=torch.float64, device=device)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / d**0.5).to(dtype)


def bit_reverse_indices(d: int) -> torch.Tensor:
    """br[i] = i with its log2(d) bits reversed, e.g. d=8: [0, 4, 2, 6, 1, 5, 3, 7]."""
    bits = _check_power_of_two(d, "head_dim")
    idx = torch.arange(d)
    out = torch.zeros_like(idx)
    for b in range(bits):
        out |= ((idx >> b) & 1) << (bits - 1 - b)
    return out


def bit_reversal_permutation(eigenvalues: torch.Tensor) -> torch.Tensor:
    """Column permutation `perm` with P = I[:, perm], so (X @ P)[:, j] == X[:, perm[j]].

    OSCAR_SPEC §2.3: sorted_idx = argsort(λ, descending); perm[br[i]] = sorted_idx[i].  Output position
    br(i) receives source column sorted_idx[i]: for d=128 the top column goes to 0, the 2nd to 64, the
    3rd to 32, the 4th to 96, which spreads the largest directions across quantisation groups.
    Ties are broken by index (stable sort) so the permutation is deterministic.
    """
    if eigenvalues.ndim != 1:
        raise ValueError(f"eigenvalues must be 1-D [d], got shape {tuple(eigenvalues.shape)}")
    d = eigenvalues.shape[0]
    br = bit_reverse_indices(d)
    sorted_idx = torch.sort(eigenvalues.detach().cpu().to(torch.float64), descending=True, stable=True).indices
    perm = torch.empty(d, dtype=torch.long)
    perm[br] = sorted_idx
    return perm


def permutation_matrix(perm: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """P = I[:, perm] as a dense matrix."""
    return torch.eye(perm.shape[0], dtype=dtype)[:, perm]

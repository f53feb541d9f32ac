"""Rotation fit R = U·H·P: eigenvectors of the attention target, Hadamard, bit-reversal permutation.

Row convention, as in the kernels: k_rot = k @ R.  R is orthogonal, so (q R)(k R)ᵀ = q kᵀ and the
kernels rotate the query once per step instead of inverse-rotating every cached key.
"""

from __future__ import annotations

import torch

from .hadamard import bit_reversal_permutation, hadamard

# "r_h_pbr" is the authors' default; the others are the ablations of OSCAR_SPEC §2.3 / §7.3.
COMPOSITIONS = ("r_h_pbr", "r_h", "plain", "hadamard", "identity")


def eigh_sorted(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigen-decomposition of a symmetric [d, d] matrix in float64, ascending eigenvalues (torch.eigh).

    Each eigenvector's sign is fixed so its largest-magnitude entry is positive: eigh's signs are
    arbitrary, and calibration must give the same artifact hash on every worker and every run.
    """
    if c.ndim != 2 or c.shape[0] != c.shape[1]:
        raise ValueError(f"target must be a square [d, d] matrix, got {tuple(c.shape)}")
    c64 = c.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(c64).all()):
        raise ValueError("target matrix has NaN/inf entries: the captured activations are not finite")
    evals, evecs = torch.linalg.eigh((c64 + c64.T) / 2)
    pivot = evecs.abs().argmax(0)
    signs = torch.sign(evecs[pivot, torch.arange(evecs.shape[1])])
    signs[signs == 0] = 1
    return evals, evecs * signs


def fit_rotation(c: torch.Tensor, composition: str = "r_h_pbr") -> tuple[torch.Tensor, torch.Tensor]:
    """Fit one rotation to a target covariance.

    c: [d, d] (per layer) or [H, d, d] (per KV head).  Returns (R, eigenvalues) in float64 with
    R: [d, d] or [H, d, d], orthogonal to ~1e-15, and eigenvalues ascending ([d] or [H, d]).
    """
    if composition not in COMPOSITIONS:
        raise ValueError(f"composition must be one of {COMPOSITIONS}, got {composition!r}")
    if c.ndim == 3:
        fits = [fit_rotation(ch, composition) for ch in c]
        return torch.stack([r for r, _ in fits]), torch.stack([e for _, e in fits])
    evals, u = eigh_sorted(c)
    d = c.shape[0]
    if composition == "identity":
        return torch.eye(d, dtype=torch.float64), evals
    h = hadamard(d)
    if composition == "hadamard":  # QuaRot-style, data-free
        return h, evals
    if composition == "plain":
        return u, evals
    uh = u @ h
    if composition == "r_h":
        return uh, evals
    return uh[:, bit_reversal_permutation(evals)], evals


def orthogonality_error(r: torch.Tensor) -> float:
    """max |RᵀR − I| (per head when r is [H, d, d])."""
    r64 = r.to(torch.float64)
    eye = torch.eye(r64.shape[-1], dtype=torch.float64)
    return float((r64.transpose(-1, -2) @ r64 - eye).abs().max())

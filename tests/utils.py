"""Test helpers."""

from __future__ import annotations

import torch


def assert_close_verbose(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float, what: str = "") -> None:
    """NaN/inf-aware allclose that reports how many elements mismatch and where the worst is."""
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    nan_mismatch = torch.isnan(a) != torch.isnan(e)
    diff = (a - e).abs().nan_to_num(0.0)
    bad = (diff > atol + rtol * e.abs().nan_to_num(0.0)) | nan_mismatch
    if bool(bad.any()):
        idx = torch.nonzero(bad)[:5].tolist()
        worst = int(diff.flatten().argmax())
        raise AssertionError(f"{what}: {int(bad.sum())}/{bad.numel()} elements differ (atol={atol}, rtol={rtol}); "
                             f"first at {idx}; max |diff| {float(diff.max()):.3e} at flat index {worst}")


def save_random_rotations(path, n_layers: int, head_dim: int, n_kv_heads: int, architecture: str) -> str:
    """A RotationSet of random orthogonal R_K / R_V per layer (fixed seed) saved at `path`, as a
    deployment passes an artifact; clip ratios are the defaults K 0.96 / V 0.92."""
    from oscar_ray.quant import RotationSet

    g = torch.Generator().manual_seed(1)
    r = torch.linalg.qr(torch.randn(2 * n_layers, head_dim, head_dim, generator=g, dtype=torch.float64))[0].float()
    ones = torch.ones(n_layers, head_dim)
    rs = RotationSet(r[:n_layers], r[n_layers:], ones, ones.clone(), torch.full((n_layers,), 0.96),
                     torch.full((n_layers,), 0.92), manifest={"n_kv_heads": n_kv_heads, "architecture": architecture})
    rs.save(path)
    return str(path)

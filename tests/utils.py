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

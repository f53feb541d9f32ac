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


def int2_tier_checksums(kv, seg) -> dict[tuple[int, int], int]:
    """XOR of every 32-bit word of each (request, KV head)'s INT2-tier code rows and (s, z) pairs, K
    and V: what decode_cuda's read_only ring must sum to over its CTAs and warps."""
    import numpy as np

    out = {}
    lens, table = seg.int2_lens.tolist(), seg.int2_page_table.cpu()
    page = kv.k_codes.shape[1]
    tensors = [t.cpu() for t in (kv.k_codes, kv.v_codes, kv.k_scales, kv.v_scales)]
    for b, n in enumerate(lens):
        pages = table[b, :(n + page - 1) // page].long()
        for kh in range(kv.k_codes.shape[2]):
            x = np.uint32(0)
            for t in tensors:
                rows = t[pages, :, kh].flatten(0, 1)[:n].contiguous()
                x ^= np.bitwise_xor.reduce(rows.view(torch.uint8).numpy().view(np.uint32).ravel(), initial=np.uint32(0))
            out[(b, kh)] = int(x)
    return out

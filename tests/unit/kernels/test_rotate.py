"""rotate_qk against reference.rotate_heads (fp32 rounding), every GQA grouping and rotation shape."""

import pytest
import torch

from oscar_ray.kernels.reference import rotate_heads
from oscar_ray.kernels.rotate import rotate_qk


def _orthogonal(*shape, gen):
    return torch.linalg.qr(torch.randn(*shape, dtype=torch.float64, generator=gen))[0].float()


@pytest.mark.parametrize("n, hkv, g, d, per_head, dtype", [
    (1, 8, 4, 128, True, torch.bfloat16), (19, 2, 3, 64, True, torch.float32), (5, 4, 1, 64, False, torch.float16),
    (33, 1, 12, 128, False, torch.bfloat16)])
def test_rotate_qk_equals_rotate_heads(seed, n, hkv, g, d, per_head, dtype):
    gen = torch.Generator().manual_seed(seed)
    r = _orthogonal(hkv, d, d, gen=gen) if per_head else _orthogonal(d, d, gen=gen)
    q = torch.randn(n, hkv * g, d, generator=gen).to(dtype)
    k = torch.randn(n, hkv, d, generator=gen).to(dtype)
    q_rot, k_rot = rotate_qk(q, r, k)
    assert q_rot.dtype == k_rot.dtype == torch.float32
    torch.testing.assert_close(q_rot, rotate_heads(q, r), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(k_rot, rotate_heads(k, r), atol=2e-5, rtol=1e-5)
    q_only, none = rotate_qk(q, r, n_kv_heads=hkv)
    assert none is None and torch.equal(q_only, q_rot)


def test_rotate_qk_strided_rows_and_errors(seed):
    gen = torch.Generator().manual_seed(seed)
    r = _orthogonal(2, 64, 64, gen=gen)
    qkv = torch.randn(3, 8 + 2 + 2, 64, generator=gen)  # q and k as views of one fused projection
    q, k = qkv[:, :8], qkv[:, 8:10]
    q_rot, k_rot = rotate_qk(q, r, k)
    torch.testing.assert_close(q_rot, rotate_heads(q, r), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(k_rot, rotate_heads(k, r), atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="rotation must be"):
        rotate_qk(q, r[:, :32, :32], k)
    with pytest.raises(ValueError, match="not a multiple"):
        rotate_qk(q[:, :7], r, k)
    with pytest.raises(ValueError, match="rotation is required"):
        rotate_qk(q, None)
    with pytest.raises(ValueError, match="k has size"):
        rotate_qk(q, r, k[:2])
    assert rotate_qk(q[:0], r, k[:0])[0].shape == (0, 8, 64)

"""rotate_qk compiled, against torch's matmul on the card, at decode and prefill row counts.
Skipped without CUDA."""

import pytest
import torch

from oscar_ray.kernels import rotate_qk
from oscar_ray.kernels.reference import rotate_heads

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n", [1, 8, 32, 4096])
@pytest.mark.parametrize("per_head", [False, True])
def test_rotate_qk_matches_torch_cuda(seed, n, per_head):
    hkv, g, d = 8, 4, 128
    shape = (hkv, d, d) if per_head else (d, d)
    r = torch.linalg.qr(torch.randn(*shape, device="cuda", dtype=torch.float64))[0].float()
    qkv = torch.randn(n, hkv * g + 2 * hkv, d, device="cuda").to(torch.bfloat16)  # views of a fused projection
    q, k = qkv[:, :hkv * g], qkv[:, hkv * g:hkv * (g + 1)]
    q_rot, k_rot = rotate_qk(q, r, k)
    # fp32 FMA chains against cuBLAS's fp32 (no TF32: allow_tf32 is off by default for matmul)
    torch.testing.assert_close(q_rot, rotate_heads(q, r), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_rot, rotate_heads(k, r), atol=1e-5, rtol=1e-5)

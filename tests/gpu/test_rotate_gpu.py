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


@pytest.mark.parametrize("n", [1, 8, 33])
def test_rotate_qk_store_equals_bf16_write_kv_cuda(seed, n):
    # the sglang "rotate" decode form's BF16 copy: rotate_qk's store programs and bf16_write_kv run
    # the same compiled column programs, so the pages must be bit-equal on the card too
    from oscar_ray.kernels import bf16_write_kv
    from oscar_ray.kernels.rotate import NewRows

    hkv, g, d, pages, page = 8, 4, 128, 40, 64
    r = torch.linalg.qr(torch.randn(hkv, d, d, device="cuda", dtype=torch.float64))[0].float()
    q = torch.randn(n, hkv * g, d, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(n, hkv, d, device="cuda").to(torch.bfloat16) for _ in "kv")
    ids = torch.randperm(pages, device="cuda")[:n].int()  # one row per page: no two rows share a slot
    offs = torch.randint(0, page, (n,), device="cuda").int()
    kp, vp = (torch.zeros(pages, page, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    want_k, want_v = kp.clone(), vp.clone()
    bf16_write_kv(k, v, r, None, ids, offs, want_k, want_v)
    q_rot, _ = rotate_qk(q, r, n_kv_heads=hkv, store=NewRows(k, v, None, ids, offs, kp, vp))
    torch.cuda.synchronize()
    assert torch.equal(kp, want_k) and torch.equal(vp, want_v)
    torch.testing.assert_close(q_rot, rotate_heads(q, r), atol=1e-5, rtol=1e-5)

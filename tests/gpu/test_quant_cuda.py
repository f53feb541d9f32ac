"""The math core on CUDA agrees with the CPU (runs on the H200; skipped without CUDA)."""

import pytest
import torch

from oscar_ray.quant import dequantize_int2, pack_int2, quantize_int2, reference_attention, unpack_int2

pytestmark = pytest.mark.gpu


def test_int2_cuda_matches_cpu(seed):
    x = torch.randn(1000, 8, 128) * 4
    c_cpu, s_cpu = quantize_int2(x)
    c_gpu, s_gpu = quantize_int2(x.cuda())
    assert torch.equal(c_gpu.cpu(), c_cpu) and torch.equal(s_gpu.cpu(), s_cpu)
    assert torch.equal(unpack_int2(pack_int2(c_gpu)).cpu(), c_cpu)
    assert torch.allclose(dequantize_int2(c_gpu, s_gpu).cpu(), dequantize_int2(c_cpu, s_cpu))


def test_attention_cuda_matches_cpu(seed):
    q, k, v = torch.randn(64, 32, 128), torch.randn(64, 8, 128), torch.randn(64, 8, 128)
    assert torch.allclose(reference_attention(q.cuda(), k.cuda(), v.cuda()).cpu(), reference_attention(q, k, v), atol=1e-10)

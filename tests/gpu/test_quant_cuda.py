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


def test_clip_fit_takes_cuda_activations_and_matches_cpu(seed):
    # a GPU calibration worker feeds CUDA keys/values into a ClipFit built from CPU statistics
    from oscar_ray.quant import ClipFit

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(512, 2, 64, generator=g, dtype=torch.float64)
    c_q = torch.einsum("thi,thj->hij", q, q) / 512
    r = torch.linalg.qr(torch.randn(64, 64, generator=g, dtype=torch.float64))[0]
    k, v = torch.randn(2, 256, 2, 64, generator=g, dtype=torch.float64)
    cpu, gpu = ClipFit(c_q, r, r), ClipFit(c_q, r, r)
    cpu.update(k, v)
    gpu.update(k.cuda(), v.cuda())
    assert gpu.k_err.device.type == "cpu" and gpu.best() == cpu.best()
    assert torch.allclose(gpu.k_err, cpu.k_err, rtol=1e-9) and torch.allclose(gpu.v_err, cpu.v_err, rtol=1e-9)


def test_centred_quantisers_take_cuda_activations(seed):
    # the calibrated means live on the CPU (artifact); centring must follow the activations' device
    from oscar_ray.quant import ChannelMean, ClipFit, fake_quantize

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(512, 2, 64, generator=g, dtype=torch.float64)
    c_q = torch.einsum("thi,thj->hij", q, q) / 512
    r = torch.linalg.qr(torch.randn(64, 64, generator=g, dtype=torch.float64))[0]
    k, v = torch.randn(2, 256, 2, 64, generator=g, dtype=torch.float64) + 5.0
    mean = ChannelMean(2, 64, skip=16)
    mean.update(k.cuda())
    mu = mean.mean()
    assert mu.device.type == "cpu" and torch.allclose(mu, k[16:].mean(0))
    cpu, gpu = ClipFit(c_q, r, r, k_mean=mu, v_mean=mu), ClipFit(c_q, r, r, k_mean=mu, v_mean=mu)
    cpu.update(k, v)
    gpu.update(k.cuda(), v.cuda())
    assert gpu.best() == cpu.best() and torch.allclose(gpu.k_err, cpu.k_err, rtol=1e-9)
    # fp64 rotations round differently on the GPU: allow the rare code flip at a rounding boundary
    diff = (fake_quantize(k.cuda(), r, 0.9, mean=mu).cpu() - fake_quantize(k, r, 0.9, mean=mu)).abs()
    assert float((diff > 1e-5).double().mean()) < 1e-3

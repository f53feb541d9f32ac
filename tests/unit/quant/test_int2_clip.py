import pytest
import torch

from oscar_ray.quant import clip_index, clip_rows, dequantize_int2, fake_quantize, pack_int2, quantize_int2, unpack_int2
from oscar_ray.quant.int2 import LLOYD_MAX_OUTER, LLOYD_MAX_RATIO


@pytest.mark.parametrize("d", [4, 64, 128])
def test_pack_unpack_bit_exact(seed, d):
    codes = torch.randint(0, 4, (7, 3, d), dtype=torch.uint8)
    packed = pack_int2(codes)
    assert packed.shape == (7, 3, d // 4) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int2(packed), codes)


def test_pack_layout_is_quartered():
    d = 16
    codes = torch.zeros(d, dtype=torch.uint8)
    codes[1], codes[1 + d // 4], codes[1 + d // 2], codes[1 + 3 * d // 4] = 1, 2, 3, 1
    packed = pack_int2(codes)
    assert packed[1] == 1 | (2 << 2) | (3 << 4) | (1 << 6)
    assert torch.all(packed[[0, 2, 3]] == 0)


def test_pack_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple of 4"):
        pack_int2(torch.zeros(6, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        pack_int2(torch.zeros(8, dtype=torch.int32))


@pytest.mark.parametrize("group_size", [None, 32, 16])
@pytest.mark.parametrize("scale_dtype,slack", [("float32", 1e-5), ("float16", 4e-3)])
def test_dequant_error_within_half_step(seed, group_size, scale_dtype, slack):
    d = 64
    x = torch.randn(500, 2, d) * torch.rand(500, 2, 1) * 10
    codes, scales = quantize_int2(x, group_size, scale_dtype)
    assert int(codes.max()) <= 3
    gs = group_size or d
    assert scales.shape == (500, 2, 2 * (d // gs)) and scales.dtype == getattr(torch, scale_dtype)
    xq = dequantize_int2(codes, scales, group_size)
    step = scales.float()[..., 0::2].repeat_interleave(gs, dim=-1)
    err = (x - xq).abs()
    assert torch.all(err <= step / 2 * (1 + slack) + 1e-6), float((err / step).max())


def test_constant_rows_are_finite():
    x = torch.full((3, 1, 64), 2.5)
    codes, scales = quantize_int2(x)
    xq = dequantize_int2(codes, scales)
    assert torch.isfinite(xq).all() and torch.allclose(xq, x, atol=1e-3)


def test_lloyd_max_levels(seed):
    x = torch.randn(100, 1, 128)
    codes, scales = quantize_int2(x, scale_dtype="float32", lloyd_max=True)
    xq = dequantize_int2(codes, scales)
    mu, sigma = x.mean(-1, keepdim=True), x.std(-1, unbiased=False, keepdim=True)
    levels = (xq - mu) / sigma
    step = 2 * LLOYD_MAX_OUTER / 3 * LLOYD_MAX_RATIO
    expected = torch.tensor([-1.5, -0.5, 0.5, 1.5]) * step
    assert torch.allclose(levels, expected[codes.long()], atol=1e-4)


def test_bad_parameters_name_the_field():
    with pytest.raises(ValueError, match="group_size"):
        quantize_int2(torch.randn(2, 64), group_size=48)
    with pytest.raises(ValueError, match="scale_dtype"):
        quantize_int2(torch.randn(2, 64), scale_dtype="bfloat8")
    with pytest.raises(ValueError, match="clip_ratio"):
        clip_rows(torch.randn(2, 64), 1.5)


@pytest.mark.parametrize("ratio,n_clipped", [(0.96, 5), (0.92, 10)])
def test_clip_counts_at_head_dim_128(seed, ratio, n_clipped):
    x = torch.randn(50, 128, dtype=torch.float64)
    y = clip_rows(x, ratio)
    assert clip_index(ratio, 128) == 128 - n_clipped - 1
    assert torch.all((y != x).sum(-1) == n_clipped)
    assert torch.all(y.abs().amax(-1) == torch.sort(x.abs(), -1).values[:, clip_index(ratio, 128)])


def test_clip_zero_is_identity(seed):
    x = torch.randn(4, 64)
    assert clip_rows(x, 0.0) is x
    assert torch.equal(clip_rows(x, 1.0), x)


def test_fake_quantize_round_trips_rotation(seed):
    from oscar_ray.quant import hadamard

    x = torch.randn(64, 3, 64, dtype=torch.float64)
    h = hadamard(64)
    direct = fake_quantize(x, h)
    codes, scales = quantize_int2(x @ h)
    assert torch.allclose(direct, dequantize_int2(codes, scales).double() @ h.T, atol=1e-12)

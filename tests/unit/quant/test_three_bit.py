"""3-bit codes (the cache's key_bits 3): the 7-step grid and the two-plane packing."""

import pytest
import torch

from oscar_ray.quant import dequantize_int2, fake_quantize, pack_codes, pack_int2, quantize_int2, unpack_codes


@pytest.mark.parametrize("d", [8, 64, 128])
def test_pack_round_trip_and_layout(d):
    codes = torch.randint(0, 8, (5, 3, d), dtype=torch.uint8)
    packed = pack_codes(codes, 3)
    assert packed.shape == (5, 3, 3 * d // 8)
    assert torch.equal(unpack_codes(packed, 3), codes)
    assert torch.equal(packed[..., : d // 4], pack_int2(codes & 3))  # low bits: the INT2 layout as is
    e = d // 8  # byte i of the plane holds bit 2 of element i + j·d/8 at bit j
    plane = packed[..., d // 4:]
    for j in range(8):
        assert torch.equal((plane >> j) & 1, (codes[..., j * e:(j + 1) * e] >> 2) & 1)
    assert torch.equal(pack_codes(codes & 3, 2), pack_int2(codes & 3))


def test_seven_step_grid(seed):
    x = torch.randn(64, 4, 64) * 3
    c3, s3 = quantize_int2(x, bits=3)
    c2, s2 = quantize_int2(x)
    assert int(c3.max()) == 7 and int(c3.min()) == 0
    row_min, row_max = x.amin(-1), x.amax(-1)
    assert torch.allclose(s3[..., 0].float(), (row_max - row_min) / 7, rtol=1e-3)  # fp16 scale
    err3 = (dequantize_int2(c3, s3) - x).pow(2).mean()
    err2 = (dequantize_int2(c2, s2) - x).pow(2).mean()
    assert err3 < 0.3 * err2  # (3/7)² ≈ 0.18 for uniform rounding error
    assert (dequantize_int2(c3, s3) - x).abs().max() <= 0.5 * s3[..., :1].float().max() * 1.01
    fq = fake_quantize(x, bits=3)
    assert torch.allclose(fq.float(), dequantize_int2(c3, s3), atol=1e-6)


def test_bad_bits_and_shapes():
    x = torch.randn(2, 64)
    for bad in (1, 4, True):
        with pytest.raises(ValueError, match="bits"):
            quantize_int2(x, bits=bad)
    with pytest.raises(ValueError, match="lloyd_max"):
        quantize_int2(x, lloyd_max=True, bits=3)
    with pytest.raises(ValueError, match="feedback"):
        fake_quantize(x[None], feedback=torch.eye(64)[None], bits=3)
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_codes(torch.zeros(2, 12, dtype=torch.uint8), 3)
    with pytest.raises(ValueError, match="3-bit"):
        unpack_codes(torch.zeros(2, 10, dtype=torch.uint8), 3)

import pytest
import torch

from oscar_ray.quant import (bit_reversal_permutation, bit_reverse_indices, dequantize_int2, fit_rotation, hadamard,
                             orthogonality_error, permutation_matrix, quantize_int2)
from oscar_ray.quant.rotation import eigh_sorted


def _spd(d: int) -> torch.Tensor:
    a = torch.randn(4 * d, d, dtype=torch.float64) * torch.logspace(0, 2, d, dtype=torch.float64)
    return a.T @ a / (4 * d)


@pytest.mark.parametrize("d", [1, 2, 4, 32, 64, 128, 256])
def test_hadamard_is_orthogonal(d):
    h = hadamard(d)
    assert orthogonality_error(h) < 1e-13
    assert torch.all((h.abs() - d**-0.5).abs() < 1e-15)


@pytest.mark.parametrize("d", [0, 3, 48, 96, 100])
def test_hadamard_rejects_non_power_of_two(d):
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        hadamard(d)


def test_bit_reverse_indices():
    assert bit_reverse_indices(8).tolist() == [0, 4, 2, 6, 1, 5, 3, 7]


def test_bit_reversal_places_sorted_columns(seed):
    d = 128
    evals = torch.randn(d)
    order = torch.argsort(evals, descending=True)
    perm = bit_reversal_permutation(evals)
    # OSCAR_SPEC §2.3: top source column at position 0, 2nd at 64, 3rd at 32, 4th at 96
    assert [int(perm[p]) for p in (0, 64, 32, 96)] == order[:4].tolist()
    assert sorted(perm.tolist()) == list(range(d))
    x = torch.randn(5, d, dtype=torch.float64)
    assert torch.equal(x @ permutation_matrix(perm), x[:, perm])


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("composition", ["r_h_pbr", "r_h", "plain", "hadamard"])
def test_rotation_orthogonal_fp64(seed, d, composition):
    r, evals = fit_rotation(_spd(d), composition)
    assert r.dtype == torch.float64 and r.shape == (d, d)
    assert orthogonality_error(r) < 1e-12
    assert torch.all(evals[1:] >= evals[:-1])


@pytest.mark.parametrize("d", [64, 128])
def test_diag_of_rotated_target_is_uniform(seed, d):
    c = _spd(d)
    r, _ = fit_rotation(c)
    diag = torch.diagonal(r.T @ c @ r)
    expected = torch.trace(c) / d
    assert torch.allclose(diag, expected.expand(d), rtol=1e-10, atol=0)


def test_per_head_rotation_shapes(seed):
    c = torch.stack([_spd(64) for _ in range(3)])
    r, e = fit_rotation(c)
    assert r.shape == (3, 64, 64) and e.shape == (3, 64)
    assert orthogonality_error(r) < 1e-12


def test_eigenvector_signs_are_canonical(seed):
    c = _spd(32)
    _, u1 = eigh_sorted(c)
    _, u2 = eigh_sorted(c.clone())
    assert torch.equal(u1, u2)
    pivot = u1.abs().argmax(0)
    assert torch.all(u1[pivot, torch.arange(32)] > 0)


@pytest.mark.parametrize("scale_dtype", ["float16", "float32"])
def test_bit_reversal_changes_nothing_when_group_is_head_dim(seed, scale_dtype):
    d = 64
    c = _spd(d)
    r_h, evals = fit_rotation(c, "r_h")
    r_hp, _ = fit_rotation(c, "r_h_pbr")
    perm = bit_reversal_permutation(evals)
    x = torch.randn(200, 3, d, dtype=torch.float64) * 3
    codes_a, scales_a = quantize_int2(x @ r_h, None, scale_dtype)
    codes_b, scales_b = quantize_int2(x @ r_hp, None, scale_dtype)
    assert torch.equal(scales_a, scales_b)  # min/max are permutation invariant: bit-identical scales
    assert torch.equal(codes_a[..., perm], codes_b)  # codes are the same, only relabelled
    back_a = dequantize_int2(codes_a, scales_a).double() @ r_h.T
    back_b = dequantize_int2(codes_b, scales_b).double() @ r_hp.T
    assert torch.allclose(back_a, back_b, atol=1e-12, rtol=0)

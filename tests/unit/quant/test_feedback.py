"""Query-aware rounding (quant/feedback.py): same grid as nearest rounding, lower logit error."""

import pytest
import torch

from oscar_ray.quant import (ClipFit, QueryMoment, clip_rows, dequantize_int2, fake_quantize, feedback_factor,
                             fit_rotation, quantize_int2, quantize_int2_feedback)


def _anisotropic_metric(h: int, d: int, rank: int = 4) -> torch.Tensor:
    a = torch.randn(h, d, rank, dtype=torch.float64)
    return a @ a.transpose(-1, -2) + 0.01 * torch.eye(d, dtype=torch.float64)


def _weighted(e: torch.Tensor, m: torch.Tensor) -> float:
    return float(torch.einsum("thi,hij,thj->", e.double(), m, e.double()))


def test_factor_is_unit_upper_triangular():
    g = feedback_factor(_anisotropic_metric(3, 32))
    assert g.dtype == torch.float32 and g.shape == (3, 32, 32)
    assert torch.equal(torch.tril(g, -1), torch.zeros_like(g))
    assert torch.allclose(g.diagonal(dim1=-2, dim2=-1), torch.ones(3, 32))


def test_factor_rejects_bad_input():
    with pytest.raises(ValueError, match="metric"):
        feedback_factor(torch.zeros(4, 3))
    with pytest.raises(ValueError, match="damp"):
        feedback_factor(torch.eye(4), damp=0.0)


@pytest.mark.parametrize("group_size", [None, 16])
def test_isotropic_metric_gives_nearest_codes(group_size):
    # M = I: (M + λI)⁻¹ is diagonal, nothing is fed forward, so the codes are nearest rounding of the
    # clipped rows (an element beyond the clip saturates at code 0 or 3 either way)
    x = torch.randn(50, 2, 64)
    xc = clip_rows(x, 0.9)
    codes, scales = quantize_int2_feedback(x, xc, feedback_factor(torch.eye(64).expand(2, 64, 64)), group_size)
    ref_codes, ref_scales = quantize_int2(xc, group_size)
    assert torch.equal(codes, ref_codes) and torch.equal(scales, ref_scales)


@pytest.mark.parametrize("group_size", [None, 32])
def test_feedback_lowers_the_weighted_error_on_the_same_grid(group_size):
    h, d = 2, 64
    m = _anisotropic_metric(h, d)
    x = torch.randn(400, h, d)
    xc = clip_rows(x, 0.9)
    codes, scales = quantize_int2_feedback(x, xc, feedback_factor(m), group_size)
    near_codes, near_scales = quantize_int2(xc, group_size)
    assert torch.equal(scales, near_scales)  # the grid is the one nearest rounding stores
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 3
    e_fb = x - dequantize_int2(codes, scales, group_size)
    e_near = x - dequantize_int2(near_codes, near_scales, group_size)
    # rank-4 query subspace: the error is pushed out of it (measured ~0.05-0.2×)
    assert _weighted(e_fb, m) < 0.5 * _weighted(e_near, m)
    # it is paid for in plain MSE, which is why it is for keys (logits) only
    assert float(e_fb.pow(2).sum()) > float(e_near.pow(2).sum())


def test_shapes_are_checked():
    x = torch.randn(5, 2, 16)
    with pytest.raises(ValueError, match="factor"):
        quantize_int2_feedback(x, x, torch.eye(16).expand(3, 16, 16))
    with pytest.raises(ValueError, match="clipped"):
        quantize_int2_feedback(x, x[:4], torch.eye(16).expand(2, 16, 16))


def test_fake_quantize_with_feedback_lowers_logit_error():
    h, d = 2, 32
    q = torch.randn(600, 2 * h, d, dtype=torch.float64) * torch.linspace(3, 0.1, d, dtype=torch.float64)
    k = torch.randn(600, h, d, dtype=torch.float64)
    acc = QueryMoment(h, d, n_q_heads=2 * h)
    acc.update(q)
    c_q = acc.per_head()
    r, _ = fit_rotation(c_q)
    fb = feedback_factor(r.transpose(-1, -2) @ c_q @ r)
    near = fake_quantize(k, r, 0.9)
    aware = fake_quantize(k, r, 0.9, feedback=fb)
    assert _weighted(k - aware, c_q) < 0.8 * _weighted(k - near, c_q)
    with pytest.raises(ValueError, match="lloyd_max"):
        fake_quantize(k, r, 0.9, lloyd_max=True, feedback=fb)


def _clipfit_setup(h=2, d=16, t=96):
    q = torch.randn(t, 2 * h, d, dtype=torch.float64)
    k, v = torch.randn(t, h, d, dtype=torch.float64), torch.randn(t, h, d, dtype=torch.float64)
    acc = QueryMoment(h, d, n_q_heads=2 * h)
    acc.update(q)
    c_q = acc.per_head()
    r, _ = fit_rotation(c_q)
    return q, k, v, c_q, r, feedback_factor(r.transpose(-1, -2) @ c_q @ r)


def test_clipfit_attention_objective_merges_and_needs_queries():
    q, k, v, c_q, r, fb = _clipfit_setup()
    cands = (0.0, 0.8, 0.9)
    mk = lambda: ClipFit(c_q, r, r, candidates=cands, k_feedback=fb, key_objective="attention", sink=8)  # noqa: E731
    whole, a, b = mk(), mk(), mk()
    whole.update(k, v, q)
    whole.update(k[:50], v[:50], q[:50])
    a.update(k, v, q)
    b.update(k[:50], v[:50], q[:50])
    merged = a.merge(b)
    assert torch.allclose(merged.k_err, whole.k_err) and torch.allclose(merged.v_err, whole.v_err)
    assert bool((whole.k_err > 0).all())
    with pytest.raises(ValueError, match="needs q"):
        mk().update(k, v)
    with pytest.raises(ValueError, match="key_objective"):
        ClipFit(c_q, r, r, key_objective="mse")


def test_clipfit_attention_objective_keeps_the_sink_exact():
    q, k, v, c_q, r, fb = _clipfit_setup(t=40)
    fit = ClipFit(c_q, r, r, candidates=(0.0, 0.9), k_feedback=fb, key_objective="attention", sink=40)
    fit.update(k, v, q)
    assert torch.equal(fit.k_err, torch.zeros(2, dtype=torch.float64))  # every key in the sink

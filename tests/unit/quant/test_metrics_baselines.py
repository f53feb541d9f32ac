import pytest
import torch

from oscar_ray.quant import (ClipFit, QueryMoment, attention_output_error, bits_per_element, fit_rotation, kivi2,
                             logit_error, naive_int2, oscar_int2, per_channel_int2, quarot_int2, reference_attention)


def test_bits_per_element_matches_paper():
    assert round(bits_per_element(131072), 3) == 2.284
    assert round(bits_per_element(32768), 3) == 2.384
    assert bits_per_element(320) == 16.0
    assert bits_per_element(10**9, head_dim=64, group_size=64) == pytest.approx(2.5, abs=1e-5)
    with pytest.raises(ValueError, match="context_len"):
        bits_per_element(0)


def test_logit_error_equals_dense_definition(seed):
    q, k = torch.randn(20, 6, 8, dtype=torch.float64), torch.randn(30, 2, 8, dtype=torch.float64)
    k_hat = k + 0.1 * torch.randn_like(k)
    dense = sum(((q[:, h * 3 + j] @ (k[:, h] - k_hat[:, h]).T) ** 2).sum() for h in range(2) for j in range(3))
    ref = sum(((q[:, h * 3 + j] @ k[:, h].T) ** 2).sum() for h in range(2) for j in range(3))
    assert logit_error(q, k, k_hat, relative=False) == pytest.approx(float(dense), rel=1e-12)
    assert logit_error(q, k, k_hat) == pytest.approx(float(dense / ref), rel=1e-12)


def test_attention_matches_sdpa(seed):
    q, k, v = torch.randn(17, 6, 16), torch.randn(17, 2, 16), torch.randn(17, 2, 16)
    ours = reference_attention(q, k, v, chunk_size=5)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.double().transpose(0, 1), k.double().repeat_interleave(3, 1).transpose(0, 1),
        v.double().repeat_interleave(3, 1).transpose(0, 1), is_causal=True).transpose(0, 1)
    assert torch.allclose(ours, sdpa, atol=1e-12)
    assert attention_output_error(q, k, v, k, v) == 0.0


def test_kivi_keys_are_per_channel(seed):
    k = torch.randn(130, 2, 8, dtype=torch.float64)
    kq = per_channel_int2(k, token_group=64)
    for block in (kq[:64], kq[64:128]):
        for h in range(2):
            for c in range(8):
                assert len(torch.unique(block[:, h, c].float())) <= 4
    assert torch.equal(kq[128:], k[128:])  # partial group stays full precision
    k_hat, v_hat = kivi2(k, k.clone(), token_group=64, residual=10)
    assert torch.equal(k_hat[-10:], k[-10:]) and torch.equal(v_hat[-10:], k[-10:])


def test_rotations_tame_an_outlier_channel(seed):
    # One channel 30x larger than the rest (as in real keys): min-max per token spends all four levels
    # on it; a Hadamard turns the spike into ±30/8 on every channel, which four levels capture well.
    d, t = 64, 256
    k = torch.randn(t, 1, d, dtype=torch.float64)
    k[..., 5] *= 30
    v = torch.randn(t, 1, d, dtype=torch.float64)
    q = torch.randn(t, 3, d, dtype=torch.float64)
    naive = logit_error(q, k, naive_int2(k, v)[0])
    quarot = logit_error(q, k, quarot_int2(k, v)[0])
    assert quarot < naive / 2, (naive, quarot)


def test_clip_fit_merges_and_picks_a_candidate(seed):
    d = 32
    q, k, v = torch.randn(100, 4, d), torch.randn(100, 2, d), torch.randn(100, 2, d)
    m = QueryMoment(2, d, n_q_heads=4)
    m.update(q)
    r, _ = fit_rotation(m.layer())
    cands = (0.0, 0.8, 0.9)
    whole = ClipFit(m.per_head(), r, r, candidates=cands)
    whole.update(k, v)
    a, b = ClipFit(m.per_head(), r, r, candidates=cands), ClipFit(m.per_head(), r, r, candidates=cands)
    a.update(k[:40], v[:40])
    b.update(k[40:], v[40:])
    merged = a.merge(b)
    assert torch.allclose(merged.k_err, whole.k_err, rtol=1e-12) and torch.allclose(merged.v_err, whole.v_err, rtol=1e-12)
    r_k, r_v = whole.best()
    assert r_k in cands and r_v in cands
    assert whole.k_err[cands.index(r_k)] == whole.k_err.min()
    with pytest.raises(ValueError, match="candidates"):
        ClipFit(m.per_head(), r, r, candidates=(1.2,))

"""Channel-mean centring: exact merges, artifact round trip, exactness under softmax, and that it
removes a shared per-channel offset from the INT2 error."""

import json

import pytest
import torch

from oscar_ray.quant import (ChannelMean, ModelGeometry, RotationSet, add_value_mean, centred, fit_rotation,
                             oscar_int2, reference_attention)
from oscar_ray.quant.artifact import MANIFEST_FILE


def test_channel_mean_streams_merges_and_skips(seed):
    xs = [torch.randn(int(torch.randint(70, 200, ())), 3, 8) for _ in range(5)]
    one = ChannelMean(3, 8, skip=64)
    for x in xs:
        one.update(x)
    parts = [ChannelMean(3, 8, skip=64) for _ in range(2)]
    for i, x in enumerate(xs):
        parts[i % 2].update(x)
    ref = torch.cat([x[64:] for x in xs]).double().mean(0)
    torch.testing.assert_close(one.mean(), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(parts[0].merge(parts[1]).mean(), ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="x must be"):
        one.update(torch.randn(10, 2, 8))
    with pytest.raises(ValueError, match="no rows"):
        c = ChannelMean(3, 8, skip=64)
        c.update(torch.randn(10, 3, 8))
        c.mean()


def test_centring_is_exact_under_softmax(seed):
    """Without quantisation, shifting every key by μ_K and adding μ_V back after attention changes
    nothing: q·μ_K is one constant per query and the attention weights sum to 1."""
    q, k, v = torch.randn(40, 4, 16, dtype=torch.float64), torch.randn(40, 2, 16, dtype=torch.float64), \
        torch.randn(40, 2, 16, dtype=torch.float64)
    mu_k, mu_v = 5 * torch.randn(2, 16, dtype=torch.float64), 5 * torch.randn(2, 16, dtype=torch.float64)
    ref = reference_attention(q, k, v)
    out = add_value_mean(reference_attention(q, centred(k, mu_k), centred(v, mu_v)), mu_v)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_centring_removes_a_shared_offset(seed):
    """Keys = a large common offset + small per-token part: per-token INT2 spends its levels on the
    offset unless it is subtracted first; the centred error is several times smaller."""
    d = 32
    offset = torch.zeros(d)
    offset[:4] = 20.0
    k = offset + torch.randn(512, 1, d)
    r = fit_rotation(torch.eye(d, dtype=torch.float64) + 0.1 * torch.ones(d, d, dtype=torch.float64))[0]
    plain, _ = oscar_int2(k, k, r, r, 0.0, 0.0)
    cent, _ = oscar_int2(k, k, r, r, 0.0, 0.0, k_mean=k.double().mean(0), v_mean=k.double().mean(0))
    e_plain, e_cent = (k.double() - plain).norm(), (k.double() - cent).norm()
    assert e_cent < e_plain / 3, (e_plain, e_cent)


def _set(centred=True, per_head=0, n_layers=3, n_kv=2, d=16) -> RotationSet:
    shape = (n_layers, per_head, d, d) if per_head else (n_layers, d, d)
    rot = lambda: torch.linalg.qr(torch.randn(*shape, dtype=torch.float64))[0]  # noqa: E731
    means = {"k_mean": torch.randn(n_layers, n_kv, d), "v_mean": torch.randn(n_layers, n_kv, d)} if centred else {}
    return RotationSet(rot(), rot(), torch.randn(shape[:-1]), torch.randn(shape[:-1]), torch.full((n_layers,), 0.9),
                       torch.full((n_layers,), 0.9), manifest={"n_kv_heads": n_kv}, **means)


@pytest.mark.parametrize("per_head", [0, 2])
def test_artifact_round_trip_with_means(tmp_path, seed, per_head):
    rs = _set(per_head=per_head)
    rs.save(tmp_path)
    back = RotationSet.load(tmp_path, expect=ModelGeometry(3, 2, 16))
    assert back.centred and back.manifest["centred"] and back.manifest["format_version"] == 2
    assert torch.equal(back.k_mean, rs.k_mean) and torch.equal(back.v_mean, rs.v_mean)
    # μ_V in the R_V basis, the one the cache sees after value absorption
    r = rs.v_rotation.double()
    want = (torch.einsum("lhi,lij->lhj", rs.v_mean.double(), r) if not per_head
            else torch.einsum("lhi,lhij->lhj", rs.v_mean.double(), r))
    torch.testing.assert_close(back.value_mean_rotated().double(), want, rtol=1e-6, atol=1e-6)


def test_uncentred_and_version_1_artifacts_load(tmp_path, seed):
    rs = _set(centred=False)
    rs.save(tmp_path)
    m = json.loads((tmp_path / MANIFEST_FILE).read_text())
    m["format_version"] = 1
    m.pop("centred")
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(m))
    back = RotationSet.load(tmp_path)
    assert not back.centred and back.k_mean is None and back.value_mean_rotated() is None


def test_bad_means_are_rejected(tmp_path, seed):
    good = _set()
    with pytest.raises(ValueError, match="k_mean must be"):
        RotationSet(good.k_rotation, good.v_rotation, good.k_eigenvalues, good.v_eigenvalues, good.k_clip,
                    good.v_clip, k_mean=torch.zeros(2, 2, 16), v_mean=torch.zeros(2, 2, 16))
    with pytest.raises(ValueError, match="together"):
        RotationSet(good.k_rotation, good.v_rotation, good.k_eigenvalues, good.v_eigenvalues, good.k_clip,
                    good.v_clip, k_mean=good.k_mean)
    # a manifest that claims means the tensor file does not hold
    _set(centred=False).save(tmp_path)
    m = json.loads((tmp_path / MANIFEST_FILE).read_text())
    m["centred"] = True
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(m))
    with pytest.raises(ValueError, match="centred"):
        RotationSet.load(tmp_path)

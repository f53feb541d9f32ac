"""`rotations: hadamard | identity` (the QuaRot-INT2 and naive-INT2 baselines of the quality
benchmarks): the named basis is the one served, exact while every key is BF16, and it changes what
the INT2 history holds."""

from __future__ import annotations

import torch

from oscar_ray.engines.torch.core import EngineCore
from oscar_ray.quant import hadamard

from .conftest import tiny_config, tiny_model

IDS = list(range(1000, 1090))


def _ref_logprobs(ids):
    with torch.no_grad():
        lp = torch.log_softmax(tiny_model()(input_ids=torch.tensor([ids])).logits[0, :-1], -1)
    return lp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_named_rotations_are_served_and_exact_without_int2(tokenizer):
    ref = _ref_logprobs(IDS)
    errs = {}
    for name, want in (("hadamard", hadamard(16).float()), ("identity", torch.eye(16))):
        core = EngineCore(tiny_config(name), tiny_model(), tokenizer)
        assert torch.allclose(core.k_rotation, want.expand(2, 16, 16), atol=1e-6), name
        assert torch.allclose(core.rotations.v_rotation, want.expand(2, 16, 16), atol=1e-6), name
        assert torch.allclose(core.rotations.k_clip, torch.full((2,), core.cfg.cache.k_clip_ratio))
        one_chunk = core.score(IDS, chunk=len(IDS))  # no cached prefix is read: the rotation must be exact
        assert (one_chunk - ref).abs().max() < 1e-4, name
        errs[name] = (core.score(IDS, chunk=8) - ref).abs()  # later chunks read INT2 history
        core.allocator.check_invariants()
    for name, diff in errs.items():
        assert diff[16:].max() > 1e-3, name  # the history really is INT2 under both baselines
    assert not torch.allclose(errs["hadamard"], errs["identity"])  # different bases, different errors


def test_an_unknown_rotation_name_is_a_missing_artifact(tokenizer):
    import pytest

    with pytest.raises((ValueError, FileNotFoundError, OSError)):
        EngineCore(tiny_config("hadamard-ish"), tiny_model(), tokenizer)

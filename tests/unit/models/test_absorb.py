"""Value absorption leaves logits unchanged (fp64, no quantisation); architecture facts."""

import pytest
import torch

from oscar_ray.models.absorb import absorb_value_rotation
from oscar_ray.models.arch import arch_facts
from oscar_ray.quant import hadamard


def _random_rotations(n_layers, n_kv, d, per_head):
    shape = (n_layers, n_kv, d, d) if per_head else (n_layers, d, d)
    q, _ = torch.linalg.qr(torch.randn(*shape, dtype=torch.float64))
    return q


def _tiny(kind):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=97, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**common, attention_bias=True)).double().eval()
    return LlamaForCausalLM(LlamaConfig(**common)).double().eval()


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("per_head", [False, True])
def test_tiny_models_logits_unchanged(seed, kind, per_head):
    lm = _tiny(kind)
    ids = torch.randint(0, 97, (2, 23))
    with torch.no_grad():
        before = lm(input_ids=ids).logits
        w0 = lm.model.layers[0].self_attn.v_proj.weight.clone()
        absorb_value_rotation(lm, _random_rotations(2, 2, 16, per_head))
        after = lm(input_ids=ids).logits
    assert (after - before).abs().max() < 1e-9
    # and the V projection did change (a no-op absorption would pass the check above)
    assert not torch.allclose(lm.model.layers[0].self_attn.v_proj.weight, w0)


def test_smollm2_fp64_logits_unchanged():
    from oscar_ray.models.loader import load_model

    lm, tok = load_model("smollm2", dtype=torch.float64)
    ids = tok("It is a truth universally acknowledged, that a single man", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        before = lm(input_ids=ids).logits
        w0 = lm.model.layers[3].self_attn.v_proj.weight.clone()
        absorb_value_rotation(lm, _random_rotations(30, 3, 64, False))
        after = lm(input_ids=ids).logits
    assert not torch.equal(w0, lm.model.layers[3].self_attn.v_proj.weight)
    assert (after - before).abs().max() < 1e-9


def test_absorbing_twice_is_refused_or_a_no_op():
    """The same rotation again leaves the weights alone; another one is refused, weights untouched."""
    lm = _tiny("llama")
    r = _random_rotations(2, 2, 16, True)
    absorb_value_rotation(lm, r)
    w = lm.model.layers[1].self_attn.v_proj.weight.clone()
    absorb_value_rotation(lm, r.clone())
    assert torch.equal(w, lm.model.layers[1].self_attn.v_proj.weight)
    with pytest.raises(ValueError, match="v_rotation"):
        absorb_value_rotation(lm, _random_rotations(2, 2, 16, True))
    assert torch.equal(w, lm.model.layers[1].self_attn.v_proj.weight)
    assert not any("absorbed" in k for k in lm.state_dict())


def test_wrong_shape_names_the_field():
    lm = _tiny("llama")
    with pytest.raises(ValueError, match="v_rotation"):
        absorb_value_rotation(lm, hadamard(16).expand(3, 16, 16))


def test_arch_facts():
    from transformers import Glm4MoeConfig, LlamaConfig, Qwen3Config

    assert arch_facts(LlamaConfig()).qk_norm == "none"
    assert arch_facts(Qwen3Config()).qk_norm == "per_head_rms"
    glm = arch_facts(Glm4MoeConfig(use_qk_norm=True))
    assert glm.rotary == "partial" and glm.qk_norm == "per_head_rms"
    assert arch_facts(Glm4MoeConfig(use_qk_norm=False)).qk_norm == "none"
    with pytest.raises(ValueError, match="model_type"):
        arch_facts(type("C", (), {"model_type": "mamba"})())

"""A tiny random Llama with SmolLM2's tokenizer (so detokenisation and chat templates are real),
and a check of the allocator's invariants after every engine test."""

from __future__ import annotations

import pytest
import torch

from tests.utils import save_random_rotations


@pytest.fixture(scope="session")
def tokenizer():
    from oscar_ray.models.loader import load_tokenizer

    return load_tokenizer("smollm2")


def tiny_model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    lm = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # peaky logits: greedy choices are not near-ties, so paging errors show as flips
        lm.lm_head.weight.mul_(8.0)
    return lm


@pytest.fixture(scope="session")
def tiny_rotations(tmp_path_factory):
    """Random orthogonal R_K, R_V per layer (an artifact on disk, as a deployment passes one)."""
    return save_random_rotations(tmp_path_factory.mktemp("rot"), 2, 16, 2, "LlamaForCausalLM")


TINY_CACHE = {"page_size": 4, "sink_tokens": 4, "recent_tokens": 8}


def tiny_config(rotations: str | None, **kw):
    from oscar_ray.engines.torch import TorchEngineConfig

    base = dict(model="tiny", kv_cache="oscar", rotations=rotations, max_model_len=256, num_bf16_pages=64,
                num_int2_pages=128, max_num_seqs=8, max_batched_tokens=32, cache=TINY_CACHE)
    base.update(kw)
    if base["kv_cache"] == "bf16":
        base["num_int2_pages"] = None
        base["rotations"] = None
    return TorchEngineConfig(**base)


def greedy_reference(lm, prompt: list[int], n: int) -> list[int]:
    """Plain transformers greedy decoding (full recompute each token): the engine must match it."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(lm(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]

"""Capture post-norm, post-RoPE Q/K and V of a real transformers model, layer by layer.

The hook is an attention function registered in transformers' AttentionInterface: it sees exactly
the (query, key, value) the attention kernel would (after q/k-norm and RoPE, before the KV cache),
hands them to a sink, then runs stock SDPA so the model's output is unchanged.  No activations are
stored here; the sink decides (streaming accumulators keep memory constant).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

# sink(layer_idx, q [T, Hq, d], k [T, Hkv, d], v [T, Hkv, d]) -> None
Sink = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]
CAPTURE_IMPL = "oscar_capture"
_SINK_ATTR = "_oscar_capture_sink"


def _capture_attention(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    sink = getattr(module, _SINK_ATTR, None)
    if sink is not None:
        if query.shape[0] != 1:
            raise ValueError(f"capture expects batch size 1 (one sequence per forward), got {query.shape[0]}")
        # [1, H, T, d] → [T, H, d]
        sink(module.layer_idx, query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(CAPTURE_IMPL, _capture_attention)


def attention_modules(model) -> list:
    mods = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "k_proj")]
    if not mods:
        raise ValueError(f"{type(model).__name__} has no attention modules with layer_idx/k_proj")
    return mods


@contextlib.contextmanager
def capture_qkv(model, sink: Sink) -> Iterator[None]:
    """Within the block, every forward of `model` (batch 1, no cache) calls sink per layer."""
    _register()
    mods = attention_modules(model)
    previous = model.config._attn_implementation
    for m in mods:
        setattr(m, _SINK_ATTR, sink)
    model.set_attn_implementation(CAPTURE_IMPL)
    try:
        yield
    finally:
        for m in mods:
            if hasattr(m, _SINK_ATTR):
                delattr(m, _SINK_ATTR)
        model.set_attn_implementation(previous)


@torch.inference_mode()
def run_sequences(model, sequences: list[torch.Tensor], sink: Sink) -> int:
    """Forward each 1-D token tensor through the model with capture on; returns tokens processed."""
    total = 0
    with capture_qkv(model, sink):
        for ids in sequences:
            model(input_ids=ids[None, :], use_cache=False)
            total += int(ids.numel())
    return total

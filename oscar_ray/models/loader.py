"""Load a real causal LM offline (GGUF via transformers + gguf, or an HF directory) and read its geometry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..quant import ModelGeometry


@dataclass(frozen=True)
class AttentionGeometry:
    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    architecture: str

    def model_geometry(self) -> ModelGeometry:
        return ModelGeometry(self.n_layers, self.n_kv_heads, self.head_dim)


def attention_geometry(config) -> AttentionGeometry:
    """Attention shapes from a transformers config (Llama, Qwen3, GLM-4 MoE all name them alike)."""
    n_q = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_q
    arch = (getattr(config, "architectures", None) or [config.model_type])[0]
    return AttentionGeometry(config.num_hidden_layers, n_q, getattr(config, "num_key_value_heads", n_q),
                             head_dim, arch)


def resolve_model_path(model: str) -> Path:
    """'smollm2' → the fetched, verified GGUF; otherwise an existing path."""
    if model == "smollm2":
        from ..assets import smollm2_gguf

        return smollm2_gguf()
    path = Path(model).expanduser()
    if not path.exists():
        raise ValueError(f"model {model!r} is neither 'smollm2' nor an existing GGUF file / model directory")
    return path


def load_model(model: str = "smollm2", dtype: torch.dtype = torch.float32):
    """Returns (model in eval mode, tokenizer).  Offline: nothing is looked up on a hub."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(model)
    if path.is_file():  # a GGUF: transformers dequantises it (Q4_1 → fp32 for SmolLM2, ~20 s on 2 cores)
        kwargs = {"gguf_file": path.name}
        root = str(path.parent)
    else:
        kwargs, root = {}, str(path)
    tok = AutoTokenizer.from_pretrained(root, **kwargs)
    lm = AutoModelForCausalLM.from_pretrained(root, dtype=dtype, **kwargs)
    lm.eval()
    return lm, tok

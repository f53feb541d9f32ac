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


def _converted_dir(gguf: Path) -> Path:
    """A safetensors copy of a GGUF, made once: dequantising SmolLM2's Q4_1 GGUF and building its
    tokenizer takes ~18 s on 2 cores, loading the converted fp32 copy ~2 s (every test and every
    calibration worker loads the model)."""
    import os
    import shutil
    import tempfile

    from ..env import cache_dir

    stat = gguf.stat()
    target = cache_dir() / "converted" / f"{gguf.stem}-{stat.st_size}-fp32"
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tmp)
        from safetensors.torch import save_model

        lm = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # transformers refuses save_pretrained on a GGUF-loaded model; its weights are plain fp32
        # tensors by now, so write them and a config without the gguf quantization entry.
        config = lm.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        save_model(lm, str(tmp / "model.safetensors"))
        try:
            os.replace(tmp, target)
        except OSError:  # another process converted it first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _local_root(model: str) -> str:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # offline by design: nothing is looked up on a hub
    path = resolve_model_path(model)
    return str(_converted_dir(path) if path.is_file() else path)


def load_config(model: str):
    """The model's transformers config, without loading weights (a GGUF is converted once first)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(_local_root(model))


def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_local_root(model))


def load_model(model: str = "smollm2", dtype: torch.dtype = torch.float32):
    """Returns (model in eval mode, tokenizer).  Offline: nothing is looked up on a hub."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = _local_root(model)
    tok = AutoTokenizer.from_pretrained(root)
    lm = AutoModelForCausalLM.from_pretrained(root, dtype=dtype)
    lm.eval()
    return lm, tok

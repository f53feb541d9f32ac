"""The torch reference engine: a transformers model whose attention reads and writes the OSCAR
paged INT2/BF16 cache, with continuous batching (CPU: torch reference ops; CUDA: Triton kernels).

Build and start (what a deployment does):
    from oscar_ray.engines.torch import TorchEngineConfig, build_torch_engine
    engine = build_torch_engine(TorchEngineConfig(model="smollm2"))   # or a dict of the same fields
    await engine.start()                                              # loads the model (~5-25 s)
    async for chunk in engine.generate(GenerateRequest("r1", messages=({"role": "user", "content": "Hi"},))):
        print(chunk.text, end="")
    await engine.shutdown()
Scoring for evaluation scripts (synchronous, no event loop): `EngineCore(cfg).score(token_ids)`.
"""

from __future__ import annotations

from typing import Any

from .config import TorchEngineConfig


def build_torch_engine(cfg: TorchEngineConfig | dict[str, Any], model=None, tokenizer=None):
    """A not-yet-started `TorchEngine` for `cfg` (a TorchEngineConfig or its dict); `model` and
    `tokenizer` may be passed to share an already loaded model (it is modified in place)."""
    from .engine import TorchEngine

    if not isinstance(cfg, TorchEngineConfig):
        cfg = TorchEngineConfig.model_validate(cfg)
    return TorchEngine(cfg, model, tokenizer)


def __getattr__(name: str):
    if name == "TorchEngine":
        from .engine import TorchEngine

        return TorchEngine
    if name == "EngineCore":
        from .core import EngineCore

        return EngineCore
    raise AttributeError(name)


__all__ = ["EngineCore", "TorchEngine", "TorchEngineConfig", "build_torch_engine"]

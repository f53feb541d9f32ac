"""Engine kinds by name, imported lazily: a CPU host never imports sglang, the router never torch."""

from __future__ import annotations

import importlib
from typing import Any

from oscar_ray.engines.base import Engine

# kind -> (module, factory taking the engine's config dict or model, config model "module:Class" or None)
ENGINE_KINDS: dict[str, tuple[str, str, str | None]] = {
    "torch": ("oscar_ray.engines.torch", "build_torch_engine", "oscar_ray.engines.torch.config:TorchEngineConfig"),
    "sglang": ("oscar_ray.engines.sglang", "build_sglang_engine", "oscar_ray.engines.sglang.config:SGLangEngineConfig"),
    "mock": ("oscar_ray.engines.mock", "MockEngine", None),
}


def _kind(kind: str) -> tuple[str, str, str | None]:
    if kind not in ENGINE_KINDS:
        raise ValueError(f"engine.kind {kind!r} is not one of {sorted(ENGINE_KINDS)}")
    return ENGINE_KINDS[kind]


def config_model(kind: str):
    """The engine's pydantic config class, or None when it has none or is not installed here
    (sglang on a CPU host): then only the kind is checked and the engine validates on start."""
    spec = _kind(kind)[2]
    if spec is None:
        return None
    mod, _, cls = spec.partition(":")
    try:
        return getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError):
        return None


def validate_engine_config(kind: str, config: dict[str, Any]) -> Any:
    """Validate `config` with the engine's own model when importable; returns the model (or the dict)."""
    model = config_model(kind)
    if kind == "mock":
        from oscar_ray.engines.mock import MockEngineConfig

        return MockEngineConfig.from_dict(config)
    return model.model_validate(config) if model is not None else dict(config)


def build_engine(kind: str, config: dict[str, Any]) -> Engine:
    mod, factory, _ = _kind(kind)
    try:
        module = importlib.import_module(mod)
    except ImportError as e:
        extra = " (pip install 'oscar-ray[sglang]')" if kind == "sglang" else ""
        raise ValueError(f"engine.kind {kind!r} needs {mod}, which failed to import: {e}{extra}") from e
    return getattr(module, factory)(validate_engine_config(kind, config))

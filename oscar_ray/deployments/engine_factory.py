"""Engine kinds by name, imported lazily: a CPU host never imports sglang, the router never torch.

Both config models import without their engine's heavy dependency (`TorchEngineConfig` needs
pydantic only; `SGLangEngineConfig` lives in `oscar_ray.engines.sglang.server_args`, which does not
import sglang), so `build_app` validates an sglang config on a CPU head node too.
"""

from __future__ import annotations

import importlib
from typing import Any

from oscar_ray.engines.base import Engine

# kind -> (module, factory taking the engine's validated config, config model "module:Class" or None)
ENGINE_KINDS: dict[str, tuple[str, str, str | None]] = {
    "torch": ("oscar_ray.engines.torch", "build_torch_engine", "oscar_ray.engines.torch.config:TorchEngineConfig"),
    "sglang": ("oscar_ray.engines.sglang", "build_sglang_engine",
               "oscar_ray.engines.sglang.server_args:SGLangEngineConfig"),
    "mock": ("oscar_ray.engines.mock", "MockEngine", None),
}
_HINT = {"sglang": " (pip install 'oscar-ray[sglang]')"}


def _kind(kind: str) -> tuple[str, str, str | None]:
    if kind not in ENGINE_KINDS:
        raise ValueError(f"engine.kind {kind!r} is not one of {sorted(ENGINE_KINDS)}")
    return ENGINE_KINDS[kind]


def config_model(kind: str):
    """The engine's pydantic config class, or None when it has none or its module cannot be
    imported here (a missing optional dependency): then only the kind is checked and the engine
    validates on start. A module that imports but lacks the class is a bug and raises."""
    spec = _kind(kind)[2]
    if spec is None:
        return None
    mod, _, cls = spec.partition(":")
    try:
        module = importlib.import_module(mod)
    except ImportError:
        return None
    if not hasattr(module, cls):
        raise AttributeError(f"engine kind {kind!r}: {mod} has no config class {cls}")
    return getattr(module, cls)


def validate_engine_config(kind: str, config: dict[str, Any]) -> Any:
    """Validate `config` with the engine's own model when importable; returns the model (or the dict).
    A bad field raises pydantic's ValidationError (a ValueError) naming it."""
    if kind == "mock":
        from oscar_ray.engines.mock import MockEngineConfig

        return MockEngineConfig.from_dict(config)
    model = config_model(kind)
    return model.model_validate(config) if model is not None else dict(config)


def build_engine(kind: str, config: dict[str, Any]) -> Engine:
    """A not-yet-started engine of `kind`; ValueError naming the missing extra when its module or
    its runtime (sglang itself) cannot be imported on this host."""
    mod, factory, _ = _kind(kind)
    try:
        module = importlib.import_module(mod)
        return getattr(module, factory)(validate_engine_config(kind, config))
    except ImportError as e:
        raise ValueError(f"engine.kind {kind!r} needs {mod}, which failed to import: {e}{_HINT.get(kind, '')}") from e

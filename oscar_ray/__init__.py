"""oscar-ray: 2-bit KV-cache LLM serving on Ray with OSCAR rotations.

Public names are re-exported lazily (PEP 562): `import oscar_ray.quant` must work on a machine with
only torch + triton (the GPU image has no pydantic or ray), so this file imports nothing eagerly.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    # config (pydantic)
    "OscarCacheConfig": "oscar_ray.config",
    "QualityConfig": "oscar_ray.config",
    # quant (torch only)
    "hadamard": "oscar_ray.quant",
    "bit_reversal_permutation": "oscar_ray.quant",
    "fit_rotation": "oscar_ray.quant",
    "QueryMoment": "oscar_ray.quant",
    "ValueTargetDiag": "oscar_ray.quant",
    "ValueTargetSoftmax": "oscar_ray.quant",
    "quantize_int2": "oscar_ray.quant",
    "dequantize_int2": "oscar_ray.quant",
    "feedback_factor": "oscar_ray.quant",
    "quantize_int2_feedback": "oscar_ray.quant",
    "pack_int2": "oscar_ray.quant",
    "unpack_int2": "oscar_ray.quant",
    "pack_codes": "oscar_ray.quant",
    "unpack_codes": "oscar_ray.quant",
    "clip_rows": "oscar_ray.quant",
    "bits_per_element": "oscar_ray.quant",
    "RotationSet": "oscar_ray.quant",
    "ModelGeometry": "oscar_ray.quant",
    # kernels (torch + triton)
    "int2_write": "oscar_ray.kernels",
    "int2_write_kv": "oscar_ray.kernels",
    "bf16_write": "oscar_ray.kernels",
    "bf16_write_kv": "oscar_ray.kernels",
    "rotate_qk": "oscar_ray.kernels",
    "NewRows": "oscar_ray.kernels",
    "demote_pages": "oscar_ray.kernels",
    "demote_pages_kv": "oscar_ray.kernels",
    "int2_decode_attention": "oscar_ray.kernels",
    "int2_extend_attention": "oscar_ray.kernels",
    # cache (pure Python)
    "KVAllocator": "oscar_ray.cache",
    "check_invariants": "oscar_ray.cache",
    # engines
    "Engine": "oscar_ray.engines.base",
    "GenerateRequest": "oscar_ray.engines.base",
    "SamplingParams": "oscar_ray.engines.base",
    "Chunk": "oscar_ray.engines.base",
    "KVStats": "oscar_ray.engines.base",
    "InvalidRequest": "oscar_ray.engines.base",
    "EngineOverloaded": "oscar_ray.engines.base",
    "EngineDead": "oscar_ray.engines.base",
    "TorchEngineConfig": "oscar_ray.engines.torch.config",
    "build_torch_engine": "oscar_ray.engines.torch",
    "SGLangEngineConfig": "oscar_ray.engines.sglang",
    "build_sglang_engine": "oscar_ray.engines.sglang",
    # deployments (ray serve)
    "ServeAppConfig": "oscar_ray.deployments.config",
    "build_app": "oscar_ray.deployments.builder",
    "load_app_config": "oscar_ray.deployments.builder",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'oscar_ray' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

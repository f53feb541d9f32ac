"""oscar-ray as a plugin for stock sglang 0.5.23 (the `oscar-ray[sglang]` extra).

Importable without sglang: this package exposes the config → server-args translation, the
settings, the TP sharding of rotations, and the serving engine `build_sglang_engine(cfg)` (an
`Engine` over the in-process `sglang.Engine`, engine.py; it imports sglang only in `start()`).
The sglang-facing modules (plugin, hooks, pool, backend) import sglang and are loaded by
sglang's plugin loader through the entry point
`oscar = "oscar_ray.engines.sglang.plugin:register"` in group `sglang.srt.plugins`.

Launch (docs/sglang_plugin.md):
    OSCAR_ROTATIONS=/art/qwen3-8b python -m sglang.launch_server --model-path /models/Qwen3-8B \
        --attention-backend oscar --page-size 64 --max-running-requests 64 \
        --cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled
"""

from .engine import SGLangEngine, build_sglang_engine
from .server_args import (OSCAR_BACKEND, SGLangEngineConfig, sglang_engine_kwargs, sglang_env,
                          sglang_server_args)
from .settings import IDENTITY, OscarSettings
from .sharding import RankRotations, kv_heads_of_rank, rank_rotations, shard_rotation

ENTRY_POINT = ("sglang.srt.plugins", "oscar", "oscar_ray.engines.sglang.plugin:register")

__all__ = [
    "ENTRY_POINT", "IDENTITY", "OSCAR_BACKEND", "OscarSettings", "RankRotations", "SGLangEngine", "SGLangEngineConfig",
    "build_sglang_engine", "kv_heads_of_rank", "rank_rotations", "shard_rotation", "sglang_engine_kwargs", "sglang_env",
    "sglang_server_args",
]

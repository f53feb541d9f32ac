"""Entry point of the oscar-ray plugin for stock sglang 0.5.23 (group `sglang.srt.plugins`).

`sglang.srt.plugins.load_plugins()` runs `register()` in every sglang process: the launcher
(`launch_server.py` / `cli/serve.py`, before argument parsing), `Engine.__init__`, every scheduler
(`managers/scheduler.py::run_scheduler_process`, one per TP / PP rank), the data-parallel
controller and the detokenizer; then it applies the hooks through
`plugins/hook_registry.py::HookRegistry.apply_hooks()`.  register() is cheap and touches no GPU:
it only registers; every hook checks `--attention-backend oscar` and otherwise calls through, so
an installed plugin leaves other launches unchanged.

Hooks (targets under sglang.srt.):
  layers.attention.attention_registry  register_attention_backend("oscar") + the CLI choice
  mem_cache.kv_cache_configurator.KVCacheConfigurator._resolve_kv_pool_class   AROUND: MHA → our pool
  mem_cache.kv_cache_configurator.KVCacheConfigurator._build_token_to_kv_pool  AROUND: pool spec scope
  model_executor.pool_configurator.DefaultPoolConfigurator._compute_cell_size  AFTER: INT2 bytes/slot
  model_executor.pool_configurator.DefaultPoolConfigurator.__init__            AFTER: + BF16 arena bytes
  model_executor.model_runner.ModelRunner.load_model                           AFTER: fold R_V (per rank)
  model_executor.model_runner_components.weight_updater.WeightUpdater.update_weights_from_{disk,tensor}
                                                                               BEFORE: refuse (would unfold)
  models.utils.enable_fused_set_kv_buffer                                      AROUND: False for our pool
"""

from __future__ import annotations

import functools
import logging

from oscar_ray.quant.artifact import RotationSet

from .server_args import OSCAR_BACKEND
from .settings import OscarSettings
from .sharding import RankRotations, rank_rotations

logger = logging.getLogger(__name__)
SGLANG_VERSION = "0.5.23"  # hook targets are private sglang names: pinned, checked at load
EXTRA_HINT = "pip install 'oscar-ray[sglang]' (sglang==0.5.23)"
_KVC = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"
_DPC = "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator"
_MR = "sglang.srt.model_executor.model_runner.ModelRunner"
_WU = "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater"
_FUSED = "sglang.srt.models.utils.enable_fused_set_kv_buffer"


def require_sglang():
    """Import sglang or fail naming the extra; ValueError on another sglang release."""
    try:
        import sglang
    except ImportError as e:
        raise ImportError(f"the OSCAR sglang plugin needs sglang: {EXTRA_HINT}") from e
    if sglang.__version__ != SGLANG_VERSION:
        raise ValueError(f"oscar-ray's sglang plugin targets sglang {SGLANG_VERSION}, found {sglang.__version__}: "
                         f"{EXTRA_HINT}")
    return sglang


def oscar_active(server_args) -> bool:
    """True when this launch selected the OSCAR backend (both phases, or neither: ValueError)."""
    names = {getattr(server_args, "attention_backend", None)}
    prefill = getattr(server_args, "prefill_attention_backend", None)
    decode = getattr(server_args, "decode_attention_backend", None)
    if OSCAR_BACKEND in names:
        others = {prefill, decode} - {None, OSCAR_BACKEND}
        if others:
            raise ValueError(f"--attention-backend oscar cannot be mixed with prefill/decode backends {others}: "
                             "both phases read the OSCAR cache")
        return True
    if OSCAR_BACKEND in (prefill, decode):
        raise ValueError("--prefill-attention-backend / --decode-attention-backend oscar need the other phase on "
                         "oscar too: use --attention-backend oscar")
    return False


@functools.lru_cache(maxsize=8)
def _load_rotations(path: str) -> RotationSet:
    return RotationSet.load(path)


def load_rank_rotations(settings: OscarSettings, model_config, tp_rank: int, tp_size: int,
                        start_layer: int, end_layer: int) -> RankRotations:
    """This rank's rotations from settings.rotations (validated against the model's geometry)."""
    rotations = None if settings.identity else _load_rotations(settings.rotations)
    return rank_rotations(rotations, n_layers=model_config.num_hidden_layers,
                          n_kv_heads=model_config.get_total_num_kv_heads(), head_dim=model_config.head_dim,
                          tp_rank=tp_rank, tp_size=tp_size, start_layer=start_layer, end_layer=end_layer,
                          k_clip=settings.key_clip, v_clip=settings.v_clip)


def register() -> None:
    """Entry point (`oscar = "oscar_ray.engines.sglang.plugin:register"`); idempotent."""
    require_sglang()
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from . import hooks

    if OSCAR_BACKEND not in ATTENTION_BACKENDS:
        register_attention_backend(OSCAR_BACKEND)(hooks.create_backend)
    if OSCAR_BACKEND not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([OSCAR_BACKEND])
    targets = [
        (f"{_KVC}._resolve_kv_pool_class", hooks.resolve_kv_pool_class, HookType.AROUND),
        (f"{_KVC}._build_token_to_kv_pool", hooks.build_token_to_kv_pool, HookType.AROUND),
        (f"{_DPC}._compute_cell_size", hooks.compute_cell_size, HookType.AFTER),
        (f"{_DPC}.__init__", hooks.add_arena_overhead, HookType.AFTER),
        (f"{_MR}.load_model", hooks.absorb_after_load, HookType.AFTER),
        (f"{_WU}.update_weights_from_disk", hooks.refuse_weight_update, HookType.BEFORE),
        (f"{_WU}.update_weights_from_tensor", hooks.refuse_weight_update, HookType.BEFORE),
        (_FUSED, hooks.no_fused_kv_write, HookType.AROUND),
    ]
    registered = {(ht, h) for ht, h, _ in (x for v in HookRegistry._hooks.values() for x in v)}
    for target, fn, kind in targets:
        if (kind, fn) not in registered:  # load_plugins is once per process; direct calls may repeat
            HookRegistry.register(target, fn, kind)


HOOK_TARGETS = (f"{_KVC}._resolve_kv_pool_class", f"{_KVC}._build_token_to_kv_pool", f"{_DPC}._compute_cell_size",
                f"{_DPC}.__init__", f"{_MR}.load_model", f"{_WU}.update_weights_from_disk",
                f"{_WU}.update_weights_from_tensor", _FUSED)

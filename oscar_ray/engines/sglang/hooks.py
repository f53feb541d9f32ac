"""The hook functions plugin.register() installs through sglang's HookRegistry (see plugin.py).

Signatures follow `sglang/srt/plugins/hook_registry.py::_wrap_fn`: AROUND fn(original, *args),
AFTER fn(result, *args) → new result or None, BEFORE fn(*args) → None.  Each one calls through
unless the launch selected `--attention-backend oscar`.  Loaded only by the plugin: imports sglang.
"""

from __future__ import annotations

import logging

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.runtime_context import get_parallel, get_server_args

from .backend import create_oscar_backend
from .plugin import HOOK_TARGETS, load_rank_rotations, oscar_active
from .pool import OscarMHATokenToKVPool, OscarPoolSpec, pool_spec
from .settings import OscarSettings
from .tables import ArenaLayout
from .weights import fold_value_rotation_

logger = logging.getLogger(__name__)
create_backend = create_oscar_backend


def verify_hooks() -> None:
    """HookRegistry only logs a target it cannot patch; an OSCAR launch with a missing hook would
    corrupt the cache silently, so it fails here instead."""
    missing = [t for t in HOOK_TARGETS if t not in HookRegistry._patched]
    if missing:
        raise RuntimeError(f"oscar-ray hooks were not applied to {missing}: sglang changed, or load_plugins() "
                           "did not run in this process")


def _settings() -> OscarSettings:
    return OscarSettings.from_env()


def _check_mha(kvc) -> None:
    if kvc.use_mla_backend or kvc.mambaish_config or kvc.is_hybrid_swa:
        raise ValueError("--attention-backend oscar supports plain MHA/GQA models (no MLA, hybrid linear, SWA)")
    if kvc.kv_shard_rank is not None:
        raise ValueError("--attention-backend oscar does not support --enable-kv-cache-sharding")


def resolve_kv_pool_class(original, kvc, *, kind, default):
    """AROUND KVCacheConfigurator._resolve_kv_pool_class: the MHA pool becomes ours."""
    cls = original(kvc, kind=kind, default=default)
    if kind != "mha" or not oscar_active(kvc.server_args):
        return cls
    if cls is not MHATokenToKVPool:
        raise ValueError(f"--attention-backend oscar replaces the plain MHA pool, but this launch selected "
                         f"{cls.__name__} (page-major layout or a platform pool)")
    return OscarMHATokenToKVPool


def build_token_to_kv_pool(original, kvc, **kwargs):
    """AROUND KVCacheConfigurator._build_token_to_kv_pool: build the pool inside pool_spec(...)
    with this rank's rotations and the request-slot count of the req_to_token pool just built."""
    if not oscar_active(kvc.server_args):
        return original(kvc, **kwargs)
    verify_hooks()
    _check_mha(kvc)
    par = get_parallel()
    settings = _settings()
    rotations = load_rank_rotations(settings, kvc.model_config, par.attn_tp_rank, par.attn_tp_size,
                                    kvc.layer_info.start_layer, kvc.layer_info.end_layer)
    max_reqs = kwargs["req_to_token_pool"].req_to_token.shape[0]
    with pool_spec(OscarPoolSpec(settings, max_reqs, rotations)):
        return original(kvc, **kwargs)


MIN_PAGE = 16  # the kernels' tiles: a page smaller than 16 tokens makes page tables of one entry per token


def _rank_geometry(kvc, num_layers: int):
    page = kvc.server_args.page_size or 1
    if page < MIN_PAGE:
        raise ValueError(f"--page-size {page} is too small for --attention-backend oscar: use the OSCAR page "
                         f"(64; >= {MIN_PAGE}), of which the sink and recent windows are whole multiples")
    heads = kvc.model_config.get_num_kv_heads(get_parallel().attn_tp_size)
    return _settings().geometry(num_layers, heads, kvc.model_config.head_dim, page)


def compute_cell_size(result, dpc, kvc, num_layers):
    """AFTER DefaultPoolConfigurator._compute_cell_size: bytes per slot = INT2 K+V, all layers."""
    if not oscar_active(kvc.server_args):
        return None
    _check_mha(kvc)
    cell = _rank_geometry(kvc, num_layers).int2_token_bytes()
    logger.info("OSCAR: KV cell %d B per token slot (stock sglang: %d B)", cell, result)
    return cell


def add_arena_overhead(result, dpc, kvc):
    """AFTER DefaultPoolConfigurator.__init__: charge the BF16 arena before tokens are sized."""
    args = kvc.server_args
    if not oscar_active(args):
        return None
    if not args.max_running_requests:
        raise ValueError("--max-running-requests is required with --attention-backend oscar: it sizes the "
                         "BF16 sink/recent arena (one window per request slot)")
    geometry = _rank_geometry(kvc, kvc.layer_info.num_effective_layers)
    arena = ArenaLayout(geometry, args.max_running_requests + 1)  # + req_to_token's padding row 0
    dpc._fixed_overhead_bytes += arena.arena_bytes()
    return None


def absorb_after_load(result, runner):
    """AFTER ModelRunner.load_model: fold R_V into this rank's qkv_proj / o_proj shards, once."""
    if not oscar_active(runner.server_args):
        return None
    settings = _settings()
    if not settings.absorb_v or settings.identity:
        return None
    par = get_parallel()
    info = runner.layer_info
    rotations = load_rank_rotations(settings, runner.model_config, par.attn_tp_rank, par.attn_tp_size,
                                    info.start_layer, info.end_layer)
    folded = 0
    for module in runner.model.modules():
        attn, qkv, o = (getattr(module, n, None) for n in ("attn", "qkv_proj", "o_proj"))
        if attn is None or qkv is None or o is None or not hasattr(attn, "layer_id"):
            continue
        if getattr(module, "_oscar_v_absorbed", False):
            continue
        _, r_v, _, _ = rotations.layer(attn.layer_id)
        fold_value_rotation_(qkv.weight.data, None if getattr(qkv, "bias", None) is None else qkv.bias.data,
                             o.weight.data, r_v, attn.tp_q_head_num, attn.tp_k_head_num, attn.qk_head_dim)
        module._oscar_v_absorbed = True
        folded += 1
    expected = info.end_layer - info.start_layer
    if folded != expected:
        raise ValueError(f"OSCAR V absorption folded {folded} attention layers of {expected} on this rank: the "
                         "model lacks qkv_proj/o_proj/attn modules; set OSCAR_ABSORB_V=0")
    logger.info("OSCAR: folded R_V into %d layers (tp rank %d)", folded, par.attn_tp_rank)
    return None


def refuse_weight_update(updater, *args, **kwargs):
    """BEFORE WeightUpdater.update_weights_from_*: new weights would arrive without R_V folded."""
    if oscar_active(get_server_args()) and _settings().absorb_v and not _settings().identity:
        raise ValueError("weight updates are not supported with OSCAR V absorption (the new weights would not "
                         "carry R_V); restart the engine with the new model")


def no_fused_kv_write(original, *args, **kwargs):
    """AROUND models.utils.enable_fused_set_kv_buffer: models such as qwen3_moe write K/V inside
    their RoPE kernel when this is True, bypassing the pool; the OSCAR pool must see every write."""
    from sglang.srt.model_executor.forward_context import get_token_to_kv_pool

    if isinstance(get_token_to_kv_pool(), OscarMHATokenToKVPool):
        return False
    return original(*args, **kwargs)

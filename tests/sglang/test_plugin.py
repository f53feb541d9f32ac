"""Plugin discovery, registration into sglang's registries and hook registry, argument parsing."""

import argparse
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES  # noqa: E402
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS  # noqa: E402
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

from oscar_ray.engines.sglang import ENTRY_POINT, SGLangEngineConfig, sglang_engine_kwargs, sglang_server_args  # noqa: E402
from oscar_ray.engines.sglang import plugin  # noqa: E402


def test_entry_point_is_installed():
    group, name, value = ENTRY_POINT
    found = [ep for ep in entry_points(group=group) if ep.name == name]
    assert found, (f"no '{name}' entry point in group {group}: install oscar-ray with "
                   f'[project.entry-points."{group}"] {name} = "{value}" (tests/sglang/README.md)')
    assert found[0].value == value and found[0].dist.name == "oscar-ray"
    assert found[0].load() is plugin.register


def test_load_plugins_registers_backend_and_hooks(plugins_loaded):
    from oscar_ray.engines.sglang import hooks

    assert ATTENTION_BACKENDS["oscar"] is hooks.create_backend
    assert ATTENTION_BACKEND_CHOICES.count("oscar") == 1
    assert set(plugin.HOOK_TARGETS) <= HookRegistry._patched
    hooks.verify_hooks()
    from sglang.srt.model_executor.model_runner import ModelRunner

    assert ModelRunner.load_model.__wrapped__.__qualname__ == "ModelRunner.load_model"


def test_register_again_adds_nothing(plugins_loaded):
    before = sum(len(v) for v in HookRegistry._hooks.values())
    plugin.register()
    assert sum(len(v) for v in HookRegistry._hooks.values()) == before
    assert ATTENTION_BACKEND_CHOICES.count("oscar") == 1


def _parse(argv):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(argv)


def test_sglang_parses_our_server_args(plugins_loaded):
    cfg = SGLangEngineConfig(model_path="/models/m", tp_size=8, nnodes=2, node_rank=1, dist_init_addr="10.1.2.3:5000",
                             rotations="identity", max_running_requests=48, mem_fraction_static=0.85,
                             extra_args={"chunked_prefill_size": 8192})
    ns = _parse(sglang_server_args(cfg))
    assert (ns.model_path, ns.tp_size, ns.nnodes, ns.node_rank, ns.dist_init_addr) == ("/models/m", 8, 2, 1,
                                                                                        "10.1.2.3:5000")
    assert (ns.attention_backend, ns.page_size, ns.kv_cache_dtype, ns.max_running_requests) == ("oscar", 64, "auto", 48)
    assert (ns.cuda_graph_backend_decode, ns.cuda_graph_backend_prefill) == ("disabled", "disabled")
    assert ns.mem_fraction_static == 0.85 and ns.chunked_prefill_size == 8192
    assert plugin.oscar_active(ns)
    # every Engine kwarg is a ServerArgs field
    assert set(sglang_engine_kwargs(cfg)) <= set(ServerArgs.__struct_fields__)


def test_backend_choice_and_mixing_rules(plugins_loaded):
    with pytest.raises(SystemExit):
        _parse(["--model-path", "m", "--attention-backend", "no_such_backend"])
    assert not plugin.oscar_active(_parse(["--model-path", "m", "--attention-backend", "triton"]))
    mixed = _parse(["--model-path", "m", "--attention-backend", "oscar", "--decode-attention-backend", "triton"])
    with pytest.raises(ValueError, match="cannot be mixed"):
        plugin.oscar_active(mixed)
    with pytest.raises(ValueError, match="--attention-backend oscar"):
        plugin.oscar_active(_parse(["--model-path", "m", "--prefill-attention-backend", "oscar"]))


def test_pool_class_hook(plugins_loaded):
    """The patched KVCacheConfigurator._resolve_kv_pool_class picks our pool for OSCAR launches only."""
    from oscar_ray.engines.sglang.pool import OscarMHATokenToKVPool

    oscar = SimpleNamespace(server_args=_parse(["--model-path", "m", "--attention-backend", "oscar"]))
    stock = SimpleNamespace(server_args=_parse(["--model-path", "m", "--attention-backend", "triton"]))
    resolve = KVCacheConfigurator._resolve_kv_pool_class
    assert resolve(oscar, kind="mha", default=MHATokenToKVPool) is OscarMHATokenToKVPool
    assert resolve(stock, kind="mha", default=MHATokenToKVPool) is MHATokenToKVPool
    assert resolve(oscar, kind="mla", default=MLATokenToKVPool) is MLATokenToKVPool
    assert issubclass(OscarMHATokenToKVPool, MHATokenToKVPool)

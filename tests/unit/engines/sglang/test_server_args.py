"""Config → sglang server args / Engine kwargs / OSCAR_* environment (runs without sglang)."""

import pytest
from pydantic import ValidationError

from oscar_ray.config import OscarCacheConfig
from oscar_ray.engines.sglang import (OscarSettings, SGLangEngineConfig, sglang_engine_kwargs, sglang_env,
                                      sglang_server_args)


def _pairs(argv):
    """argv → {flag: value or True}."""
    out, i = {}, 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = True
            i += 1
    return out


def test_oscar_single_node():
    cfg = SGLangEngineConfig(model_path="/models/Qwen3-8B", tp_size=4, rotations="/art/q3",
                             cache=OscarCacheConfig(sink_tokens=128, recent_tokens=512, page_size=64),
                             max_running_requests=32, port=31000)
    args = _pairs(sglang_server_args(cfg))
    assert args == {"--model-path": "/models/Qwen3-8B", "--tp-size": "4", "--max-running-requests": "32",
                    "--host": "127.0.0.1", "--port": "31000", "--attention-backend": "oscar", "--page-size": "64",
                    "--kv-cache-dtype": "auto", "--cuda-graph-backend-decode": "disabled",
                    "--cuda-graph-backend-prefill": "disabled"}
    assert "--nnodes" not in args
    env = sglang_env(cfg)
    assert env["OSCAR_ROTATIONS"] == "/art/q3"
    assert (env["OSCAR_SINK_TOKENS"], env["OSCAR_RECENT_TOKENS"]) == ("128", "512")
    assert OscarSettings.from_env(env) == cfg.settings()


def test_multi_node_and_engine_kwargs():
    cfg = SGLangEngineConfig(model_path="m", tp_size=16, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000",
                             rotations="identity", mem_fraction_static=0.8, extra_args={"chunked_prefill_size": 4096,
                                                                                         "enable_metrics": True,
                                                                                         "log_requests": False})
    kw = sglang_engine_kwargs(cfg)
    assert kw["nnodes"] == 2 and kw["node_rank"] == 1 and kw["dist_init_addr"] == "10.0.0.1:5000"
    assert kw["tp_size"] == 16 and kw["mem_fraction_static"] == 0.8 and kw["chunked_prefill_size"] == 4096
    assert "host" not in kw and "port" not in kw
    args = _pairs(sglang_server_args(cfg))
    assert args["--nnodes"] == "2" and args["--node-rank"] == "1" and args["--dist-init-addr"] == "10.0.0.1:5000"
    assert args["--enable-metrics"] is True and "--log-requests" not in args


def test_bf16_is_stock_sglang():
    cfg = SGLangEngineConfig(model_path="m", kv_cache="bf16")
    args = _pairs(sglang_server_args(cfg))
    assert "--attention-backend" not in args and "--page-size" not in args
    assert sglang_env(cfg) == {}
    with pytest.raises(ValueError, match="kv_cache='oscar'"):
        cfg.settings()


@pytest.mark.parametrize("kwargs, field", [
    ({"rotations": None}, "rotations"),
    ({"nnodes": 2}, "dist_init_addr"),
    ({"nnodes": 2, "node_rank": 2, "dist_init_addr": "a:1"}, "node_rank"),
    ({"tp_size": 3, "nnodes": 2, "dist_init_addr": "a:1"}, "tp_size"),
    ({"extra_args": {"tp_size": 2}}, "extra_args"),
    ({"port": 0}, "port"),
    ({"surprise": 1}, "surprise"),
])
def test_bad_config_names_the_field(kwargs, field):
    base = {"model_path": "m", "rotations": "identity"}
    with pytest.raises(ValidationError, match=field):
        SGLangEngineConfig(**{**base, **kwargs})


@pytest.mark.parametrize("env, name", [
    ({}, "OSCAR_ROTATIONS"),
    ({"OSCAR_ROTATIONS": "identity", "OSCAR_SINK_TOKENS": "x"}, "OSCAR_SINK_TOKENS"),
    ({"OSCAR_ROTATIONS": "identity", "OSCAR_SCALE_DTYPE": "int8"}, "OSCAR_SCALE_DTYPE"),
    ({"OSCAR_ROTATIONS": "identity", "OSCAR_K_CLIP": "1.5"}, "OSCAR_K_CLIP"),
    ({"OSCAR_ROTATIONS": "identity", "OSCAR_ABSORB_V": "yes"}, "OSCAR_ABSORB_V"),
    ({"OSCAR_ROTATIONS": "identity", "OSCAR_KEY_BITS": "4"}, "OSCAR_KEY_BITS"),
])
def test_bad_env_names_the_variable(env, name):
    with pytest.raises(ValueError, match=name):
        OscarSettings.from_env(env)


def test_settings_geometry_needs_whole_pages():
    s = OscarSettings.from_env({"OSCAR_ROTATIONS": "identity", "OSCAR_SINK_TOKENS": "48", "OSCAR_SCALE_DTYPE": "float32"})
    g = s.geometry(36, 4, 128, 16)
    assert (g.sink_tokens, g.recent_tokens, g.scale_bytes, g.n_kv_heads) == (48, 256, 4, 4)
    with pytest.raises(ValueError, match="sink_tokens=48 must be a multiple of page_size=64"):
        s.geometry(36, 4, 128, 64)


def test_page_layout_travels_to_every_process():
    cfg = SGLangEngineConfig(model_path="m", rotations="/art/q3", cache=OscarCacheConfig(page_layout="token"))
    env = sglang_env(cfg)
    assert env["OSCAR_PAGE_LAYOUT"] == "token"  # the non-default value reaches the scheduler processes
    s = OscarSettings.from_env(env)
    assert s == cfg.settings() and not s.geometry(36, 8, 128, 64).head_major
    assert sglang_env(SGLangEngineConfig(model_path="m", rotations="/art/q3"))["OSCAR_PAGE_LAYOUT"] == "head"
    assert OscarSettings(rotations="identity").geometry(36, 8, 128, 64).head_major  # the default, as the config's
    assert not OscarSettings(rotations="identity", page_layout="token").geometry(36, 8, 128, 64).head_major
    with pytest.raises(ValueError, match="OSCAR_PAGE_LAYOUT must be token or head"):
        OscarSettings.from_env({**env, "OSCAR_PAGE_LAYOUT": "headmajor"})


def test_three_bit_keys_travel_to_every_process():
    cfg = SGLangEngineConfig(model_path="m", rotations="/art/q3", cache=OscarCacheConfig(key_bits=3))
    env = sglang_env(cfg)
    assert env["OSCAR_KEY_BITS"] == "3"
    s = OscarSettings.from_env(env)
    assert s == cfg.settings() and s.key_bits == 3
    assert s.geometry(36, 8, 128, 64).key_code_shape(1)[-1] == 48
    assert s.key_clip == 0.0  # the artifact's INT2 clip ratios do not apply to 8 levels
    assert OscarSettings(rotations="identity").key_clip is None  # INT2 keys: the artifact's ratios
    assert OscarSettings(rotations="identity", key_bits=3, k_clip=0.9).key_clip == 0.9

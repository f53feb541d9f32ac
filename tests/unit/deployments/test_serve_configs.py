"""Every Serve YAML in configs/ validates against our ServeAppConfig and Ray's ServeDeploySchema,
and builds an application whose deployment options Serve accepts (no Ray cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from oscar_ray.deployments.builder import (
    ENGINE_DEPLOYMENT, INGRESS_DEPLOYMENT, app_builder, build_app, engine_deployment_options, load_app_config,
)
from oscar_ray.deployments.config import PlacementSpec, ServeAppConfig
from oscar_ray.deployments.engine_factory import ENGINE_KINDS, config_model, validate_engine_config

CONFIGS = Path(__file__).parents[3] / "configs"
SERVE_YAMLS = ["smollm2-cpu.yaml", "qwen3-8b.yaml", "qwen3-32b.yaml", "glm47.yaml"]


@pytest.mark.parametrize("name", SERVE_YAMLS)
def test_config_validates_in_both_schemas_and_builds(name):
    path = CONFIGS / name
    raw = yaml.safe_load(path.read_text())
    schema = ServeDeploySchema.model_validate(raw)
    app = schema.applications[0]
    assert app.import_path == "oscar_ray.deployments.builder:app_builder"
    cfg = load_app_config(path)
    opts = engine_deployment_options(cfg)
    assert build_app(cfg) is not None
    # the options Serve would apply: a deployment built with them validates its config
    from ray import serve

    from oscar_ray.deployments.replica import EngineReplica

    serve.deployment(EngineReplica).options(**opts)
    assert opts["name"] == ENGINE_DEPLOYMENT
    assert ("autoscaling_config" in opts) == (cfg.autoscaling is not None)


def test_placement_of_the_reference_configs():
    glm = engine_deployment_options(load_app_config(CONFIGS / "glm47.yaml"))
    assert glm["placement_group_bundles"] == [{"CPU": 8.0, "GPU": 8.0}]
    assert glm["placement_group_strategy"] == "STRICT_PACK"
    assert glm["ray_actor_options"]["num_gpus"] == 0  # the GPUs belong to the engine's rank workers
    q32 = engine_deployment_options(load_app_config(CONFIGS / "qwen3-32b.yaml"))
    assert q32["placement_group_bundles"] == [{"CPU": 4.0, "GPU": 4.0}]
    q8 = engine_deployment_options(load_app_config(CONFIGS / "qwen3-8b.yaml"))
    assert "placement_group_bundles" not in q8 and q8["ray_actor_options"]["num_gpus"] == 1
    policy = q8["autoscaling_config"]["policy"]
    assert policy["policy_function"] == "oscar_ray.deployments.autoscaling:KVPressurePolicy"
    assert policy["policy_kwargs"]["kv_high"] == 0.8


# (placement kwargs, num_gpus, expected bundles, expected strategy)
PLACEMENTS = [
    ({}, 0, None, "STRICT_PACK"),
    ({}, 1, None, "STRICT_PACK"),
    ({"tp_size": 4}, 4, [{"CPU": 1.0, "GPU": 4.0}], "STRICT_PACK"),
    ({"tp_size": 16, "nnodes": 2}, 16, [{"CPU": 1.0, "GPU": 8.0}] * 2, "STRICT_SPREAD"),
    ({"tp_size": 8, "pp_size": 2, "nnodes": 2, "gpus_per_node": 8}, 16, [{"CPU": 1.0, "GPU": 8.0}] * 2,
     "STRICT_SPREAD"),
]


@pytest.mark.parametrize("kwargs,gpus,bundles,strategy", PLACEMENTS)
def test_placement_bundles_one_per_node(kwargs, gpus, bundles, strategy):
    p = PlacementSpec(**kwargs)
    assert p.bundles(gpus) == bundles
    assert p.resolved_strategy() == strategy


BASE = {"model_id": "m", "tokenizer": "smollm2"}
# (override, field named in the error)
BAD = [
    ({"engine": {"kind": "vllm"}}, "engine.kind"),
    ({"replicas": {"num_replicas": 0}}, "replicas.num_replicas"),
    ({"autoscaling": {"kv_low": 0.9, "kv_high": 0.8}}, "kv_low"),
    ({"autoscaling": {"min_replicas": 5, "max_replicas": 2}}, "min_replicas"),
    ({"placement": {"tp_size": 3, "nnodes": 2}}, "nnodes"),
    ({"placement": {"tp_size": 4}}, "num_gpus"),
    ({"router": {"rel_threshold": 0.5}}, "router.rel_threshold"),
    ({"drain_timeout_s": 100}, "drain_timeout_s"),
    ({"typo_field": 1}, "typo_field"),
]


@pytest.mark.parametrize("override,field", BAD, ids=[b[1] for b in BAD])
def test_bad_app_config_names_the_field(override, field):
    with pytest.raises(ValueError, match=field):
        ServeAppConfig.model_validate({**BASE, **override})


def test_app_builder_takes_args_or_a_config_file():
    assert app_builder({"config_file": str(CONFIGS / "smollm2-cpu.yaml")}) is not None
    with pytest.raises(ValueError, match="config_file"):
        app_builder({"config_file": "x.yaml", "model_id": "m"})
    with pytest.raises(ValueError, match="mock engine config"):
        build_app({**BASE, "engine": {"kind": "mock", "config": {"token_delay": 1}}})


def test_ingress_deployment_name_matches_yaml_overrides():
    # Serve YAML `deployments:` overrides are keyed by these names.
    app = build_app({**BASE, "engine": {"kind": "mock"}})
    assert app._bound_deployment.name == INGRESS_DEPLOYMENT


def test_every_engine_config_pointer_resolves():
    # A wrong "module:Class" used to make config_model return None, so sglang configs went
    # unvalidated; both config models import without their engine (no sglang here).
    from oscar_ray.engines.sglang import SGLangEngineConfig
    from oscar_ray.engines.torch import TorchEngineConfig

    assert config_model("sglang") is SGLangEngineConfig
    assert config_model("torch") is TorchEngineConfig
    assert {k for k, v in ENGINE_KINDS.items() if v[2] is None} == {"mock"}


# (config file, tp_size, mem_fraction_static, context_length, extra_args)
SGLANG_YAMLS = [("qwen3-8b.yaml", 1, 0.85, 32768, {}), ("qwen3-32b.yaml", 4, 0.85, 32768, {}),
                ("glm47.yaml", 8, 0.88, 131072, {"trust_remote_code": True})]


@pytest.mark.parametrize("name,tp,mem,ctx,extra", SGLANG_YAMLS, ids=[s[0] for s in SGLANG_YAMLS])
def test_sglang_configs_validate_with_the_sglang_model(name, tp, mem, ctx, extra):
    from oscar_ray.engines.sglang import SGLangEngineConfig, sglang_engine_kwargs

    cfg = load_app_config(CONFIGS / name)
    assert cfg.engine.kind == "sglang"
    eng = validate_engine_config("sglang", cfg.engine.config)
    assert isinstance(eng, SGLangEngineConfig)
    kw = sglang_engine_kwargs(eng)
    assert (kw["tp_size"], kw["mem_fraction_static"], kw["context_length"]) == (tp, mem, ctx)
    assert kw["page_size"] == 64 and kw["attention_backend"] == "oscar"
    assert {k: kw[k] for k in extra} == extra
    assert cfg.placement.total_gpus == tp  # the placement group holds the engine's ranks
    assert cfg.max_model_len == ctx


def test_unknown_sglang_field_fails_in_build_app_naming_it():
    cfg = load_app_config(CONFIGS / "qwen3-8b.yaml").model_dump()
    cfg["engine"]["config"]["engine_kwargs"] = {"page_size": 64}  # the old, never-validated key
    with pytest.raises(ValueError, match="engine_kwargs"):
        build_app(cfg)
    cfg["engine"]["config"].pop("engine_kwargs")
    cfg["engine"]["config"]["tp_size"] = 0
    with pytest.raises(ValueError, match="tp_size"):
        build_app(cfg)

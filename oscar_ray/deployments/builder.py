"""Wire the app: OpenAI ingress -> (prefix-affinity router) -> engine replicas, from one config.

`build_app(config)` returns a Serve `Application` for `serve.run`; `app_builder(args)` is the
`import_path` target of the Serve YAMLs in configs/ (`args` is a `ServeAppConfig`, or
`{"config_file": path}` naming a YAML whose first application's args are one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ray import serve
from ray.serve import Application

from .config import ServeAppConfig
from .engine_factory import validate_engine_config
from .ingress import OpenAIIngress
from .replica import EngineReplica

ENGINE_DEPLOYMENT = "EngineReplica"
INGRESS_DEPLOYMENT = "OpenAIIngress"
POLICY = "oscar_ray.deployments.autoscaling:KVPressurePolicy"
ROUTER = "oscar_ray.deployments.router:PrefixAffinityRouter"


def engine_deployment_options(cfg: ServeAppConfig) -> dict[str, Any]:
    """`serve.deployment(...).options(**this)` for the engine replicas: resources, placement group,
    health/shutdown timing, autoscaling policy, request router."""
    r = cfg.replicas
    opts: dict[str, Any] = {
        "name": ENGINE_DEPLOYMENT,
        "max_ongoing_requests": r.max_ongoing_requests,
        "health_check_period_s": r.health_check_period_s,
        "health_check_timeout_s": r.health_check_timeout_s,
        "graceful_shutdown_timeout_s": r.graceful_shutdown_timeout_s,
        "ray_actor_options": {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus},
    }
    bundles = cfg.placement.bundles(r.num_gpus)
    if bundles:
        # The replica actor lives in bundle 0 and holds no GPU itself: the engine's rank workers
        # (sglang schedulers, one per GPU) are placed on the bundles of this group.
        opts["ray_actor_options"] = {"num_cpus": min(r.num_cpus, cfg.placement.cpus_per_bundle), "num_gpus": 0}
        opts["placement_group_bundles"] = bundles
        opts["placement_group_strategy"] = cfg.placement.resolved_strategy()
    a = cfg.autoscaling
    if a is None:
        opts["num_replicas"] = r.num_replicas
    else:
        kwargs = {k: getattr(a, k) for k in ("min_replicas", "max_replicas", "kv_high", "kv_low", "queue_high",
                                             "queue_low", "upscale_delay_s", "downscale_delay_s")}
        opts["autoscaling_config"] = {
            "min_replicas": a.min_replicas, "max_replicas": a.max_replicas,
            "initial_replicas": max(a.min_replicas, 1),
            # The policy applies its own delays (tested there); Serve's would stack on top.
            "upscale_delay_s": 0.0, "downscale_delay_s": 0.0,
            "metrics_interval_s": a.metrics_interval_s, "look_back_period_s": a.look_back_period_s,
            "policy": {"policy_function": POLICY, "policy_kwargs": kwargs},
        }
    if cfg.router.kind == "prefix_affinity":
        rt = cfg.router
        opts["request_router_config"] = {
            "request_router_class": ROUTER,
            "request_router_kwargs": {"abs_threshold": rt.abs_threshold, "rel_threshold": rt.rel_threshold,
                                      "min_match_blocks": rt.min_match_blocks,
                                      "routed_hint_ttl_s": rt.routed_hint_ttl_s},
            "request_routing_stats_period_s": rt.stats_period_s,
            "request_routing_stats_timeout_s": max(rt.stats_period_s, 5.0),
        }
    return opts


def build_app(config: ServeAppConfig | dict[str, Any]) -> Application:
    """The Serve application for one model. Validates the engine's own config first, so a typo in
    `engine.config` fails here with the field's name rather than in a replica's constructor."""
    cfg = config if isinstance(config, ServeAppConfig) else ServeAppConfig.model_validate(config)
    validate_engine_config(cfg.engine.kind, cfg.engine.config)
    engine = serve.deployment(EngineReplica).options(**engine_deployment_options(cfg)).bind(
        cfg.engine.kind, cfg.engine.config, cfg.drain_timeout_s, cfg.router.max_reported_blocks)
    return OpenAIIngress.options(
        name=INGRESS_DEPLOYMENT, num_replicas=cfg.ingress.num_replicas,
        ray_actor_options={"num_cpus": cfg.ingress.num_cpus},
    ).bind(engine, cfg.model_id, cfg.tokenizer, cfg.max_model_len)


def load_app_config(path: str | Path, app_index: int = 0) -> ServeAppConfig:
    """The `ServeAppConfig` in a Serve YAML of configs/ (its application's `args`)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"config file not found: {p}")
    data = yaml.safe_load(p.read_text()) or {}
    apps = data.get("applications") if isinstance(data, dict) else None
    if not apps or len(apps) <= app_index:
        raise ValueError(f"{p}: needs applications[{app_index}] with args (a Serve deploy file)")
    return ServeAppConfig.model_validate(apps[app_index].get("args") or {})


def app_builder(args: dict[str, Any]) -> Application:
    """`import_path: oscar_ray.deployments.builder:app_builder` (Serve passes the YAML's `args`)."""
    args = dict(args or {})
    if "config_file" in args:
        if len(args) != 1:
            raise ValueError(f"config_file excludes other args, got {sorted(args)}")
        return build_app(load_app_config(args["config_file"]))
    return build_app(ServeAppConfig.model_validate(args))

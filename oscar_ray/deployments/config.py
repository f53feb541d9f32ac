"""The serving application's config: one pydantic model, the `args` of a Serve YAML application.

`configs/<name>.yaml` is a Ray Serve deploy file (`ServeDeploySchema`) whose single application has
`import_path: oscar_ray.deployments.builder:app_builder` and `args: <ServeAppConfig>`; the tests
validate every file against both schemas. The engine's own settings stay a dict here and are
validated by that engine's config model (`engine_factory.validate_engine_config`), so this layer
does not pin another engine's fields.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from oscar_ray.config import StrictModel

EngineKind = Literal["torch", "sglang", "mock"]


class EngineSpec(StrictModel):
    kind: EngineKind = Field("torch", description="torch: reference engine (CPU/GPU); sglang: stock sglang with "
                             "the OSCAR plugin; mock: scripted engine for routing/autoscaling tests.")
    config: dict[str, Any] = Field(default_factory=dict, description="The engine's own config, validated by it.")


class PlacementSpec(StrictModel):
    """GPUs of one replica. tp_size*pp_size GPUs spread over nnodes nodes, one bundle per node."""

    tp_size: int = Field(1, ge=1, description="Tensor-parallel degree of one replica.")
    pp_size: int = Field(1, ge=1, description="Pipeline-parallel degree of one replica.")
    nnodes: int = Field(1, ge=1, description="Nodes one replica spans (multi-node sglang: nnodes/node_rank).")
    gpus_per_node: int | None = Field(None, ge=1, description="GPUs per node; default tp*pp/nnodes.")
    cpus_per_bundle: float = Field(1.0, ge=0, description="CPUs in each node's bundle (bundle 0 hosts the replica).")
    strategy: Literal["PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD"] | None = Field(
        None, description="Placement strategy; default STRICT_PACK on one node, STRICT_SPREAD across nodes.")

    @model_validator(mode="after")
    def _fits(self):
        gpus = self.tp_size * self.pp_size
        if self.nnodes > 1 and gpus % self.nnodes:
            raise ValueError(f"tp_size*pp_size ({gpus}) must divide evenly over nnodes ({self.nnodes})")
        if self.gpus_per_node is not None and self.gpus_per_node * self.nnodes != gpus and gpus > 1:
            raise ValueError(f"gpus_per_node ({self.gpus_per_node}) * nnodes ({self.nnodes}) must equal "
                             f"tp_size*pp_size ({gpus})")
        return self

    @property
    def total_gpus(self) -> int:
        return self.tp_size * self.pp_size

    def bundles(self, num_gpus: float) -> list[dict[str, float]] | None:
        """Placement-group bundles of one replica, or None when it needs no group (one device).
        One bundle per node holding all that node's GPUs: sglang puts rank 0 beside the engine in
        bundle 0 and one scheduler per GPU on its node's bundle (SERVING_ANCHORS.md, RayEngine)."""
        if num_gpus == 0 or (self.total_gpus == 1 and self.nnodes == 1):
            return None
        per_node = self.gpus_per_node or self.total_gpus // self.nnodes
        return [{"CPU": self.cpus_per_bundle, "GPU": float(per_node)} for _ in range(self.nnodes)]

    def resolved_strategy(self) -> str:
        return self.strategy or ("STRICT_PACK" if self.nnodes == 1 else "STRICT_SPREAD")


class ReplicaSpec(StrictModel):
    num_replicas: int = Field(1, ge=1, description="Fixed replica count (ignored when autoscaling is set).")
    max_ongoing_requests: int = Field(64, ge=1, description="Requests Serve sends one replica at once.")
    num_cpus: float = Field(1.0, ge=0, description="CPUs of the replica actor (outside a placement group).")
    num_gpus: float = Field(0.0, ge=0, description="GPUs of the replica actor; 0 on CPU.")
    health_check_period_s: float = Field(10.0, gt=0, description="Serve calls check_health this often.")
    health_check_timeout_s: float = Field(30.0, gt=0, description="A check slower than this restarts the replica.")
    graceful_shutdown_timeout_s: float = Field(30.0, ge=0, description="Drain budget for running requests on stop.")


class AutoscalingSpec(StrictModel):
    """KV-pressure autoscaling (`autoscaling.KVPressurePolicy`); hysteresis band [low, high]."""

    min_replicas: int = Field(1, ge=0, description="Lower bound.")
    max_replicas: int = Field(4, ge=1, description="Upper bound.")
    kv_high: float = Field(0.8, gt=0, le=1, description="Mean KV usage at or above which a replica is added.")
    kv_low: float = Field(0.3, ge=0, lt=1, description="Mean KV usage at or below which (with a short queue) one goes.")
    queue_high: float = Field(4.0, ge=0, description="Waiting requests per replica that also mean pressure.")
    queue_low: float = Field(0.0, ge=0, description="Waiting requests per replica at or below which it is idle.")
    upscale_delay_s: float = Field(10.0, ge=0, description="Pressure must last this long before scaling up.")
    downscale_delay_s: float = Field(120.0, ge=0, description="Idleness must last this long before scaling down.")
    metrics_interval_s: float = Field(2.0, gt=0, description="How often replicas report (record_autoscaling_stats).")
    look_back_period_s: float = Field(10.0, gt=0, description="Window the reported metrics are averaged over.")

    @model_validator(mode="after")
    def _band(self):
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas})")
        if self.kv_low >= self.kv_high:
            raise ValueError(f"kv_low ({self.kv_low}) must be below kv_high ({self.kv_high}) (hysteresis band)")
        if self.queue_low >= self.queue_high:
            raise ValueError(f"queue_low ({self.queue_low}) must be below queue_high ({self.queue_high})")
        return self


class RouterSpec(StrictModel):
    """Prefix-affinity routing (`router.PrefixAffinityPolicy`) or Serve's default power-of-two."""

    kind: Literal["prefix_affinity", "pow2"] = Field("prefix_affinity", description="Which request router.")
    abs_threshold: float = Field(8, ge=0, description="Queue gap (max-min ongoing) above which load wins ...")
    rel_threshold: float = Field(1.5, ge=1, description="... and max > rel_threshold*min: both must hold.")
    min_match_blocks: int = Field(1, ge=1, description="Fewest matched prompt blocks that count as affinity.")
    stats_period_s: float = Field(1.0, gt=0, description="How often replicas report cached block hashes.")
    max_reported_blocks: int = Field(4096, ge=1, description="Most recent block hashes a replica reports.")
    routed_hint_ttl_s: float = Field(5.0, ge=0, description="How long a routed prompt counts as cached at its "
                                     "replica before the replica's own report confirms it.")


class IngressSpec(StrictModel):
    num_replicas: int = Field(1, ge=1, description="OpenAI ingress replicas.")
    num_cpus: float = Field(0.5, ge=0, description="CPUs of an ingress replica (tokenising, SSE framing).")


class ServeAppConfig(StrictModel):
    """One served model: OpenAI ingress -> router -> engine replicas."""

    model_id: str = Field(..., min_length=1, description="Name clients put in `model` (GET /v1/models lists it).")
    tokenizer: str = Field(..., min_length=1, description="'smollm2' or a local HF directory: the ingress renders "
                           "the chat template and tokenises, so the router can hash prompt token blocks.")
    max_model_len: int | None = Field(None, ge=16, description="Context limit checked at the ingress; default: the "
                                      "engine's.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="Engine kind and its config.")
    replicas: ReplicaSpec = Field(default_factory=ReplicaSpec, description="Engine replica deployment.")
    autoscaling: AutoscalingSpec | None = Field(None, description="KV-pressure autoscaling; None = fixed count.")
    router: RouterSpec = Field(default_factory=RouterSpec, description="Request routing between replicas.")
    placement: PlacementSpec = Field(default_factory=PlacementSpec, description="TP / multi-node placement.")
    ingress: IngressSpec = Field(default_factory=IngressSpec, description="OpenAI ingress deployment.")
    drain_timeout_s: float = Field(20.0, ge=0, description="On shutdown the engine finishes running requests this "
                                   "long, then aborts the rest.")

    @model_validator(mode="after")
    def _consistent(self):
        if self.placement.total_gpus > 1 and self.replicas.num_gpus == 0:
            raise ValueError(f"placement.tp_size*pp_size = {self.placement.total_gpus} needs replicas.num_gpus > 0")
        if self.drain_timeout_s > self.replicas.graceful_shutdown_timeout_s:
            raise ValueError(f"drain_timeout_s ({self.drain_timeout_s}) must fit in "
                             f"replicas.graceful_shutdown_timeout_s ({self.replicas.graceful_shutdown_timeout_s})")
        if not math.isfinite(self.router.abs_threshold):
            raise ValueError("router.abs_threshold must be finite (inf would never fall back on imbalance)")
        return self

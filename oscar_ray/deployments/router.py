"""Ray Serve request router: a thin adapter from Serve's RequestRouter API to `PrefixAffinityPolicy`.

Serve builds this in every handle that calls the engine deployment (here: each ingress replica).
What it reads:
- the request's prompt token ids: `pending_request.args[0]["prompt_token_ids"]` (the ingress
  passes one payload dict; see ingress.py);
- each replica's `routing_stats` (`EngineReplica.record_routing_stats`, polled every
  `request_routing_stats_period_s`): `page_size`, `seq` and `block_hashes`;
- load: Serve's own per-replica ongoing-request cache (updated on every send, completion and
  probe, so fresher than the report), else the replica's reported running + waiting.
The ranks it returns are probed by Serve, which drops full replicas and backs off if all are full.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from oscar_ray.cache import block_hashes

from .routing import AffinityTable, PrefixAffinityPolicy, ReplicaView


def prompt_token_ids(pending_request: PendingRequest | None) -> Sequence[int] | None:
    if pending_request is None or not pending_request.args:
        return None
    payload = pending_request.args[0]
    if isinstance(payload, dict):
        ids = payload.get("prompt_token_ids")
        return ids if isinstance(ids, (list, tuple)) else None
    return None


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """`request_router_config.request_router_class: oscar_ray.deployments.router:PrefixAffinityRouter`;
    `request_router_kwargs`: abs_threshold, rel_threshold, min_match_blocks, routed_hint_ttl_s."""

    def initialize_state(self, abs_threshold: float = 8, rel_threshold: float = 1.5, min_match_blocks: int = 1,
                         routed_hint_ttl_s: float = 5.0, **_: Any) -> None:
        self._policy = PrefixAffinityPolicy(abs_threshold, rel_threshold, min_match_blocks)
        self._table = AffinityTable(routed_hint_ttl_s)
        self._page_size = 0
        self.decisions: dict[str, int] = {}  # reason -> count, for logs and tests

    def _policy_state(self) -> None:
        if not hasattr(self, "_policy"):  # Serve calls initialize_state only when kwargs are given
            self.initialize_state()

    def _keys(self, pending_request: PendingRequest | None) -> list[bytes]:
        ids = prompt_token_ids(pending_request)
        if not ids or not self._page_size:
            return []
        try:
            return list(block_hashes(ids, self._page_size))
        except ValueError:
            return []  # malformed ids: the engine rejects the request with a 400; route anywhere

    def _view(self, replica: RunningReplica, now: float) -> ReplicaView:
        rid = replica.replica_id.unique_id
        stats = replica.routing_stats or {}
        if stats.get("page_size"):
            self._page_size = int(stats["page_size"])
        if "seq" in stats:
            self._table.report(rid, stats["seq"], stats.get("block_hashes", ()), now)
        load = self._replica_queue_len_cache.get(replica.replica_id)
        if load is None:
            load = float(stats.get("running", 0)) + float(stats.get("queue_len", 0))
        return ReplicaView(rid, float(load), self._table.cached(rid, now))

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        self._policy_state()
        now = time.monotonic()
        views = [self._view(r, now) for r in candidate_replicas]
        decision = self._policy.choose(self._keys(pending_request), views)
        self.decisions[decision.reason] = self.decisions.get(decision.reason, 0) + 1
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        return [[by_id[i] for i in rank] for rank in decision.ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self._policy_state()
        keys = self._keys(pending_request)
        if keys:
            self._table.routed(replica_id.unique_id, keys, time.monotonic())

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        if hasattr(self, "_table"):
            self._table.forget(replica_id.unique_id)

"""KV-pressure autoscaling: a pure decision function plus the Serve policy class that calls it.

Each engine replica reports `kv_usage` (used/total pages) and `queue_len` (requests waiting for
admission) from `record_autoscaling_stats`; Serve averages them over `look_back_period_s`.
Ongoing-request counts alone miss the LLM failure mode: 8 long-context requests can fill a
replica's KV cache while 64 short ones do not, so KV usage is the primary signal and the waiting
queue (requests the engine could not admit: out of pages or batch slots) the second.

Decision (per control-loop tick, ~0.1 s):
- pressure: mean kv_usage >= kv_high OR waiting per replica >= queue_high -> want current + 1
  (+ more when the excess is large: ceil(current * kv / kv_high), so 2 replicas at 100% KV with
  kv_high 0.8 ask for 3, not 2 ticks of +1);
- idle: mean kv_usage <= kv_low AND waiting per replica <= queue_low -> want current - 1;
- in between: hold (the hysteresis band, so a replica added at 80% is not removed at 79%).
A want takes effect only after it has held for upscale_delay_s / downscale_delay_s without a
break (state: direction and since when). Bounds [min_replicas, max_replicas] are applied last.
Serve's own delays are set to 0 by the builder: the delays live here, where they are tested.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KV_METRIC = "kv_usage"
QUEUE_METRIC = "queue_len"


@dataclass(frozen=True)
class KVPressureParams:
    min_replicas: int = 1
    max_replicas: int = 4
    kv_high: float = 0.8
    kv_low: float = 0.3
    queue_high: float = 4.0
    queue_low: float = 0.0
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 120.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 0 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if not 0 <= self.kv_low < self.kv_high <= 1:
            raise ValueError(f"need 0 <= kv_low < kv_high <= 1, got {self.kv_low}, {self.kv_high}")
        if not 0 <= self.queue_low < self.queue_high:
            raise ValueError(f"need 0 <= queue_low < queue_high, got {self.queue_low}, {self.queue_high}")


def _mean(values: Mapping[Any, float]) -> float:
    return sum(values.values()) / len(values) if values else 0.0


def desired_replicas(current: int, kv_usage: Mapping[Any, float], queue_len: Mapping[Any, float],
                     params: KVPressureParams, state: Mapping[str, Any], now: float) -> tuple[int, dict[str, Any]]:
    """(replicas to run, new state). `kv_usage`/`queue_len`: per-replica averages; `state` holds
    `want` (+1/-1/0) and `since` (when that want began). Pure: same inputs, same answer."""
    bounded = min(max(current, params.min_replicas), params.max_replicas)
    if current == 0:  # cold start: no replica reports anything; the minimum (or 1) comes up now
        return max(bounded, 1) if params.max_replicas else 0, {"oscar_want": 0, "oscar_since": None}
    kv = _mean(kv_usage)
    waiting = sum(queue_len.values()) / current
    if kv >= params.kv_high or waiting >= params.queue_high:
        want = 1
        target = max(current + 1, math.ceil(current * kv / params.kv_high),
                     math.ceil(current * waiting / params.queue_high) if params.queue_high else 0)
    elif kv <= params.kv_low and waiting <= params.queue_low:
        want, target = -1, current - 1
    else:
        want, target = 0, current
    since = state.get("oscar_since") if state.get("oscar_want") == want and state.get("oscar_since") is not None else now
    delay = params.upscale_delay_s if want > 0 else params.downscale_delay_s
    if want == 0 or now - since < delay:
        return bounded, {"oscar_want": want, "oscar_since": since if want else None}
    target = min(max(target, params.min_replicas), params.max_replicas)
    # Once acted on, a further step needs the condition to hold for a full delay again.
    return target, {"oscar_want": want, "oscar_since": now if target != current else since}


class KVPressurePolicy:
    """Serve custom autoscaling policy: `autoscaling_config.policy = {policy_function:
    "oscar_ray.deployments.autoscaling:KVPressurePolicy", policy_kwargs: {KVPressureParams fields}}`."""

    def __init__(self, **kwargs: Any) -> None:
        self.params = KVPressureParams(**kwargs)

    def __call__(self, ctx) -> tuple[int, dict[str, Any]]:
        metrics = ctx.aggregated_metrics or {}
        running = set(ctx.running_replicas or ())
        kv = {r: v for r, v in metrics.get(KV_METRIC, {}).items() if not running or r in running}
        queue = {r: v for r, v in metrics.get(QUEUE_METRIC, {}).items() if not running or r in running}
        now = ctx.current_time if ctx.current_time is not None else time.time()
        # Decide from the target, not the running count: right after a scale-up the new replica
        # is still starting, and holding at "current" (1 of 2) would undo the decision at once.
        current = max(ctx.target_num_replicas or 0, ctx.current_num_replicas or 0)
        n, state = desired_replicas(current, kv, queue, self.params, ctx.policy_state or {}, now)
        return n, state

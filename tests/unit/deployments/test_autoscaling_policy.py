"""Table tests of the KV-pressure autoscaling decision (pure) and its Serve policy wrapper."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from oscar_ray.deployments.autoscaling import KVPressureParams, KVPressurePolicy, desired_replicas

P = KVPressureParams(min_replicas=1, max_replicas=4, kv_high=0.8, kv_low=0.3, queue_high=4, queue_low=0,
                     upscale_delay_s=10, downscale_delay_s=60)


def kv(*values):
    return {f"r{i}": v for i, v in enumerate(values)}


UP, DOWN = {"oscar_want": 1, "oscar_since": 0.0}, {"oscar_want": -1, "oscar_since": 0.0}
# (name, current, kv_usage, queue_len, state, now, expected replicas, expected want)
CASES = [
    ("pressure starts the up timer", 2, kv(0.9, 0.85), kv(0, 0), {}, 100.0, 2, 1),
    ("pressure held past the delay scales up", 2, kv(0.9, 0.85), kv(0, 0), UP, 10.0, 3, 1),
    ("just before the delay holds", 2, kv(0.9, 0.85), kv(0, 0), UP, 9.9, 2, 1),
    ("big excess jumps: 2 at 100% -> ceil(2*1/0.8)=3", 2, kv(1.0, 1.0), kv(0, 0), UP, 10.0, 3, 1),
    ("queue alone is pressure (5/replica >= 4)", 2, kv(0.1, 0.1), kv(6, 4), UP, 10.0, 3, 1),
    ("queue-proportional jump: 1 replica, 12 waiting -> 3", 1, kv(0.1), kv(12), UP, 10.0, 3, 1),
    ("max_replicas caps", 4, kv(1.0, 1.0, 1.0, 1.0), kv(9, 9, 9, 9), UP, 10.0, 4, 1),
    ("inside the band holds and clears the timer", 2, kv(0.5, 0.6), kv(0, 0), UP, 10.0, 2, 0),
    ("idle starts the down timer", 3, kv(0.1, 0.0, 0.2), kv(0, 0, 0), {}, 5.0, 3, -1),
    ("idle held past the delay scales down by one", 3, kv(0.1, 0.0, 0.2), kv(0, 0, 0), DOWN, 60.0, 2, -1),
    ("idle but a queue is not idle (hysteresis on queue)", 3, kv(0.1, 0.0, 0.2), kv(1, 0, 0), DOWN, 60.0, 3, 0),
    ("min_replicas floors", 1, kv(0.0), kv(0), DOWN, 600.0, 1, -1),
    ("direction change restarts the timer", 2, kv(0.9, 0.9), kv(0, 0), DOWN, 60.0, 2, 1),
    ("no metrics yet counts as idle", 2, {}, {}, {}, 0.0, 2, -1),
    ("cold start from zero replicas", 0, {}, {}, {}, 0.0, 1, 0),
]


@pytest.mark.parametrize("name,current,kv_usage,queue,state,now,expected,want", CASES, ids=[c[0] for c in CASES])
def test_desired_replicas_table(name, current, kv_usage, queue, state, now, expected, want):
    n, new_state = desired_replicas(current, kv_usage, queue, P, state, now)
    assert n == expected
    assert new_state["oscar_want"] == want


def test_timer_survives_across_calls_and_restarts_after_acting():
    state, n = {}, 2
    for t in (0.0, 5.0, 9.0):
        n, state = desired_replicas(n, kv(0.95, 0.95), kv(0, 0), P, state, t)
        assert n == 2
    n, state = desired_replicas(n, kv(0.95, 0.95), kv(0, 0), P, state, 10.0)
    assert n == 3
    # the next step needs another full delay of pressure, measured from the scale-up
    n, state = desired_replicas(n, kv(0.95, 0.95, 0.95), kv(0, 0, 0), P, state, 15.0)
    assert n == 3
    n, state = desired_replicas(n, kv(0.95, 0.95, 0.95), kv(0, 0, 0), P, state, 20.0)
    assert n == 4


@pytest.mark.parametrize("kwargs", [
    {"min_replicas": 3, "max_replicas": 2}, {"kv_low": 0.8, "kv_high": 0.8}, {"kv_high": 1.5},
    {"queue_low": 5, "queue_high": 4},
])
def test_bad_params_raise(kwargs):
    with pytest.raises(ValueError):
        KVPressureParams(**kwargs)


def test_policy_reads_serve_context_and_ignores_departed_replicas():
    policy = KVPressurePolicy(min_replicas=1, max_replicas=3, upscale_delay_s=0, downscale_delay_s=0)
    ctx = SimpleNamespace(
        aggregated_metrics={"kv_usage": {"r0": 0.95, "r1": 0.9, "gone": 0.0}, "queue_len": {"r0": 0, "r1": 0}},
        running_replicas=["r0", "r1"], current_num_replicas=2, target_num_replicas=2, current_time=1.0,
        policy_state={})
    n, state = policy(ctx)
    assert n == 3 and state["oscar_want"] == 1
    ctx.aggregated_metrics = {"kv_usage": {"r0": 0.0, "r1": 0.0}, "queue_len": {"r0": 0.0, "r1": 0.0}}
    ctx.policy_state, ctx.current_time = state, 2.0
    assert policy(ctx)[0] == 1


def test_policy_holds_the_target_while_a_new_replica_starts():
    # 1 running, target 2 (the new one is starting): pressure persists, the target must not drop
    policy = KVPressurePolicy(min_replicas=1, max_replicas=2, upscale_delay_s=0, downscale_delay_s=30)
    ctx = SimpleNamespace(aggregated_metrics={"kv_usage": {"r0": 0.5}, "queue_len": {"r0": 0}},
                          running_replicas=["r0"], current_num_replicas=1, target_num_replicas=2,
                          current_time=1.0, policy_state={})
    assert policy(ctx)[0] == 2

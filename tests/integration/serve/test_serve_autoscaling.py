"""Serve adds an engine replica under sustained KV pressure and removes it once idle.

Real Ray + Serve + our KVPressurePolicy; the engine is the scripted mock (allowed for autoscaler
tests) so that KV usage is a known function of load: 16 pages of 16 tokens, each request holds
ceil((64 prompt + generated) / 16) >= 5 pages, so 4 concurrent requests fill the cache.
"""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.slow

PORT = 8011


def _engine_replicas(serve) -> int:
    app = serve.status().applications.get("scale")
    if app is None or "EngineReplica" not in app.deployments:
        return 0
    return app.deployments["EngineReplica"].replica_states.get("RUNNING", 0)


def _wait(pred, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.25)
    return False


@pytest.fixture(scope="module")
def serve_app():
    os.environ["RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S"] = "0.5"  # workers inherit it
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve

    from oscar_ray.deployments.builder import build_app

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    cfg = {
        "model_id": "mock", "tokenizer": "smollm2",
        "engine": {"kind": "mock", "config": {"total_pages": 16, "page_size": 16, "token_delay_s": 0.05,
                                              "max_running": 8}},
        "replicas": {"num_cpus": 0.5, "graceful_shutdown_timeout_s": 5},
        "drain_timeout_s": 2,
        "autoscaling": {"min_replicas": 1, "max_replicas": 2, "kv_high": 0.6, "kv_low": 0.1, "queue_high": 4,
                        "upscale_delay_s": 1, "downscale_delay_s": 3, "metrics_interval_s": 0.5,
                        "look_back_period_s": 1},
        "ingress": {"num_cpus": 0.25},
    }
    serve.run(build_app(cfg), name="scale", route_prefix="/")
    yield serve
    serve.shutdown()
    ray.shutdown()


def test_pressure_adds_a_replica_and_idleness_removes_it(serve_app):
    serve = serve_app
    assert _engine_replicas(serve) == 1
    stop = threading.Event()
    statuses: list[int] = []

    def load(i: int) -> None:
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                r = c.post(f"http://127.0.0.1:{PORT}/v1/completions",
                           json={"model": "mock", "prompt": [7 + i] * 64, "max_tokens": 40})
                statuses.append(r.status_code)

    threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    try:
        assert _wait(lambda: _engine_replicas(serve) == 2, 45), "no scale-up under sustained KV pressure"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert statuses and set(statuses) == {200}, set(statuses)
    assert _wait(lambda: _engine_replicas(serve) == 1, 40), "no scale-down after the load stopped"

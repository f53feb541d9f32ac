"""Start the CPU default (configs/smollm2-cpu.yaml) as one or more Serve apps on a local Ray
cluster, for the fault scripts and the BF16-vs-OSCAR comparison.

`serve_cpu_default({"bf16": {"kv_cache": "bf16"}, "oscar": {}})` deploys one app per entry at
route `/<name>` (engine config overrides merged into the file's), yields the base URLs, and
tears everything down on exit.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
CPU_DEFAULT = REPO / "configs" / "smollm2-cpu.yaml"


def app_args(overrides: dict[str, Any] | None = None, replicas: int | None = None,
             max_ongoing: int | None = None, config: Path = CPU_DEFAULT) -> dict[str, Any]:
    """The `args` of the config file's app with engine-config overrides."""
    args = copy.deepcopy(yaml.safe_load(config.read_text())["applications"][0]["args"])
    args["engine"]["config"].update(overrides or {})
    if replicas is not None:
        args["replicas"]["num_replicas"] = replicas
    if max_ongoing is not None:
        args["replicas"]["max_ongoing_requests"] = max_ongoing
    return args


@contextlib.contextmanager
def serve_cpu_default(apps: dict[str, dict[str, Any]], port: int = 8000, num_cpus: int = 4,
                      replicas: int | None = None, max_ongoing: int | None = None) -> Iterator[dict[str, str]]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve

    from oscar_ray.deployments.builder import build_app

    # address="local": always a fresh cluster of our own. A bare ray.init() joins the cluster in
    # RAY_ADDRESS or /tmp/ray/ray_current_cluster (one started by `ray start` on this machine),
    # where num_cpus is refused and our serve.shutdown() would remove that cluster's apps; a
    # cluster another ray.init() started is not joined. 256 MiB object store: only small dicts cross it.
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             object_store_memory=256 * 2**20)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        urls = {}
        for name, over in apps.items():
            t0 = time.perf_counter()
            serve.run(build_app(app_args(over, replicas, max_ongoing)), name=name, route_prefix=f"/{name}")
            urls[name] = f"http://127.0.0.1:{port}/{name}"
            r = httpx.get(urls[name] + "/v1/models", timeout=60)
            r.raise_for_status()
            print(f"[serve] {name} up in {time.perf_counter() - t0:.1f} s: {urls[name]}", flush=True)
        yield urls
    finally:
        serve.shutdown()
        ray.shutdown()


def kv_stats(url: str) -> dict[str, float]:
    """The replica KV gauges from the app's Prometheus /metrics (summed over replicas)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("oscar_kv_used_pages", "oscar_kv_total_pages", "oscar_running_requests",
                            "oscar_queue_len", "oscar_requests_in_flight")):
            name, _, value = line.rpartition(" ")
            key = name.split("{")[0]
            out[key] = out.get(key, 0.0) + float(value)
    return out


def replica_pids() -> dict[str, int]:
    """Engine replica actor pids by replica id (Serve's controller status)."""
    from ray.util.state import list_actors

    return {a.name or a.actor_id: a.pid for a in list_actors(filters=[("state", "=", "ALIVE")])
            if "EngineReplica" in (a.class_name or "") or "EngineReplica" in (a.name or "")}


def replica_processes(app: str) -> list:
    """psutil processes of an app's engine replicas (Ray titles them `ray::ServeReplica:<app>:EngineReplica`),
    only those of this driver's cluster (descendants of its raylet): another cluster on the machine
    may run an app of the same name."""
    import psutil

    out = []
    mine = {c.pid for c in psutil.Process().children(recursive=True)}
    for p in psutil.process_iter(["cmdline"]):
        if p.pid not in mine:
            continue
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if f"ServeReplica:{app}:EngineReplica" in cmd:
            out.append(p)
    return out


def engine_kv(app: str) -> dict:
    """One replica's engine KVStats (used_pages excludes evictable prefix-cache pages)."""
    from ray import serve

    return serve.get_deployment_handle("EngineReplica", app_name=app).kv_stats.remote().result(timeout_s=30)


def running_replicas(app: str) -> int:
    from ray import serve

    st = serve.status().applications[app].deployments["EngineReplica"]
    return int(st.replica_states.get("RUNNING", 0))


def save(result: dict, path: str | Path) -> Path:
    from load_tests.runner import write_json

    return write_json(result, path)

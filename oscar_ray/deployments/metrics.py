"""Prometheus metrics of one ingress replica (GET /metrics): latency, tokens, and the KV state the
engine replicas last reported. A private registry, so two apps in one process do not collide."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# TTFT on CPU SmolLM2 is ~50-500 ms, on GPU 10-200 ms; TPOT 1-100 ms: buckets span both.
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class ServeMetrics:
    def __init__(self, model: str) -> None:
        self.registry = r = CollectorRegistry()
        self.model = model
        self.requests = Counter("oscar_requests", "Finished HTTP requests", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("oscar_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.cached_tokens = Counter("oscar_cached_prompt_tokens", "Prompt tokens served from the prefix cache",
                                     registry=r)
        self.generation_tokens = Counter("oscar_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram("oscar_time_to_first_token_seconds", "Arrival at the ingress to first token",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("oscar_time_per_output_token_seconds", "(end - first token) / (tokens - 1)",
                              buckets=_TPOT_BUCKETS, registry=r)
        self.in_flight = Gauge("oscar_requests_in_flight", "Requests this ingress is streaming", registry=r)
        self.prefix_hit_rate = Gauge("oscar_prefix_hit_rate", "cached / prompt tokens of requests seen here",
                                     registry=r)
        labels = ["replica"]
        self.kv_usage = Gauge("oscar_kv_usage", "Used / total KV pages (last report)", labels, registry=r)
        self.kv_used = Gauge("oscar_kv_used_pages", "Used KV pages (last report)", labels, registry=r)
        self.kv_total = Gauge("oscar_kv_total_pages", "KV pages (last report)", labels, registry=r)
        self.queue = Gauge("oscar_queue_len", "Requests waiting for admission (last report)", labels, registry=r)
        self.running = Gauge("oscar_running_requests", "Requests decoding (last report)", labels, registry=r)
        self.engine_hit_rate = Gauge("oscar_engine_prefix_hit_rate", "Engine-reported prefix hit rate", labels,
                                     registry=r)

    def observe_request(self, endpoint: str, status: int, prompt: int = 0, completion: int = 0, cached: int = 0,
                        ttft_s: float | None = None, tpot_s: float | None = None) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.prompt_tokens.inc(prompt)
        self.cached_tokens.inc(cached)
        self.generation_tokens.inc(completion)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if tpot_s is not None:
            self.tpot.observe(tpot_s)
        total = self.prompt_tokens._value.get()
        if total:
            self.prefix_hit_rate.set(self.cached_tokens._value.get() / total)

    def observe_kv(self, replica: str, kv: dict[str, Any]) -> None:
        self.kv_usage.labels(replica).set(kv.get("usage", 0.0))
        self.kv_used.labels(replica).set(kv.get("used_pages", 0))
        self.kv_total.labels(replica).set(kv.get("total_pages", 0))
        self.queue.labels(replica).set(kv.get("queue_len", 0))
        self.running.labels(replica).set(kv.get("running", 0))
        self.engine_hit_rate.labels(replica).set(kv.get("hit_rate", 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)

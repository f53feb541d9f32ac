"""The engine replica deployment: one `Engine` (torch, sglang or mock, chosen by config) per replica.

Wire format with the ingress (plain dicts: they cross a Ray boundary and the router reads them):
- request: {"request_id", "prompt_token_ids": [...], "sampling": {SamplingParams fields}}
- stream items: {"text", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"},
  the last one also carries "kv" (this replica's KVStats) for the ingress's /metrics;
  or a single {"error": {"status", "message", "param", "code"}} when the engine refuses the request
  before its first token (InvalidRequest 400, EngineOverloaded 429, EngineDead 503).
Serve hooks: `check_health` (the engine's own check; raising restarts the replica),
`record_autoscaling_stats` (kv_usage, queue_len), `record_routing_stats` (the same plus the block
hashes of cached prefixes), and an async `__del__` that drains the engine before the actor exits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from oscar_ray.engines.base import (
    EngineDead, EngineError, GenerateRequest, InvalidRequest, SamplingParams,
)

from .engine_factory import build_engine

log = logging.getLogger("ray.serve")


def error_item(e: Exception) -> dict[str, Any]:
    status = getattr(e, "status", 500)
    return {"error": {"status": status, "message": str(e), "param": getattr(e, "param", None),
                      "code": getattr(e, "code", "engine_error")}}


class EngineReplica:
    """Serve deployment class (wrapped by `serve.deployment` in builder.py)."""

    async def __init__(self, engine_kind: str, engine_config: dict[str, Any], drain_timeout_s: float = 20.0,
                       max_reported_blocks: int = 4096) -> None:
        self.engine = build_engine(engine_kind, engine_config)
        await self.engine.start()
        self.drain_timeout_s = drain_timeout_s
        self.max_reported_blocks = max_reported_blocks
        self._seq = 0
        self._last_hashes: tuple[bytes, ...] = ()
        try:
            from ray import serve

            self.replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # constructed outside Serve (unit use)
            self.replica_id = "local"
        info = self.engine.model_info()
        log.info("engine %s ready: %s, max_model_len %d, page_size %d, kv %s", engine_kind, info.name,
                 info.max_model_len, info.page_size, info.kv_cache)

    async def generate(self, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            request = GenerateRequest(request_id=payload["request_id"],
                                      sampling=SamplingParams(**payload.get("sampling", {})),
                                      prompt_token_ids=payload.get("prompt_token_ids"),
                                      prompt=payload.get("prompt"), messages=payload.get("messages"))
            stream = self.engine.generate(request)
        except (EngineError, ValueError, TypeError, KeyError) as e:
            if not isinstance(e, EngineError):
                e = InvalidRequest(str(e))
            yield error_item(e)
            return
        finished = False
        try:
            async for chunk in stream:
                item = {"text": chunk.text, "finish_reason": chunk.finish_reason,
                        "prompt_tokens": chunk.prompt_tokens, "completion_tokens": chunk.completion_tokens,
                        "cached_tokens": chunk.cached_tokens}
                if chunk.error:
                    item["error_text"] = chunk.error
                if chunk.finish_reason is not None:
                    finished = True
                    item["kv"] = self.kv_stats()
                yield item
        except EngineError as e:
            finished = True
            yield error_item(e)
        except Exception as e:  # not the contract's error: still one structured item, and the abort below
            log.exception("request %s: engine stream raised", request.request_id)
            yield error_item(EngineDead(f"the engine failed mid-request: {type(e).__name__}: {e}"))
        finally:
            if not finished:
                # Client gone (Serve cancelled this task) or the consumer stopped early: free the
                # request's pages now rather than when the engine next notices.
                try:
                    await asyncio.shield(self.engine.abort(request.request_id))
                except EngineError as e:  # a dead engine has nothing left to free
                    log.warning("request %s: abort failed: %s", request.request_id, e)
                await stream.aclose()

    async def check_health(self) -> None:
        await self.engine.check_health()

    def record_autoscaling_stats(self) -> dict[str, float]:
        s = self.engine.kv_stats()
        return {"kv_usage": float(s.usage), "queue_len": float(s.queue_len), "running": float(s.running)}

    def record_routing_stats(self) -> dict[str, Any]:
        s = self.engine.kv_stats()
        hashes = tuple(self.engine.cached_block_hashes(self.max_reported_blocks))
        if hashes != self._last_hashes:  # seq tells the router whether to rebuild its set
            self._seq += 1
            self._last_hashes = hashes
        return {"kv_usage": s.usage, "queue_len": s.queue_len, "running": s.running, "page_size": s.page_size,
                "seq": self._seq, "block_hashes": list(hashes)}

    def kv_stats(self) -> dict[str, Any]:
        return {**self.engine.kv_stats().as_dict(), "replica": self.replica_id}

    def model_info(self) -> dict[str, Any]:
        info = self.engine.model_info()
        return {"name": info.name, "max_model_len": info.max_model_len, "page_size": info.page_size,
                "kv_cache": info.kv_cache}

    async def __del__(self) -> None:
        # Serve has already waited for in-flight requests (graceful_shutdown_timeout_s); whatever
        # still runs gets drain_timeout_s more inside the engine, then is aborted and freed.
        engine = getattr(self, "engine", None)
        if engine is not None:
            await engine.shutdown(self.drain_timeout_s)

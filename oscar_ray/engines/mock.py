"""A scripted engine implementing the `Engine` contract, for router and autoscaler tests and the
prefix-routing benchmark (never for API tests: those run the real torch engine on SmolLM2).

What is scripted, and why each piece exists:
- output: `max_tokens` tokens "t0 t1 ..." (token id = 1000 + i), one every `token_delay_s`; the
  request ends with "length" unless a stop string matches.
- prefix cache: the chained block keys of every prompt it served (`oscar_ray.cache.block_hashes`,
  page_size tokens a block), LRU-bounded to `cache_blocks`. A new request's prompt is matched
  block by block, and prefill costs `prefill_s_per_token` for each *uncached* token, so TTFT
  depends on cache hits the way a real engine's does (~0.5 ms/token is SmolLM2's CPU prefill).
- pages: a running request holds ceil((prompt + generated) / page_size) pages out of
  `total_pages`; they are freed when it ends or is aborted. `kv_stats().usage` is that share.
- admission: at most `max_running` requests decode at once, the rest wait (queue_len); more than
  `max_waiting` waiting raises `EngineOverloaded`.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from oscar_ray.cache import block_hashes

from .base import (
    Chunk, Engine, EngineDead, EngineOverloaded, GenerateRequest, InvalidRequest, KVStats, ModelInfo,
)


@dataclass(frozen=True)
class MockEngineConfig:
    """Knobs of the scripted engine (see the module docstring)."""

    name: str = "mock"
    page_size: int = 16
    total_pages: int = 256
    max_model_len: int = 2048
    token_delay_s: float = 0.01
    prefill_s_per_token: float = 0.0
    max_running: int = 8
    max_waiting: int = 64
    cache_blocks: int = 4096

    @classmethod
    def from_dict(cls, data: dict | None) -> MockEngineConfig:
        data = dict(data or {})
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown mock engine config keys: {sorted(unknown)}")
        return cls(**data)


def _fake_tokens(text: str) -> tuple[int, ...]:
    # One token per UTF-8 byte: deterministic and prefix-preserving, all the router needs.
    return tuple(text.encode()) or (0,)


class MockEngine(Engine):
    """Scripted engine; see the module docstring. Thread-free: everything runs on the event loop."""

    def __init__(self, config: MockEngineConfig | dict | None = None) -> None:
        self.cfg = config if isinstance(config, MockEngineConfig) else MockEngineConfig.from_dict(config)
        self._cache: OrderedDict[bytes, None] = OrderedDict()  # most recent last
        self._pages: dict[str, int] = {}  # running request -> pages held
        self._tasks: dict[str, asyncio.Event] = {}  # request -> abort flag
        self._slots: asyncio.Semaphore | None = None
        self._waiting = 0
        self._started = self._closed = False
        self._prompt_tokens = self._cached_tokens = 0

    async def start(self) -> None:
        if not self._started:
            self._slots = asyncio.Semaphore(self.cfg.max_running)
            self._started = True

    def _prompt_ids(self, req: GenerateRequest) -> tuple[int, ...]:
        if req.prompt_token_ids is not None:
            return req.prompt_token_ids
        if req.prompt is not None:
            return _fake_tokens(req.prompt)
        return _fake_tokens("".join(f"<{m['role']}>{m.get('content', '')}" for m in req.messages or ()))

    def _match(self, ids: Sequence[int]) -> int:
        n = 0
        for key in block_hashes(ids, self.cfg.page_size, max(0, len(ids) - 1) // self.cfg.page_size):
            if key not in self._cache:
                break
            self._cache.move_to_end(key)
            n += 1
        return n * self.cfg.page_size

    def _insert(self, ids: Sequence[int]) -> None:
        for key in block_hashes(ids, self.cfg.page_size):
            self._cache[key] = None
            self._cache.move_to_end(key)
        while len(self._cache) > self.cfg.cache_blocks:
            self._cache.popitem(last=False)

    def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]:
        if not self._started or self._closed:
            raise EngineDead("mock engine is not running")
        ids = self._prompt_ids(request)
        if len(ids) + request.sampling.max_tokens > self.cfg.max_model_len:
            raise InvalidRequest(
                f"prompt ({len(ids)} tokens) + max_tokens ({request.sampling.max_tokens}) exceeds the context "
                f"length {self.cfg.max_model_len}", param="messages")
        if request.request_id in self._tasks:
            raise InvalidRequest(f"request_id {request.request_id!r} is already running", param="request_id")
        if self._waiting >= self.cfg.max_waiting:
            raise EngineOverloaded(f"{self._waiting} requests waiting (max_waiting={self.cfg.max_waiting})")
        self._tasks[request.request_id] = asyncio.Event()
        self._waiting += 1
        return self._run(request, ids)

    async def _run(self, req: GenerateRequest, ids: tuple[int, ...]) -> AsyncIterator[Chunk]:
        rid, cfg = req.request_id, self.cfg
        aborted = self._tasks[rid]
        admitted = False
        try:
            await self._slots.acquire()
            admitted = True
            self._waiting -= 1
            cached = self._match(ids)
            self._prompt_tokens += len(ids)
            self._cached_tokens += cached
            self._pages[rid] = math.ceil(len(ids) / cfg.page_size)
            await asyncio.sleep((len(ids) - cached) * cfg.prefill_s_per_token)
            self._insert(ids)
            text, n = "", 0
            for i in range(req.sampling.max_tokens):
                if aborted.is_set():
                    yield Chunk(rid, finish_reason="abort", prompt_tokens=len(ids), completion_tokens=n,
                                cached_tokens=cached)
                    return
                if i:
                    await asyncio.sleep(cfg.token_delay_s)
                piece = f"t{i} "
                text += piece
                n += 1
                self._pages[rid] = math.ceil((len(ids) + n) / cfg.page_size)
                stop = next((s for s in req.sampling.stop if s in text), None)
                last = stop is not None or n == req.sampling.max_tokens
                reason = ("stop" if stop is not None else "length") if last else None
                yield Chunk(rid, text=piece, token_ids=(1000 + i,), finish_reason=reason, prompt_tokens=len(ids),
                            completion_tokens=n, cached_tokens=cached)
                if last:
                    return
        finally:
            if not admitted:
                self._waiting -= 1
            else:
                self._slots.release()
            self._pages.pop(rid, None)
            self._tasks.pop(rid, None)

    async def abort(self, request_id: str) -> bool:
        flag = self._tasks.get(request_id)
        if flag is None:
            return False
        flag.set()
        self._pages.pop(request_id, None)  # pages go at once, as the contract asks
        return True

    def kv_stats(self) -> KVStats:
        used = min(sum(self._pages.values()), self.cfg.total_pages)
        return KVStats(used_pages=used, total_pages=self.cfg.total_pages, usage=used / self.cfg.total_pages,
                       hit_rate=self._cached_tokens / self._prompt_tokens if self._prompt_tokens else 0.0,
                       queue_len=self._waiting, running=len(self._pages), page_size=self.cfg.page_size)

    async def check_health(self) -> None:
        if not self._started or self._closed:
            raise EngineDead("mock engine is not running")

    def model_info(self) -> ModelInfo:
        return ModelInfo(self.cfg.name, self.cfg.max_model_len, self.cfg.page_size, "mock")

    def cached_block_hashes(self, limit: int = 4096) -> Sequence[bytes]:
        keys = list(reversed(self._cache))
        return keys[:limit]

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        self._closed = True
        await self._drain(lambda: bool(self._tasks), lambda: self._tasks, drain_timeout_s)

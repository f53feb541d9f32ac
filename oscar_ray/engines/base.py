"""The contract every engine (torch reference, sglang plugin, scripted mock) gives the deployments.

Deployments, the router and the autoscaler see an engine only through this module: `generate`
streams `Chunk`s (incremental detokenized text + token ids), `abort` frees a request's pages at
once, `kv_stats` is what routing and autoscaling decide on, `check_health` raises when the engine
cannot serve. Everything here is plain Python so it pickles across Ray actor boundaries.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort", "error"]


class EngineError(RuntimeError):
    """Base of the errors an engine raises to its caller; `status` is the HTTP status it maps to."""

    status = 500
    code = "engine_error"


class InvalidRequest(EngineError, ValueError):
    """The request cannot be served as asked (e.g. prompt longer than the context): HTTP 400."""

    status = 400
    code = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineOverloaded(EngineError):
    """The waiting queue is full: HTTP 429, retry later (another replica may have room)."""

    status = 429
    code = "overloaded"


class EngineDead(EngineError):
    """The engine's worker failed or shut down: HTTP 503; Serve's health check restarts the replica."""

    status = 503
    code = "engine_unavailable"


def _check(cond: bool, name: str, why: str, value: object) -> None:
    if not cond:
        raise InvalidRequest(f"{name} {why}, got {value!r}", param=name)


@dataclass(frozen=True)
class SamplingParams:
    """OpenAI-style sampling. temperature 0 is greedy (deterministic); top_k 0 disables top-k.
    `seed` makes a sampled request reproducible on the same engine build. Invalid values raise
    `InvalidRequest` (a ValueError) naming the field."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens", "must be an int >= 1",
               self.max_tokens)
        _check(isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
               and 0.0 <= self.temperature <= 2.0, "temperature", "must be in [0, 2]", self.temperature)
        _check(isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]",
               self.top_p)
        _check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", "must be an int >= 0", self.top_k)
        _check(len(self.stop) <= 4 and all(isinstance(s, str) and s for s in self.stop), "stop",
               "must be at most 4 non-empty strings", self.stop)
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
               "must be non-negative ints", self.stop_token_ids)
        _check(self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2**63), "seed",
               "must be an int in [0, 2**63)", self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(frozen=True)
class GenerateRequest:
    """One generation. Exactly one of `prompt_token_ids`, `prompt` (raw text) or `messages` (chat,
    rendered with the model's chat template by the engine, which owns the tokenizer)."""

    request_id: str
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_token_ids: tuple[int, ...] | None = None
    prompt: str | None = None
    messages: tuple[dict, ...] | None = None

    def __post_init__(self) -> None:
        _check(isinstance(self.request_id, str) and bool(self.request_id), "request_id",
               "must be a non-empty string", self.request_id)
        given = [n for n in ("prompt_token_ids", "prompt", "messages") if getattr(self, n) is not None]
        _check(len(given) == 1, "prompt", "needs exactly one of prompt_token_ids, prompt, messages", given)
        if self.prompt_token_ids is not None:
            object.__setattr__(self, "prompt_token_ids", tuple(self.prompt_token_ids))
            _check(len(self.prompt_token_ids) > 0 and all(isinstance(t, int) and t >= 0
                                                          for t in self.prompt_token_ids),
                   "prompt_token_ids", "must be a non-empty list of non-negative ints", "…")
        if self.messages is not None:
            object.__setattr__(self, "messages", tuple(self.messages))
            _check(len(self.messages) > 0 and all(isinstance(m, dict) and "role" in m for m in self.messages),
                   "messages", "must be a non-empty list of {role, content} objects", "…")
        if self.prompt is not None:
            _check(isinstance(self.prompt, str) and bool(self.prompt), "prompt", "must be a non-empty string",
                   self.prompt)


@dataclass(frozen=True)
class Chunk:
    """A streamed delta. The last chunk of a request has `finish_reason` set; the usage counters
    are cumulative so the final chunk carries the request's totals."""

    request_id: str
    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None


@dataclass(frozen=True)
class KVStats:
    """What a replica reports to the router and the autoscaler. `usage` is used/total pages in
    [0, 1]; `hit_rate` is cached prompt tokens / prompt tokens since start."""

    used_pages: int
    total_pages: int
    usage: float
    hit_rate: float
    queue_len: int
    running: int
    page_size: int = 0

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    max_model_len: int
    page_size: int
    kv_cache: str  # "oscar" or "bf16"


class Engine(abc.ABC):
    """Async engine. Implementations run their model loop off the event loop (a thread or a
    subprocess) and must leave no pages allocated for a request once its last chunk is out or it
    was aborted."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model and start the loop; idempotent."""

    @abc.abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]:
        """Stream the request's chunks. Raises `InvalidRequest`/`EngineOverloaded`/`EngineDead`
        before the first chunk when it cannot be admitted. Closing the iterator early aborts."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> bool:
        """Stop the request and free its pages now; False when it is unknown or already done."""

    @abc.abstractmethod
    def kv_stats(self) -> KVStats: ...

    @abc.abstractmethod
    async def check_health(self) -> None:
        """Raise `EngineDead` when the engine cannot serve."""

    @abc.abstractmethod
    def model_info(self) -> ModelInfo: ...

    def cached_block_hashes(self, limit: int = 4096) -> Sequence[bytes]:
        """Chained block keys (`oscar_ray.cache.block_hashes`) of the prefixes this engine holds,
        most recently used first; the prefix-affinity router matches prompts against them."""
        return ()

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Stop admitting, let running requests finish for up to `drain_timeout_s`, then abort the
        rest and release the model. Default: nothing to release."""

    async def _drain(self, pending: Callable[[], bool], live: Callable[[], Iterable[str]],
                     timeout_s: float) -> None:
        """The drain half of `shutdown`: poll every 50 ms while `pending()` holds, for at most
        `timeout_s`, then abort every request id `live()` still names (frees their pages at once)."""
        deadline = time.monotonic() + timeout_s
        while pending() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for rid in list(live()):
            await self.abort(rid)

"""`TorchEngine`: the async `Engine` over `EngineCore`, with its model loop on a background thread.

The loop thread owns the core: it takes new requests and aborts from thread-safe queues at each
step boundary, runs `step()` (torch releases the GIL in its kernels, so the event loop stays
responsive), samples, detokenises, and pushes `Chunk`s into each request's asyncio.Queue with
`call_soon_threadsafe`. `abort()` resolves once the loop has freed the pages (at most one step).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import torch

from oscar_ray.engines.base import (
    Chunk, Engine, EngineDead, EngineOverloaded, GenerateRequest, InvalidRequest, KVStats, ModelInfo,
)

from .config import TorchEngineConfig
from .sampling import make_generator, sample
from .scheduler import Seq
from .text import Detokenizer, StopMatcher

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Req:
    """Per-request state the loop thread keeps beside the scheduler's Seq."""

    request: GenerateRequest
    out: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    detok: Detokenizer
    stop: StopMatcher
    generator: object
    stop_ids: frozenset[int]
    emitted_tokens: list[int] = field(default_factory=list)
    done: bool = False

    def put(self, chunk: Chunk) -> None:
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, chunk)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening
            pass


class TorchEngine(Engine):
    """The torch reference engine (see the package docstring for how to build and start it)."""

    def __init__(self, cfg: TorchEngineConfig, model=None, tokenizer=None) -> None:
        self.cfg = cfg
        self._model, self._tokenizer = model, tokenizer
        self.core = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._dead: BaseException | None = None
        self._live: dict[str, Seq] = {}  # request_id -> Seq (loop thread only)
        self._n_queued = 0  # submitted, not yet finished (any thread; guarded by _count_lock)
        self._count_lock = threading.Lock()
        self._stats = KVStats(0, 0, 0.0, 0.0, 0, 0)
        self._hashes: tuple[bytes, ...] = ()
        self._start_lock = asyncio.Lock()
        self._final: list = []  # (request state, last chunk) to send once its pages are freed
        self.steps = 0

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        async with self._start_lock:
            if self.core is not None:
                return
            from .core import EngineCore

            self.core = await asyncio.to_thread(EngineCore, self.cfg, self._model, self._tokenizer)
            self._model = self._tokenizer = None
            self._eos = set(self._eos_ids())
            self._publish()
            self._thread = threading.Thread(target=self._run, name="oscar-torch-engine", daemon=True)
            self._thread.start()

    def _eos_ids(self) -> list[int]:
        tok = self.core.tokenizer
        ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        gen = getattr(self.core.model, "generation_config", None)
        extra = getattr(gen, "eos_token_id", None)
        ids |= set(extra if isinstance(extra, (list, tuple)) else [extra] if extra is not None else [])
        return [i for i in ids if i is not None]

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        if self.core is None or self._thread is None:
            return
        self._stopping = True
        await self._drain(lambda: bool(self._n_queued) and self._thread.is_alive(), lambda: self._live,
                          drain_timeout_s)
        self._inbox.put(("stop", None, None))
        self._wake.set()
        await asyncio.to_thread(self._thread.join, 10.0)

    # --- requests ------------------------------------------------------------------------------
    def _prompt_ids(self, request: GenerateRequest) -> list[int]:
        tok = self.core.tokenizer
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
            vocab = self.core.model.config.vocab_size
            if max(ids) >= vocab:
                raise InvalidRequest(f"prompt_token_ids holds id {max(ids)} >= vocab size {vocab}",
                                     param="prompt_token_ids")
            return ids
        if request.messages is not None:
            try:
                ids = tok.apply_chat_template(list(request.messages), add_generation_prompt=True, tokenize=True)
            except Exception as e:  # jinja errors on malformed messages
                raise InvalidRequest(f"messages cannot be rendered with the chat template: {e}",
                                     param="messages") from e
            if hasattr(ids, "keys"):  # BatchEncoding in newer transformers
                ids = ids["input_ids"]
            return list(ids)
        return tok(request.prompt, add_special_tokens=False)["input_ids"]

    def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]:
        """Validate and enqueue now (raising InvalidRequest / EngineOverloaded / EngineDead before
        any chunk), then stream. Closing the returned iterator early aborts the request."""
        self._check_alive()
        if not isinstance(request, GenerateRequest):
            raise InvalidRequest(f"request must be a GenerateRequest, got {type(request).__name__}")
        ids = self._prompt_ids(request)
        param = next(n for n in ("messages", "prompt", "prompt_token_ids") if getattr(request, n) is not None)
        if len(ids) >= self.cfg.max_model_len:
            raise InvalidRequest(f"the prompt has {len(ids)} tokens; max_model_len is {self.cfg.max_model_len} "
                                 "(prompt + at least one generated token)", param=param)
        with self._count_lock:
            if self._n_queued >= self.cfg.max_queue + self.cfg.max_num_seqs:
                raise EngineOverloaded(f"{self._n_queued} requests in flight (max_queue {self.cfg.max_queue} + "
                                       f"max_num_seqs {self.cfg.max_num_seqs}); retry later")
            self._n_queued += 1
        sp = request.sampling
        loop = asyncio.get_running_loop()
        req = _Req(request, asyncio.Queue(), loop, Detokenizer(self.core.tokenizer, ids), StopMatcher(sp.stop),
                   make_generator(sp), frozenset(sp.stop_token_ids) | (frozenset() if sp.ignore_eos
                                                                        else frozenset(self._eos)))
        max_new = min(sp.max_tokens, self.cfg.max_model_len - len(ids))
        seq = Seq(request.request_id, list(ids), len(ids), max_new, payload=req)
        self._inbox.put(("add", seq, None))
        self._wake.set()
        return self._stream(seq, req)

    async def _stream(self, seq: Seq, req: _Req) -> AsyncIterator[Chunk]:
        finished = False
        try:
            while True:
                chunk = await req.out.get()
                if isinstance(chunk, BaseException):
                    raise chunk
                yield chunk
                if chunk.finish_reason is not None:
                    finished = True
                    return
        finally:
            if not finished:
                self._inbox.put(("abort", seq, None))
                self._wake.set()

    async def abort(self, request_id: str) -> bool:
        self._check_alive()
        fut = asyncio.get_running_loop().create_future()
        self._inbox.put(("abort_id", request_id, (asyncio.get_running_loop(), fut)))
        self._wake.set()
        return await fut

    # --- observability -------------------------------------------------------------------------
    def kv_stats(self) -> KVStats:
        return self._stats

    def cached_block_hashes(self, limit: int = 4096) -> Sequence[bytes]:
        return self._hashes[:limit]

    async def check_health(self) -> None:
        self._check_alive()

    def model_info(self) -> ModelInfo:
        c = self.cfg
        return ModelInfo(c.name or c.model, c.max_model_len, c.cache.page_size, c.kv_cache)

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDead(f"the engine loop died: {self._dead!r}")
        if self.core is None:
            raise EngineDead("the engine is not started; await engine.start() first")
        if self._stopping:
            raise EngineDead("the engine is shutting down")
        if self._thread is not None and not self._thread.is_alive():
            raise EngineDead("the engine loop thread is not running")

    def _publish(self) -> None:
        a = self.core.allocator
        u = a.usage()
        used = (u.int2.used - u.int2.cached) + (u.bf16.used - u.bf16.cached)  # cached pages are evictable
        total = u.int2.total + u.bf16.total
        s = self.core.scheduler
        self._stats = KVStats(used, total, used / total if total else 0.0, a.prefix.stats().hit_rate,
                              len(s.waiting), len(s.running), self.core.geometry.page_size)

    # --- the loop thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                if not self._drain_inbox():
                    return
                if not (self.core.scheduler.running or self.core.scheduler.waiting):
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                with self.core.lock:
                    self._step()
                self.steps += 1
                self._flush()
        except BaseException as e:  # noqa: BLE001 - the loop must report any failure to every waiter
            log.exception("torch engine loop died")
            self._dead = e
            for seq in list(self._live.values()):
                seq.payload.put(EngineDead(f"the engine loop died: {e!r}"))

    def _drain_inbox(self) -> bool:
        while True:
            try:
                kind, obj, extra = self._inbox.get_nowait()
            except queue.Empty:
                return True
            if kind == "stop":
                return False
            if kind == "add":
                if obj.request_id in self._live:  # a duplicate id: refuse the newcomer only
                    self._finish(obj, "error", error=f"request_id {obj.request_id!r} is already running",
                                 free=False)
                    self._flush()
                    continue
                self._live[obj.request_id] = obj
                with self.core.lock:
                    self.core.scheduler.add(obj)
            elif kind == "abort":
                if self._live.get(obj.request_id) is obj:
                    self._abort(obj)
            elif kind == "abort_id":
                seq = self._live.get(obj)
                if seq is not None:
                    self._abort(seq)
                loop, fut = extra
                self._flush()
                loop.call_soon_threadsafe(lambda f=fut, r=seq is not None: f.done() or f.set_result(r))
            self._flush()

    def _abort(self, seq: Seq) -> None:
        with self.core.lock:
            self.core.scheduler.drop(seq)
        self._finish(seq, "abort", free=False)

    def _finish(self, seq: Seq, reason: str, text: str = "", error: str | None = None, free: bool = True,
                tokens: tuple[int, ...] = ()) -> None:
        req: _Req = seq.payload
        if req.done:
            return
        req.done = seq.finished = True
        if self._live.get(seq.request_id) is seq:
            del self._live[seq.request_id]
        with self._count_lock:
            self._n_queued -= 1
        # sent after the pages are freed and the stats published (see _flush): a caller that sees
        # the last chunk also sees the request's pages back in kv_stats
        self._final.append((req, Chunk(seq.request_id, text, tokens, reason, seq.n_prompt, seq.n_generated,
                                       seq.n_cached, error)))

    def _flush(self) -> None:
        self._publish()
        final, self._final = self._final, []
        for req, chunk in final:
            req.put(chunk)

    def _step(self) -> None:
        core = self.core
        result = core.step()
        plan = result.plan
        prompts_done = [s for s, it in plan.items if it.start < s.n_prompt and s.n_written >= s.n_prompt]
        finished: list[Seq] = []
        if result.sampled:
            seqs = [s for s, _ in result.sampled]
            toks = sample(torch.stack([lg for _, lg in result.sampled]), [s.payload.request.sampling for s in seqs],
                          [s.payload.generator for s in seqs])
            for seq, tok in zip(seqs, toks):
                if self._emit(seq, tok):
                    finished.append(seq)
        core.finish_step(finished, prompts_done)

    def _emit(self, seq: Seq, tok: int) -> bool:
        """Append a sampled token, stream its text; True when the request is finished."""
        req: _Req = seq.payload
        seq.tokens.append(tok)
        if tok in req.stop_ids:
            self._finish(seq, "stop", req.stop.flush(), tokens=(tok,))
            return True
        text = req.stop.feed(req.detok.push(tok))
        if req.stop.stopped:
            self._finish(seq, "stop", text, tokens=(tok,))
            return True
        if seq.n_generated >= seq.max_new:
            self._finish(seq, "length", text + req.stop.flush(), tokens=(tok,))
            return True
        req.put(Chunk(seq.request_id, text, (tok,), None, seq.n_prompt, seq.n_generated, seq.n_cached))
        return False

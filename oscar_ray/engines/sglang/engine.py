"""`SGLangEngine`: the `Engine` contract over sglang 0.5.23's in-process `sglang.Engine`, with the
OSCAR plugin selected by the config (kv_cache="oscar": attention backend "oscar" + OSCAR_* env).

What it uses of sglang (`sglang/srt/entrypoints/engine.py`, `managers/tokenizer_manager.py`):
- `Engine(**sglang_engine_kwargs(cfg))`: launches the schedulers (one process per TP rank) and the
  detokenizer with mp "spawn", and builds the TokenizerManager in this process. Inside a Ray
  placement group (a TP replica: builder.py gives the replica actor no GPU and the group one
  bundle of GPUs per node) it is `sglang/srt/ray/engine.py::RayEngine` instead, whose
  `_launch_scheduler_processes` puts one scheduler actor per GPU on the current placement group
  (`ray.util.get_current_placement_group()`); everything below is inherited from Engine. It blocks for the
  whole model load, so it runs in a worker thread; its zmq.asyncio sockets bind to the event loop
  of their first use (pyzmq `_AsyncSocket._get_loop`), and `TokenizerManager.auto_create_handle_loop`
  starts its receive loop on the loop of the first request: both are the replica's loop.
  The OSCAR_* variables go into os.environ first: spawned schedulers see only the environment.
- `await Engine.async_generate(input_ids=..., sampling_params=..., rid=..., stream=True)` returns
  `TokenizerManager.generate_request`'s async generator; translate.py maps its items.
- `TokenizerManager.abort_request(rid)` sends an AbortReq; the scheduler frees the request's KV
  and answers with a final {"type": "abort"} item (`_handle_abort_req`). Closing the generator
  early does the same (`_release_req_states_on_failure` aborts a dispatched request).
- `TokenizerManager.load_snapshot_reader.read_all()`: the per-DP-rank `LoadSnapshot`s the
  schedulers publish in shared memory (num_running_reqs, num_waiting_reqs, num_used_tokens,
  max_total_num_tokens, token_usage): `kv_stats` without a round trip.
- health: every child of `Engine.get_all_child_pids()` alive (with RayEngine the detokenizer;
  its scheduler actors are Ray's to watch), the TokenizerManager's loop tasks
  (`asyncio_tasks`) still running, `gracefully_exit` not set. (`is_healthy()` is not used: only
  sglang's HTTP server ever sets `server_status = Up`.) When a scheduler dies, sglang's
  `SubprocessWatchdog` also SIGQUITs this process; inside a Ray actor that ends the replica and
  Serve starts a new one, and the ingress answers the cut streams with 503 error events.
- `Engine.shutdown()`: ends the subprocesses (kill_process_tree of this process's children).
sglang's radix cache is not exported, so `cached_block_hashes` stays empty: the prefix-affinity
router then only has its routed-prompt hints (RouterSpec.routed_hint_ttl_s) for these replicas.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import os
from collections.abc import AsyncIterator
from pathlib import Path

from oscar_ray.engines.base import (
    Chunk, Engine, EngineDead, EngineOverloaded, GenerateRequest, InvalidRequest, KVStats, ModelInfo,
)

from .server_args import SGLangEngineConfig, sglang_engine_kwargs, sglang_env
from .translate import OutputTranslator, map_exception, sglang_generate_kwargs

log = logging.getLogger(__name__)
EXTRA_HINT = "pip install 'oscar-ray[sglang]' (sglang==0.5.23)"
PLUGIN_GROUP, PLUGIN_NAME = "sglang.srt.plugins", "oscar"


def _pid_alive(pid: int) -> bool:
    """False for a process that is gone or a zombie (a crashed child nobody reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no procfs: existence only
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


def resolve_launcher(launcher: str, in_placement_group: bool) -> str:
    """"process" (sglang.Engine) or "ray" (RayEngine) for SGLangEngineConfig.launcher."""
    if launcher == "auto":
        return "ray" if in_placement_group else "process"
    return launcher


def _in_placement_group() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized() and ray.util.get_current_placement_group() is not None


def _plugin_installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.name == PLUGIN_NAME for ep in entry_points(group=PLUGIN_GROUP))


class SGLangEngine(Engine):
    """One sglang engine per replica (see the module docstring). Not started until `start()`."""

    def __init__(self, cfg: SGLangEngineConfig) -> None:
        self.cfg = cfg
        self._sgl = None  # sglang.Engine
        self._tm = None  # its TokenizerManager
        self._incremental = False
        self._live: set[str] = set()
        self._stopping = False
        self._dead: str | None = None
        self._start_lock = asyncio.Lock()
        self._prompt_tokens = self._cached_tokens = 0
        limit = None if cfg.max_queue is None else cfg.max_running_requests + cfg.max_queue
        self._max_in_flight = limit

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        async with self._start_lock:
            if self._sgl is not None:
                return
            import sglang

            if self.cfg.kv_cache == "oscar" and not _plugin_installed():
                raise EngineDead(f"kv_cache='oscar' needs the oscar-ray sglang plugin entry point ({PLUGIN_GROUP}:"
                                 f"{PLUGIN_NAME}): install oscar-ray as a package ({EXTRA_HINT})")
            os.environ.update(sglang_env(self.cfg))
            kwargs = sglang_engine_kwargs(self.cfg)
            launcher = resolve_launcher(self.cfg.launcher, _in_placement_group())
            if launcher == "ray":
                from sglang.srt.ray.engine import RayEngine as engine_class
            else:
                engine_class = sglang.Engine
            log.info("starting sglang %s engine (%s): %s", sglang.__version__, launcher, kwargs)
            self._sgl = await asyncio.to_thread(lambda: engine_class(**kwargs))
            self._tm = self._sgl.tokenizer_manager
            self._incremental = bool(getattr(self._tm, "incremental_streaming_output", False))

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        if self._sgl is None:
            return
        self._stopping = True
        await self._drain(lambda: bool(self._live), lambda: self._live, drain_timeout_s)
        sgl, self._sgl = self._sgl, None
        await asyncio.to_thread(sgl.shutdown)

    # --- requests ------------------------------------------------------------------------------
    def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]:
        """Check and translate now (InvalidRequest / EngineOverloaded / EngineDead before any chunk;
        sglang's own refusals come as the first iteration's error), then stream."""
        self._check_alive()
        if not isinstance(request, GenerateRequest):
            raise InvalidRequest(f"request must be a GenerateRequest, got {type(request).__name__}")
        if request.request_id in self._live:
            raise InvalidRequest(f"request_id {request.request_id!r} is already running", param="request_id")
        if self._max_in_flight is not None and len(self._live) >= self._max_in_flight:
            raise EngineOverloaded(f"{len(self._live)} requests in flight (max_running_requests "
                                   f"{self.cfg.max_running_requests} + max_queue {self.cfg.max_queue}); retry later")
        tm = self._tm
        vocab = getattr(getattr(tm, "model_config", None), "vocab_size", None)
        kwargs = sglang_generate_kwargs(request, getattr(tm, "tokenizer", None), vocab)
        return self._stream(request.request_id, kwargs)

    async def _stream(self, rid: str, kwargs: dict) -> AsyncIterator[Chunk]:
        # Counted from the first iteration, which the replica starts right after generate() with no
        # await between: a stream closed before it started never reaches sglang and leaves nothing.
        tr = OutputTranslator(rid, self._incremental)
        gen, finished = None, False
        self._live.add(rid)
        try:
            try:
                gen = await self._sgl.async_generate(**kwargs)
            except Exception as e:
                raise map_exception(e) from e
            while True:
                try:
                    out = await gen.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as e:
                    raise map_exception(e) from e
                chunk = tr.chunk(out)
                if chunk is None:
                    continue
                if chunk.finish_reason is not None:
                    finished = True
                    self._prompt_tokens += chunk.prompt_tokens
                    self._cached_tokens += chunk.cached_tokens
                yield chunk
                if finished:
                    return
            finished = True  # sglang ended the stream without a finish reason: report it as an error
            raise EngineDead(f"sglang ended request {rid} without a finish reason")
        finally:
            self._live.discard(rid)
            if not finished and gen is not None:
                self._abort_in_sglang(rid)
            if gen is not None:
                await gen.aclose()

    def _abort_in_sglang(self, rid: str) -> None:
        try:
            self._tm.abort_request(rid)
        except Exception as e:  # the scheduler socket is gone: the engine is dying anyway
            log.warning("abort of %s failed: %r", rid, e)

    async def abort(self, request_id: str) -> bool:
        if self._tm is None or request_id not in self._live:
            return False
        self._abort_in_sglang(request_id)  # the scheduler frees the KV; the stream ends with "abort"
        return True

    # --- observability -------------------------------------------------------------------------
    def _page_size(self) -> int:
        ps = getattr(getattr(self._sgl, "server_args", None), "page_size", None)
        return int(ps) if ps else self.cfg.cache.page_size

    def kv_stats(self) -> KVStats:
        loads = []
        if self._tm is not None:
            try:
                loads = self._tm.load_snapshot_reader.read_all()
            except Exception as e:  # the shared-memory file is gone with its schedulers
                log.debug("load snapshot read failed: %r", e)
        page = self._page_size()
        hit = self._cached_tokens / self._prompt_tokens if self._prompt_tokens else 0.0
        if not loads:
            return KVStats(0, 0, 0.0, hit, 0, len(self._live), page)
        used = sum(x.num_used_tokens for x in loads)
        total = sum(x.max_total_num_tokens for x in loads)
        return KVStats(used_pages=math.ceil(used / page), total_pages=total // page,
                       usage=min(1.0, used / total) if total else 0.0, hit_rate=hit,
                       queue_len=sum(x.num_waiting_reqs for x in loads),
                       running=sum(x.num_running_reqs for x in loads), page_size=page)

    async def check_health(self) -> None:
        self._check_alive()
        dead = [pid for pid in self._sgl.get_all_child_pids() if not _pid_alive(pid)]
        if dead:
            self._dead = f"sglang subprocesses {dead} exited"
        for task in list(getattr(self._tm, "asyncio_tasks", ())):
            if task.done():
                exc = None if task.cancelled() else task.exception()
                self._dead = f"sglang's tokenizer-manager loop ended ({exc!r})"
        if getattr(self._tm, "gracefully_exit", False):
            self._dead = "sglang received SIGTERM and is exiting"
        self._check_alive()

    def model_info(self) -> ModelInfo:
        if self._tm is None:
            raise EngineDead("the engine is not started; await engine.start() first")
        name = getattr(self._tm, "served_model_name", None) or self.cfg.model_path
        return ModelInfo(name, int(self._tm.context_len), self._page_size(), self.cfg.kv_cache)

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDead(f"the sglang engine is dead: {self._dead}")
        if self._sgl is None:
            raise EngineDead("the engine is not started; await engine.start() first")
        if self._stopping:
            raise EngineDead("the engine is shutting down")


def build_sglang_engine(cfg: SGLangEngineConfig | dict) -> SGLangEngine:
    """A not-yet-started SGLangEngine for `cfg`; ImportError naming the extra when sglang is absent."""
    if importlib.util.find_spec("sglang") is None:
        raise ImportError(f"engine kind 'sglang' needs sglang: {EXTRA_HINT}")
    if not isinstance(cfg, SGLangEngineConfig):
        cfg = SGLangEngineConfig.model_validate(cfg)
    return SGLangEngine(cfg)


__all__ = ["SGLangEngine", "build_sglang_engine"]

"""One replica stream -> SSE events or one JSON body, with every failure ending the response cleanly.

A replica stream can fail after the HTTP status is already 200:
- the replica reports an engine error as an item `{"error": {status, message, param, code}}`
  (replica.py; e.g. EngineDead 503 when its engine loop died);
- the replica itself dies or becomes unreachable: the handle's `__anext__` raises
  `ray.exceptions.RayActorError` / `ActorDiedError` / `ActorUnavailableError`, or `RayTaskError`
  for an exception the replica did not turn into an item;
- anything unexpected in the ingress's own framing code.
Every one of these ends a stream with one OpenAI-style error event, `data: {"error": {...}}`
(`code` = the HTTP status the request would have had, 503 for a lost replica: a 200 stream has no
other place for it), then `data: [DONE]`, and the response closes. Each event is one whole string
yielded to Starlette, so a client never sees half a chunk. A non-streaming request gets the same
error as a JSON body with that status. Only `asyncio.CancelledError` (the client went away)
passes through: there is nobody left to tell.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import aclosing
from typing import Any

from fastapi.responses import JSONResponse, Response

from . import protocol as P

log = logging.getLogger("ray.serve")


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


DONE = "data: [DONE]\n\n"


class StreamFailed(Exception):
    """The replica stream ended in an error after the response started (status, OpenAI code)."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    @classmethod
    def from_item(cls, err: dict[str, Any]) -> StreamFailed:
        return cls(int(err.get("status", 500)), str(err.get("message", "engine error")), err.get("code"),
                   err.get("param"))

    @classmethod
    def lost_replica(cls, e: BaseException) -> StreamFailed:
        first = (str(e).strip().splitlines() or [""])[0]  # Ray's messages go on with actor id, pid, ...
        return cls(503, f"the engine replica failed mid-request ({type(e).__name__}: {first}); retry the request",
                   "engine_unavailable")

    def event(self) -> str:
        return sse(P.error_json(self.status, self.message, self.param, self.status))

    def response(self) -> JSONResponse:
        return JSONResponse(P.error_json(self.status, self.message, self.param, self.code), status_code=self.status)


class ReplicaStream:
    """Drives one replica stream (`gen`, whose first item `first` is already read) into SSE events
    or a single JSON body, recording metrics on the ingress's `ServeMetrics`."""

    def __init__(self, metrics, model_id: str, gen, first: dict, t0: float, endpoint: str, rid: str, chat: bool,
                 include_usage: bool) -> None:
        self.metrics, self.model_id, self.gen, self.first, self.t0 = metrics, model_id, gen, first, t0
        self.endpoint, self.rid, self.chat, self.include_usage = endpoint, rid, chat, include_usage
        self.created = P.now()
        self.t_first: float | None = None
        self.last: dict[str, Any] = first
        self.status = 499  # until the stream ends one way or another: the client went away

    async def items(self):
        """The replica's items up to the finishing one; raises StreamFailed on any failure."""
        self.metrics.in_flight.inc()
        try:
            item = self.first
            while True:
                if "error" in item:
                    raise StreamFailed.from_item(item["error"])
                if self.t_first is None and item.get("completion_tokens", 0) > 0:
                    self.t_first = time.perf_counter()
                self.last = item
                yield item
                if item.get("finish_reason") is not None:
                    break
                try:
                    item = await self.gen.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as e:  # RayActorError & co, RayTaskError: the replica is gone
                    log.warning("request %s: replica stream failed after %d tokens: %r", self.rid,
                                self.last.get("completion_tokens", 0), e)
                    raise StreamFailed.lost_replica(e) from e
            self.status = 200
        except StreamFailed as e:
            self.status = e.status
            raise
        finally:
            self.metrics.in_flight.dec()
            if self.status != 200:
                self._cancel()  # client gone or error: abort in the engine, free its pages
            self._record()

    def _cancel(self) -> None:
        try:
            self.gen.cancel()
        except Exception as e:  # a dead replica's handle may refuse; nothing is left to free then
            log.debug("request %s: cancel after failure raised %r", self.rid, e)

    def _record(self) -> None:
        last, end = self.last, time.perf_counter()
        n = last.get("completion_tokens", 0)
        ttft = self.t_first - self.t0 if self.t_first is not None else None
        tpot = (end - self.t_first) / (n - 1) if self.t_first is not None and n > 1 else None
        self.metrics.observe_request(self.endpoint, self.status, last.get("prompt_tokens", 0), n,
                                     last.get("cached_tokens", 0), ttft, tpot)
        if "kv" in last:
            kv = dict(last["kv"])
            self.metrics.observe_kv(kv.pop("replica", "?"), kv)

    def _usage(self) -> P.Usage:
        last = self.last
        return P.usage(last.get("prompt_tokens", 0), last.get("completion_tokens", 0), last.get("cached_tokens", 0))

    @staticmethod
    def _finish(item: dict) -> str | None:
        f = item.get("finish_reason")
        return {"abort": "stop", "error": "stop"}.get(f, f) if f else None

    async def whole(self) -> Response:
        text = []
        try:
            async with aclosing(self.items()) as items:  # closed (engine abort) even if we fail here
                async for item in items:
                    text.append(item.get("text", ""))
            fin, model = self._finish(self.last), self.model_id
            body = (P.chat_response(self.rid, model, "".join(text), fin, self._usage()) if self.chat
                    else P.completion_response(self.rid, model, "".join(text), fin, self._usage()))
            return JSONResponse(body)
        except StreamFailed as e:
            return e.response()
        except Exception as e:  # a bug in our own framing: still an OpenAI error, never a bare 500
            log.exception("request %s: building the response failed", self.rid)
            return StreamFailed(500, f"internal error building the response: {type(e).__name__}: {e}").response()

    async def sse(self):
        model, rid, created = self.model_id, self.rid, self.created
        try:
            if self.chat:
                yield sse(P.chat_chunk(rid, model, created, {"role": "assistant", "content": ""}))
            async with aclosing(self.items()) as items:  # closed (engine abort) even if framing fails
                async for item in items:
                    fin = self._finish(item)
                    if not item.get("text") and fin is None:
                        continue
                    if self.chat:
                        event = sse(P.chat_chunk(rid, model, created, {"content": item.get("text", "")}, fin))
                    else:
                        event = sse(P.completion_chunk(rid, model, created, item.get("text", ""), fin))
                    yield event
            if self.include_usage:
                chunk = P.chat_chunk if self.chat else P.completion_chunk
                yield sse(chunk(rid, model, created, None, None, self._usage()))
        except StreamFailed as e:
            yield e.event()
        except Exception as e:  # a bug in our own framing: the client still gets an error and [DONE]
            log.exception("request %s: streaming failed", rid)
            yield StreamFailed(500, f"internal error while streaming: {type(e).__name__}: {e}").event()
        yield DONE

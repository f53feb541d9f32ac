"""OpenAI-compatible HTTP ingress (FastAPI via `serve.ingress`).

The ingress renders the chat template and tokenises with the model's tokenizer, then sends the
engine replicas token ids: the router hashes them into the same block keys the engines cache
(router.py), and the prompt-length check happens here, before any replica is involved.
Errors are OpenAI's JSON shape `{"error": {message, type, param, code}}`: malformed JSON 400,
invalid parameter 400 naming it, unknown model 404, prompt too long 400, engine queue full 429,
Serve queue full or no live replica 503.
A client that disconnects cancels this request's task; the `finally` of each stream cancels the
call into the replica, whose `generate` then aborts the request in the engine (pages freed).
"""

# No `from __future__ import annotations`: FastAPI must see `Request` as a class, not a string,
# in the methods serve.ingress re-binds.
import asyncio
import json
import logging
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from ray import serve
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from starlette.exceptions import HTTPException as StarletteHTTPException

from oscar_ray.engines.base import EngineError, InvalidRequest

from . import protocol as P
from .metrics import ServeMetrics

log = logging.getLogger("ray.serve")
app = FastAPI(title="oscar-ray OpenAI API")


class HTTPError(Exception):
    """An OpenAI-shaped error response raised inside the request path."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        return JSONResponse(P.error_json(self.status, self.message, self.param, self.code), status_code=self.status)


@app.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    return HTTPError(exc.status_code, str(exc.detail)).response()


@app.exception_handler(RequestValidationError)
async def _request_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    return HTTPError(400, str(exc.errors()[0].get("msg")) if exc.errors() else "invalid request").response()


def _validation_error(e: ValidationError) -> HTTPError:
    err = e.errors()[0]
    param = ".".join(str(p) for p in err.get("loc", ()) if not isinstance(p, int)) or None
    return HTTPError(400, f"{param}: {err.get('msg')}" if param else str(err.get("msg")), param)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class _Stream:
    """Drives one replica stream into SSE events or a single JSON body, recording metrics."""

    def __init__(self, ing, gen, first: dict, t0: float, endpoint: str, rid: str, chat: bool,
                 include_usage: bool) -> None:
        self.ing, self.gen, self.first, self.t0 = ing, gen, first, t0
        self.endpoint, self.rid, self.chat, self.include_usage = endpoint, rid, chat, include_usage
        self.created = P.now()
        self.t_first: float | None = None
        self.last: dict[str, Any] = first
        self.done = False

    async def items(self):
        self.ing.metrics.in_flight.inc()
        try:
            item = self.first
            while True:
                if "error" in item:
                    raise EngineError(item["error"]["message"])
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
            self.done = True
        finally:
            self.ing.metrics.in_flight.dec()
            if not self.done:
                self.gen.cancel()  # client gone or error: abort in the engine, free its pages
            self._record(200 if self.done else 499)

    def _record(self, status: int) -> None:
        last, end = self.last, time.perf_counter()
        n = last.get("completion_tokens", 0)
        ttft = self.t_first - self.t0 if self.t_first is not None else None
        tpot = (end - self.t_first) / (n - 1) if self.t_first is not None and n > 1 else None
        self.ing.metrics.observe_request(self.endpoint, status, last.get("prompt_tokens", 0), n,
                                         last.get("cached_tokens", 0), ttft, tpot)
        if "kv" in last:
            kv = dict(last["kv"])
            self.ing.metrics.observe_kv(kv.pop("replica", "?"), kv)

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
            async for item in self.items():
                text.append(item.get("text", ""))
        except EngineError as e:
            return HTTPError(500, f"engine failed mid-request: {e}").response()
        fin, model = self._finish(self.last), self.ing.model_id
        body = (P.chat_response(self.rid, model, "".join(text), fin, self._usage()) if self.chat
                else P.completion_response(self.rid, model, "".join(text), fin, self._usage()))
        return JSONResponse(body)

    async def sse(self):
        model, rid, created = self.ing.model_id, self.rid, self.created
        try:
            if self.chat:
                yield _sse(P.chat_chunk(rid, model, created, {"role": "assistant", "content": ""}))
            async for item in self.items():
                fin = self._finish(item)
                if not item.get("text") and fin is None:
                    continue
                if self.chat:
                    yield _sse(P.chat_chunk(rid, model, created, {"content": item.get("text", "")}, fin))
                else:
                    yield _sse(P.completion_chunk(rid, model, created, item.get("text", ""), fin))
            if self.include_usage:
                chunk = P.chat_chunk if self.chat else P.completion_chunk
                yield _sse(chunk(rid, model, created, None, None, self._usage()))
        except EngineError as e:
            yield _sse(P.error_json(500, f"engine failed mid-request: {e}"))
        yield "data: [DONE]\n\n"


@serve.deployment
@serve.ingress(app)
class OpenAIIngress:
    """Serve deployment: `OpenAIIngress.bind(engine_handle, app_config_dict)`."""

    async def __init__(self, engine, model_id: str, tokenizer: str, max_model_len: int | None = None) -> None:
        from oscar_ray.models.loader import load_tokenizer

        self.engine = engine
        self.model_id = model_id
        self.tokenizer = await asyncio.to_thread(load_tokenizer, tokenizer)
        info = await engine.model_info.remote()
        self.max_model_len = min(max_model_len or info["max_model_len"], info["max_model_len"])
        self.metrics = ServeMetrics(model_id)

    # ---- request parsing -------------------------------------------------------------------
    async def _parse(self, raw: Request, model_cls):
        body = await raw.body()
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HTTPError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None
        if not isinstance(data, dict):
            raise HTTPError(400, "request body must be a JSON object")
        try:
            req = model_cls.model_validate(data)
        except ValidationError as e:
            raise _validation_error(e) from None
        if req.model != self.model_id:
            raise HTTPError(404, f"The model `{req.model}` does not exist; this server serves `{self.model_id}`.",
                            "model", "model_not_found")
        return req

    def _check_len(self, ids: list[int], max_tokens: int, param: str) -> None:
        if len(ids) + max_tokens > self.max_model_len:
            raise HTTPError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, "
                            f"you requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} "
                            f"for the completion).", param, "context_length_exceeded")

    def _chat_ids(self, req: P.ChatCompletionRequest) -> list[int]:
        text = self.tokenizer.apply_chat_template(req.chat(), tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _prompt_ids(self, req: P.CompletionRequest) -> list[int]:
        if isinstance(req.prompt, list):
            return list(req.prompt)
        return list(self.tokenizer(req.prompt)["input_ids"])

    # ---- routes ----------------------------------------------------------------------------
    @app.get("/health")
    async def health(self) -> Response:
        try:
            await self.engine.check_health.remote()
        except Exception as e:  # a dead replica is a 503 here, Serve restarts it
            return HTTPError(503, f"engine unhealthy: {e}").response()
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models(self) -> JSONResponse:
        return JSONResponse(P.model_list(self.model_id, self.max_model_len))

    @app.get("/metrics")
    async def metrics(self) -> Response:
        try:  # one fresh report (from whichever replica the router picks) besides the last seen
            kv = await asyncio.wait_for(self.engine.kv_stats.remote(), timeout=2.0)
            self.metrics.observe_kv(kv.pop("replica", "?"), kv)
        except Exception:
            pass
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat_completions(self, raw: Request) -> Response:
        return await self._serve(raw, chat=True)

    @app.post("/v1/completions")
    async def completions(self, raw: Request) -> Response:
        return await self._serve(raw, chat=False)

    # ---- the request path ------------------------------------------------------------------
    async def _serve(self, raw: Request, chat: bool) -> Response:
        t0 = time.perf_counter()
        endpoint = "chat" if chat else "completions"
        try:
            req = await self._parse(raw, P.ChatCompletionRequest if chat else P.CompletionRequest)
            sampling = req.sampling()
            ids = self._chat_ids(req) if chat else self._prompt_ids(req)
            self._check_len(ids, sampling.max_tokens, "messages" if chat else "prompt")
        except HTTPError as e:
            self.metrics.observe_request(endpoint, e.status)
            return e.response()
        except InvalidRequest as e:
            self.metrics.observe_request(endpoint, 400)
            return HTTPError(400, str(e), e.param).response()
        rid = P.new_id("chatcmpl" if chat else "cmpl")
        payload = {"request_id": f"{rid}-{uuid.uuid4().hex[:6]}", "prompt_token_ids": ids,
                   "sampling": {f: getattr(sampling, f) for f in sampling.__dataclass_fields__}}
        gen = self.engine.options(stream=True).generate.remote(payload)
        try:
            first = await gen.__anext__()
        except (BackPressureError, DeploymentUnavailableError) as e:
            gen.cancel()
            self.metrics.observe_request(endpoint, 503)
            return HTTPError(503, f"no engine replica can take the request now: {e}", code="overloaded").response()
        except StopAsyncIteration:
            return HTTPError(500, "engine ended the stream without output").response()
        if "error" in first:
            err = first["error"]
            self.metrics.observe_request(endpoint, err["status"])
            return HTTPError(err["status"], err["message"], err.get("param"), err.get("code")).response()
        stream = _Stream(self, gen, first, t0, endpoint, rid, chat, req.include_usage)
        if req.stream:
            return StreamingResponse(stream.sse(), media_type="text/event-stream")
        return await stream.whole()

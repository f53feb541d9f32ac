"""OpenAI-compatible HTTP ingress: `OpenAIServer` (the request path) + `build_openai_app` (its FastAPI
routes) + `OpenAIIngress` (the Serve deployment that builds both on its replica).

The ingress renders the chat template and tokenises with the model's tokenizer, then sends the
engine replicas token ids: the router hashes them into the same block keys the engines cache
(router.py), and the prompt-length check happens here, before any replica is involved.
Errors are OpenAI's JSON shape `{"error": {message, type, param, code}}`: malformed JSON 400,
invalid parameter 400 naming it, unknown model 404, prompt too long 400, engine queue full 429,
Serve queue full, no live replica, or a replica lost mid-request 503 (a stream that already sent
200 ends with an error event and `[DONE]` instead: stream.py).
A client that disconnects cancels this request's task; the `finally` of each stream cancels the
call into the replica, whose `generate` then aborts the request in the engine (pages freed).

`OpenAIServer` needs only an engine handle (`.options(stream=True).generate.remote(payload)`,
`.model_info/.check_health/.kv_stats.remote()`), so the same app runs under Serve and, in tests,
over an in-process replica; the deployment returns it from `__serve_build_asgi_app__` (Serve
2.60's late-bound ingress), so no route is defined twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from ray import serve
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from starlette.exceptions import HTTPException as StarletteHTTPException

from oscar_ray.engines.base import InvalidRequest

from . import protocol as P
from .metrics import ServeMetrics
from .stream import ReplicaStream, StreamFailed

log = logging.getLogger("ray.serve")


class HTTPError(Exception):
    """An OpenAI-shaped error response raised inside the request path."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        return JSONResponse(P.error_json(self.status, self.message, self.param, self.code), status_code=self.status)


def _validation_error(e: ValidationError) -> HTTPError:
    err = e.errors()[0]
    param = ".".join(str(p) for p in err.get("loc", ()) if not isinstance(p, int)) or None
    return HTTPError(400, f"{param}: {err.get('msg')}" if param else str(err.get("msg")), param)


class OpenAIServer:
    """The OpenAI request path over an engine-replica handle (see the module docstring)."""

    def __init__(self, engine, model_id: str, tokenizer, max_model_len: int) -> None:
        self.engine, self.model_id, self.tokenizer, self.max_model_len = engine, model_id, tokenizer, max_model_len
        self.metrics = ServeMetrics(model_id)

    @classmethod
    async def create(cls, engine, model_id: str, tokenizer: str, max_model_len: int | None = None) -> OpenAIServer:
        """Load `tokenizer` ('smollm2' or an HF directory) and cap `max_model_len` at the engine's."""
        from oscar_ray.models.loader import load_tokenizer

        tok = await asyncio.to_thread(load_tokenizer, tokenizer)
        info = await engine.model_info.remote()
        return cls(engine, model_id, tok, min(max_model_len or info["max_model_len"], info["max_model_len"]))

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
    async def health(self) -> Response:
        try:
            await self.engine.check_health.remote()
        except Exception as e:  # a dead replica is a 503 here, Serve restarts it
            return HTTPError(503, f"engine unhealthy: {e}").response()
        return JSONResponse({"status": "ok"})

    async def models(self) -> JSONResponse:
        return JSONResponse(P.model_list(self.model_id, self.max_model_len))

    async def prometheus(self) -> Response:
        try:  # one fresh report (from whichever replica the router picks) besides the last seen
            kv = await asyncio.wait_for(self.engine.kv_stats.remote(), timeout=2.0)
            self.metrics.observe_kv(kv.pop("replica", "?"), kv)
        except Exception:
            pass
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def serve(self, raw: Request, chat: bool) -> Response:
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
            _cancel(gen)
            self.metrics.observe_request(endpoint, 503)
            return HTTPError(503, f"no engine replica can take the request now: {e}", code="overloaded").response()
        except StopAsyncIteration:
            self.metrics.observe_request(endpoint, 500)
            return HTTPError(500, "engine ended the stream without output").response()
        except Exception as e:  # the replica died or is unreachable before its first item
            log.warning("request %s: replica failed before the first token: %r", rid, e)
            _cancel(gen)
            self.metrics.observe_request(endpoint, 503)
            return StreamFailed.lost_replica(e).response()
        if "error" in first:
            err = first["error"]
            self.metrics.observe_request(endpoint, err["status"])
            return HTTPError(err["status"], err["message"], err.get("param"), err.get("code")).response()
        stream = ReplicaStream(self.metrics, self.model_id, gen, first, t0, endpoint, rid, chat, req.include_usage)
        if req.stream:
            return StreamingResponse(stream.sse(), media_type="text/event-stream")
        return await stream.whole()


def _cancel(gen) -> None:
    try:
        gen.cancel()
    except Exception as e:
        log.debug("cancel of a failed replica call raised %r", e)


def build_openai_app(server: OpenAIServer) -> FastAPI:
    """The FastAPI app of one ingress replica: OpenAI routes + OpenAI-shaped errors for FastAPI's own."""
    app = FastAPI(title="oscar-ray OpenAI API")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return HTTPError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(RequestValidationError)
    async def _request_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return HTTPError(400, str(exc.errors()[0].get("msg")) if exc.errors() else "invalid request").response()

    @app.get("/health")
    async def health() -> Response:
        return await server.health()

    @app.get("/v1/models")
    async def models() -> Response:
        return await server.models()

    @app.get("/metrics")
    async def metrics() -> Response:
        return await server.prometheus()

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        return await server.serve(raw, chat=True)

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        return await server.serve(raw, chat=False)

    return app


@serve.deployment
@serve.ingress()
class OpenAIIngress:
    """Serve deployment: `OpenAIIngress.bind(engine_handle, model_id, tokenizer, max_model_len)`."""

    async def __init__(self, engine, model_id: str, tokenizer: str, max_model_len: int | None = None) -> None:
        self.server = await OpenAIServer.create(engine, model_id, tokenizer, max_model_len)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_openai_app(self.server)


__all__ = ["HTTPError", "OpenAIIngress", "OpenAIServer", "build_openai_app"]

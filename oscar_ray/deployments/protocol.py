"""OpenAI wire models: chat/completions requests, responses, stream chunks, errors.

Requests accept and ignore fields we do not implement (extra="ignore", as vLLM's protocol does:
OpenAI clients send `user`, `metadata`, `logit_bias`... and must not be refused for it), but every
field we do read is type-checked here and range-checked by `SamplingParams`, so an invalid value
is a 400 naming the field, never a silent default.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

from oscar_ray.engines.base import InvalidRequest, SamplingParams

DEFAULT_MAX_TOKENS = 256

# Strict numbers: lax pydantic turns JSON `true` into 1 (found by the fuzz, load_tests/faults);
# OpenAI refuses booleans for numeric fields. A strict float still takes a JSON integer (`"temperature": 1`).
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    stream: bool | None = False  # OpenAI's SDKs may send null for "not streaming"
    stream_options: StreamOptions | None = None
    max_tokens: Int | None = None
    temperature: Float | None = None
    top_p: Float | None = None
    top_k: Int | None = None  # vLLM/sglang extension
    stop: str | list[str] | None = None
    seed: Int | None = None
    n: Int | None = 1
    ignore_eos: bool = False  # vLLM extension; the benchmarks use it for fixed output lengths

    @field_validator("n")
    @classmethod
    def _one(cls, v: int | None) -> int:
        if v not in (None, 1):
            raise ValueError("only n=1 is supported")
        return 1

    @field_validator("stream")
    @classmethod
    def _stream(cls, v: bool | None) -> bool:
        return bool(v)

    def _sampling(self, max_tokens: int | None) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0, stop=stop, seed=self.seed, ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _content(self):
        # only an assistant turn may omit content (OpenAI: when it carried tool calls)
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs 'content'")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: only text parts are supported
            parts = []
            for p in self.content:
                if p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise InvalidRequest(f"content part of type {p.get('type')!r} is not supported (text only)",
                                         param="messages")
                parts.append(p["text"])
            return "".join(parts)
        return self.content or ""


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: Int | None = None

    def sampling(self) -> SamplingParams:
        # max_completion_tokens is the newer name; it wins when both are given, as in OpenAI's API.
        mt = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        try:
            return self._sampling(mt)
        except InvalidRequest as e:
            if e.param == "max_tokens" and self.max_completion_tokens is not None:
                e.param = "max_completion_tokens"
            raise

    def chat(self) -> list[dict[str, str]]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] = Field(...)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _single(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], str):
            if len(v) != 1:
                raise ValueError("batched prompts are not supported; send one prompt per request")
            v = v[0]
        if isinstance(v, (str, list)) and not v:
            raise ValueError("prompt must not be empty")
        return v

    def sampling(self) -> SamplingParams:
        return self._sampling(16 if self.max_tokens is None else self.max_tokens)  # OpenAI's default is 16


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None


def usage(prompt: int, completion: int, cached: int = 0) -> Usage:
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                 prompt_tokens_details={"cached_tokens": cached})


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


def error_json(status: int, message: str, param: str | None = None, code: str | int | None = None) -> dict:
    kind = {400: "invalid_request_error", 404: "not_found_error", 422: "invalid_request_error",
            429: "rate_limit_error", 503: "service_unavailable"}.get(status, "server_error")
    return ErrorResponse(error=ErrorBody(message=message, type=kind, param=param, code=code or kind)).model_dump()


def chat_response(rid: str, model: str, text: str, finish: str | None, u: Usage) -> dict:
    return {"id": rid, "object": "chat.completion", "created": now(), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish}],
            "usage": u.model_dump()}


def chat_chunk(rid: str, model: str, created: int, delta: dict | None, finish: str | None = None,
               u: Usage | None = None) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": choices, "usage": u.model_dump() if u else None}


def completion_response(rid: str, model: str, text: str, finish: str | None, u: Usage) -> dict:
    return {"id": rid, "object": "text_completion", "created": now(), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            "usage": u.model_dump()}


def completion_chunk(rid: str, model: str, created: int, text: str | None, finish: str | None = None,
                     u: Usage | None = None) -> dict:
    choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": choices, "usage": u.model_dump() if u else None}


def model_list(model_id: str, max_model_len: int | None) -> dict:
    return {"object": "list", "data": [{"id": model_id, "object": "model", "created": now(),
                                        "owned_by": "oscar-ray", "max_model_len": max_model_len}]}


_Request.model_rebuild()
ChatCompletionRequest.model_rebuild()
CompletionRequest.model_rebuild()

"""A tiny real OpenAI-style SSE server (starlette + uvicorn on a loopback port) for the load tool's
tests. The request's `model` picks the behaviour; each stream sends `max_tokens` content chunks of
one word each, the usage chunk, then `data: [DONE]`, split into odd byte pieces to exercise the
SSE parser."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

MODEL = "test-model"


def _chunk(rid: str, content: str | None, finish: str | None = None, usage: dict | None = None) -> dict:
    choices = [] if usage else [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]
    return {"id": rid, "object": "chat.completion.chunk", "model": MODEL, "choices": choices, "usage": usage}


def _split(payload: bytes):
    # 7-byte pieces: events arrive cut mid-line, mid-field and mid-UTF-8 character
    for i in range(0, len(payload), 7):
        yield payload[i:i + 7]


class State:
    def __init__(self) -> None:
        self.started = 0
        self.finished = 0
        self.disconnected = 0
        self.in_flight = 0
        self.max_in_flight = 0


async def _models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


def make_app(state: State) -> Starlette:
    async def chat(request: Request):
        body = await request.json()
        mode = body.get("model")
        n = int(body.get("max_tokens", 4))
        if mode == "bad":
            return JSONResponse({"error": {"message": "max_tokens: bad", "type": "invalid_request_error",
                                           "param": "max_tokens", "code": "invalid_value"}}, status_code=400)
        if mode == "html500":
            return JSONResponse("oops", status_code=500)
        state.started += 1

        async def gen():
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
            done = False
            try:
                for i in range(n):
                    if mode == "slow":
                        await asyncio.sleep(0.05)
                    if mode == "error" and i == 2:
                        yield b'data: {"error": {"message": "engine died", "type": "server_error", "code": 500}}\n\n'
                        yield b"data: [DONE]\n\n"
                        return
                    if mode == "truncate" and i == 2:
                        return
                    if mode == "garbled" and i == 2:
                        yield b"data: {not json\n\n"
                    word = "\u00e9t\u00e9 " if i % 2 else "word "  # two-byte characters cut by _split
                    for piece in _split(f"data: {json.dumps(_chunk('r', word, 'length' if i == n - 1 else None))}\n\n"
                                        .encode()):
                        yield piece
                    await asyncio.sleep(0)
                usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n,
                         "prompt_tokens_details": {"cached_tokens": 3}}
                yield f": keep-alive comment\n\ndata: {json.dumps(_chunk('r', None, usage=usage))}\n\n".encode()
                yield b"data: [DONE]\n\n"
                if mode == "after_done":
                    yield b'data: {"choices": []}\n\n'
                done = True
            finally:
                state.in_flight -= 1
                state.finished += done
                state.disconnected += not done and mode == "slow"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", _models), Route("/v1/chat/completions", chat, methods=["POST"])])


class Server:
    """uvicorn on 127.0.0.1:<free port> in a thread; `with Server() as s: s.url`."""

    def __init__(self) -> None:
        self.state = State()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(make_app(self.state), log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test SSE server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

"""The ingress's answer when a replica fails: real HTTP (httpx over ASGI, and the official openai
client) into the real FastAPI app of `OpenAIIngress` (`build_openai_app`), over a real
`EngineReplica` running the scripted `MockEngine` in-process.

The one stand-in is `LocalHandle`, the part of a Serve `DeploymentHandle` the ingress uses; its
stream raises after N items exactly what Serve's `DeploymentResponseGenerator.__anext__` raises
when the replica actor dies (`ActorDiedError`), is unreachable (`ActorUnavailableError`), fails
otherwise (`RayActorError`), or an exception nobody expected.
"""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from oscar_ray.deployments.ingress import OpenAIServer, build_openai_app
from oscar_ray.deployments.replica import EngineReplica
from oscar_ray.engines.mock import MockEngine

MODEL = "mock-model"
MSGS = [{"role": "user", "content": "Count please."}]
FAILURES = [ActorDiedError(), ActorUnavailableError("the node is unreachable", None),
            RayActorError(error_msg="the actor crashed"), RuntimeError("something nobody expected")]
IDS = [type(e).__name__ for e in FAILURES]


class _Call:
    def __init__(self, fn):
        self.fn = fn

    async def remote(self, *args):
        out = self.fn(*args)
        return await out if asyncio.iscoroutine(out) else out


class _Stream:
    """A replica stream as the ingress sees it (`__anext__`, `cancel()`). As in Serve, the replica's
    generator runs in its own task to the end whatever the consumer does, and `cancel()` cancels
    that task (the replica's `finally` then aborts the request in the engine)."""

    _END = object()

    def __init__(self, agen, fail_after: int | None, exc: BaseException | None) -> None:
        self.fail_after, self.exc, self.n, self.cancelled = fail_after, exc, 0, False
        self.items: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._pump(agen))

    async def _pump(self, agen) -> None:
        try:
            async for item in agen:
                self.items.put_nowait(item)
        except Exception as e:  # the replica raised: Serve re-raises it at the caller
            self.items.put_nowait(e)
        self.items.put_nowait(self._END)

    async def __anext__(self):
        if self.fail_after is not None and self.n >= self.fail_after:
            raise self.exc
        self.n += 1
        item = await self.items.get()
        if item is self._END:
            raise StopAsyncIteration
        if isinstance(item, Exception):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True
        self.task.cancel()


class LocalHandle:
    def __init__(self, replica: EngineReplica, fail_after: int | None = None, exc: BaseException | None = None):
        self.replica, self.fail_after, self.exc = replica, fail_after, exc
        self.streams: list[_Stream] = []
        self.model_info, self.check_health, self.kv_stats = (_Call(replica.model_info),
                                                             _Call(replica.check_health), _Call(replica.kv_stats))

    def options(self, stream: bool = False) -> LocalHandle:
        return self

    @property
    def generate(self):
        def start(payload):
            s = _Stream(self.replica.generate(payload), self.fail_after, self.exc)
            self.streams.append(s)
            return s

        class _G:
            remote = staticmethod(start)
        return _G


async def _replica(engine_config: dict, engine=None) -> EngineReplica:
    r = object.__new__(EngineReplica)  # EngineReplica's __init__ is async (Serve awaits it)
    await r.__init__("mock", engine_config)
    if engine is not None:
        r.engine = engine
        await engine.start()
    return r


@pytest.fixture(scope="module")
def tokenizer():
    from oscar_ray.models.loader import load_tokenizer

    return load_tokenizer("smollm2")


@pytest.fixture
def logged():
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("ray.serve")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


async def _client(handle, tokenizer) -> httpx.AsyncClient:
    server = OpenAIServer(handle, MODEL, tokenizer, 2048)
    transport = httpx.ASGITransport(app=build_openai_app(server))
    return httpx.AsyncClient(transport=transport, base_url="http://ingress", timeout=10)


def _events(body: str) -> list:
    assert body.endswith("\n\n"), body[-80:]  # ends on an event boundary: no half-written chunk
    out = []
    for block in body.strip("\n").split("\n\n"):
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _assert_error_then_done(events: list, status: int) -> dict:
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    err = events[-2]["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] == status and err["type"] == ("service_unavailable" if status == 503 else "server_error")
    for e in events[:-2]:
        assert "error" not in e and e["object"] == "chat.completion.chunk"
    return err


def _request(stream: bool, max_tokens: int = 50) -> dict:
    return {"model": MODEL, "messages": MSGS, "max_tokens": max_tokens, "stream": stream}


@pytest.mark.parametrize("exc", FAILURES, ids=IDS)
def test_replica_lost_mid_stream_ends_with_error_event_and_done(exc, tokenizer, logged):
    async def main():
        replica = await _replica({"token_delay_s": 0.001})
        handle = LocalHandle(replica, fail_after=4, exc=exc)
        async with await _client(handle, tokenizer) as c:
            r = await asyncio.wait_for(c.post("/v1/chat/completions", json=_request(True)), 10)
        await asyncio.sleep(0.05)  # let the cancelled replica generator run its abort
        return r, handle, replica

    r, handle, replica = asyncio.run(main())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    err = _assert_error_then_done(events, 503)
    assert type(exc).__name__ in err["message"] and err["param"] is None
    texts = [e["choices"][0]["delta"].get("content") for e in events[:-2]]
    assert texts == ["", "t0 ", "t1 ", "t2 ", "t3 "]  # the role chunk, then the 4 items before the failure
    assert handle.streams[0].cancelled
    assert replica.engine.kv_stats().running == 0  # the engine request was aborted, its pages freed
    assert any(type(exc).__name__ in r.getMessage() for r in logged), [r.getMessage() for r in logged]


@pytest.mark.parametrize("exc", FAILURES, ids=IDS)
def test_replica_lost_non_streaming_is_a_503_json_error(exc, tokenizer, logged):
    async def main():
        replica = await _replica({"token_delay_s": 0.001})
        async with await _client(LocalHandle(replica, fail_after=3, exc=exc), tokenizer) as c:
            mid = await asyncio.wait_for(c.post("/v1/chat/completions", json=_request(False)), 10)
        async with await _client(LocalHandle(replica, fail_after=0, exc=exc), tokenizer) as c:
            before = [await asyncio.wait_for(c.post("/v1/chat/completions", json=_request(s)), 10)
                      for s in (False, True)]
        return mid, before

    mid, before = asyncio.run(main())
    for r in (mid, *before):  # mid-request, and before the first token (streaming or not: no 200 sent yet)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["type"] == "service_unavailable" and err["code"] == "engine_unavailable"
        assert type(exc).__name__ in err["message"]
    assert len(logged) >= 3


class _DyingEngine(MockEngine):
    """Raises a non-EngineError after `n` chunks, as a crashed engine loop would."""

    def __init__(self, n: int) -> None:
        super().__init__({"token_delay_s": 0.001})
        self.n = n

    def generate(self, request):
        inner = super().generate(request)

        async def run():
            async for i, chunk in _aenumerate(inner):
                if i == self.n:
                    await inner.aclose()
                    raise RuntimeError("CUDA error: an illegal memory access was encountered")
                yield chunk
        return run()


async def _aenumerate(agen):
    i = 0
    async for x in agen:
        yield i, x
        i += 1


def test_engine_crash_inside_the_replica_is_a_503_error_event(tokenizer, logged):
    async def main():
        replica = await _replica({}, engine=_DyingEngine(3))
        async with await _client(LocalHandle(replica), tokenizer) as c:
            s = await asyncio.wait_for(c.post("/v1/chat/completions", json=_request(True)), 10)
            w = await asyncio.wait_for(c.post("/v1/chat/completions", json=_request(False)), 10)
        return s, w, replica

    s, w, replica = asyncio.run(main())
    err = _assert_error_then_done(_events(s.text), 503)
    assert "illegal memory access" in err["message"]
    assert w.status_code == 503 and "illegal memory access" in w.json()["error"]["message"]
    assert replica.engine.kv_stats().running == 0
    assert any("engine stream raised" in r.getMessage() for r in logged)


def test_openai_client_sees_an_api_error_not_a_hang(tokenizer):
    import openai

    async def main():
        replica = await _replica({"token_delay_s": 0.001})
        http = await _client(LocalHandle(replica, fail_after=3, exc=ActorDiedError()), tokenizer)
        client = openai.AsyncOpenAI(base_url="http://ingress/v1", api_key="none", http_client=http, max_retries=0)
        got = []
        with pytest.raises(openai.APIError) as e:
            stream = await client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=50, stream=True)
            async for chunk in stream:
                got.append(chunk.choices[0].delta.content)
        with pytest.raises(openai.InternalServerError) as e2:
            await client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=50)
        await http.aclose()
        return got, e.value, e2.value

    got, stream_err, whole_err = asyncio.run(asyncio.wait_for(main(), 20))
    assert got == ["", "t0 ", "t1 ", "t2 "] and "ActorDiedError" in stream_err.message
    assert whole_err.status_code == 503


def test_engine_queue_full_is_429_with_an_openai_body(tokenizer):
    # One request decodes, one waits (max_running=1, max_waiting=1): the third is refused by the
    # engine before its first token (EngineOverloaded -> replica error item -> 429).
    async def main():
        replica = await _replica({"max_running": 1, "max_waiting": 1, "token_delay_s": 0.02})
        stats = replica.engine.kv_stats
        async with await _client(LocalHandle(replica), tokenizer) as c:
            first = asyncio.create_task(c.post("/v1/chat/completions", json=_request(False, 50)))
            while stats().running < 1:
                await asyncio.sleep(0.005)
            second = asyncio.create_task(c.post("/v1/chat/completions", json=_request(False, 1)))
            while stats().queue_len < 1:
                await asyncio.sleep(0.005)
            third = await c.post("/v1/chat/completions", json=_request(False, 1))
            return third, await asyncio.wait_for(first, 10), await asyncio.wait_for(second, 10)

    third, first, second = asyncio.run(asyncio.wait_for(main(), 20))
    assert third.status_code == 429, third.text
    err = third.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "rate_limit_error" and err["code"] == "overloaded" and "waiting" in err["message"]
    assert first.status_code == 200 and second.status_code == 200  # the waiting one ran once the slot freed

"""The load tool's streaming client and runner against a real local SSE server."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from load_tests.client import RequestRecord, check_loopback, stream_request
from load_tests.runner import run_workload, write_json
from load_tests.workloads import Workload

from .sse_server import MODEL, Server


@pytest.fixture(scope="module")
def server():
    with Server() as s:
        yield s


def _one(server, model: str, max_tokens: int = 5, cancel_after_s=None, timeout_s: float = 30) -> RequestRecord:
    async def go():
        async with httpx.AsyncClient() as c:
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
                    "stream": True}
            return await stream_request(c, server.url + "/v1/chat/completions", body, RequestRecord(0),
                                        timeout_s, cancel_after_s)
    return asyncio.run(go())


def test_ok_stream_reassembles_text_and_usage(server):
    r = _one(server, MODEL, 5)
    assert r.ok, (r.error, r.error_message)
    assert r.text == "word \u00e9t\u00e9 word \u00e9t\u00e9 word "  # split UTF-8 and lines rejoined
    assert len(r.chunk_times) == 5 and r.output_tokens == 5 and r.prompt_tokens == 7 and r.cached_tokens == 3
    assert r.finish_reason == "length"
    assert 0 < r.ttft == r.chunk_times[0] <= r.chunk_times[-1] <= r.e2e
    assert r.chunk_times == sorted(r.chunk_times) and len(r.itls()) == 4


@pytest.mark.parametrize("model,kind,code", [
    ("bad", "http_400", "invalid_value"),
    ("html500", "http_500", "not_openai_error"),
    ("error", "stream_error", 500),
    ("truncate", "truncated", None),
    ("garbled", "garbled", None),
    ("after_done", "garbled", None),
])
def test_failures_are_classified(server, model, kind, code):
    r = _one(server, model, 5)
    assert r.error == kind, r.error_message
    assert r.error_code == code
    assert r.e2e is not None


def test_connection_refused_is_connect_error():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now

    async def go():
        async with httpx.AsyncClient() as c:
            return await stream_request(c, f"http://127.0.0.1:{port}/v1/chat/completions",
                                        {"model": MODEL, "messages": []}, RequestRecord(0), 10)
    assert asyncio.run(go()).error == "connect"


def test_cancel_closes_the_connection_and_server_sees_it(server):
    before = server.state.disconnected
    r = _one(server, "slow", max_tokens=400, cancel_after_s=0.3)  # 400 x 50 ms = 20 s if not cancelled
    assert r.error == "cancelled" and 0 < len(r.chunk_times) < 400
    for _ in range(100):  # the server's generator is closed once it notices the reset
        if server.state.disconnected > before:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert server.state.disconnected == before + 1


def test_timeout_bounds_a_request(server):
    r = _one(server, "slow", max_tokens=400, timeout_s=0.3)
    assert r.error == "timeout" and r.e2e < 20


@pytest.mark.parametrize("url,ok", [
    ("http://127.0.0.1:8000", True), ("http://localhost:8000/x", True), ("http://[::1]:8000", True),
    ("http://127.3.4.5", True), ("http://10.0.0.1:8000", False), ("http://8.8.8.8", False),
])
def test_loopback_only(url, ok):
    if ok:
        check_loopback(url)
    else:
        with pytest.raises(ValueError, match="allow-remote"):
            check_loopback(url)
        check_loopback(url, allow_remote=True)


def _wl(**kw) -> Workload:
    base = dict(name="t", kind="random_short", concurrency=3, num_requests=10, duration_s=60, timeout_s=30,
                sampling={"max_tokens": 4}, slo={"ttft_s": 60.0})
    return Workload.from_dict({**base, **kw})


def test_closed_loop_run_respects_count_and_concurrency(server, tmp_path):
    server.state.max_in_flight = 0
    res = asyncio.run(run_workload(server.url, _wl()))
    s = res["summary"]
    assert s["requests"] == 10 and s["ok"] == 10 and s["errors"] == {}
    assert s["output_tokens"] == 40 and s["slo_met"] == 10
    assert 1 <= server.state.max_in_flight <= 3
    assert [r["index"] for r in res["records"]] == list(range(10))
    assert res["conditions"]["model"] == MODEL and res["conditions"]["cpu_count"] >= 1
    back = json.loads(write_json(res, tmp_path / "r.json").read_text())
    assert back["summary"] == json.loads(json.dumps(s))


def test_open_loop_run_is_bounded_by_count(server):
    res = asyncio.run(run_workload(server.url, _wl(concurrency=None, rate=200.0, num_requests=15, max_in_flight=4)))
    assert res["summary"]["requests"] == 15 and res["summary"]["ok"] == 15


def test_errors_counted_by_kind(server):
    res = asyncio.run(run_workload(server.url, _wl(model="error", num_requests=4)))
    s = res["summary"]
    assert s["ok"] == 0 and s["errors"] == {"stream_error": 4} and s["goodput_requests_per_s"] == 0


def test_run_refuses_remote_target():
    with pytest.raises(ValueError, match="loopback"):
        asyncio.run(run_workload("http://192.0.2.1:8000", _wl()))

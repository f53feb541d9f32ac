"""The OpenAI API of the Serve app with the real torch engine on SmolLM2-135M, through the official
`openai` client (and raw HTTP where the client would not send the bad input).

One Serve app for the module (starting Ray + Serve + SmolLM2 costs ~20 s on 2 cores).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import httpx
import pytest

pytestmark = pytest.mark.slow

PORT = 8013
BASE = f"http://127.0.0.1:{PORT}"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
APP = "api"


@pytest.fixture(scope="module")
def app():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve

    from oscar_ray.deployments.builder import build_app
    from oscar_ray.deployments.config import ServeAppConfig

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    cfg = ServeAppConfig.model_validate({
        "model_id": MODEL, "tokenizer": "smollm2",
        "engine": {"kind": "torch", "config": {"model": "smollm2", "max_model_len": 1024, "max_num_seqs": 16,
                                               "num_threads": 2}},
        "replicas": {"num_cpus": 1, "max_ongoing_requests": 32},
        "ingress": {"num_cpus": 0.5},
    })
    serve.run(build_app(cfg), name=APP, route_prefix="/")
    engine = serve.get_deployment_handle("EngineReplica", app_name=APP)
    yield engine
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def client(app):
    from openai import OpenAI

    return OpenAI(base_url=f"{BASE}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer():
    from oscar_ray.models.loader import load_tokenizer

    return load_tokenizer("smollm2")


def _chat_len(tokenizer, messages) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


MSGS = [{"role": "user", "content": "What is the capital of France?"}]


def test_models(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]


def test_chat_non_streaming_and_streaming_agree(client, tokenizer):
    whole = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=12, temperature=0)
    text = whole.choices[0].message.content
    assert isinstance(text, str) and text.strip()
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens == _chat_len(tokenizer, MSGS)
    assert 1 <= whole.usage.completion_tokens <= 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    stream = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    deltas, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            deltas.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(deltas) == text  # greedy: same tokens both ways
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_max_completion_tokens_and_stop(client):
    r = client.chat.completions.create(model=MODEL, messages=MSGS, max_completion_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    full = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=12, temperature=0).choices[0]
    word = full.message.content.split()[1] if len(full.message.content.split()) > 1 else None
    if word:
        cut = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=12, temperature=0, stop=[word])
        assert cut.choices[0].finish_reason == "stop"
        assert word not in cut.choices[0].message.content


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model=MODEL, messages=MSGS, max_tokens=8, temperature=1.0, top_p=0.9, seed=1234)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_completions(client, tokenizer):
    prompt = "The three primary colours are"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.choices[0].text
    assert r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens == len(tokenizer(prompt)["input_ids"])
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text


def test_16_concurrent_streams_complete_with_usage(app, tokenizer):
    from openai import AsyncOpenAI

    async def one(c, i):
        msgs = [{"role": "user", "content": f"Count to {i + 3}."}]
        stream = await c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})
        n_content, usage = 0, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            n_content += sum(1 for ch in chunk.choices if ch.delta.content)
        return msgs, n_content, usage

    async def main():
        c = AsyncOpenAI(base_url=f"{BASE}/v1", api_key="none", max_retries=0, timeout=300)
        return await asyncio.gather(*(one(c, i) for i in range(16)))

    results = asyncio.run(main())
    assert len(results) == 16
    for msgs, n_content, usage in results:
        assert usage is not None and usage.completion_tokens == 10
        assert usage.prompt_tokens == _chat_len(tokenizer, msgs)
        assert 1 <= n_content <= 10


LONG = "word " * 1100
# (name, body or raw bytes, expected status, expected param or None)
BAD = [
    ("malformed json", b'{"model": "x", "messages": [', 400, None),
    ("not an object", b"[1, 2]", 400, None),
    ("unknown model", {"model": "gpt-nope", "messages": MSGS}, 404, "model"),
    ("missing messages", {"model": MODEL}, 400, "messages"),
    ("empty messages", {"model": MODEL, "messages": []}, 400, "messages"),
    ("bad role", {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.role"),
    ("temperature too high", {"model": MODEL, "messages": MSGS, "temperature": 5}, 400, "temperature"),
    ("temperature wrong type", {"model": MODEL, "messages": MSGS, "temperature": "hot"}, 400, "temperature"),
    ("top_p zero", {"model": MODEL, "messages": MSGS, "top_p": 0}, 400, "top_p"),
    ("max_tokens zero", {"model": MODEL, "messages": MSGS, "max_tokens": 0}, 400, "max_tokens"),
    ("max_completion_tokens negative", {"model": MODEL, "messages": MSGS, "max_completion_tokens": -1}, 400,
     "max_completion_tokens"),
    ("n=2", {"model": MODEL, "messages": MSGS, "n": 2}, 400, "n"),
    ("five stop strings", {"model": MODEL, "messages": MSGS, "stop": list("abcde")}, 400, "stop"),
    ("negative seed", {"model": MODEL, "messages": MSGS, "seed": -3}, 400, "seed"),
    ("image content part", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400, "messages"),
    ("prompt too long", {"model": MODEL, "messages": [{"role": "user", "content": LONG}]}, 400, "messages"),
    ("max_tokens past the context", {"model": MODEL, "messages": MSGS, "max_tokens": 5000}, 400, "messages"),
]


@pytest.mark.parametrize("name,body,status,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_an_openai_error_and_the_server_stays_up(app, name, body, status, param):
    with httpx.Client(timeout=60) as c:
        if isinstance(body, bytes):
            r = c.post(f"{BASE}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        else:
            r = c.post(f"{BASE}/v1/chat/completions", json=body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        if param is not None:
            assert err["param"] == param, err
        ok = c.post(f"{BASE}/v1/chat/completions", json={"model": MODEL, "messages": MSGS, "max_tokens": 1})
        assert ok.status_code == 200, ok.text


def test_bad_completion_input_and_unknown_route(app):
    with httpx.Client(timeout=60) as c:
        r = c.post(f"{BASE}/v1/completions", json={"model": MODEL, "prompt": ["a", "b"]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = c.post(f"{BASE}/v1/completions", json={"model": MODEL, "prompt": "x", "top_p": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "top_p"
        r = c.get(f"{BASE}/v1/nothing")
        assert r.status_code == 404 and "error" in r.json()
        assert c.get(f"{BASE}/health").status_code == 200


def test_openai_client_raises_bad_request(client):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MSGS, temperature=3)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=MSGS)


def _kv(engine) -> dict:
    return engine.kv_stats.remote().result()


def test_disconnect_aborts_and_frees_pages(app):
    engine = app
    base = _kv(engine)
    assert base["running"] == 0
    # ~1000 tokens would take minutes on CPU: if the abort did not happen, the pages stay held
    # for the whole wait below and the test fails.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}], "stream": True,
            "max_tokens": 900, "temperature": 0, "ignore_eos": True}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", f"{BASE}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # kept referenced: dropping it would close the stream early
            n = 0
            while n < 4:
                line = next(lines)
                if line.startswith("data: ") and json.loads(line[6:])["choices"]:
                    n += 1
            during = _kv(engine)
            assert during["running"] == 1 and during["used_pages"] > base["used_pages"]
            r.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 60
    after = _kv(engine)
    while (after["running"] or after["used_pages"] > base["used_pages"]) and time.monotonic() < deadline:
        time.sleep(0.2)
        after = _kv(engine)
    assert after["running"] == 0 and after["used_pages"] <= base["used_pages"], (base, during, after)


def test_metrics_report_latency_tokens_and_kv(app, client):
    client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=4, temperature=0)
    text = httpx.get(f"{BASE}/metrics", timeout=30).text
    for name in ("oscar_time_to_first_token_seconds_count", "oscar_time_per_output_token_seconds_count",
                 "oscar_generation_tokens_total", "oscar_prompt_tokens_total", "oscar_kv_usage{",
                 "oscar_queue_len{", "oscar_prefix_hit_rate", "oscar_kv_total_pages{"):
        assert name in text, name
    count = next(float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("oscar_time_to_first_token_seconds_count"))
    assert count >= 1


def test_full_engine_queue_is_429_with_an_openai_body(app):
    # A second app whose torch engine admits one request (max_num_seqs 1, max_queue 0): while one
    # stream decodes, the next request is refused by the engine -> 429, through the official client.
    import openai
    from ray import serve

    from oscar_ray.deployments.builder import build_app

    serve.run(build_app({
        "model_id": MODEL, "tokenizer": "smollm2",
        "engine": {"kind": "torch", "config": {"model": "smollm2", "max_model_len": 1024, "max_num_seqs": 1,
                                               "max_queue": 0, "num_threads": 1}},
        "replicas": {"num_cpus": 0, "max_ongoing_requests": 8}, "ingress": {"num_cpus": 0},
    }), name="one-slot", route_prefix="/one")
    try:
        tight = openai.OpenAI(base_url=f"{BASE}/one/v1", api_key="none", max_retries=0, timeout=60)
        body = {"model": MODEL, "messages": MSGS, "stream": True, "max_tokens": 900, "temperature": 0,
                "ignore_eos": True}
        with httpx.Client(timeout=60) as c, c.stream("POST", f"{BASE}/one/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            while not ((line := next(lines)).startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"]
                       .get("content")):
                pass  # the one slot is now decoding
            with pytest.raises(openai.RateLimitError) as e:
                tight.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=1)
            r.close()
        err = e.value.body
        assert e.value.status_code == 429 and err["type"] == "rate_limit_error" and err["code"] == "overloaded"
        assert "max_queue" in err["message"]
        deadline = time.monotonic() + 30  # the closed stream is aborted: the slot frees, requests pass again
        while True:
            try:
                assert tight.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=1).choices
                break
            except openai.RateLimitError:
                assert time.monotonic() < deadline, "the aborted stream never freed its slot"
                time.sleep(0.2)
    finally:
        serve.delete("one-slot")

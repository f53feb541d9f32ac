"""Bad-input fuzz of the HTTP API: paths and methods from the app's /openapi.json, request bodies
from the OpenAI request models' JSON schema, mutated one field at a time (wrong type, out of
range, huge, empty, unicode), plus broken bodies (not JSON, not an object, wrong content type,
deep nesting, 1 MB strings) and unknown routes/methods.

Pass: every answer is either a success in OpenAI's shape (JSON or a well-formed SSE stream ending
in [DONE]) or a 4xx with `{"error": {"message": str, "type": str, ...}}`; no 5xx; /health stays 200.

    python -m load_tests.faults.fuzz --out load_tests/results/faults/fuzz.json
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from typing import Any

import httpx

from load_tests.client import RequestRecord, stream_request
from load_tests.runner import conditions

from .serving import save, serve_cpu_default

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
BASE = {
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "/v1/completions": {"model": MODEL, "prompt": "Hello", "max_tokens": 2},
}
# values a field may get; max_tokens is kept small or invalid so a case costs at most ~8 tokens
VALUES: list[Any] = [None, True, -1, 0, 1, 2.5, -1e308, 1e308, "", "x", "\u00e9\u6f22\U0001f600", [], [1, 2], [[]],
                     {}, {"a": 1}, [{"role": "user"}], [{"role": "wizard", "content": "x"}],
                     [{"role": "user", "content": 5}], [{"role": "user", "content": [{"type": "image_url"}]}],
                     "a" * 5000, 2**63, -(2**63), [-5, 10**9], ["a"] * 5]
BROKEN = [b"", b"{", b"null", b"[]", b"42", b'"str"', b"\xff\xfe\x00", b'{"model": ' * 200 + b"1" + b"}" * 200,
          json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 1_000_000}]}).encode()]


def _is_error(body: Any) -> bool:
    e = body.get("error") if isinstance(body, dict) else None
    return isinstance(e, dict) and isinstance(e.get("message"), str) and isinstance(e.get("type"), str)


def _is_success(path: str, body: Any) -> bool:
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        return False
    c = body["choices"][0]
    text = c.get("message", {}).get("content") if "chat" in path else c.get("text")
    return isinstance(text, str) and isinstance(body.get("usage"), dict)


def cases(paths: dict[str, list[str]], schemas: dict[str, dict], rng: random.Random) -> list[dict]:
    out = []
    for path, base in BASE.items():
        fields = sorted(set(schemas[path].get("properties", {})) | set(base))
        for f in fields:
            for v in VALUES:
                if f in ("max_tokens", "max_completion_tokens") and isinstance(v, (int, float)) and 8 < v < 10**6:
                    continue
                body = {**base, f: v}
                # ~30% of cases also as streams (stream forced true), except mutations of `stream`
                # itself, which must reach the server as the mutated value
                out.append({"method": "POST", "path": path, "json": body,
                            "stream": f != "stream" and rng.random() < 0.3})
            if f in base:
                out.append({"method": "POST", "path": path, "json": {k: x for k, x in base.items() if k != f}})
        out.append({"method": "POST", "path": path, "json": dict(base)})
        for raw in BROKEN:
            out.append({"method": "POST", "path": path, "content": raw})
        out.append({"method": "POST", "path": path, "content": json.dumps(base).encode(),
                    "headers": {"content-type": "text/plain"}})
        out.append({"method": "GET", "path": path})
    for path, methods in paths.items():
        for m in ("PUT", "DELETE", "PATCH"):
            if m.lower() not in methods:
                out.append({"method": m, "path": path})
    out += [{"method": "GET", "path": "/v1/nope"}, {"method": "POST", "path": "/v1/embeddings", "json": {}}]
    rng.shuffle(out)
    return out


def _row(case: dict, label: str, status: int | None) -> dict:
    """One case, compact: which field got which value (the rest of the body is the path's base)."""
    base = BASE.get(case["path"], {})
    j = case.get("json")
    if isinstance(j, dict):
        changed = {k: v for k, v in j.items() if base.get(k, object()) != v}
        missing = sorted(set(base) - set(j))
        what = json.dumps(changed)[:80] if changed else ("missing " + ",".join(missing) if missing else "base body")
    elif "content" in case:
        what = "raw " + repr(case["content"][:40])[:60] + (f" {case['headers']}" if case.get("headers") else "")
    else:
        what = "no body"
    return {"method": case["method"], "path": case["path"], "input": what, "stream": bool(case.get("stream")),
            "label": label, "status": status}


def check(client: httpx.Client, base_url: str, case: dict) -> tuple[str, int | None]:
    """(label, HTTP status): label 'ok' / 'error_4xx' when well-formed, else a failure label."""
    url = base_url + case["path"]
    j = case.get("json")
    # a stream when forced, or when the mutated `stream` is truthy as JSON-bool coercion sees it
    # (true, 1); then the body is sent as generated
    if isinstance(j, dict) and (case.get("stream") or j.get("stream") in (True, 1)):
        import asyncio

        body = {**j, "stream": True} if case.get("stream") else j

        async def go():
            async with httpx.AsyncClient(timeout=120) as ac:
                return await stream_request(ac, url, body, RequestRecord(0), 120)
        rec = asyncio.run(go())
        if rec.ok:
            return "ok", rec.status
        if rec.error and rec.error.startswith("http_4") and rec.error_code != "not_openai_error":
            return "error_4xx", rec.status
        return f"bad_{rec.error}:{rec.error_code}", rec.status
    try:
        r = client.request(case["method"], url, json=case.get("json"), content=case.get("content"),
                           headers=case.get("headers"))
    except httpx.HTTPError as e:  # reset, timeout: the server did not answer this case at all
        return f"bad_transport_{type(e).__name__}", None
    try:
        body = r.json()
    except ValueError:
        return f"bad_{r.status_code}_not_json", r.status_code
    if 200 <= r.status_code < 300 and _is_success(case["path"], body):
        return "ok", r.status_code
    if 400 <= r.status_code < 500 and _is_error(body):
        return "error_4xx", r.status_code
    return f"bad_{r.status_code}", r.status_code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--port", type=int, default=8000, help="Serve HTTP port on 127.0.0.1")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from oscar_ray.deployments.protocol import ChatCompletionRequest, CompletionRequest  # the fields to fuzz

    schemas = {"/v1/chat/completions": ChatCompletionRequest.model_json_schema(),
               "/v1/completions": CompletionRequest.model_json_schema()}
    with serve_cpu_default({"fuzz": {"num_threads": 2}}, args.port) as urls:
        url = urls["fuzz"]
        with httpx.Client(timeout=120) as client:
            spec = client.get(url + "/openapi.json").json()
            paths = {p: list(ops) for p, ops in spec["paths"].items()}
            todo = cases(paths, schemas, random.Random(args.seed))
            outcomes, failures, health_bad, rows = Counter(), [], 0, []
            for i, case in enumerate(todo):
                label, status = check(client, url, case)
                outcomes[label] += 1
                rows.append(_row(case, label, status))
                if label.startswith("bad"):
                    failures.append({"case": {k: (v if k != "content" else v[:200].decode("latin-1"))
                                              for k, v in case.items() if k != "json"} | (
                        {"json": json.dumps(case["json"])[:300]} if "json" in case else {}), "got": label})
                if i % 25 == 0 and client.get(url + "/health").status_code != 200:
                    health_bad += 1
            health_end = client.get(url + "/health").status_code
    res = {"conditions": conditions(url, MODEL), "openapi_paths": paths, "cases": len(todo),
           "outcomes": dict(outcomes),
           "status_by_path": {p: dict(Counter(r["status"] for r in rows if r["path"] == p))
                              for p in sorted({r["path"] for r in rows})},
           "failures": failures[:50], "cases_table": rows, "health_failures": health_bad,
           "health_at_end": health_end,
           "verdict": {"pass": not failures and health_bad == 0 and health_end == 200, "malformed": len(failures)}}
    save(res, args.out)
    print(res["verdict"], res["outcomes"])
    return 0 if res["verdict"]["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

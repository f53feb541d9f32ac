"""The fault scripts' pure parts: which streams count as open at a kill, the fuzz case generator
and its answer-shape checks, the cancel storm's cut points. (The runs themselves start Ray and
SmolLM2 and take minutes: they are scripts with committed results, not tests.)"""

from __future__ import annotations

import argparse
import random

from load_tests.faults.cancel_storm import cuts_of
from load_tests.faults.fuzz import BASE, _is_error, _is_success, _row, cases
from load_tests.faults.replica_kill import _in_flight

SCHEMAS = {"/v1/chat/completions": {"properties": {"model": {}, "messages": {}, "stream": {}, "top_k": {}}},
           "/v1/completions": {"properties": {"model": {}, "prompt": {}, "stream": {}, "echo": {}}}}
PATHS = {"/health": ["get"], "/v1/chat/completions": ["post"], "/v1/completions": ["post"]}


def test_in_flight_window_is_start_inclusive_end_exclusive():
    recs = [{"start": 0.0, "e2e": 5.0}, {"start": 4.0, "e2e": 1.0}, {"start": 5.0, "e2e": 2.0},
            {"start": 6.0, "e2e": None}]
    assert _in_flight(recs, 5.0) == [recs[2]]  # recs[0] and recs[1] ended at 5.0
    assert _in_flight(recs, 4.5) == recs[:2]
    assert _in_flight(recs, 6.0) == [recs[2]]  # no e2e: never counted open


def test_fuzz_cases_cover_fields_removals_and_methods():
    todo = cases(PATHS, SCHEMAS, random.Random(0))
    chat = [c for c in todo if c["path"] == "/v1/chat/completions" and c["method"] == "POST" and "json" in c]
    # every field of schema and base gets every value; `stream` mutations are never forced to stream
    for f in ("model", "messages", "stream", "top_k", "max_tokens"):
        assert sum(f in c["json"] and c["json"][f] != BASE[c["path"]].get(f, object()) for c in chat) >= 20
    assert "stream" not in BASE["/v1/chat/completions"]
    assert not any(c.get("stream") for c in chat if "stream" in c["json"])
    assert 0 < sum(bool(c.get("stream")) for c in todo) < len(todo)
    # removals only of fields the base body has, and the base body itself once
    removed = [c for c in chat if set(c["json"]) < set(BASE["/v1/chat/completions"])]
    assert sorted(f for c in removed for f in set(BASE["/v1/chat/completions"]) - set(c["json"])) == [
        "max_tokens", "messages", "model"]
    assert sum(c["json"] == BASE["/v1/chat/completions"] for c in chat) == 1
    methods = {(c["method"], c["path"]) for c in todo if "json" not in c and "content" not in c}
    assert {("PUT", "/health"), ("DELETE", "/health"), ("PATCH", "/health"), ("GET", "/v1/completions")} <= methods
    assert cases(PATHS, SCHEMAS, random.Random(0)) == todo  # seeded


def test_answer_shapes():
    assert _is_error({"error": {"message": "m", "type": "invalid_request_error", "code": None}})
    assert not _is_error({"detail": "Not Found"}) and not _is_error({"error": "m"})
    assert not _is_error({"error": {"message": "m"}})
    chat = {"choices": [{"message": {"content": "hi"}}], "usage": {}}
    assert _is_success("/v1/chat/completions", chat)
    assert not _is_success("/v1/completions", chat)  # completions carry choices[].text
    assert _is_success("/v1/completions", {"choices": [{"text": ""}], "usage": {}})
    assert not _is_success("/v1/chat/completions", {"choices": [], "usage": {}})


def test_row_names_the_mutation():
    base = BASE["/v1/completions"]
    assert _row({"method": "POST", "path": "/v1/completions", "json": {**base, "echo": 5}}, "error_4xx", 400)[
        "input"] == '{"echo": 5}'
    assert _row({"method": "POST", "path": "/v1/completions", "json": dict(base)}, "ok", 200)["input"] == "base body"
    gone = {k: v for k, v in base.items() if k != "prompt"}
    assert _row({"method": "POST", "path": "/v1/completions", "json": gone}, "ok", 400)["input"] == "missing prompt"
    assert _row({"method": "PUT", "path": "/health"}, "error_4xx", 405)["input"] == "no body"


def test_cancel_cuts_seeded_and_in_range():
    a = argparse.Namespace(n=500, max_s=3.0, seed=0)
    cuts = cuts_of(a)
    assert len(cuts) == 500 and all(0 <= c <= 3.0 for c in cuts) and cuts == cuts_of(a)
    assert cuts != cuts_of(argparse.Namespace(n=500, max_s=3.0, seed=1))

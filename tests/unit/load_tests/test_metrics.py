"""Metric math on records with known timings, workload validation and prompt generation."""

from __future__ import annotations

import pytest

from load_tests.client import RequestRecord
from load_tests.metrics import meets_slo, percentile, summarize
from load_tests.runner import arrival_times
from load_tests.sse import SSEParser
from load_tests.workloads import SLO, Workload, build_body, build_messages


def test_percentile_linear_interpolation():
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted 1 2 3 4
    assert percentile(xs, 0) == 1 and percentile(xs, 100) == 4
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(xs, 90) == pytest.approx(3.7)
    assert percentile([7.0], 99) == 7 and percentile([], 50) is None
    with pytest.raises(ValueError, match="q"):
        percentile(xs, 101)


def _rec(i, start, ttft, chunks, e2e, tokens, error=None):
    return RequestRecord(index=i, start=start, ttft=ttft, chunk_times=chunks, e2e=e2e, output_tokens=tokens,
                         error=error)


def test_tpot_and_itl():
    r = _rec(0, 0.0, 0.5, [0.5, 0.6, 0.8, 1.1], 1.1, 4)
    assert r.tpot == pytest.approx(0.2)  # (1.1 - 0.5) / 3
    assert r.itls() == pytest.approx([0.1, 0.2, 0.3])
    assert _rec(0, 0, 0.5, [0.5], 0.5, 1).tpot is None


def test_summary_of_known_records():
    recs = [
        _rec(0, 0.0, 0.5, [0.5, 1.0, 1.5], 1.5, 3),    # tpot 0.5
        _rec(1, 1.0, 1.0, [1.0, 1.2, 1.4], 1.4, 3),    # tpot 0.2, ends at 2.4
        _rec(2, 2.0, 0.2, [0.2, 0.3], 2.0, 2),         # tpot 1.8, ends at 4.0
        _rec(3, 2.5, None, [], 0.1, 0, error="http_429"),
        _rec(4, 3.0, 0.1, [0.1], 0.5, 1, error="cancelled"),
    ]
    s = summarize(recs, SLO(ttft_s=0.8, tpot_s=1.0))
    assert s["requests"] == 5 and s["ok"] == 3 and s["cancelled"] == 1 and s["errors"] == {"http_429": 1}
    assert s["wall_s"] == pytest.approx(4.0)  # first start 0 .. last end 2.0 + 2.0
    assert s["output_tokens"] == 8 and s["output_tokens_per_s"] == pytest.approx(2.0)
    assert s["requests_per_s"] == pytest.approx(0.75)
    assert s["ttft_s"]["p50"] == pytest.approx(0.5) and s["ttft_s"]["n"] == 3
    assert s["tpot_s"]["p50"] == pytest.approx(0.5) and s["tpot_s"]["p99"] == pytest.approx(1.774)
    assert s["itl_s"]["n"] == 5 and s["e2e_s"]["mean"] == pytest.approx((1.5 + 1.4 + 2.0) / 3)
    # SLO: #0 ttft 0.5 tpot 0.5 ok; #1 ttft 1.0 > 0.8 fails; #2 tpot 1.8 > 1.0 fails
    assert s["slo_met"] == 1 and s["goodput_requests_per_s"] == pytest.approx(0.25)
    assert s["slo_attainment"] == pytest.approx(1 / 5)


def test_slo_bounds():
    r = _rec(0, 0, 0.5, [0.5], 0.5, 1)
    assert meets_slo(r, SLO(ttft_s=0.5, tpot_s=0.01))  # one token: no TPOT to violate
    assert not meets_slo(r, SLO(ttft_s=0.4))
    assert not meets_slo(r, SLO(e2e_s=0.1))
    assert meets_slo(r, SLO())
    assert not meets_slo(_rec(0, 0, None, [], 0.1, 0, error="timeout"), SLO())


def test_sse_parser_pieces_comments_and_crlf():
    p = SSEParser()
    out = []
    for piece in [b"da", b"ta: 1\r\n", b"\r\n: ping\n\n", b"event: x\ndata: a\ndata: b\n\n", b"data: [DO"]:
        out += list(p.feed(piece))
    assert out == ["1", "a\nb"] and p.pending()
    assert list(p.feed(b"NE]\n\n")) == ["[DONE]"] and not p.pending()


BASE = {"name": "w", "kind": "shared_prefix_chat", "concurrency": 2}


@pytest.mark.parametrize("bad,field", [
    ({"kind": "nope"}, "kind"),
    ({"concurrency": None}, "exactly one"),
    ({"rate": 1.0}, "exactly one"),
    ({"concurrency": 0}, "concurrency"),
    ({"concurrency": None, "rate": -1.0}, "rate"),
    ({"duration_s": 0}, "duration_s"),
    ({"prompt": {"context_words": 5}}, "prompt"),
    ({"typo": 1}, "typo"),
    ({"endpoint": "embeddings"}, "endpoint"),
])
def test_bad_workload_names_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        Workload.from_dict({**BASE, **bad})


def test_shared_prefix_turns_extend_each_other():
    w = Workload.from_dict({**BASE, "prompt": {"conversations": 3, "turns": 4, "num_prefixes": 2}})
    by_conv: dict[str, list[list[dict]]] = {}
    for i in range(200):
        m = build_messages(w, i)
        assert m == build_messages(w, i)  # deterministic
        assert m[0]["role"] == "system" and m[-1]["role"] == "user" and len(m) % 2 == 0
        by_conv.setdefault(m[1]["content"].rstrip("?"), []).append(m)
    assert len(by_conv) == 3
    for convs in by_conv.values():
        longest = max(convs, key=len)
        for m in convs:  # every turn is a prefix of the longest one, up to its last user message
            assert m[:-1] == longest[:len(m) - 1]
            assert longest[len(m) - 1]["content"].startswith(m[-1]["content"].rstrip("?"))
    prefixes = {m[0]["content"] for convs in by_conv.values() for m in convs}
    assert len(prefixes) <= 2


def test_bodies_and_other_kinds():
    w = Workload.from_dict({"name": "l", "kind": "long_context", "concurrency": 1, "prompt": {"context_words": 50},
                            "sampling": {"max_tokens": 9, "ignore_eos": True}})
    b = build_body(w, 0, "m")
    assert b["stream"] and b["stream_options"] == {"include_usage": True} and b["max_tokens"] == 9
    assert len(b["messages"][0]["content"].split()) == 50 + 9
    s = Workload.from_dict({"name": "s", "kind": "random_short", "rate": 1.0, "endpoint": "completions",
                            "prompt": {"min_words": 2, "max_words": 3}})
    n = {len(build_body(s, i, "m")["prompt"].split()) for i in range(50)}
    assert n == {2, 3}


def test_poisson_arrivals_bounded_and_seeded():
    w = Workload.from_dict({"name": "p", "kind": "random_short", "rate": 10.0, "duration_s": 5, "num_requests": 1000})
    t = arrival_times(w)
    assert t == arrival_times(w) and t == sorted(t) and t[-1] <= 5
    assert 20 < len(t) < 90  # mean 50; P(outside) < 1e-6
    assert len(arrival_times(w.with_(num_requests=7))) == 7

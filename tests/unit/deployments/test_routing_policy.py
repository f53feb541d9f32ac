"""Table tests of the prefix-affinity policy and the affinity table (pure, no Ray)."""

from __future__ import annotations

import random

import pytest

from oscar_ray.cache import block_hashes
from oscar_ray.deployments.routing import AffinityTable, PrefixAffinityPolicy, ReplicaView, matched_blocks

PAGE = 4
SYSTEM_A = list(range(100, 112))  # 3 blocks
SYSTEM_B = list(range(200, 212))


def keys(ids):
    return list(block_hashes(ids, PAGE))


def cached(*prompts):
    return frozenset(k for p in prompts for k in keys(p))


def view(rid, load, *prompts):
    return ReplicaView(rid, load, cached(*prompts))


def test_matched_blocks_counts_leading_chain_only():
    prompt = SYSTEM_A + [1, 2, 3, 4]
    assert matched_blocks(keys(prompt), cached(SYSTEM_A)) == 3
    assert matched_blocks(keys(prompt), cached(prompt)) == 4
    # the same last block after another prefix hashes differently: no match
    assert matched_blocks(keys(SYSTEM_B + [1, 2, 3, 4]), cached(prompt)) == 0
    assert matched_blocks([], cached(prompt)) == 0


# (name, replicas, prompt, expected reason, expected first rank, expected matched blocks)
CASES = [
    ("affinity to the holder", [view("a", 0, SYSTEM_A), view("b", 0, SYSTEM_B)], SYSTEM_A + [9] * 4,
     "affinity", ["a"], 3),
    ("longest match wins over shorter", [view("a", 0, SYSTEM_A[:4]), view("b", 0, SYSTEM_A)], SYSTEM_A + [9] * 4,
     "affinity", ["b"], 3),
    ("equal matches, least loaded first", [view("a", 5, SYSTEM_A), view("b", 2, SYSTEM_A), view("c", 0)],
     SYSTEM_A + [1] * 4, "affinity", ["b", "a"], 3),
    ("affinity despite a small gap (gap 6 <= abs 8)", [view("a", 7, SYSTEM_A), view("b", 1)], SYSTEM_A,
     "affinity", ["a"], 3),
    ("big gap but ratio below rel (20 vs 14: 1.43 < 1.5)", [view("a", 20, SYSTEM_A), view("b", 14)], SYSTEM_A,
     "affinity", ["a"], 3),
    ("imbalanced: gap 9 > 8 and 10 > 1.5*1", [view("a", 10, SYSTEM_A), view("b", 1)], SYSTEM_A,
     "imbalanced", None, 0),
    ("no replica holds the prefix", [view("a", 0, SYSTEM_B), view("b", 3)], SYSTEM_A, "no_match", None, 0),
    ("prompt shorter than a page has no keys", [view("a", 0, SYSTEM_A), view("b", 0)], [1, 2], "no_match", None, 0),
    ("single replica", [view("a", 50, SYSTEM_B)], SYSTEM_A, "single", ["a"], 0),
]


@pytest.mark.parametrize("name,replicas,prompt,reason,first,blocks", CASES, ids=[c[0] for c in CASES])
def test_policy_table(name, replicas, prompt, reason, first, blocks):
    policy = PrefixAffinityPolicy(abs_threshold=8, rel_threshold=1.5, rng=random.Random(0))
    d = policy.choose(keys(prompt), replicas)
    assert d.reason == reason
    assert d.matched_blocks == blocks
    ids = {r.replica_id for r in replicas}
    if first is not None:
        assert d.ranked[0] == first
    else:  # power of two: two distinct replicas, less loaded first
        pick = d.ranked[0]
        assert len(pick) == min(2, len(replicas)) and len(set(pick)) == len(pick) and set(pick) <= ids
        loads = {r.replica_id: r.load for r in replicas}
        assert [loads[i] for i in pick] == sorted(loads[i] for i in pick)
    # every replica id named is a candidate; nothing is listed twice
    flat = [i for rank in d.ranked for i in rank]
    assert set(flat) <= ids and len(flat) == len(set(flat))


def test_affinity_puts_the_rest_behind_as_pow2():
    policy = PrefixAffinityPolicy(rng=random.Random(1))
    reps = [view("a", 0, SYSTEM_A), view("b", 3), view("c", 1), view("d", 2)]
    d = policy.choose(keys(SYSTEM_A), reps)
    assert d.ranked[0] == ["a"] and len(d.ranked) == 2
    assert len(d.ranked[1]) == 2 and "a" not in d.ranked[1]


def test_imbalance_fallback_spreads_load():
    # a hot prefix held by one replica: once its queue runs away, requests go elsewhere
    policy = PrefixAffinityPolicy(abs_threshold=4, rel_threshold=1.5, rng=random.Random(2))
    loads = {"a": 0, "b": 0, "c": 0}
    holders = {"a"}
    for _ in range(60):
        reps = [ReplicaView(r, loads[r], cached(SYSTEM_A) if r in holders else frozenset()) for r in loads]
        d = policy.choose(keys(SYSTEM_A), reps)
        target = d.ranked[0][0]
        loads[target] += 1
        holders.add(target)  # it now caches the prefix too
    assert max(loads.values()) - min(loads.values()) <= 5, loads


def test_min_match_blocks_threshold():
    policy = PrefixAffinityPolicy(min_match_blocks=4, rng=random.Random(0))
    d = policy.choose(keys(SYSTEM_A + [1] * 4), [view("a", 0, SYSTEM_A), view("b", 0)])
    assert d.reason == "no_match"  # 3 blocks < 4


@pytest.mark.parametrize("kwargs", [{"abs_threshold": -1}, {"rel_threshold": 0.5}, {"min_match_blocks": 0}])
def test_bad_policy_params_raise(kwargs):
    with pytest.raises(ValueError):
        PrefixAffinityPolicy(**kwargs)


def test_affinity_table_hints_and_reports():
    t = AffinityTable(ttl_s=4.0)
    k = keys(SYSTEM_A)
    t.report("a", 1, [], now=0.0)
    assert matched_blocks(k, t.cached("a", 0.0)) == 0
    t.routed("a", k, now=1.0)  # routed, not yet reported: counts as cached
    assert matched_blocks(k, t.cached("a", 2.0)) == 3
    assert matched_blocks(k, t.cached("a", 5.5)) == 0  # hint expired (4 s)
    t.routed("a", k, now=6.0)
    t.report("a", 1, [], now=6.5)  # same seq: ignored, hint stays
    assert matched_blocks(k, t.cached("a", 6.5)) == 3
    t.report("a", 2, k[:1], now=9.0)  # new report: hints older than ttl/2 dropped, report used
    assert matched_blocks(k, t.cached("a", 9.0)) == 1
    t.forget("a")
    assert t.cached("a", 9.0) == frozenset()

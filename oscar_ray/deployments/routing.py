"""Prefix-cache affinity with an imbalance fallback: the pure policy the Serve router adapts.

Keys are the chained block hashes of the prompt's token ids (`oscar_ray.cache.block_hashes`, one
key per full page of `page_size` tokens), the same keys each engine's prefix index stores, so a
match means the replica holds those KV pages. The ingress tokenises (it renders the chat template
with the model's tokenizer), so keys are exact; a character-level tree (Ray's
PrefixCacheAffinityRouter, sglang's router) only approximates what the engine has cached.

Decision, in order:
1. imbalanced: (max - min load) > abs_threshold AND max > rel_threshold * min (both, as sglang's
   router: the absolute gap alone would fire at high load where 8 of 100 is noise, the ratio alone
   at 0 vs 2) -> power of two choices over all replicas.
2. some replica matches >= min_match_blocks leading blocks -> those with the longest match,
   least loaded first; the rest by power of two as the next rank.
3. otherwise -> power of two choices.

A replica's report is up to `stats_period_s` old, so a burst of one new prefix would scatter
before anyone reports it; `AffinityTable` therefore also counts a prompt as cached at the replica
it was just routed to, for `ttl_s` or until that replica's next report.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Reason = Literal["affinity", "imbalanced", "no_match", "single", "empty"]


@dataclass(frozen=True)
class ReplicaView:
    replica_id: str
    load: float  # ongoing requests at the replica (router-side count, else its report)
    cached: frozenset[bytes] | set[bytes]


@dataclass(frozen=True)
class Decision:
    ranked: list[list[str]]  # replica ids, most preferred rank first
    reason: Reason
    matched_blocks: int = 0


def matched_blocks(keys: Sequence[bytes], cached: frozenset[bytes] | set[bytes]) -> int:
    """Leading prompt blocks present in `cached` (a chain: block j's key names blocks 0..j)."""
    n = 0
    for key in keys:
        if key not in cached:
            break
        n += 1
    return n


class PrefixAffinityPolicy:
    """Pure routing decision over `ReplicaView`s; `rng` makes power-of-two choices reproducible."""

    def __init__(self, abs_threshold: float = 8, rel_threshold: float = 1.5, min_match_blocks: int = 1,
                 rng: random.Random | None = None) -> None:
        if abs_threshold < 0 or rel_threshold < 1 or min_match_blocks < 1:
            raise ValueError(f"need abs_threshold >= 0, rel_threshold >= 1, min_match_blocks >= 1; got "
                             f"{abs_threshold}, {rel_threshold}, {min_match_blocks}")
        self.abs_threshold = abs_threshold
        self.rel_threshold = rel_threshold
        self.min_match_blocks = min_match_blocks
        self.rng = rng or random.Random()

    def imbalanced(self, loads: Iterable[float]) -> bool:
        loads = list(loads)
        if len(loads) < 2:
            return False
        hi, lo = max(loads), min(loads)
        return hi - lo > self.abs_threshold and hi > self.rel_threshold * lo

    def pow2(self, replicas: Sequence[ReplicaView]) -> list[str]:
        """Two distinct random replicas, the less loaded first (ties keep the random order)."""
        pick = self.rng.sample(list(replicas), k=min(2, len(replicas)))
        return [r.replica_id for r in sorted(pick, key=lambda r: r.load)]

    def choose(self, keys: Sequence[bytes], replicas: Sequence[ReplicaView]) -> Decision:
        if not replicas:
            return Decision([], "empty")
        if len(replicas) == 1:
            return Decision([[replicas[0].replica_id]], "single",
                            matched_blocks(keys, replicas[0].cached))
        if self.imbalanced(r.load for r in replicas):
            return Decision([self.pow2(replicas)], "imbalanced")
        matches = {r.replica_id: matched_blocks(keys, r.cached) for r in replicas}
        best = max(matches.values())
        if best < self.min_match_blocks:
            return Decision([self.pow2(replicas)], "no_match")
        first = sorted((r for r in replicas if matches[r.replica_id] == best), key=lambda r: r.load)
        rest = [r for r in replicas if matches[r.replica_id] != best]
        ranked = [[r.replica_id for r in first]]
        if rest:
            ranked.append(self.pow2(rest))
        return Decision(ranked, "affinity", best)


class AffinityTable:
    """Per replica: the block keys it last reported, plus keys of prompts just routed to it.

    `report(rid, seq, keys, now)` replaces the reported set when `seq` is new and drops hints older
    than that report (the replica has either cached those prompts, and says so, or evicted them).
    `routed(rid, keys, now)` adds a hint; `cached(rid, now)` is reported | live hints.
    """

    def __init__(self, ttl_s: float = 5.0) -> None:
        self.ttl_s = ttl_s
        self._reported: dict[str, frozenset[bytes]] = {}
        self._seq: dict[str, object] = {}
        self._report_time: dict[str, float] = {}
        self._hints: dict[str, dict[bytes, float]] = {}

    def report(self, rid: str, seq: object, keys: Iterable[bytes], now: float) -> None:
        if rid in self._seq and self._seq[rid] == seq:
            return
        self._seq[rid] = seq
        self._reported[rid] = frozenset(keys)
        self._report_time[rid] = now
        hints = self._hints.get(rid)
        if hints:
            # A hint routed within ~a stats period may not be in this report yet: keep those.
            self._hints[rid] = {k: t for k, t in hints.items() if t > now - self.ttl_s / 2}

    def routed(self, rid: str, keys: Iterable[bytes], now: float) -> None:
        if self.ttl_s <= 0:
            return
        hints = self._hints.setdefault(rid, {})
        for k in keys:
            hints[k] = now

    def cached(self, rid: str, now: float) -> frozenset[bytes] | set[bytes]:
        reported = self._reported.get(rid, frozenset())
        hints = self._hints.get(rid)
        if not hints:
            return reported
        live = {k for k, t in hints.items() if now - t <= self.ttl_s}
        if len(live) != len(hints):
            self._hints[rid] = {k: hints[k] for k in live}
        return reported | live if live else reported

    def forget(self, rid: str) -> None:
        for table in (self._reported, self._seq, self._report_time, self._hints):
            table.pop(rid, None)

"""Randomized fuzz: thousands of allocator calls against a shadow engine that moves the data.

The shadow engine keeps a fake device memory {(kind, page, offset): value} where a position's
value is a hash of the whole token prefix up to it (as real KV is). Each step it runs the moves in
a random order (the allocator promises they commute), then the writes, then end_step, then wipes
free pages. After every call the invariants are checked; after every step every live request
must read back its own values through its slot table. A fresh seed per run; the seed is printed
and attached to the failure (rerun with OSCAR_TEST_SEED=<seed>, the suite's replay variable).
"""

import os
import random

import pytest

from oscar_ray.cache import Demotion, KVAllocator, OutOfPages, PageGeometry, PageKind

B, I = PageKind.BF16, PageKind.INT2
STEPS = 4000
VOCAB = 40  # small, so unrelated prompts rarely share blocks; reuse comes from `history`
# (page_size, sink_tokens, recent_tokens, INT2 pages, BF16 pages): edge cases of the layout.
CONFIGS = [
    (4, 8, 8, 48, 40),
    (2, 0, 4, 40, 24),  # no sink
    (3, 3, 0, 40, 16),  # no recent window: every full page is demoted at once
    (1, 2, 3, 96, 40),  # one token per page
    (8, 16, 32, 40, 40),
]


def snapshot(a: KVAllocator):
    return (
        {k: (p.free_pages(), tuple(p.refcount(i) for i in range(p.capacity)))
         for k, p in a._pools.items()},
        {r: (a.segments(r), a.n_tokens(r)) for r in a._requests},
        tuple((k, dict(e)) for k, e in a.prefix._lru.items()),
        a.prefix.stats(), tuple(a._pins), frozenset(a._busy),
    )


def prefix_values(tokens, values=None):
    values = list(values or [])
    for tok in tokens[len(values):]:
        values.append(hash((values[-1] if values else 0, tok)))
    return values


class ShadowEngine:
    def __init__(self, config, rng):
        page, sink, recent, n_int2, n_bf16 = config
        self.a = KVAllocator(PageGeometry(1, 1, 8, page, sink_tokens=sink, recent_tokens=recent),
                             n_int2, n_bf16)
        self.rng, self.P = rng, page
        self.max_prompt = 10 * page
        self.mem, self.moves, self.writes = {}, [], []
        self.seqs = {}  # live request -> (tokens, values)
        self.cold = set()  # live requests never forked: their layout must be the cold one
        self.busy = set()
        self.history = []  # token lists seen before, to build prompts that hit the cache
        self.next_id = 0

    # --- helpers -----------------------------------------------------------------------------
    def ready(self):
        return [r for r in self.seqs if r not in self.busy]

    def queue(self, out, rid):
        tokens, values = self.seqs[rid]
        assert len(out.slots) == len(tokens) - out.n_cached_tokens
        self.moves += out.demotions + out.copies
        for pos, slot in enumerate(out.slots, start=out.n_cached_tokens):
            assert slot.offset == pos % self.P
            self.writes.append((rid, (slot.kind, slot.page, slot.offset), values[pos]))
        for d in out.demotions:
            assert d.positions.start % self.P == 0 and d.positions.stop <= out.n_cached_tokens

    def kinds(self, rid):
        return [s.kind for s in self.a.slot_table(rid)[:: self.P]]

    def check_cold(self, rid):
        if rid in self.cold:
            assert self.kinds(rid) == self.a.geometry.layout(self.a.n_tokens(rid))

    def attempt(self, call, can=None):
        before = snapshot(self.a)
        try:
            out = call()
        except OutOfPages:
            assert can is not True, "can_* said yes, the call ran out of pages"
            assert snapshot(self.a) == before, "OutOfPages changed the state"
            return None
        assert can is not False, "can_* said no, the call succeeded"
        return out

    # --- operations ----------------------------------------------------------------------------
    def op_allocate(self):
        rng = self.rng
        if self.history and rng.random() < 0.6:
            base = rng.choice(self.history)
            prompt = base[: rng.choice([len(base), rng.randint(1, len(base))])]
            prompt += [rng.randrange(VOCAB) for _ in range(rng.randint(0, 2 * self.P))]
        else:
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, self.max_prompt))]
        prompt = prompt[: self.max_prompt]
        token_ids = prompt if rng.random() < 0.8 else None
        rid, self.next_id = self.next_id, self.next_id + 1
        can = self.a.can_allocate(len(prompt), token_ids)
        out = self.attempt(lambda: self.a.allocate(rid, len(prompt), token_ids), can)
        if out is None:
            return
        assert out.n_cached_tokens % self.P == 0 and out.n_cached_tokens < len(prompt)
        assert token_ids is not None or out.n_cached_tokens == 0
        self.seqs[rid] = (prompt, prefix_values(prompt))
        self.cold.add(rid)
        self.busy.add(rid)
        self.queue(out, rid)
        self.check_cold(rid)

    def op_extend(self):
        rids = self.ready()
        if not rids:
            return
        rid = self.rng.choice(rids)
        n_new = 1 if self.rng.random() < 0.7 else self.rng.randint(1, 3 * self.P)
        can = self.a.can_extend(rid, n_new)
        out = self.attempt(lambda: self.a.extend(rid, n_new), can)
        if out is None:
            return
        tokens, values = self.seqs[rid]
        assert out.n_cached_tokens == len(tokens)
        tokens = tokens + [self.rng.randrange(VOCAB) for _ in range(n_new)]
        self.seqs[rid] = (tokens, prefix_values(tokens, values))
        self.busy.add(rid)
        self.queue(out, rid)
        self.check_cold(rid)

    def op_fork(self):
        rids = self.ready()
        if not rids:
            return
        parent = self.rng.choice(rids)
        tokens, values = self.seqs[parent]
        n = len(tokens) if self.rng.random() < 0.5 else self.rng.randint(1, len(tokens))
        child, self.next_id = self.next_id, self.next_id + 1
        out = self.attempt(lambda: self.a.fork(parent, child, n))
        if out is None:
            return
        self.seqs[child] = (tokens[:n], values[:n])
        n_shared = n // self.P
        assert self.kinds(child)[:n_shared] == self.kinds(parent)[:n_shared]
        if out.copies:
            self.busy.add(child)
        self.queue(out, child)

    def op_release(self):
        if not self.seqs:
            return
        rid = self.rng.choice(list(self.seqs))
        if self.rng.random() < 0.5:
            if rid not in self.busy and self.rng.random() < 0.5:  # cache on finish
                self.a.insert_prefix(rid, self.seqs[rid][0])
            self.a.free(rid)
        else:
            assert self.a.abort(rid) is True
        assert self.a.abort(rid) is False
        self.history.append(self.seqs.pop(rid)[0])
        # The engine drops a released request from the step's batch: its writes never happen.
        self.writes = [w for w in self.writes if w[0] != rid]
        self.history = self.history[-50:]
        self.cold.discard(rid)
        self.busy.discard(rid)

    def op_insert(self):
        rids = self.ready()
        if not rids:
            return
        rid = self.rng.choice(rids)
        tokens = self.seqs[rid][0]
        self.a.insert_prefix(rid, tokens[: self.rng.randint(0, len(tokens))])
        self.history.append(tokens)

    def op_clear(self):
        self.a.clear_prefix_cache()

    def op_step(self):
        P = self.P
        reads, move_writes = set(), set()
        for m in self.moves:
            src_kind, dst_kind = (B, I) if isinstance(m, Demotion) else (m.kind, m.kind)
            reads |= {(src_kind, m.src, pos % P) for pos in m.positions}
            move_writes |= {(dst_kind, m.dst, pos % P) for pos in m.positions}
        write_keys = [key for _, key, _ in self.writes]
        assert len(set(write_keys)) == len(write_keys), "two writes to one slot in a step"
        assert not (reads & move_writes), "moves of one step do not commute"
        assert not (set(write_keys) & (reads | move_writes)), "a write overlaps a move"
        self.rng.shuffle(self.moves)
        for m in self.moves:
            src_kind, dst_kind = (B, I) if isinstance(m, Demotion) else (m.kind, m.kind)
            for pos in m.positions:  # KeyError: the move reads a page wiped as free
                self.mem[(dst_kind, m.dst, pos % P)] = self.mem[(src_kind, m.src, pos % P)]
        for _, key, value in self.writes:
            self.mem[key] = value
        self.moves, self.writes = [], []
        self.a.end_step()
        self.busy.clear()
        for kind, pool in self.a._pools.items():
            for page in pool.free_pages():
                for offset in range(P):
                    self.mem.pop((kind, page, offset), None)
        for rid, (tokens, values) in self.seqs.items():
            table = self.a.slot_table(rid)
            got = [self.mem.get((s.kind, s.page, s.offset)) for s in table]
            assert got == values, f"request {rid} reads back wrong KV"

    def run(self, steps):
        ops = [self.op_allocate, self.op_extend, self.op_fork, self.op_release, self.op_insert,
               self.op_step, self.op_clear]
        weights = [18, 34, 6, 18, 8, 15, 1]
        for _ in range(steps):
            self.rng.choices(ops, weights)[0]()
            self.a.check_invariants()
        for rid in list(self.seqs):
            self.a.free(rid)
        self.seqs.clear()
        self.op_step()
        self.a.clear_prefix_cache()
        usage = self.a.usage()
        assert usage.int2.used == usage.bf16.used == 0, usage
        for pool in self.a._pools.values():
            assert sorted(pool.free_pages()) == list(range(pool.capacity))
        self.a.check_invariants()
        stats = self.a.prefix.stats()
        assert 0.0 <= stats.hit_rate < 1.0
        return stats


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "P{}-S{}-R{}-i{}-b{}".format(*c))
def test_fuzz_allocator(config):
    seed = int(os.environ.get("OSCAR_TEST_SEED") or random.SystemRandom().randrange(2**31))
    print(f"fuzz seed {seed}: rerun with OSCAR_TEST_SEED={seed}")
    try:
        stats = ShadowEngine(config, random.Random(seed)).run(STEPS)
    except Exception as exc:
        exc.add_note(f"fuzz seed {seed}, config {config}: rerun with OSCAR_TEST_SEED={seed}")
        raise
    assert stats.lookups > 0

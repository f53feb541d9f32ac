"""Iteration-level scheduling over the paged allocator (no tensors here).

Each step: (1) every running sequence whose prompt is done decodes one token (an `extend` of 1);
when the pools cannot give it a slot, the youngest running sequence is preempted (its pages freed,
it goes back to the front of the queue and later recomputes prompt + generated tokens); (2) the
rest of the token budget continues unfinished prompts in chunks; (3) waiting sequences are
admitted in FIFO order while there are free sequence slots, budget and pages for their whole
prompt (`can_allocate`, prefix-cache hits counted). A sequence is allocated once per admission, so
chunked prefill needs no allocator call until its first decode.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from oscar_ray.cache import KVAllocator

from .batch import StepItem

_ids = itertools.count()


@dataclass(eq=False)
class Seq:
    """One request's tokens and cache progress. `tokens` = prompt + generated; positions
    0 .. n_written - 1 hold KV; the last sampled token is written by the next decode."""

    request_id: str
    tokens: list[int]
    n_prompt: int
    max_new: int
    key: int = field(default_factory=lambda: next(_ids))  # allocator id: unique even if a request_id repeats
    n_written: int = 0
    n_cached: int = 0  # prompt tokens served by the prefix cache at the last admission
    allocated: bool = False
    finished: bool = False
    preemptions: int = 0
    payload: object = None  # the engine's per-request state (sampling, detokenizer, output queue)

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - self.n_prompt

    @property
    def remaining(self) -> int:
        return len(self.tokens) - self.n_written


@dataclass
class Plan:
    items: list[tuple[Seq, StepItem]]
    preempted: list[Seq]
    admitted: list[Seq]
    demotions: list
    copies: list


class Scheduler:
    def __init__(self, allocator: KVAllocator, max_num_seqs: int, max_batched_tokens: int,
                 prefix_caching: bool = True) -> None:
        self.alloc = allocator
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.prefix_caching = prefix_caching
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []  # admission order, oldest first
        self.n_preemptions = 0

    def add(self, seq: Seq) -> None:
        self.waiting.append(seq)

    def drop(self, seq: Seq) -> None:
        """Remove a sequence wherever it is and free its pages now."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.allocated:
            self.alloc.free(seq.key)
            seq.allocated = False

    def _preempt(self, seq: Seq) -> None:
        self.running.remove(seq)
        self.alloc.free(seq.key)
        seq.allocated, seq.n_written, seq.n_cached = False, 0, 0
        seq.preemptions += 1
        self.n_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> Plan:
        items, preempted, admitted, demotions, copies = [], [], [], [], []
        budget = self.max_batched_tokens
        for seq in list(self.running):  # oldest first: the youngest are preempted first
            if seq not in self.running or seq.remaining != 1 or budget == 0:
                continue
            while not self.alloc.can_extend(seq.key, 1):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq not in self.running:
                continue
            a = self.alloc.extend(seq.key, 1)
            demotions += a.demotions
            items.append((seq, StepItem(seq.key, self.alloc.segments(seq.key), seq.n_written, 1)))
            budget -= 1
        for seq in self.running:  # unfinished prompts continue in chunks
            if seq.remaining > 1 and budget > 0:
                n = min(seq.remaining, budget)
                items.append((seq, StepItem(seq.key, self.alloc.segments(seq.key), seq.n_written, n)))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            ids = seq.tokens if self.prefix_caching else None
            if not self.alloc.can_allocate(len(seq.tokens), ids):
                break
            self.waiting.popleft()
            a = self.alloc.allocate(seq.key, len(seq.tokens), ids)
            demotions += a.demotions
            copies += a.copies
            seq.allocated, seq.n_cached = True, min(a.n_cached_tokens, seq.n_prompt)
            self.running.append(seq)
            admitted.append(seq)
            seg = self.alloc.segments(seq.key)
            if a.n_cached_tokens >= len(seq.tokens):  # all cached: recompute the last token for its logits
                seq.n_written = len(seq.tokens)
                items.append((seq, StepItem(seq.key, seg, len(seq.tokens) - 1, 1, write=False)))
                budget -= 1
            else:
                seq.n_written = a.n_cached_tokens
                n = min(seq.remaining, budget)
                items.append((seq, StepItem(seq.key, seg, seq.n_written, n)))
                budget -= n
        return Plan(items, preempted, admitted, demotions, copies)

    def fits_alone(self, n_tokens: int) -> bool:
        """Whether a sequence of n_tokens could run with the pools otherwise empty."""
        g = self.alloc.geometry
        kinds = g.layout(n_tokens)
        u = self.alloc.usage()
        n2 = sum(1 for k in kinds if k.value == "int2")
        return n2 <= u.int2.total and len(kinds) - n2 <= u.bf16.total

"""Workload specs (YAML) and the prompts they generate.

A workload fixes *what* is sent (prompt shape, sampling) and *how* (arrival process, bounds); only
the target changes between runs, so BF16-cache and OSCAR-cache deployments see identical requests
(same seed -> same prompts in the same order).

Prompt kinds:
- `shared_prefix_chat`: multi-turn chats. `num_prefixes` system prompts of `prefix_words`; each
  request is turn k (1..`turns`) of one of `conversations` chats, carrying the k-1 earlier turns
  (synthetic user/assistant text of `turn_words`), so turn k's prompt extends turn k-1's: the
  prefix cache and prefix-affinity routing have something to find.
- `long_context`: one long user message of `context_words` words plus a question.
- `random_short`: a user message of `min_words`..`max_words` random words.
Words come from a fixed English list; ~1.3 SmolLM2 tokens per word.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

KINDS = ("shared_prefix_chat", "long_context", "random_short")
WORDS = (
    "the of and to in is was for on that with as by at from his her it an were are which this be "
    "or has had not but their they one all been there who more would when will other time after "
    "new first year people also two about over into only most made may city river garden letter "
    "morning evening window music history market winter summer village mountain question answer "
    "friend family school water light house table paper story country island forest journey dinner "
    "train bridge road stone silver golden quiet early late small large happy careful bright cold "
    "warm north south east west under between before during without against around through "
    "because while although whether perhaps always never often sometimes together alone again").split()


@dataclass
class SLO:
    """Per-request service-level objective; a request meets it when every set bound holds."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


@dataclass
class Workload:
    name: str
    kind: str
    endpoint: str = "chat"            # chat: /v1/chat/completions; completions: /v1/completions
    model: str | None = None          # None: the first id of GET /v1/models
    seed: int = 0
    concurrency: int | None = None    # closed loop: this many requests in flight
    rate: float | None = None         # open loop: Poisson arrivals per second
    max_in_flight: int = 256          # open-loop bound; an arrival waits for a free slot
    duration_s: float = 60.0          # stop issuing after this long
    num_requests: int = 100           # ... or after this many
    timeout_s: float = 120.0          # per request, whole stream
    sampling: dict[str, Any] = field(default_factory=lambda: {"max_tokens": 32, "temperature": 0.0})
    prompt: dict[str, Any] = field(default_factory=dict)
    slo: SLO = field(default_factory=SLO)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r} is not one of {KINDS}")
        if self.endpoint not in ("chat", "completions"):
            raise ValueError(f"endpoint {self.endpoint!r} must be 'chat' or 'completions'")
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("set exactly one of concurrency (closed loop) and rate (Poisson arrivals)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        for name in ("duration_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.num_requests < 1 or self.max_in_flight < 1:
            raise ValueError("num_requests and max_in_flight must be >= 1")
        if isinstance(self.slo, dict):
            self.slo = SLO(**self.slo)
        unknown = set(self.prompt) - set(PROMPT_DEFAULTS[self.kind])
        if unknown:
            raise ValueError(f"prompt: unknown keys {sorted(unknown)} for kind {self.kind!r} "
                             f"(known: {sorted(PROMPT_DEFAULTS[self.kind])})")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Workload:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"workload: unknown keys {sorted(unknown)}")
        return cls(**d)

    @classmethod
    def from_file(cls, path: str | Path) -> Workload:
        return cls.from_dict(yaml.safe_load(Path(path).read_text()))

    def with_(self, **changes: Any) -> Workload:
        """A copy with some fields replaced (e.g. concurrency for a sweep); validated again."""
        d = asdict(self)
        d.update(changes)
        return Workload.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def params(self) -> dict[str, Any]:
        return {**PROMPT_DEFAULTS[self.kind], **self.prompt}


PROMPT_DEFAULTS: dict[str, dict[str, Any]] = {
    "shared_prefix_chat": {"num_prefixes": 4, "prefix_words": 300, "conversations": 32, "turns": 4,
                           "turn_words": 30},
    "long_context": {"context_words": 1200},
    "random_short": {"min_words": 4, "max_words": 40},
}


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def build_messages(w: Workload, index: int) -> list[dict[str, str]]:
    """The chat messages of request `index`: a pure function of (workload, index)."""
    p = w.params()
    rng = random.Random(f"{w.seed}:{index}")
    if w.kind == "random_short":
        return [{"role": "user", "content": _text(rng, rng.randint(p["min_words"], p["max_words"]))}]
    if w.kind == "long_context":
        return [{"role": "user", "content": _text(rng, p["context_words"]) +
                 "\n\nIn one sentence, what is the text above about?"}]
    conv = rng.randrange(p["conversations"])
    turn = rng.randint(1, p["turns"])
    prefix = _text(random.Random(f"{w.seed}:prefix:{conv % p['num_prefixes']}"), p["prefix_words"])
    msgs = [{"role": "system", "content": prefix}]
    crng = random.Random(f"{w.seed}:conv:{conv}")  # the chat's history is the same for every turn
    for _ in range(turn - 1):
        msgs.append({"role": "user", "content": _text(crng, p["turn_words"])})
        msgs.append({"role": "assistant", "content": _text(crng, p["turn_words"])})
    msgs.append({"role": "user", "content": _text(crng, p["turn_words"]) + "?"})
    return msgs


def build_body(w: Workload, index: int, model: str) -> dict[str, Any]:
    """The JSON body of request `index`, always streaming with usage in the last chunk."""
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                            **w.sampling}
    msgs = build_messages(w, index)
    if w.endpoint == "chat":
        body["messages"] = msgs
    else:
        body["prompt"] = "\n\n".join(m["content"] for m in msgs)
    return body

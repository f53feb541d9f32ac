"""Incremental detokenisation and stop strings.

`Detokenizer.push(token)` returns the text the new token completes. It decodes a short window of
recent tokens twice (with and without the new one) and emits the difference, so multi-byte
characters split over tokens (a "\ufffd" tail) wait for their last byte, and SentencePiece/BPE
leading spaces come out right. `StopMatcher` holds back text that could be the start of a stop
string and cuts the output before a stop string (which is never emitted).
"""

from __future__ import annotations


class Detokenizer:
    """Text of generated tokens, delta by delta (special tokens skipped)."""

    def __init__(self, tokenizer, context: list[int] | tuple[int, ...] = ()) -> None:
        self.tok = tokenizer
        self.ids: list[int] = list(context[-6:])  # a little prompt context for the first token's spacing
        self.prefix = 0  # window start
        self.read = len(self.ids)  # tokens already turned into text

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # nothing printable yet, or an incomplete UTF-8 sequence: wait for more tokens
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before):]


class StopMatcher:
    """Feed text deltas, get the part safe to emit; `stopped` turns True at a stop string."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(stops)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.pending = ""  # text held back (could start a stop string)
        self.stopped = False

    def feed(self, delta: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return delta
        text = self.pending + delta
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self.pending = True, ""
            return text[:cut]
        hold = 0
        for n in range(min(len(text), self.longest - 1), 0, -1):
            if any(s.startswith(text[-n:]) for s in self.stops):
                hold = n
                break
        self.pending = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold]

    def flush(self) -> str:
        """At the end of generation (not at a stop string) the held-back text is real output."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out

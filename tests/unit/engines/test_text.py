"""Incremental detokenisation (real SmolLM2 tokenizer) and stop-string hold-back."""

import pytest

from oscar_ray.engines.torch.text import Detokenizer, StopMatcher

TEXTS = ["Café — naïve 東京 🙂 done", "  two  spaces\nand a newline", "It's 3.14, isn't it?", "🙂🙂🙂"]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_join_to_the_full_decode(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    context = tokenizer("Answer:", add_special_tokens=False)["input_ids"]
    d = Detokenizer(tokenizer, context)
    deltas = [d.push(t) for t in ids]
    assert "".join(deltas) == tokenizer.decode(ids)
    assert all("\ufffd" not in x for x in deltas)  # a split emoji never leaks a replacement char


def test_special_tokens_are_skipped(tokenizer):
    d = Detokenizer(tokenizer)
    ids = tokenizer("Hello", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert "".join(d.push(t) for t in ids) == "Hello"


def test_stop_string_is_cut_and_never_emitted():
    m = StopMatcher(("STOP",))
    out = [m.feed(x) for x in ["abc S", "T", "OP tail"]]
    assert out == ["abc ", "", ""]
    assert "".join(out) == "abc " and m.stopped
    assert m.feed("more") == ""


def test_held_back_prefix_is_released_when_it_diverges():
    m = StopMatcher(("</s>",))
    assert m.feed("x <") == "x "
    assert m.feed("/") == ""
    assert m.feed("b>") == "</b>"
    assert not m.stopped


def test_flush_releases_held_text_at_the_end():
    m = StopMatcher(("###",))
    assert m.feed("end #") == "end "
    assert m.flush() == "#"


def test_earliest_of_several_stops_wins():
    m = StopMatcher(("world", "lo w"))
    assert m.feed("hello world") == "hel"
    assert m.stopped


def test_no_stops_passes_through():
    assert StopMatcher(()).feed("any text") == "any text"

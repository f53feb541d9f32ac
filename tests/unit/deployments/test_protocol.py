"""Wire-model edge cases the HTTP fuzz (load_tests/faults/fuzz.py) found: OpenAI refuses booleans for
numbers and content-less user turns, and accepts `stream: null`; so must we, naming the field."""

import pytest
from pydantic import ValidationError

from oscar_ray.deployments.protocol import ChatCompletionRequest, CompletionRequest

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("field", ["temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "top_k", "n"])
def test_boolean_for_a_number_is_refused_naming_the_field(field):
    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({**BASE, field: True})
    assert e.value.errors()[0]["loc"][0] == field


def test_integers_still_pass_for_float_fields_and_null_stream_means_not_streaming():
    r = ChatCompletionRequest.model_validate({**BASE, "temperature": 1, "top_p": 1, "stream": None, "n": None})
    assert r.temperature == 1.0 and r.stream is False and r.n == 1
    assert r.sampling().temperature == 1.0


@pytest.mark.parametrize("role", ["user", "system", "developer", "tool"])
def test_a_turn_without_content_is_refused_except_for_the_assistant(role):
    with pytest.raises(ValidationError, match="needs 'content'"):
        ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": role}]})
    ok = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None}]})
    assert ok.chat()[1] == {"role": "assistant", "content": ""}


def test_completion_request_numbers_are_strict_too():
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": "hi", "max_tokens": False})
    assert CompletionRequest.model_validate({"model": "m", "prompt": "hi", "max_tokens": 3}).sampling().max_tokens == 3

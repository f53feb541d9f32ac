"""The sglang serving engine's translations, against the shapes sglang 0.5.23 produces (runs without
sglang; a real sglang engine needs a GPU and is not started here).

Shapes, from the 0.5.23 source:
- stream items: `managers/tokenizer_manager.py::_handle_batch_output` -> {"text", "output_ids",
  "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", ...}};
  non-incremental (the default) items are cumulative and the intermediate "output_ids" is sglang's
  own growing list; incremental items are deltas, coalesced by `_coalesce_streaming_chunks`.
- our abort's answer: `_handle_abort_req` -> cumulative "text", meta_info without prompt/cached
  tokens, finish_reason {"type": "abort", "message": ...}.
- finish reasons: `managers/schedule_batch.py` FINISH_* `to_json()`.
"""

from __future__ import annotations

import subprocess

import pytest

from oscar_ray.deployments.engine_factory import build_engine
from oscar_ray.engines.base import (
    EngineDead, EngineOverloaded, GenerateRequest, InvalidRequest, SamplingParams,
)
from oscar_ray.engines.sglang import SGLangEngine, SGLangEngineConfig, build_sglang_engine
from oscar_ray.engines.sglang.engine import _pid_alive, resolve_launcher
from oscar_ray.engines.sglang.translate import (
    OutputTranslator, SGLangRequestError, finish_reason, map_exception, sglang_generate_kwargs,
    sglang_sampling_params,
)

# sglang 0.5.23 sampling/sampling_params.py::SamplingParams, the API fields (not the internal ones)
SGLANG_SAMPLING_FIELDS = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "beam_width",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
    "custom_params", "watermark",
}


def _meta(rid="r", finish=None, prompt=7, completion=0, cached=0, **extra):
    return {"id": rid, "finish_reason": finish, "prompt_tokens": prompt, "weight_version": "default",
            "num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": completion, "cached_tokens": cached,
            **extra}


# ---- request side -------------------------------------------------------------------------------
def test_sampling_params_use_sglang_names_and_conventions():
    greedy = sglang_sampling_params(SamplingParams(max_tokens=5, temperature=0.0))
    assert greedy == {"max_new_tokens": 5, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "ignore_eos": False}
    full = sglang_sampling_params(SamplingParams(max_tokens=9, temperature=0.7, top_p=0.9, top_k=40, stop=("\n\n",),
                                                 stop_token_ids=(2, 7), seed=1234, ignore_eos=True))
    assert full == {"max_new_tokens": 9, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "ignore_eos": True,
                    "stop": ["\n\n"], "stop_token_ids": [2, 7], "sampling_seed": 1234}
    assert set(full) <= SGLANG_SAMPLING_FIELDS


def test_generate_kwargs_for_token_ids_text_and_chat(tokenizer):
    req = GenerateRequest("rid-1", SamplingParams(max_tokens=3), prompt_token_ids=(1, 2, 3))
    kw = sglang_generate_kwargs(req, vocab_size=49152)
    assert kw == {"input_ids": [1, 2, 3], "rid": "rid-1", "stream": True,
                  "sampling_params": sglang_sampling_params(req.sampling)}
    assert sglang_generate_kwargs(GenerateRequest("t", prompt="Hello"))["prompt"] == "Hello"
    msgs = ({"role": "user", "content": "What is 2+2?"},)
    chat = sglang_generate_kwargs(GenerateRequest("c", messages=msgs), tokenizer, 49152)
    want = tokenizer.apply_chat_template(list(msgs), add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert chat["input_ids"] == list(want) and "prompt" not in chat


def test_generate_kwargs_refuse_what_sglang_would_not_check():
    with pytest.raises(InvalidRequest, match="49152") as e:
        sglang_generate_kwargs(GenerateRequest("r", prompt_token_ids=(5, 49152)), vocab_size=49152)
    assert e.value.param == "prompt_token_ids" and e.value.status == 400
    with pytest.raises(InvalidRequest) as e:
        sglang_generate_kwargs(GenerateRequest("r", messages=({"role": "user", "content": "x"},)), None)
    assert e.value.param == "messages"


# ---- stream side ----------------------------------------------------------------------------------
def test_cumulative_items_become_deltas_with_copied_ids():
    tr = OutputTranslator("r", incremental=False)
    live_ids = [11]  # sglang's state.output_ids: the same list in every intermediate item
    c1 = tr.chunk({"text": "Hel", "output_ids": live_ids, "meta_info": _meta(completion=1)})
    live_ids.append(12)
    c2 = tr.chunk({"text": "Hello", "output_ids": live_ids, "meta_info": _meta(completion=2)})
    live_ids.append(13)  # a token whose text the detokenizer still holds back (partial UTF-8)
    c3 = tr.chunk({"text": "Hello", "output_ids": live_ids, "meta_info": _meta(completion=3)})
    c4 = tr.chunk({"text": "Hello wo", "output_ids": [11, 12, 13, 14],
                   "meta_info": _meta(finish={"type": "length", "length": 4}, completion=4, cached=4)})
    assert [(c.text, c.token_ids) for c in (c1, c2, c3, c4)] == [("Hel", (11,)), ("lo", (12,)), ("", (13,)),
                                                                  (" wo", (14,))]
    assert c1.finish_reason is None and c4.finish_reason == "length"
    assert (c4.prompt_tokens, c4.completion_tokens, c4.cached_tokens) == (7, 4, 4)
    assert tr.chunk({"text": "Hello wo", "output_ids": [11, 12, 13, 14], "meta_info": _meta(completion=4)}) is None


def test_incremental_items_and_coalesced_deltas():
    tr = OutputTranslator("r", incremental=True)
    a = tr.chunk({"text": "Hi", "output_ids": [5], "meta_info": _meta(completion=1)})
    # two queued deltas joined by _coalesce_streaming_chunks: texts and ids concatenated, meta last
    b = tr.chunk({"text": " the", "output_ids": [6, 7], "meta_info": _meta(completion=3)})
    c = tr.chunk({"text": "re", "output_ids": [8],
                  "meta_info": _meta(finish={"type": "stop", "matched": 2}, completion=4)})
    assert [(x.text, x.token_ids, x.completion_tokens) for x in (a, b, c)] == [
        ("Hi", (5,), 1), (" the", (6, 7), 3), ("re", (8,), 4)]
    assert c.finish_reason == "stop" and tr.text == "Hi there"


@pytest.mark.parametrize("incremental", [False, True])
def test_our_abort_ends_the_stream_without_repeating_text(incremental):
    tr = OutputTranslator("r", incremental)
    tr.chunk({"text": "Once", "output_ids": [1], "meta_info": _meta(prompt=9, cached=3, completion=1)})
    end = tr.chunk({"text": "Once", "output_ids": [1] if not incremental else [1],
                    "meta_info": {"id": "r", "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
                                  "weight_version": "default", "e2e_latency": 0.1, "completion_tokens": 1}})
    assert end.finish_reason == "abort" and end.text == "" and end.token_ids == ()
    assert (end.prompt_tokens, end.completion_tokens, end.cached_tokens) == (9, 1, 3)


# (finish_reason dict, expected error class, expected HTTP status)
ABORTS = [
    ({"type": "abort", "message": "The request queue is full.", "status_code": 503, "err_type": None},
     EngineOverloaded, 429),
    ({"type": "abort", "message": "Retracted under decode memory pressure without a KV backup. Retry later.",
      "status_code": 503, "err_type": None}, SGLangRequestError, 503),
    ({"type": "abort", "message": "bad json schema", "status_code": 400, "err_type": "BadRequestError"},
     InvalidRequest, 400),
    ({"type": "abort", "message": "Out of memory even after retracting all other requests in the decode batch. "
      "Aborting the last request.", "status_code": 500, "err_type": None}, SGLangRequestError, 500),
]


@pytest.mark.parametrize("reason,cls,status", ABORTS, ids=["queue-full", "retracted", "bad-request", "oom"])
def test_scheduler_aborts_with_a_status_are_engine_errors(reason, cls, status):
    with pytest.raises(cls) as e:
        OutputTranslator("r", False).chunk({"text": "", "output_ids": [], "meta_info": _meta(finish=reason)})
    assert e.value.status == status and reason["message"] in str(e.value)


def test_finish_reasons():
    assert finish_reason(None) is None
    assert finish_reason({"type": "stop", "matched": 128001}) == "stop"
    assert finish_reason({"type": "stop", "matched": "\n\n"}) == "stop"
    assert finish_reason({"type": "length", "length": 16}) == "length"
    assert finish_reason({"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}) == "abort"
    with pytest.raises(SGLangRequestError):
        finish_reason({"type": "bogus"})


def test_generator_exceptions_map_to_engine_errors():
    from fastapi import HTTPException

    too_long = ValueError("The input (5000 tokens) is longer than the model's context length (4096 tokens).")
    e = map_exception(too_long)
    assert isinstance(e, InvalidRequest) and e.status == 400 and "5000 tokens" in str(e)
    e = map_exception(HTTPException(status_code=503, detail="The request queue is full."))
    assert isinstance(e, EngineOverloaded) and e.status == 429
    e = map_exception(RuntimeError("zmq socket closed"))
    assert isinstance(e, SGLangRequestError) and e.status == 500 and "RuntimeError" in str(e)
    assert map_exception(EngineDead("x")).status == 503


# ---- the engine object without sglang ---------------------------------------------------------------
def test_without_sglang_build_fails_naming_the_extra_and_nothing_runs():
    cfg = {"model_path": "/models/Qwen3-8B", "rotations": "identity", "max_queue": 8}
    try:
        import sglang  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"oscar-ray\[sglang\]"):
            build_sglang_engine(cfg)
        with pytest.raises(ValueError, match=r"oscar-ray\[sglang\]"):
            build_engine("sglang", cfg)
    else:
        assert isinstance(build_sglang_engine(cfg), SGLangEngine)
    engine = SGLangEngine(SGLangEngineConfig.model_validate(cfg))
    with pytest.raises(EngineDead, match="not started"):
        engine.generate(GenerateRequest("r", prompt_token_ids=(1,)))
    with pytest.raises(EngineDead, match="not started"):
        engine.model_info()
    assert engine.kv_stats().running == 0 and engine._max_in_flight == 64 + 8


def test_config_max_queue_and_it_is_not_a_server_arg():
    from oscar_ray.engines.sglang import sglang_engine_kwargs

    cfg = SGLangEngineConfig(model_path="m", rotations="identity", max_queue=0)
    assert "max_queue" not in sglang_engine_kwargs(cfg)
    with pytest.raises(ValueError, match="max_queue"):
        SGLangEngineConfig(model_path="m", rotations="identity", max_queue=-1)


def test_pid_alive_sees_exited_and_zombie_children():
    import os
    import time

    assert _pid_alive(os.getpid())
    child = subprocess.Popen(["sleep", "0"])
    deadline = time.monotonic() + 10
    while _pid_alive(child.pid) and time.monotonic() < deadline:  # exited, not reaped: a zombie
        time.sleep(0.01)
    assert not _pid_alive(child.pid)
    child.wait()
    assert not _pid_alive(child.pid)


def test_launcher_is_ray_inside_a_placement_group():
    assert resolve_launcher("auto", in_placement_group=True) == "ray"
    assert resolve_launcher("auto", in_placement_group=False) == "process"
    assert resolve_launcher("process", in_placement_group=True) == "process"
    assert SGLangEngineConfig(model_path="m", rotations="identity").launcher == "auto"
    with pytest.raises(ValueError, match="launcher"):
        SGLangEngineConfig(model_path="m", rotations="identity", launcher="k8s")

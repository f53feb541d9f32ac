"""Our request/chunk types <-> what sglang 0.5.23's in-process `Engine.async_generate` takes and
streams. Pure functions and one small stateful translator; no sglang import (unit-tested here).

Request side (`sglang/srt/entrypoints/engine.py::Engine.async_generate` builds a
`managers/io_struct.py::GenerateReqInput` from its keywords):
  input_ids | prompt, sampling_params (a dict of `sampling/sampling_params.py::SamplingParams`
  fields), rid, stream=True.
  SamplingParams: max_new_tokens, temperature (0 -> sglang sets top_k=1: greedy), top_p, top_k
  (-1 = whole vocabulary; our 0 means the same), stop (strings, trimmed from the output unless
  no_stop_trim), stop_token_ids, ignore_eos, sampling_seed (sglang honours it only with
  --enable-deterministic-inference; otherwise a seeded request is not reproducible there).

Stream side (`managers/tokenizer_manager.py::TokenizerManager._handle_batch_output` and
`_stream_one_response`): every item is `{"text", "output_ids", "meta_info"}` with meta_info
`{"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", ...}`.
- By default (`--incremental-streaming-output` off) `text` and `output_ids` are CUMULATIVE: the
  whole output so far (the intermediate `output_ids` is even the live list sglang keeps appending
  to, so it is copied at once). With the flag on they are deltas, and `_coalesce_streaming_chunks`
  concatenates queued deltas. `OutputTranslator` turns either into our deltas.
- finish_reason is None while running, else a dict from `managers/schedule_batch.py`
  (`FINISH_MATCHED_TOKEN/STR` -> {"type": "stop", "matched"}, `FINISH_LENGTH` -> {"type": "length"},
  `FINISH_ABORT` -> {"type": "abort", "message", "status_code", "err_type"}).
- An abort (ours, via `abort_request`, answered by `_handle_abort_req`) carries the cumulative
  text even in incremental mode, only `completion_tokens` in meta_info, and no status; an abort the
  scheduler decided carries a status: 400 bad request, 503 "The request queue is full."
  (`scheduler.py::_abort_on_queued_limit`) or "Retracted under decode memory pressure ... Retry
  later.", 500 out of memory.
Errors raised by the generator: ValueError for invalid input (`_validate_one_request`: prompt
longer than the context, ...), `fastapi.HTTPException` (status_code, detail) for a non-stream abort.
"""

from __future__ import annotations

from typing import Any

from oscar_ray.engines.base import (
    Chunk, EngineError, EngineOverloaded, FinishReason, GenerateRequest, InvalidRequest, SamplingParams,
)


class SGLangRequestError(EngineError):
    """sglang ended the request with an HTTP status our other errors do not cover (e.g. 500 OOM)."""

    code = "engine_error"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def sglang_sampling_params(sp: SamplingParams) -> dict[str, Any]:
    """Our SamplingParams as sglang's `sampling_params` dict (field names of its SamplingParams)."""
    out: dict[str, Any] = {"max_new_tokens": sp.max_tokens, "temperature": float(sp.temperature),
                           "top_p": float(sp.top_p), "top_k": sp.top_k if sp.top_k > 0 else -1,
                           "ignore_eos": sp.ignore_eos}
    if sp.stop:
        out["stop"] = list(sp.stop)
    if sp.stop_token_ids:
        out["stop_token_ids"] = list(sp.stop_token_ids)
    if sp.seed is not None:
        out["sampling_seed"] = sp.seed
    return out


def sglang_generate_kwargs(request: GenerateRequest, tokenizer=None, vocab_size: int | None = None) -> dict[str, Any]:
    """Keyword arguments of `Engine.async_generate` for one streamed request. `messages` are rendered
    with `tokenizer`'s chat template (the engine's own); token ids are checked against `vocab_size`
    (sglang does not: an out-of-range id would fault the embedding lookup on the GPU)."""
    kw: dict[str, Any] = {"sampling_params": sglang_sampling_params(request.sampling), "rid": request.request_id,
                          "stream": True}
    if request.prompt is not None:
        kw["prompt"] = request.prompt
        return kw
    if request.prompt_token_ids is not None:
        ids, param = list(request.prompt_token_ids), "prompt_token_ids"
    else:
        if tokenizer is None:
            raise InvalidRequest("messages need the engine's tokenizer (sglang started with skip_tokenizer_init)",
                                 param="messages")
        try:
            ids = tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True, tokenize=True)
        except Exception as e:  # jinja errors on malformed messages
            raise InvalidRequest(f"messages cannot be rendered with the chat template: {e}", param="messages") from e
        ids, param = list(ids["input_ids"] if hasattr(ids, "keys") else ids), "messages"
    if vocab_size is not None and max(ids) >= vocab_size:
        raise InvalidRequest(f"{param} holds token id {max(ids)} >= vocab size {vocab_size}", param=param)
    kw["input_ids"] = ids
    return kw


def error_for_status(status: int, message: str) -> EngineError:
    """The EngineError for an sglang HTTP status (400 -> 400, full queue -> 429, else that status)."""
    if status == 400:
        return InvalidRequest(message)
    if status == 429 or (status == 503 and "queue is full" in message):
        return EngineOverloaded(message)
    return SGLangRequestError(status, message)


def map_exception(e: BaseException) -> EngineError:
    """An exception out of sglang's generator as our EngineError (ValueError: invalid input)."""
    if isinstance(e, EngineError):
        return e
    status = getattr(e, "status_code", None)
    if isinstance(status, int):  # fastapi.HTTPException
        return error_for_status(status, str(getattr(e, "detail", e)))
    if isinstance(e, ValueError):
        return InvalidRequest(str(e))
    return SGLangRequestError(500, f"sglang failed: {type(e).__name__}: {e}")


def finish_reason(reason: dict | None) -> FinishReason | None:
    """sglang's finish_reason dict -> ours; raises the EngineError of an abort that has a status."""
    if reason is None:
        return None
    kind = reason.get("type")
    if kind == "abort":
        status = reason.get("status_code")
        if isinstance(status, int) and status >= 400:
            raise error_for_status(status, str(reason.get("message") or "aborted"))
        return "abort"
    if kind in ("stop", "length"):
        return kind
    raise SGLangRequestError(500, f"unknown sglang finish_reason {reason!r}")


class OutputTranslator:
    """sglang stream items of one request -> our `Chunk`s (deltas, cumulative usage)."""

    def __init__(self, request_id: str, incremental: bool) -> None:
        self.request_id, self.incremental = request_id, incremental
        self.text, self.n_ids = "", 0  # what was emitted so far
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0

    def chunk(self, out: dict[str, Any]) -> Chunk | None:
        """The Chunk for one item, None when it carries nothing new; raises EngineError for an abort
        with an error status."""
        meta = out.get("meta_info") or {}
        reason = finish_reason(meta.get("finish_reason"))
        text, ids = out.get("text") or "", list(out.get("output_ids") or ())
        if not self.incremental:
            new_text = text[len(self.text):] if text.startswith(self.text) else ""
            new_ids = ids[self.n_ids:]
        elif reason == "abort":
            # An abort's text is cumulative even here, and coalescing may have prefixed it with
            # queued deltas: nothing in it can be trusted as new, and the request is over anyway.
            new_text, new_ids = "", []
        else:
            new_text, new_ids = text, ids
        self.text += new_text
        self.n_ids += len(new_ids)
        self.prompt_tokens = meta.get("prompt_tokens", self.prompt_tokens)
        self.completion_tokens = meta.get("completion_tokens", max(self.completion_tokens, self.n_ids))
        self.cached_tokens = meta.get("cached_tokens", self.cached_tokens)
        if not new_text and not new_ids and reason is None:
            return None
        return Chunk(self.request_id, text=new_text, token_ids=tuple(new_ids), finish_reason=reason,
                     prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                     cached_tokens=self.cached_tokens)

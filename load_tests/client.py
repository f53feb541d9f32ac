"""One streaming OpenAI request, timed chunk by chunk, classified into ok / error kind.

Error kinds (`RequestRecord.error`):
  http_<status>   non-200 answer (the OpenAI error body's `code` goes in `error_code`)
  stream_error    an `{"error": ...}` event inside a 200 stream (e.g. the engine died mid-request)
  truncated       the body ended without `data: [DONE]`
  garbled         an event that is not JSON, or a chunk without the OpenAI fields
  timeout         no complete answer within the workload's `timeout_s`
  connect         could not connect / connection reset before the status line
  cancelled       we cancelled it on purpose (the cancel storm); not counted as a failure
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from .sse import DONE, SSEParser

CANCELLED = "cancelled"


@dataclass
class RequestRecord:
    """What one request did. Times are seconds: `start` from the run's start, the rest from `start`."""

    index: int
    start: float = 0.0
    ttft: float | None = None          # first chunk carrying output text
    e2e: float | None = None           # [DONE] (or failure) time
    chunk_times: list[float] = field(default_factory=list)  # every content chunk's arrival
    output_tokens: int = 0             # usage.completion_tokens, else the count of content chunks
    prompt_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""
    finish_reason: str | None = None
    status: int | None = None
    error: str | None = None
    error_code: str | None = None
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (tokens - 1)."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def itls(self) -> list[float]:
        """Gaps between consecutive content chunks (one chunk may carry several tokens)."""
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]

    def to_dict(self, with_text: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_text:
            d.pop("text")
        return d


def check_loopback(url: str, allow_remote: bool = False) -> None:
    """Refuse a target that is not on this machine unless `allow_remote`: a load test aimed at a
    shared or production endpoint by a typo is a denial of service."""
    host = urlsplit(url).hostname
    if not host:
        raise ValueError(f"target {url!r} has no host")
    if allow_remote:
        return
    try:
        addrs = {ipaddress.ip_address(host)}
    except ValueError:
        try:
            addrs = {ipaddress.ip_address(a[4][0]) for a in socket.getaddrinfo(host, None)}
        except socket.gaierror as e:
            raise ValueError(f"target host {host!r} does not resolve: {e}") from None
    if not all(a.is_loopback for a in addrs):
        raise ValueError(f"target {url!r} is not a loopback address ({sorted(map(str, addrs))}); "
                         "pass --allow-remote to load-test another machine")


def _content(event: dict, chat: bool) -> str | None:
    """The text of a chunk, or None when the chunk lacks the OpenAI fields (garbled)."""
    choices = event.get("choices")
    if not isinstance(choices, list):
        return None
    text = ""
    for c in choices:
        if not isinstance(c, dict):
            return None
        if chat:
            delta = c.get("delta")
            if not isinstance(delta, dict):
                return None
            text += delta.get("content") or ""
        else:
            text += c.get("text") or ""
    return text


async def stream_request(client: httpx.AsyncClient, url: str, body: dict, rec: RequestRecord,
                         timeout_s: float, cancel_after_s: float | None = None) -> RequestRecord:
    """POST `body` (stream=True) to `url` and fill `rec`. Never raises for server misbehaviour:
    every outcome is a record. `cancel_after_s` closes the connection that long after the start
    (the cancel storm), recorded as `cancelled` unless the stream already finished."""
    chat = "messages" in body
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            if cancel_after_s is None:
                await _read(client, url, body, rec, chat, t0)
            else:
                task = asyncio.ensure_future(_read(client, url, body, rec, chat, t0))
                done, _ = await asyncio.wait([task], timeout=cancel_after_s)
                if not done:
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                    rec.error = CANCELLED
                else:
                    task.result()
    except TimeoutError:
        rec.error = "timeout"
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
        if rec.status is None:
            rec.error, rec.error_message = "connect", str(e) or type(e).__name__
        else:  # reset after a 200: the stream broke off
            rec.error, rec.error_message = "truncated", str(e) or type(e).__name__
    rec.e2e = time.perf_counter() - t0
    return rec


async def _read(client: httpx.AsyncClient, url: str, body: dict, rec: RequestRecord, chat: bool,
                t0: float) -> None:
    async with client.stream("POST", url, json=body) as resp:
        rec.status = resp.status_code
        if resp.status_code != 200:
            raw = await resp.aread()
            rec.error = f"http_{resp.status_code}"
            try:
                err = json.loads(raw)["error"]
                rec.error_code, rec.error_message = err.get("code"), err.get("message")
            except (ValueError, KeyError, TypeError):
                rec.error_code, rec.error_message = "not_openai_error", raw[:200].decode("utf-8", "replace")
            return
        parts: list[str] = []
        try:
            done = await _events(resp, rec, parts, chat, t0)
        finally:  # also on cancel or timeout: keep what arrived
            rec.text = "".join(parts)
            if not rec.output_tokens:
                rec.output_tokens = len(rec.chunk_times)
        if not done and rec.error is None:
            rec.error, rec.error_message = "truncated", "stream ended without [DONE]"


async def _events(resp: httpx.Response, rec: RequestRecord, parts: list[str], chat: bool, t0: float) -> bool:
    """Consume the SSE body into `rec`; True when `[DONE]` arrived."""
    parser, done = SSEParser(), False
    async for piece in resp.aiter_bytes():
        for data in parser.feed(piece):
            if done:  # anything after [DONE] is a protocol violation
                rec.error, rec.error_message = "garbled", f"data after [DONE]: {data[:80]}"
                return True
            if data == DONE:
                done = True
                continue
            try:
                event = json.loads(data)
            except ValueError:
                rec.error, rec.error_message = "garbled", f"not JSON: {data[:80]}"
                return done
            if not isinstance(event, dict):
                rec.error, rec.error_message = "garbled", f"not a JSON object: {data[:80]}"
                return done
            if "error" in event:
                err = event["error"] if isinstance(event["error"], dict) else {"message": str(event["error"])}
                rec.error, rec.error_code, rec.error_message = "stream_error", err.get("code"), err.get("message")
                continue  # the server still owes [DONE]
            text = _content(event, chat)
            if text is None:
                rec.error, rec.error_message = "garbled", f"chunk without choices: {data[:80]}"
                return done
            for c in event["choices"]:
                rec.finish_reason = c.get("finish_reason") or rec.finish_reason
            usage = event.get("usage")
            if isinstance(usage, dict):
                rec.output_tokens = int(usage.get("completion_tokens") or 0)
                rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                rec.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            if text:
                now = time.perf_counter() - t0
                if rec.ttft is None:
                    rec.ttft = now
                rec.chunk_times.append(now)
                parts.append(text)
    if parser.pending() and rec.error is None:
        rec.error, rec.error_message = "truncated", "stream ended inside an event"
    return done

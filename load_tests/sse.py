"""Incremental parsing of a `text/event-stream` body into `data:` payloads.

OpenAI streams are `data: <json>\n\n` events ending with `data: [DONE]`. The parser takes raw
bytes in whatever pieces the socket delivers (an event may be split anywhere, even inside a UTF-8
character) and yields each complete event's data; comment lines (`:`) and other fields are skipped.
"""

from __future__ import annotations

from collections.abc import Iterator

DONE = "[DONE]"


class SSEParser:
    """Feed bytes, get the `data` of every event completed so far.

    >>> p = SSEParser(); list(p.feed(b'data: {"a":1}\\n\\nda')) + list(p.feed(b'ta: [DONE]\\n\\n'))
    ['{"a":1}', '[DONE]']
    """

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> Iterator[str]:
        self._buf += chunk
        while True:
            cut = self._buf.find(b"\n")
            if cut < 0:
                return
            line, self._buf = self._buf[:cut].rstrip(b"\r"), self._buf[cut + 1:]
            if not line:  # blank line ends an event
                if self._data:
                    yield "\n".join(self._data)
                    self._data = []
                continue
            text = line.decode("utf-8")  # a whole line is whole characters
            if text.startswith(":"):
                continue
            field, _, value = text.partition(":")
            if field == "data":
                self._data.append(value[1:] if value.startswith(" ") else value)

    def pending(self) -> bool:
        """True when bytes or data lines of an unfinished event are buffered (a truncated stream)."""
        return bool(self._buf.strip() or self._data)

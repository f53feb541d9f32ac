"""Calibration data sources → a deterministic list of token chunks, sharded round-robin over workers."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..config import CalibDataConfig


def _texts(cfg: CalibDataConfig) -> list[str]:
    if cfg.source == "austen":
        from ..assets import AUSTEN_BOOKS, austen_books

        unknown = [b for b in cfg.books if b not in AUSTEN_BOOKS]
        if unknown or not cfg.books:
            raise ValueError(f"data.books must name Austen novels from {AUSTEN_BOOKS}, got {cfg.books}")
        books = austen_books()
        return [books[b] for b in cfg.books]
    if not cfg.paths:
        raise ValueError(f"data.paths is empty: source={cfg.source!r} needs at least one file")
    texts = []
    for p in map(Path, cfg.paths):
        if not p.is_file():
            raise ValueError(f"data.paths: {p} does not exist")
        if p.suffix == ".jsonl":
            for i, line in enumerate(p.read_text().splitlines()):
                if line.strip():
                    try:
                        texts.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"data.paths: {p} line {i + 1} is not JSON: {e}") from e
        else:
            texts.append(p.read_text())
    return texts


def token_chunks(cfg: CalibDataConfig, tokenizer, chunk_len: int, n_tokens: int) -> list[torch.Tensor]:
    """Chunks of at most `chunk_len` tokens adding up to at least `n_tokens` (fewer if the data ends).

    austen/files: one token stream cut into windows; chat: each conversation is its own chunk
    (rendered with the chat template, truncated to chunk_len), so prompts never attend to each other.
    """
    records = _texts(cfg)
    chunks: list[torch.Tensor] = []
    total = 0
    for rec in records:
        if cfg.source == "chat":
            messages = rec.get("messages") if isinstance(rec, dict) else None
            if not messages:
                raise ValueError("data: every chat record needs a non-empty 'messages' list")
            ids = tokenizer.apply_chat_template(messages, tokenize=True, return_tensors="pt")
            ids = (ids if torch.is_tensor(ids) else ids["input_ids"])[0][:chunk_len]
            pieces = [ids]
        else:
            text = rec if isinstance(rec, str) else rec.get(cfg.text_field) if isinstance(rec, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"data.text_field {cfg.text_field!r} is missing from a JSON-lines record")
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
            pieces = [ids[i : i + chunk_len] for i in range(0, len(ids) - chunk_len + 1, chunk_len)]
        for piece in pieces:
            if total >= n_tokens:
                return chunks
            if piece.numel() > 1:
                chunks.append(piece.clone())
                total += piece.numel()
    return chunks


def shard(chunks: list, worker: int, n_workers: int) -> list[int]:
    """Indices of the chunks worker `worker` owns: round-robin, so shards differ by at most one."""
    return list(range(worker, len(chunks), n_workers))

"""Calibration / evaluation text: Austen novels cut into fixed-length token sequences."""

from __future__ import annotations

import torch


def book_sequences(tokenizer, book: str, seq_len: int, n_seqs: int, skip: int = 0) -> list[torch.Tensor]:
    """`n_seqs` consecutive windows of `seq_len` tokens from an Austen novel, after `skip` windows.

    Deterministic: the same book, tokenizer and numbers always give the same token ids.
    """
    from ..assets import AUSTEN_BOOKS, austen_books

    if book not in AUSTEN_BOOKS:
        raise ValueError(f"book must be one of {AUSTEN_BOOKS}, got {book!r}")
    if seq_len < 1 or n_seqs < 0 or skip < 0:
        raise ValueError(f"seq_len must be >= 1 and n_seqs, skip >= 0 (got {seq_len}, {n_seqs}, {skip})")
    ids = tokenizer(austen_books()[book], add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    need = (skip + n_seqs) * seq_len
    if ids.numel() < need:
        raise ValueError(f"{book} has {ids.numel()} tokens; {n_seqs} sequences of {seq_len} after {skip} "
                         f"skipped need {need}")
    return [ids[(skip + i) * seq_len : (skip + i + 1) * seq_len].clone() for i in range(n_seqs)]

"""Every environment variable oscar-ray reads, typed, in one place (all prefixed OSCAR_)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """OSCAR_CACHE_DIR: where fetched assets live (never inside the repository).

    Default: $XDG_CACHE_HOME/oscar-ray, else ~/.cache/oscar-ray.
    """
    explicit = os.environ.get("OSCAR_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "oscar-ray"


def offline() -> bool:
    """OSCAR_OFFLINE=1: never try to download; fail with the list of missing assets instead."""
    return os.environ.get("OSCAR_OFFLINE", "0") not in ("", "0", "false", "False")


def num_threads() -> int | None:
    """OSCAR_NUM_THREADS: torch intra-op threads for CPU work (None keeps torch's default)."""
    value = os.environ.get("OSCAR_NUM_THREADS")
    return int(value) if value else None

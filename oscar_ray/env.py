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


# --- the sglang plugin (oscar_ray.engines.sglang): read in every sglang process it loads in -------
# sglang spawns its scheduler (one per TP rank) and detokenizer processes; the environment is the one
# channel that reaches all of them before their argument parsing, so the plugin is configured here.
SGLANG_ENV = {
    "rotations": "OSCAR_ROTATIONS",  # RotationSet directory, or "identity" (plain INT2, no rotation)
    "sink_tokens": "OSCAR_SINK_TOKENS",
    "recent_tokens": "OSCAR_RECENT_TOKENS",
    "scale_dtype": "OSCAR_SCALE_DTYPE",  # float16 | float32
    "group_size": "OSCAR_GROUP_SIZE",
    "k_clip": "OSCAR_K_CLIP",  # overrides the artifact's per-layer ratios
    "v_clip": "OSCAR_V_CLIP",
    "absorb_v": "OSCAR_ABSORB_V",  # 1: fold R_V into the weights at load (default); 0: rotate at runtime
    "key_bits": "OSCAR_KEY_BITS",  # 2 (INT2 keys, default) or 3 (one more bit plane, keys unclipped)
    "page_layout": "OSCAR_PAGE_LAYOUT",  # head (default) | token: the INT2 pages' memory order
}


def _env_int(name: str, environ) -> int | None:
    raw = environ.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _env_float(name: str, environ) -> float | None:
    raw = environ.get(name)
    if raw in (None, ""):
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


def sglang_plugin_env(environ=None) -> dict:
    """The OSCAR_* settings of the sglang plugin (see SGLANG_ENV), typed; None where unset."""
    env = os.environ if environ is None else environ
    absorb = env.get(SGLANG_ENV["absorb_v"])
    if absorb not in (None, "", "0", "1"):
        raise ValueError(f"OSCAR_ABSORB_V must be 0 or 1, got {absorb!r}")
    return {
        "rotations": env.get(SGLANG_ENV["rotations"]) or None,
        "sink_tokens": _env_int(SGLANG_ENV["sink_tokens"], env),
        "recent_tokens": _env_int(SGLANG_ENV["recent_tokens"], env),
        "scale_dtype": env.get(SGLANG_ENV["scale_dtype"]) or None,
        "group_size": _env_int(SGLANG_ENV["group_size"], env),
        "k_clip": _env_float(SGLANG_ENV["k_clip"], env),
        "v_clip": _env_float(SGLANG_ENV["v_clip"], env),
        "absorb_v": None if absorb in (None, "") else absorb == "1",
        "key_bits": _env_int(SGLANG_ENV["key_bits"], env),
        "page_layout": env.get(SGLANG_ENV["page_layout"]) or None,
    }

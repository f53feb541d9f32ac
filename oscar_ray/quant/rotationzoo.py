"""Reader for the authors' RotationZoo `.pt` files (OSCAR_SPEC §2.3).

format_version 1: {"format_version": 1, "objective": "qqt_r_h_pbr", "source_grouping": "layer",
                   "layers": {id: {"layer_id": id, "rotation": fp32[d, d], "eigenvalues": fp32[d]}}}
format_version 2: per (layer, KV head): the same, with "rotation" [Hkv, d, d] and "eigenvalues"
                  [Hkv, d], or with "heads": {h: {"rotation": [d, d], "eigenvalues": [d]}} per layer.
Layer keys may be ints or strings; they must cover 0..L-1.
"""

from __future__ import annotations

import torch


def _stack_heads(entry: dict, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    heads = entry["heads"]
    keys = sorted(heads, key=int)
    if [int(k) for k in keys] != list(range(len(keys))):
        raise ValueError(f"{where}: KV head keys must be 0..H-1, got {keys}")
    return (torch.stack([torch.as_tensor(heads[k]["rotation"]) for k in keys]),
            torch.stack([torch.as_tensor(heads[k]["eigenvalues"]) for k in keys]))


def read_rotationzoo(path) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Returns (rotations [L, d, d] or [L, Hkv, d, d], eigenvalues [L, d] or [L, Hkv, d], objective)."""
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise ValueError(f"RotationZoo file not found: {path}") from e
    except Exception as e:
        raise ValueError(f"{path} is not a readable torch checkpoint: {e}") from e
    if not isinstance(state, dict) or "layers" not in state:
        raise ValueError(f"{path}: expected a dict with a 'layers' entry (RotationZoo format)")
    version = state.get("format_version")
    if version not in (1, 2):
        raise ValueError(f"{path}: format_version {version!r} is not 1 or 2")
    layers = state["layers"]
    keys = sorted(layers, key=int)
    if [int(k) for k in keys] != list(range(len(keys))):
        raise ValueError(f"{path}: layer ids must be 0..L-1, got {keys[:8]}…")
    rots, eigs = [], []
    for key in keys:
        entry = layers[key]
        where = f"{path} layer {key}"
        if version == 2 and "heads" in entry:
            r, e = _stack_heads(entry, where)
        else:
            r, e = torch.as_tensor(entry["rotation"]), torch.as_tensor(entry["eigenvalues"])
        want = 2 if version == 1 else 3
        if r.ndim != want or r.shape[-1] != r.shape[-2] or e.shape != r.shape[:-1]:
            raise ValueError(f"{where}: rotation {tuple(r.shape)} / eigenvalues {tuple(e.shape)} do not fit "
                             f"format_version {version}")
        rots.append(r.float())
        eigs.append(e.float())
    shapes = {tuple(r.shape) for r in rots}
    if len(shapes) != 1:
        raise ValueError(f"{path}: layers have different rotation shapes {sorted(shapes)}")
    return torch.stack(rots), torch.stack(eigs), str(state.get("objective", "unknown"))

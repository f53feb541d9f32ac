"""RotationSet: the versioned calibration artifact (safetensors tensors + JSON manifest).

On disk:  <dir>/rotations.safetensors   k_rotation [L, d, d] | [L, Hkv, d, d] fp32, v_rotation (same),
                                        k_eigenvalues / v_eigenvalues [L, d] | [L, Hkv, d] fp32,
                                        k_clip / v_clip [L] fp32
                                        k_mean / v_mean [L, Hkv, d] fp32 (format 2, optional: the
                                        channel means the cache subtracts before INT2, centre.py)
          <dir>/manifest.json           geometry, provenance and the sha256 of the tensor file
The runtime loads rotations through `RotationSet.load` only, and never infers anything from a
file name.  torch + safetensors only: this module runs on the GPU image.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FORMAT_VERSION = 2  # 2 added the optional k_mean/v_mean tensors
READABLE_VERSIONS = (1, 2)
TENSORS_FILE = "rotations.safetensors"
MANIFEST_FILE = "manifest.json"
_TENSOR_NAMES = ("k_rotation", "v_rotation", "k_eigenvalues", "v_eigenvalues", "k_clip", "v_clip")
_MEAN_NAMES = ("k_mean", "v_mean")
_REQUIRED = {  # manifest field -> accepted types
    "format_version": int, "model_id": str, "architecture": str, "n_layers": int, "n_kv_heads": int,
    "head_dim": int, "group_size": int, "per_kv_head": bool, "objective": str, "value_target": str,
    "data_source": str, "token_count": int, "sha256": str,
}


@dataclass(frozen=True)
class ModelGeometry:
    """What a model's attention looks like, to validate an artifact against."""

    n_layers: int
    n_kv_heads: int
    head_dim: int


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class RotationSet:
    """Per-layer K/V rotations (row convention x_rot = x @ R), eigenvalues and clip ratios.

    Example:
        rs = RotationSet.load("artifacts/smollm2", expect=ModelGeometry(30, 3, 64))
        k_rot = k @ rs.k_rotation[layer]        # [T, Hkv, d] @ [d, d]
    """

    k_rotation: torch.Tensor
    v_rotation: torch.Tensor
    k_eigenvalues: torch.Tensor
    v_eigenvalues: torch.Tensor
    k_clip: torch.Tensor
    v_clip: torch.Tensor
    manifest: dict = field(default_factory=dict)
    k_mean: torch.Tensor | None = None  # [L, Hkv, d] key means, original post-RoPE basis; None = not centred
    v_mean: torch.Tensor | None = None  # [L, Hkv, d] value means, original (un-rotated) basis

    def __post_init__(self) -> None:
        for name in _TENSOR_NAMES + _MEAN_NAMES:
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).detach().to("cpu", torch.float32).contiguous())
        r = self.k_rotation
        if r.ndim not in (3, 4) or r.shape[-1] != r.shape[-2]:
            raise ValueError(f"k_rotation must be [L, d, d] or [L, Hkv, d, d], got {tuple(r.shape)}")
        for name in ("v_rotation",):
            if getattr(self, name).shape != r.shape:
                raise ValueError(f"{name} shape {tuple(getattr(self, name).shape)} != k_rotation {tuple(r.shape)}")
        for name in ("k_eigenvalues", "v_eigenvalues"):
            if getattr(self, name).shape != r.shape[:-1]:
                raise ValueError(f"{name} must be {tuple(r.shape[:-1])}, got {tuple(getattr(self, name).shape)}")
        for name in ("k_clip", "v_clip"):
            if getattr(self, name).shape != (r.shape[0],):
                raise ValueError(f"{name} must be [{r.shape[0]}] (one ratio per layer), got "
                                 f"{tuple(getattr(self, name).shape)}")
        if (self.k_mean is None) != (self.v_mean is None):
            raise ValueError("k_mean and v_mean must be given together (or neither)")
        if self.k_mean is not None:
            for name in _MEAN_NAMES:
                m = getattr(self, name)
                if m.ndim != 3 or m.shape[0] != r.shape[0] or m.shape[2] != r.shape[-1] or (
                        self.per_kv_head and m.shape[1] != r.shape[1]):
                    raise ValueError(f"{name} must be [{r.shape[0]}, Hkv, {r.shape[-1]}], got {tuple(m.shape)}")
            if self.v_mean.shape != self.k_mean.shape:
                raise ValueError(f"v_mean {tuple(self.v_mean.shape)} != k_mean {tuple(self.k_mean.shape)}")
        defaults = {"format_version": FORMAT_VERSION, "model_id": "unknown", "architecture": "unknown",
                    "group_size": self.head_dim, "objective": "qqt_r_h_pbr", "value_target": "diag",
                    "data_source": "unknown", "token_count": 0}
        self.manifest = {**defaults, **self.manifest, "n_layers": self.n_layers, "n_kv_heads": self.n_kv_heads,
                         "head_dim": self.head_dim, "per_kv_head": self.per_kv_head, "centred": self.centred}

    # geometry ---------------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return self.k_rotation.shape[0]

    @property
    def head_dim(self) -> int:
        return self.k_rotation.shape[-1]

    @property
    def per_kv_head(self) -> bool:
        return self.k_rotation.ndim == 4

    @property
    def n_kv_heads(self) -> int:
        if self.per_kv_head:
            return self.k_rotation.shape[1]
        if self.k_mean is not None:
            return self.k_mean.shape[1]
        return int(self.manifest.get("n_kv_heads", 0) or 0)

    @property
    def centred(self) -> bool:
        return self.k_mean is not None

    def value_mean_rotated(self) -> torch.Tensor | None:
        """[L, Hkv, d] μ_V·R_V: the value mean in the basis the absorbed W_v produces (None if not centred)."""
        if self.v_mean is None:
            return None
        r = self.v_rotation.to(torch.float64)
        if r.ndim == 3:
            return torch.einsum("lhi,lij->lhj", self.v_mean.double(), r).float()
        return torch.einsum("lhi,lhij->lhj", self.v_mean.double(), r).float()

    def validate(self, expect: ModelGeometry) -> None:
        """Raise ValueError naming the first field where this artifact and the model disagree."""
        for name in ("n_layers", "head_dim"):
            mine, theirs = getattr(self, name), getattr(expect, name)
            if mine != theirs:
                raise ValueError(f"rotation artifact {name} is {mine} but the model has {theirs}: "
                                 "it was calibrated for another model")
        if self.manifest.get("n_kv_heads") not in (None, 0, expect.n_kv_heads):
            raise ValueError(f"rotation artifact n_kv_heads is {self.manifest['n_kv_heads']} but the model has "
                             f"{expect.n_kv_heads}: it was calibrated for another model")

    # I/O --------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> str:
        """Write <path>/rotations.safetensors + manifest.json atomically; returns the tensor sha256.

        Files are written to a temporary sibling and moved into place, so a failed save never
        leaves a half-written artifact, and an existing artifact is replaced only by a complete one.
        """
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out, prefix=".tmp-") as tmp:
            tensors = Path(tmp) / TENSORS_FILE
            names = _TENSOR_NAMES + (_MEAN_NAMES if self.centred else ())
            save_file({n: getattr(self, n) for n in names}, str(tensors))
            digest = _sha256(tensors)
            manifest = {**self.manifest, "format_version": FORMAT_VERSION, "sha256": digest}
            (Path(tmp) / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            os.replace(tensors, out / TENSORS_FILE)
            os.replace(Path(tmp) / MANIFEST_FILE, out / MANIFEST_FILE)
        self.manifest = manifest
        return digest

    @classmethod
    def load(cls, path: str | os.PathLike, expect: ModelGeometry | None = None) -> "RotationSet":
        """Read and verify an artifact directory; `expect` checks it against the model's geometry."""
        root = Path(path)
        mpath, tpath = root / MANIFEST_FILE, root / TENSORS_FILE
        for p in (mpath, tpath):
            if not p.is_file():
                raise ValueError(f"rotation artifact at {root} is missing {p.name}")
        try:
            manifest = json.loads(mpath.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{mpath} is not valid JSON: {e}") from e
        for key, typ in _REQUIRED.items():
            if key not in manifest:
                raise ValueError(f"manifest field {key!r} is missing in {mpath}")
            if not isinstance(manifest[key], typ) or (typ is int and isinstance(manifest[key], bool)):
                raise ValueError(f"manifest field {key!r} must be {typ.__name__}, got {manifest[key]!r}")
        if manifest["format_version"] not in READABLE_VERSIONS:
            raise ValueError(f"manifest field 'format_version' is {manifest['format_version']}; this "
                             f"oscar-ray reads versions {', '.join(map(str, READABLE_VERSIONS))}")
        digest = _sha256(tpath)
        if digest != manifest["sha256"]:
            raise ValueError(f"manifest field 'sha256' is {manifest['sha256'][:12]}… but {tpath.name} hashes to "
                             f"{digest[:12]}…: the artifact is corrupted or was edited")
        try:
            tensors = load_file(str(tpath))
        except Exception as e:  # safetensors raises its own error types
            raise ValueError(f"{tpath} is not a readable safetensors file: {e}") from e
        missing = [n for n in _TENSOR_NAMES if n not in tensors]
        if missing:
            raise ValueError(f"{tpath.name} lacks tensors {missing}")
        if manifest.get("centred") and not all(n in tensors for n in _MEAN_NAMES):
            raise ValueError(f"manifest field 'centred' is true but {tpath.name} lacks k_mean/v_mean")
        means = {n: tensors[n] for n in _MEAN_NAMES if n in tensors}
        rs = cls(**{n: tensors[n] for n in _TENSOR_NAMES}, manifest=manifest, **means)
        for key in ("n_layers", "head_dim", "per_kv_head", "n_kv_heads", "centred"):
            if key in manifest and rs.manifest[key] != manifest[key]:
                raise ValueError(f"manifest field {key!r} says {manifest[key]} but the tensors say {rs.manifest[key]}")
        rs.manifest["sha256"] = digest
        if expect is not None:
            rs.validate(expect)
        return rs

    @property
    def sha256(self) -> str | None:
        return self.manifest.get("sha256")

    @classmethod
    def from_rotationzoo(cls, k_path, v_path, model_id: str = "rotationzoo", n_kv_heads: int = 0,
                         k_clip: float = 0.96, v_clip: float = 0.92) -> "RotationSet":
        """Read the authors' `k_rotation_qqt_r_h_pbr.pt` / `v_rotation_sst_r_h_pbr.pt` pair."""
        from .rotationzoo import read_rotationzoo

        k_rot, k_eig, k_meta = read_rotationzoo(k_path)
        v_rot, v_eig, v_meta = read_rotationzoo(v_path)
        if k_rot.shape != v_rot.shape:
            raise ValueError(f"K file has rotations {tuple(k_rot.shape)} but V file has {tuple(v_rot.shape)}")
        n = k_rot.shape[0]
        manifest = {"model_id": model_id, "architecture": "unknown", "objective": f"{k_meta}+{v_meta}",
                    "value_target": "rotationzoo", "data_source": f"rotationzoo:{Path(k_path).parent.name}",
                    "n_kv_heads": k_rot.shape[1] if k_rot.ndim == 4 else n_kv_heads}
        return cls(k_rot, v_rot, k_eig, v_eig, torch.full((n,), float(k_clip)), torch.full((n,), float(v_clip)),
                   manifest=manifest)

"""Publish a RotationSet to ModelScope and load rotations from a path, a ModelScope id or RotationZoo files."""

from __future__ import annotations

import os
from pathlib import Path

from ..quant import ModelGeometry, RotationSet

TOKEN_ENV = "MODELSCOPE_API_TOKEN"


def publish(path: str, repo_id: str) -> str:
    """Upload the artifact directory; without a token, skip with a message saying how to enable it."""
    token = os.environ.get(TOKEN_ENV)
    if not token:
        return (f"not publishing to ModelScope {repo_id}: set {TOKEN_ENV} to a ModelScope access token "
                f"(the artifact is at {path})")
    RotationSet.load(path)  # never publish a corrupted artifact
    from modelscope.hub.api import HubApi

    api = HubApi()
    api.login(token)
    api.upload_folder(repo_id=repo_id, folder_path=str(path), commit_message="oscar-ray rotation artifact")
    return f"published {path} to ModelScope {repo_id}"


def load_rotations(spec: str, expect: ModelGeometry | None = None) -> RotationSet:
    """`spec` is an artifact directory, `modelscope:<owner>/<name>`, or `rotationzoo:<k.pt>,<v.pt>`."""
    if spec.startswith("rotationzoo:"):
        files = spec.removeprefix("rotationzoo:").split(",")
        if len(files) != 2:
            raise ValueError(f"rotations {spec!r}: rotationzoo needs two files, 'rotationzoo:<k.pt>,<v.pt>'")
        rs = RotationSet.from_rotationzoo(*files, n_kv_heads=expect.n_kv_heads if expect else 0)
        if expect is not None:
            rs.validate(expect)
        return rs
    if spec.startswith("modelscope:"):
        from modelscope.hub.snapshot_download import snapshot_download

        try:
            local = snapshot_download(spec.removeprefix("modelscope:"))
        except Exception as e:  # network, auth or missing repo: one clear message
            raise ValueError(f"rotations {spec!r}: ModelScope download failed: {e}") from e
        return RotationSet.load(local, expect=expect)
    if not Path(spec).is_dir():
        raise ValueError(f"rotations {spec!r} is neither an artifact directory, 'modelscope:<id>' nor "
                         "'rotationzoo:<k.pt>,<v.pt>'")
    return RotationSet.load(spec, expect=expect)

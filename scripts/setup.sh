#!/usr/bin/env bash
# Create .venv at the repo root, install oscar-ray with the dev extra, fetch and verify the assets.
# Idempotent: a second run only checks what is already there (a few seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.venv/.oscar-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$VPY" -m pip install -q --upgrade pip
  # torch first and pinned: the CPU wheel on local disk; an unpinned torch would pull a CUDA build.
  "$VPY" -m pip install -q "torch==2.13.0"
  "$VPY" -m pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi
"$VPY" -m oscar_ray.assets

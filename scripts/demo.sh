#!/usr/bin/env bash
# Set up (idempotent), then the main job: serve SmolLM2-135M-Instruct with the OSCAR INT2 KV cache
# (torch engine, configs/smollm2-cpu.yaml) on a local Ray Serve, send one chat request with the
# official openai client, print the answer, shut down. Extra arguments go to the demo
# (e.g. --prompt "Name three rivers.").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Ray 2.60 token auth is for clusters; the demo's Ray lives and dies on loopback.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
exec .venv/bin/python -m oscar_ray.deployments.demo "$@"

#!/usr/bin/env bash
# Set up (idempotent), then the main job for now: calibrate OSCAR on SmolLM2 over Austen text and
# print the quality table (OSCAR vs naive INT2, QuaRot-INT2, KIVI-2 on held-out text).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/oscar-ray quality --config configs/quality/smollm2.yaml "$@"

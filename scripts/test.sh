#!/usr/bin/env bash
# Set up (idempotent) and run every CPU test; Triton kernels run under the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRITON_INTERPRET=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"

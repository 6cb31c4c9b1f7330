#!/usr/bin/env bash
# Sets up (idempotently) and runs the main job on built-in defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/cpkv demo "$@"

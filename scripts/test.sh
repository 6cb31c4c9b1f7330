#!/usr/bin/env bash
# Sets up (idempotently) and runs every check: lint, types, import layers, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check cpkv_core phases flags cpkv tests
echo "== mypy"; mypy
echo "== import layers"; lint-imports
echo "== pytest"; pytest --durations=15 "$@"

#!/usr/bin/env bash
# Sets up (idempotently) and runs every check: lint, types, import layers, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check cpkv_core phases flags cpkv cpkv_sglang tests
echo "== mypy"; mypy
echo "== import layers"; lint-imports
# NOTE: two workers, one a core: most tests are one Python thread, so the suite runs in a
# little over half the wall time (CPKV_TEST_WORKERS=0 runs it in this process, for -x or pdb).
# One torch thread a process: the tiny model's ops gain nothing from a second, and workers and
# their rank processes each spinning two threads on two cores ran the engine tests 18% slower.
# loadgroup keeps the SGLang plugin's tests (xdist_group "sglang") on one worker, which imports
# SGLang once (~12 s of CPU); every other test is dealt as before.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "== pytest"; pytest -n "${CPKV_TEST_WORKERS:-2}" --dist loadgroup --durations=15 "$@"

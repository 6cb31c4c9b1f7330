#!/usr/bin/env bash
# The CUDA checks, as one script for a lent GPU machine (see docs/cuda.md).
# Wheels for pydantic & co. come in .whl/ (downloaded on a machine with a registry);
# torch is the machine's own. Results go under $OUT (default: ./cuda-out).
set -u
OUT="${OUT:-cuda-out}"
mkdir -p "$OUT"
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >"$OUT/pip.log" 2>&1
export PYTHONPATH=/tmp/site:.
PY="${PYTHON:-python3}"
cpkv() { "$PY" -c 'from cpkv.cli import main; main()' "$@"; }
{
  nvidia-smi -L
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} >"$OUT/machine.txt" 2>&1
status=0
run() {  # run NAME CMD...: one check, its output and time in $OUT/NAME.txt
  local name="$1"; shift
  local start=$SECONDS
  "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"; local rc=$?
  echo "$name rc=$rc $((SECONDS-start))s" | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || status=1
}
run pytest_cuda "$PY" -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py ${CUDA_PYTEST_ARGS:-}
run verify_local cpkv verify tests/data/mixed.jsonl --phases all --cp-size 2 --page-size 4 \
  --backend local --device cuda --json
run verify_gloo cpkv verify tests/data/long.jsonl --phases all --cp-size 4 --page-size 16 \
  --backend gloo --device cuda --json
run verify_torchrun_nccl "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
  -m cpkv.cli verify tests/data/mixed.jsonl --phases all --cp-size 1 --page-size 4 \
  --device cuda --json
# NOTE: peer-read between gloo processes maps each rank's pool through CUDA IPC handles;
# prefetch fetches the next layer's history view on a side stream.
run verify_gloo_peer_read cpkv verify tests/data/long.jsonl --phases all --cp-size 4 \
  --page-size 16 --backend gloo --device cuda --materialize peer-read --json
# NOTE: every rank unmaps its peers' pools before any owner exits (CPEngine.close).
if grep -q "Producer process has been terminated" "$OUT/verify_gloo_peer_read.err"; then
  echo "verify_gloo_peer_read: a CUDA IPC owner exited before its peers unmapped" \
    | tee -a "$OUT/summary.txt"
  status=1
fi
run verify_gloo_prefetch cpkv verify tests/data/long.jsonl --phases all --cp-size 4 \
  --page-size 16 --backend gloo --device cuda --materialize-prefetch --json
exit $status

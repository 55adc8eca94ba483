#!/usr/bin/env bash
# One device call for the argmax family (H200): verify code objects against the lock, run the GPU
# tests, run the benchmark; logs and the record land in $OUT, a short table prints last.
#   usage (device): bash scripts/gpu/argmax.sh <git sha measured> [extra bench args...]
# The working tree travels with build/ carried (code objects built here by `netra kernels build`).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/netra-argmax-out}
mkdir -p "$OUT"
SHA=${1:-unknown}
shift || true
export PYTHONPATH=. PYTHONUNBUFFERED=1 NETRA_TEST_REPORT_DIR="$OUT"
# Other families' work in progress travels too; this run measures argmax only, so set the rest
# aside in this copy (the catalog would otherwise validate half-written contracts).
mkdir -p /tmp/netra-aside
for d in kernels/*/*/; do
  case "$d" in kernels/sm90/argmax/) ;; *) mv "$d" "/tmp/netra-aside/$(echo "$d" | tr / _)" ;; esac
done
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  python3 -c "import torch, cuda.bindings; print('torch', torch.__version__, 'cuda-bindings', cuda.bindings.__version__)"
  nvcc --version | tail -2
} > "$OUT/env.txt" 2>&1
python3 - <<'PY' 2>&1 | tee "$OUT/lock.txt"
from pathlib import Path
from netra.build import verify_lock
problems = verify_lock(Path("build"))
print("lock problems:", problems or "none")
PY
python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_argmax.py tests/kernels 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
python3 -m netra.bench.kernels --family argmax --git-sha "$SHA" --out "$OUT" --stem argmax_h200 "$@" 2>&1 \
  | tee "$OUT/bench.log" | tail -40

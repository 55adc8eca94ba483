#!/usr/bin/env bash
# One device call for the argmax family (H200): verify code objects against the lock, sanitize one
# small call of each tactic (memcheck, racecheck), run the GPU tests, then the spec
# (`python -m netra.bench.harness argmax`: checks, then the tactics timed beside torch.argmax);
# logs and the record (argmax.json) land in $OUT, a short summary prints last. Every step has its
# own timeout; a failing step does not stop the others. Budget: < 4 minutes.
#   usage (device): bash scripts/gpu/argmax.sh <git sha measured> [extra harness args, e.g.
#                   --argmax-explore pdl,u16,u16pdl,probe]
# The working tree travels with build/ carried (code objects built here by `netra kernels build`).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/netra-argmax-out}
mkdir -p "$OUT"
SHA=${1:-unknown}
shift || true
export PYTHONPATH=. PYTHONUNBUFFERED=1 NETRA_TEST_REPORT_DIR="$OUT"
T0=$(date +%s)
step() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
# (All families' contracts are committed and valid now: nothing is set aside, so scripts run after
# this one in the same copy see every family.)
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  python3 -c "import torch, cuda.bindings; print('torch', torch.__version__, 'cuda-bindings', cuda.bindings.__version__)"
  nvcc --version 2>/dev/null | tail -2
  step "lock verify"
  timeout 60 python3 - <<'PY'
from pathlib import Path
from netra.build import verify_lock
problems = verify_lock(Path("build"))
print("lock problems:", [p for p in problems if "argmax" in str(p)] or "none (argmax)", "| all:", len(problems))
PY
  echo "lock rc=$?"
} > "$OUT/env_lock.txt" 2>&1
tail -3 "$OUT/env_lock.txt"

# compute-sanitizer on one small call per cluster variant (rows 2 and 5; cluster 8 + PDL as the
# contract says, cluster 4 = the ring-refill path, the floor probe) and one chunked call.
cat > /tmp/argmax_small.py <<'PY'
import torch
from netra import dispatch
from netra.dispatch import Dispatcher
from netra.ops import argmax as op
dispatch.reset(Dispatcher(min_maturity="experiment", disabled=False))
for rows in (2, 5, 1):
    x = torch.randn(rows, op.VOCAB, device="cuda")
    x[0, 7] = x[0, 62080] = 9.0  # a tie across the first CTA boundary (cluster 8)
    out = torch.full((rows,), -7, dtype=torch.int64, device="cuda")
    op.argmax(x, out=out)
    t = dispatch.select(op.signature(x)).tactic
    ok = torch.equal(out, torch.argmax(x, dim=-1))
    if op.is_cluster(t.contract):
        op.cluster_config(t, 4, True)
        o4 = torch.full_like(out, -7)
        op.launch(t, x, o4, cluster=4)
        op.launch(t, x, torch.full_like(out, -7), probe=True)
        ok = ok and torch.equal(o4, out)
    torch.cuda.synchronize()
    print("rows", rows, t.contract.name, "exact", ok)
PY
for tool in memcheck racecheck; do
  step "compute-sanitizer $tool"
  timeout 60 compute-sanitizer --tool "$tool" --show-backtrace no --print-limit 6 python3 /tmp/argmax_small.py 2>&1 | tail -25
  echo "rc=${PIPESTATUS[0]}"
done > "$OUT/sanitizer.log" 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|exact" "$OUT/sanitizer.log"

step "pytest gpu"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_argmax.py tests/kernels 2>&1 \
  | tee "$OUT/pytest_gpu.log" | tail -6
step "bench"
timeout 240 python3 -m netra.bench.harness argmax --git-sha "$SHA" --out "$OUT" --deadline 200 "$@" \
  > "$OUT/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/bench.log"
step "done"
echo "== sanitizer =="
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=" "$OUT/sanitizer.log" | tr '\n' ' '; echo
echo "== pytest =="
tail -1 "$OUT/pytest_gpu.log"
echo "== bench (table last) =="
grep -vE "^(INFO|WARNING|DEBUG)" "$OUT/bench.log" | tail -60

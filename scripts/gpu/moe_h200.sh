#!/usr/bin/env bash
# One device call for the MoE decode family (issue 7): code objects vs the lock + resource/SASS
# summary, compute-sanitizer on small layer calls, then ONE process that runs the oracle checks for
# every available netra variant and times every provider side by side (netra-v1, netra-v3,
# netra-v3-unfused, SGLang's routed Triton pipeline, SGLang's shared-expert MLP, the PyTorch
# reference) on the same seeded weights/routings/inputs, graph replays interleaved round-robin;
# then the records (results/sm90/moe_*_v3.json) are written into $OUT and the table prints LAST.
# Every step has its own timeout; a failing step does not stop the others. Budget: ~4-5 minutes.
#   usage (device): bash scripts/gpu/moe_h200.sh [git sha measured]     (or GIT_SHA=...)
#   env: OUT, MOE_PROVIDERS (default all), MOE_V3_TUNE (tuning build netra-v3 uses, e.g. p6s), MOE_BENCH_LIMIT (s, default 280), MOE_TIME_BUDGET (s, 220),
#        MOE_PROFILE=1 (adds ncu of the v1 sequence, ~2 x 150 s more)
# Carry: build/ (code objects from `netra kernels build`) and .sglang_peer/ (the SGLang 0.5.23
# wheel's kernel files: `python -m netra.bench.peers.sglang_moe .sglang_peer`).
# $OUT afterwards (<= 8 files): gpu.txt, steps.txt, bench.json, summary.txt, moe_logs.tar.gz
# (bench_log.txt, stdout logs, sanitizer log, SASS summary, the records).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/moe_out}
SHA=${1:-${GIT_SHA:-}}
[[ -z "$SHA" ]] && SHA=$(git rev-parse HEAD 2>/dev/null || echo unknown)
PROVIDERS=${MOE_PROVIDERS:-all}
LOGS="$OUT/moe_logs"
mkdir -p "$OUT" "$LOGS"
T0=$SECONDS
step() {  # step NAME LIMIT_S COMMAND...   (stdout+stderr -> $LOGS/NAME.txt; rc -> steps.txt)
  local name=$1 limit=$2
  shift 2
  local t=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@" > "$LOGS/$name.txt" 2>&1
  local rc=$?
  echo "[$((SECONDS - T0))s] $name rc=$rc (limit ${limit}s, took $((SECONDS - t))s)" | tee -a "$OUT/steps.txt"
}
: > "$OUT/steps.txt"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "git $SHA providers $PROVIDERS"
} > "$OUT/gpu.txt" 2>&1
head -3 "$OUT/gpu.txt"

# 1. code objects vs kernels/lock.json, registers/spills/smem and the MMA/load mix per MoE kernel
step lock_sass 40 bash -c '
python3 - <<PY
from pathlib import Path
from netra.build import verify_lock
problems = verify_lock(Path("build"))
print("lock problems (moe):", [p for p in problems if "moe" in str(p)] or "none", "| all:", len(problems))
PY
for c in build/sm90/moe/*.cubin; do
  echo "== $c"
  cuobjdump --dump-resource-usage "$c" | grep -E "REG|STACK|SHARED|LOCAL" | head -4
  cuobjdump --dump-sass "$c" | grep -oE "\b(HMMA|QMMA|HGMMA|QGMMA|UTMALDG|UBLKCP|LDGSTS|LDG|STG|LDL|STL|SYNCS)[A-Z0-9._]*" \
    | sort | uniq -c | sort -rn | head -12
done'
grep -E "lock problems" "$LOGS/lock_sass.txt"

# 2. compute-sanitizer memcheck: small layer calls (1 and 9 tokens, routed / shared / full routing)
step sanitize 60 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
  python3 -m netra.bench.kernels_moe --mode sanitize --providers "$PROVIDERS" --out "$OUT"
grep -E "ERROR SUMMARY|FAILED" "$LOGS/sanitize.txt" | head -5

# 3. checks + every provider, one process, interleaved (its own wall-clock budget inside)
step bench "${MOE_BENCH_LIMIT:-280}" python3 -m netra.bench.kernels_moe --mode run --providers "$PROVIDERS" \
  --sglang-root .sglang_peer --out "$OUT" --git-sha "$SHA" --time-budget-s "${MOE_TIME_BUDGET:-220}" \
  --v3-tune "${MOE_V3_TUNE:-}"
[[ -f "$OUT/bench_log.txt" ]] && mv "$OUT/bench_log.txt" "$LOGS/"

# (optional) MOE_PROFILE=1: ncu on the v1 sequence at 1 and 128 tokens (scripts/gpu/moe_profile.py)
if [[ "${MOE_PROFILE:-0}" == "1" ]]; then
  for m in 1 128; do
    step "ncu_m$m" 150 ncu --clock-control none --kernel-name regex:moe_ --launch-skip 3 --launch-count 3 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section SchedulerStats python3 scripts/gpu/moe_profile.py "$m"
  done
fi

# 4. the records, from this run's bench.json (copy $OUT/records/* to results/sm90/ after review)
if [[ -f "$OUT/bench.json" ]]; then
  step report 30 python3 -m netra.bench.kernels_moe --mode report --from "$OUT" --out "$LOGS/records" --git-sha "$SHA"
  tail -6 "$LOGS/report.txt"
fi
tar -czf "$OUT/moe_logs.tar.gz" -C "$OUT" moe_logs && rm -rf "$LOGS"
ls -la "$OUT"
cat "$OUT/steps.txt"
# 5. the table, last
if [[ -f "$OUT/bench.json" ]]; then
  timeout 30 python3 -m netra.bench.kernels_moe --mode summary --from "$OUT" --out "$OUT" | tee "$OUT/summary.txt"
else
  echo "no bench.json: see moe_logs.tar.gz (bench.txt)" | tee "$OUT/summary.txt"
fi

#!/usr/bin/env bash
# ncu of one MoE variant's kernels at 1 and 128 tokens (kernels serialised by ncu: no PDL overlap).
#   usage (device): MOE_VARIANT=v3-unfused bash scripts/gpu/moe_ncu.sh
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/moe_ncu}
mkdir -p "$OUT"
for m in 1 128; do
  timeout 150 ncu --clock-control none --kernel-name regex:moe_ --launch-skip 4 --launch-count 4 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats \
    python3 scripts/gpu/moe_profile.py "$m" > "$OUT/ncu_${MOE_VARIANT:-v1}_m$m.txt" 2>&1
  echo "ncu m=$m rc=$?"
  grep -E "^  moe_|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Warp|No Eligible|Block Limit Shared|Dynamic Shared" "$OUT/ncu_${MOE_VARIANT:-v1}_m$m.txt" | head -80
done

#!/usr/bin/env bash
# One device call for the MoE decode family (issue 7): resources/SASS check, oracle checks, and the
# side-by-side benchmark against SGLang's Triton pipeline; everything lands under $OUT.
# Needs: build/ (code objects from `netra kernels build`, carried) and .sglang_peer/ (the SGLang
# 0.5.23 wheel's kernel files, carried; see netra/bench/peers/sglang_moe.py).
set -uo pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/moe_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
for c in build/sm90/moe/*.cubin; do
  echo "== $c" >> "$OUT/sass_summary.txt"
  cuobjdump --dump-sass "$c" | grep -oE "\b(HMMA|QMMA|HGMMA|QGMMA|LDG|STG|LDL|STL)[A-Z0-9._]*" | sort | uniq -c >> "$OUT/sass_summary.txt"
done
cat "$OUT/sass_summary.txt" | head -60
if [[ "${1:-}" == "--profile" ]]; then
  shift
  # Each kernel's second launch per batch size (the first warms caches/clocks).
  ncu --clock-control none --kernel-name regex:moe_ --launch-skip 3 --launch-count 3 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section SchedulerStats \
      python3 scripts/gpu/moe_profile.py 1 > "$OUT/ncu_m1.txt" 2>&1
  ncu --clock-control none --kernel-name regex:moe_ --launch-skip 3 --launch-count 3 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats python3 scripts/gpu/moe_profile.py 128 > "$OUT/ncu_m128.txt" 2>&1
  grep -E "moe_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|Warp Cycles Per Issued|Stall|Eligible|Issued Warp" "$OUT/ncu_m1.txt" "$OUT/ncu_m128.txt" | head -120
fi
python3 -m netra.bench.kernels_moe --out "$OUT" --mode ours 2>&1 | tee "$OUT/log.txt"
# The peer in its own process with a time limit: a peer failure or hang cannot cost our results.
timeout "${PEER_TIMEOUT:-150}" python3 -m netra.bench.kernels_moe --out "$OUT" --mode peer --sglang-root .sglang_peer \
  > "$OUT/peer_log.txt" 2>&1; echo "peer rc=$?" >> "$OUT/peer_log.txt"
tail -40 "$OUT/peer_log.txt"
